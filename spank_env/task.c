/*
 * slurmstepd, in each task's own process after fork, before exec (slurm_spank_task_init_privileged:
 * root, after Slurm's own namespace join, job_container/tmpfs's included): give the task a
 * mount namespace of its own in which the job's view folder is the execution's
 * exec/<attempt>/. Its children (torchrun's, DeepSpeed's workers) inherit it; nothing mounted
 * here reaches the node.
 *
 * Root touches the user's paths only through descriptors opened with the job user's
 * credentials, in the new namespace, one component at a time without following a symlink; the
 * folders checked through them are the ones mounted (viewfs.c). A failure fails this task
 * (the job ends FAILED, never a drained node); the user's own mistakes were already found by
 * user_init, as the user, and are reported by task_init (remote.c), so what fails here is what
 * changed since (a folder swapped for a symlink) or what the node cannot do.
 */
#include <stdint.h>
#include <stdio.h>

#include "dispatch.h"
#include "viewfs.h"

/* The job user's ids and groups, as Slurm has them for this task. */
static int job_user(spank_t sp, struct dsp_cred *user)
{
	gid_t *groups = NULL;
	int n = 0;
	if (spank_get_item(sp, S_JOB_UID, &user->uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &user->gid) != ESPANK_SUCCESS)
		return -1;
	if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &groups, &n) != ESPANK_SUCCESS) {
		groups = &user->gid;	/* the primary group alone */
		n = 1;
	}
	user->groups = groups;
	user->ngroups = n;
	return 0;
}

int dsp_task_init_privileged(spank_t sp)
{
	const struct dsp_out *x = dsp_remote_view();
	struct dsp_cred user, saved;
	struct dsp_view_fds fds = { -1, -1, -1 };
	char err[DSP_ERR], back[DSP_ERR];
	int rc;
	if (!x)
		return 0;	/* no view, or a mistake task_init reports */
	if (job_user(sp, &user)) {
		slurm_error("%s: no job user for the view", DSP_PLUGIN);
		return -1;
	}
	rc = dsp_view_namespace(err, sizeof(err)) || dsp_cred_enter(&user, &saved, err, sizeof(err));
	if (!rc) {
		rc = dsp_view_open(x->checkpoint, x->view_rel, x->attempt, DSP_VIEW_OPEN, user.uid, &fds, err, sizeof(err));
		if (dsp_cred_leave(&saved, back, sizeof(back)) && !rc) {
			rc = -1;
			snprintf(err, sizeof(err), "%s", back);
		}
	}
	if (!rc)
		rc = dsp_view_bind(&fds, x->view, err, sizeof(err));
	dsp_view_close(&fds);
	if (rc)
		slurm_error("dispatch-slurm: %s", err);
	return rc ? -1 : 0;
}
