/*
 * dispatch_env: a SPANK plugin that gives every task of every step of a job its
 * DISPATCH_* environment (dispatch-slurm's contract), from six options:
 *
 *   --dispatch-checkpoint=DIR   the job's checkpoint root (array jobs: .../task-%a)
 *   --dispatch-generation=G     0 for a new job, +1 per supersession
 *   --dispatch-submission=N     default: the next free number under DIR/sub/, allocated
 *                               once, at submit time
 *   --dispatch-shared-checkpoint  the job cannot isolate its writes
 *   --dispatch-grace=S          seconds to checkpoint after SIGTERM (0..DSP_GRACE_CAP)
 *   --dispatch-view=DIR         a folder inside DIR of --dispatch-checkpoint that every task
 *                               of the job sees as its execution's exec/<attempt>/ (task.c)
 *
 * plugstack.conf: required /usr/local/lib/slurm/dispatch_env.so [conf=/etc/dispatch-slurm/site.conf]
 *
 * This file only dispatches on spank_context(), init to exit: alloc.c (sbatch, salloc,
 * srun), remote.c (slurmstepd; task.c its tasks' mount namespace), slurmd.c; each has its own
 * exit, which clears its own state and frees what its init loaded (options.c, config.c own
 * that state).
 *
 * No slurm_spank_job_prolog/epilog, ever: where a plugin has one, slurmd runs it and then
 * unsets the SPANK option variables in the environment it hands the Prolog and Epilog scripts
 * (spank_clear_remote_options_env after _run_spank_job_script, prep_script_slurmd.c, every
 * release since 2012; it unsets while iterating, so one or two survive at random), and the
 * hooks (prolog/, epilog/) know a dispatch job by --dispatch-checkpoint there.
 */
#include "dispatch.h"

SPANK_PLUGIN(dispatch_env, 1);

#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 5, 0)
/*
 * Slurm 25.05 added this symbol (SchedMD/slurm ef535530f2, "Add
 * slurm_spank_init_failure_mode symbol to set return from spank_init()"; CHANGELOG/
 * slurm-25.05.md). When slurm_spank_init of a `required` plugin fails,
 * _do_call_stack() in src/common/spank.c (slurm-25-05-0-1, lines 752-757) returns its
 * value instead: ESPANK_NODE_FAILURE (the default) drains the node, ESPANK_JOB_FAILURE
 * (slurm/slurm_errno.h) fails the job and leaves the node in service
 * (src/slurmd/slurmd/req.c:2887 _launch_job_fail, src/slurmctld/proc_req.c:2100: a
 * "non-fatal error", no drain_nodes). Our init fails only when Slurm refuses
 * to register an option; a bad site.conf never fails it (config.c). Slurm 22.05 and
 * 24.11 neither know nor look up the symbol, so it is compiled only for 25.05+.
 */
int slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE;
#endif

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return dsp_alloc_init(sp, ac, av);
	case S_CTX_REMOTE:
		return dsp_remote_init(sp, ac, av);
	case S_CTX_SLURMD:
		return dsp_slurmd_init(sp, ac, av);
	default:
		return 0;
	}
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return dsp_alloc_post_opt(sp);
	default:
		return 0;
	}
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? dsp_remote_user_init(sp) : 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? dsp_task_init_privileged(sp) : 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? dsp_remote_task_init(sp) : 0;
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? dsp_remote_task_exit(sp) : 0;
}

/* Each context releases what its own init and options took (pyxis_dispatch.c does the
 * same): slurmstepd, srun, sbatch and salloc call exit; slurmd calls slurmd_exit instead
 * (slurm/spank.h), which the slurmd case of exit only mirrors. */
int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return dsp_alloc_exit(sp);
	case S_CTX_REMOTE:
		return dsp_remote_exit(sp);
	case S_CTX_SLURMD:
		return dsp_slurmd_exit(sp);
	default:
		return 0;
	}
}

int slurm_spank_slurmd_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return dsp_slurmd_exit(sp);
}
