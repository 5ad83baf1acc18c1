/*
 * slurmstepd, in slurm_spank_user_init (privileges already dropped to the job
 * user): compute this execution's DISPATCH_* values, make sure its exec folder
 * exists, and put the values into every task's environment.
 *
 * A user's mistake must fail the job, never the node: when user_init fails,
 * slurmstepd cannot launch the batch step and slurmctld drains the node and
 * requeues the job. So user_init only remembers the error, and task_init (in each
 * task's own process, after fork) reports it on the task's stderr and fails the
 * task: the job ends FAILED, the node stays in service.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dispatch.h"

struct envbuf {
	char job_id[32], cluster[128], restart[32], array_task[32], account[128], attempt[160];
};

static const char *get(spank_t sp, const char *name, char *buf, size_t sz)
{
	return spank_getenv(sp, name, buf, (int)sz) == ESPANK_SUCCESS ? buf : NULL;
}

static char user_error[DSP_ERR];

int dsp_remote_task_init(spank_t sp)
{
	(void)sp;
	if (!user_error[0])
		return 0;
	slurm_error("dispatch-slurm: %s", user_error);
	return -1;
}

int dsp_remote_user_init(spank_t sp)
{
	char err[DSP_ERR];
	struct envbuf b;
	struct dsp_out out;
	uint32_t job_id;
	if (!dsp_opts.checkpoint[0])
		return 0;	/* not a dispatch job */
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS) {
		slurm_error("dispatch_env: no job id");
		return -1;
	}
	snprintf(b.job_id, sizeof(b.job_id), "%u", job_id);
	/* S_SLURM_RESTART_COUNT is unreliable (always 0): read the job's own env */
	struct dsp_in in;
	dsp_opts_in(&in);
	in.job_id = (struct dsp_arg){ b.job_id, "SLURM_JOB_ID" };
	in.cluster = (struct dsp_arg){ get(sp, "SLURM_CLUSTER_NAME", b.cluster, sizeof(b.cluster)), "SLURM_CLUSTER_NAME" };
	in.restart = (struct dsp_arg){ get(sp, "SLURM_RESTART_COUNT", b.restart, sizeof(b.restart)), "SLURM_RESTART_COUNT" };
	in.array_task = (struct dsp_arg){ get(sp, "SLURM_ARRAY_TASK_ID", b.array_task, sizeof(b.array_task)),
					  "SLURM_ARRAY_TASK_ID" };
	in.account = (struct dsp_arg){ get(sp, "SLURM_JOB_ACCOUNT", b.account, sizeof(b.account)), "SLURM_JOB_ACCOUNT" };
	in.attempt = (struct dsp_arg){ get(sp, "DISPATCH_ATTEMPT", b.attempt, sizeof(b.attempt)), "DISPATCH_ATTEMPT" };
	if (dsp_compute(&in, &dsp_site, &out, err, sizeof(err)) ||
	    dsp_make_exec_dir(out.checkpoint, out.attempt, dsp_site.exec_mode,
			      strstr(dsp_opts.checkpoint, "%a") != NULL, err, sizeof(err))) {
		snprintf(user_error, sizeof(user_error), "%s", err);
		return 0;	/* reported by task_init: see the top of this file */
	}
	const char *vars[][2] = {
		{ "DISPATCH_CHECKPOINT", out.checkpoint }, { "DISPATCH_GENERATION", out.generation },
		{ "DISPATCH_SUBMISSION", out.submission }, { "DISPATCH_RESTART", out.restart },
		{ "DISPATCH_EPOCH", out.epoch }, { "DISPATCH_ATTEMPT", out.attempt },
		{ "DISPATCH_EXEC_DIR", out.exec_dir }, { "DISPATCH_GRACE_S", out.grace },
	};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		if (spank_setenv(sp, vars[i][0], vars[i][1], 1) != ESPANK_SUCCESS) {
			slurm_error("dispatch_env: cannot set %s", vars[i][0]);
			return -1;
		}
	if (out.shared && spank_setenv(sp, "DISPATCH_SHARED_CHECKPOINT", "1", 1) != ESPANK_SUCCESS)
		return -1;
	return 0;
}
