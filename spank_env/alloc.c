/*
 * Submitting context (sbatch, salloc; srun outside a job): refuse what can be
 * refused before the job is queued, and allocate the submission number N once.
 * Runs as the submitting user, so the root checks are the user's own rights.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

/* Make N look exactly like a --dispatch-submission option: the job env carries it to
 * every step (even with --export=NONE, Slurm keeps option variables), and the job
 * control env carries it to the Prolog and Epilog as SPANK_<name>. */
static int pass_submission(spank_t sp, unsigned long long n)
{
	char val[24];
	snprintf(val, sizeof(val), "%llu", n);
	snprintf(dsp_opts.submission, sizeof(dsp_opts.submission), "%s", val);
	if (setenv(DSP_OPTVAR("submission"), val, 1) ||
	    spank_job_control_setenv(sp, DSP_OPTVAR("submission"), val, 1) != ESPANK_SUCCESS) {
		slurm_error("dispatch_env: cannot pass the submission number to the job");
		return -1;
	}
	return 0;
}

int dsp_local_post_opt(spank_t sp)
{
	char err[DSP_ERR], root[DSP_PATH], subdir[DSP_PATH];
	unsigned long long n;
	struct dsp_in in;
	dsp_opts_in(&in);
	if (!dsp_opts.checkpoint[0]) {
		if (dsp_opts.any) {
			slurm_error("--dispatch-* options need --dispatch-checkpoint=DIR");
			return -1;
		}
		return 0;	/* not a dispatch job: nothing to do */
	}
	if (dsp_check_inputs(&in, &dsp_site, 0, root, sizeof(root), err, sizeof(err))) {
		slurm_error("%s", err);
		return -1;
	}
	if (dsp_submission_dir(root, subdir, sizeof(subdir)) || dsp_check_root(subdir, err, sizeof(err))) {
		slurm_error("--dispatch-checkpoint=%s: %s", dsp_opts.checkpoint, err);
		return -1;
	}
	if (dsp_opts.submission[0])
		return 0;
	if (getenv("SLURM_JOB_ID")) {
		/* srun inside an allocation: N belongs to the submission, never allocated again */
		slurm_error("--dispatch-checkpoint inside job %s needs --dispatch-submission "
			    "(N is allocated once per submission)", getenv("SLURM_JOB_ID"));
		return -1;
	}
	if (dsp_allocate_submission(subdir, &n, err, sizeof(err))) {
		slurm_error("--dispatch-checkpoint=%s: %s", dsp_opts.checkpoint, err);
		return -1;
	}
	slurm_info("dispatch-slurm: submission %llu under %s", n, subdir);
	return pass_submission(sp, n);
}
