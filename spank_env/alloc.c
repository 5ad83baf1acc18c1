/*
 * Submitting context (sbatch, salloc; srun outside a job): refuse what can be
 * refused before the job is queued, and allocate the submission number N once.
 * Runs as the submitting user, so the root checks are the user's own rights.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dispatch.h"
#include "viewfs.h"

/* Configuration first (a bad site.conf must not break jobs that never use the plugin),
 * then the options: they reach sbatch and salloc only if registered here. */
int dsp_alloc_init(spank_t sp, int ac, char **av)
{
	dsp_config_load(ac, av, 0);
	return dsp_opts_register(sp);
}

/* Make N look exactly like a --dispatch-submission option: the job env carries it to
 * every step (even with --export=NONE, Slurm keeps option variables), and the job
 * control env carries it to the Prolog and Epilog as SPANK_<name>. */
static int pass_submission(spank_t sp, unsigned long long n)
{
	char val[24];
	snprintf(val, sizeof(val), "%llu", n);
	if (dsp_opt_set_submission(val) || setenv(DSP_OPTVAR("submission"), val, 1) ||
	    spank_job_control_setenv(sp, DSP_OPTVAR("submission"), val, 1) != ESPANK_SUCCESS) {
		slurm_error("%s: cannot pass the submission number to the job", DSP_PLUGIN);
		return -1;
	}
	return 0;
}

/* What of the view exists must be the user's own folders on the root's filesystem, no
 * symlink on the way (what is missing is made when the job starts). Not checked here: an
 * array's task roots (they do not exist yet) and, for srun inside a job, anything (its
 * task may be in the view's namespace, where the view is a mount of its own): each step's
 * view is checked when it starts, in slurmstepd's namespace. */
static int check_view(const struct dsp_in *in, const char *root)
{
	char rel[DSP_PATH], err[DSP_ERR];
	struct dsp_view_fds fds;
	if (dsp_view_of(in, dsp_config_site(), root, rel, sizeof(rel), err, sizeof(err))) {
		slurm_error("%s", err);
		return -1;
	}
	if (!rel[0] || strstr(root, "%a") || getenv("SLURM_JOB_ID"))
		return 0;
	if (dsp_view_open(root, rel, NULL, DSP_VIEW_CHECK, geteuid(), &fds, err, sizeof(err))) {
		slurm_error("%s: %s", dsp_opt_view() ? "--dispatch-view" : "site.conf's view", err);
		return -1;
	}
	dsp_view_close(&fds);
	return 0;
}

int dsp_alloc_post_opt(spank_t sp)
{
	char err[DSP_ERR], root[DSP_PATH], subdir[DSP_PATH];
	const char *checkpoint = dsp_opt_checkpoint();
	unsigned long long n;
	struct dsp_in in;
	if (!dsp_opt_any())
		return 0;	/* not a dispatch job: nothing to do */
	if (dsp_config_usable(err, sizeof(err))) {
		slurm_error("%s", err);
		return -1;
	}
	if (!checkpoint) {
		slurm_error("--dispatch-* options need --dispatch-checkpoint=DIR");
		return -1;
	}
	dsp_opts_in(&in);
	if (dsp_check_inputs(&in, dsp_config_site(), 0, root, sizeof(root), err, sizeof(err))) {
		slurm_error("%s", err);
		return -1;
	}
	if (dsp_submission_dir(root, subdir, sizeof(subdir)) || dsp_check_root(subdir, err, sizeof(err))) {
		slurm_error("--dispatch-checkpoint=%s: %s", checkpoint, err);
		return -1;
	}
	if (check_view(&in, root))
		return -1;
	if (dsp_opt_submission()) {	/* allocated by the supervisor or a person: it must be, and unclaimed */
		if (!dsp_check_submission(root, &in, err, sizeof(err)))
			return 0;
		slurm_error("%s", err);
		return -1;
	}
	if (getenv("SLURM_JOB_ID")) {
		/* srun inside an allocation: N belongs to the submission, never allocated again */
		slurm_error("--dispatch-checkpoint inside job %s needs --dispatch-submission "
			    "(N is allocated once per submission)", getenv("SLURM_JOB_ID"));
		return -1;
	}
	if (dsp_allocate_submission(subdir, &n, err, sizeof(err))) {
		slurm_error("--dispatch-checkpoint=%s: %s", checkpoint, err);
		return -1;
	}
	slurm_info("dispatch-slurm: submission %llu under %s", n, subdir);
	return pass_submission(sp, n);
}

/* sbatch, salloc, srun exit: what init loaded (the configuration, the options' values,
 * the allocated N among them). */
int dsp_alloc_exit(spank_t sp)
{
	(void)sp;
	dsp_opts_free();
	dsp_config_free();
	return 0;
}
