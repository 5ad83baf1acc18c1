/*
 * dispatch_env: a SPANK plugin that gives every task of every step of a job its
 * DISPATCH_* environment (dispatch-slurm's contract), from five options:
 *
 *   --dispatch-checkpoint=DIR   the job's checkpoint root (array jobs: .../task-%a)
 *   --dispatch-generation=G     0 for a new job, +1 per supersession
 *   --dispatch-submission=N     default: the next free number under DIR/sub/, allocated
 *                               once, at submit time
 *   --dispatch-shared-checkpoint  the job cannot isolate its writes
 *   --dispatch-grace=S          seconds to checkpoint after SIGTERM (0..300)
 *
 * Options are registered with spank_option_register() in slurm_spank_init, the only
 * way they reach sbatch and salloc; values are validated in the callbacks so bad
 * input makes the submitting command refuse the job before it is queued.
 * plugstack.conf: required /usr/local/lib/slurm/dispatch_env.so [conf=/etc/dispatch-slurm/site.conf]
 */
#include <stdio.h>
#include <string.h>

#include "dispatch.h"

SPANK_PLUGIN(dispatch_env, 1);

struct dsp_opts dsp_opts;
struct dsp_site dsp_site;

static int opt_cb(int val, const char *optarg, int remote);

static struct spank_option options[] = {
	{ "dispatch-checkpoint", "DIR", "checkpoint root of this job (dispatch-slurm); "
	  "for an array job put %a in its last component", 1, OPT_CHECKPOINT, opt_cb },
	{ "dispatch-generation", "G", "generation G: 0 for a new job, +1 per supersession", 1,
	  OPT_GENERATION, opt_cb },
	{ "dispatch-submission", "N", "submission number N (default: allocated under DIR/sub/)", 1,
	  OPT_SUBMISSION, opt_cb },
	{ "dispatch-shared-checkpoint", NULL, "this job cannot isolate its checkpoint writes", 0,
	  OPT_SHARED, opt_cb },
	{ "dispatch-grace", "S", "seconds to checkpoint after SIGTERM (0..300)", 1, OPT_GRACE, opt_cb },
	SPANK_OPTIONS_TABLE_END
};

static int store(char *dst, size_t sz, const char *name, const char *value)
{
	if (!value || strlen(value) >= sz) {
		slurm_error("--%s: value missing or too long", name);
		return -1;
	}
	strcpy(dst, value);
	return 0;
}

/* Validate as early as possible: in sbatch/salloc/srun a failure here refuses the job. */
static int opt_cb(int val, const char *optarg, int remote)
{
	char err[DSP_ERR], tmp[DSP_PATH];
	unsigned long long v;
	int rc = 0;
	(void)remote;
	dsp_opts.any = 1;
	switch (val) {
	case OPT_CHECKPOINT:
		rc = store(dsp_opts.checkpoint, sizeof(dsp_opts.checkpoint), "dispatch-checkpoint", optarg);
		if (!rc && (rc = dsp_normalize_root(optarg, tmp, sizeof(tmp), err, sizeof(err))))
			slurm_error("--dispatch-checkpoint=%s: %s", optarg, err);
		break;
	case OPT_GENERATION:
		rc = store(dsp_opts.generation, sizeof(dsp_opts.generation), "dispatch-generation", optarg);
		if (!rc && (rc = dsp_parse_part("--dispatch-generation", "generation G", optarg, 0, DSP_G_MAX,
						&v, err, sizeof(err))))
			slurm_error("%s", err);
		break;
	case OPT_SUBMISSION:
		rc = store(dsp_opts.submission, sizeof(dsp_opts.submission), "dispatch-submission", optarg);
		if (!rc && (rc = dsp_parse_part("--dispatch-submission", "submission N", optarg, 1, DSP_N_MAX,
						&v, err, sizeof(err))))
			slurm_error("%s", err);
		break;
	case OPT_SHARED:
		dsp_opts.shared = 1;
		break;
	case OPT_GRACE:
		rc = store(dsp_opts.grace, sizeof(dsp_opts.grace), "dispatch-grace", optarg);
		if (!rc && (rc = dsp_parse_part("--dispatch-grace", "grace seconds", optarg, 0, DSP_GRACE_CAP,
						&v, err, sizeof(err))))
			slurm_error("%s", err);
		break;
	default:
		rc = -1;
	}
	return rc ? -1 : 0;
}

void dsp_opts_in(struct dsp_in *in)
{
	memset(in, 0, sizeof(*in));
	in->checkpoint = (struct dsp_arg){ dsp_opts.checkpoint, "--dispatch-checkpoint" };
	in->generation = (struct dsp_arg){ dsp_opts.generation, "--dispatch-generation" };
	in->submission = (struct dsp_arg){ dsp_opts.submission, "--dispatch-submission" };
	in->grace = (struct dsp_arg){ dsp_opts.grace, "--dispatch-grace" };
	in->shared = (struct dsp_arg){ dsp_opts.shared ? "1" : "", "--dispatch-shared-checkpoint" };
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	char err[DSP_ERR];
	const char *conf = "/etc/dispatch-slurm/site.conf";
	int explicit = 0;
	spank_context_t ctx = spank_context();
	memset(&dsp_opts, 0, sizeof(dsp_opts));
	for (int i = 0; i < ac; i++) {
		if (!strncmp(av[i], "conf=", 5)) {
			conf = av[i] + 5;
			explicit = 1;
		} else {
			slurm_error("dispatch_env: unknown plugstack.conf argument '%s'", av[i]);
			return -1;
		}
	}
	if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR && ctx != S_CTX_REMOTE)
		return 0;	/* slurmd, job script: nothing to register */
	if (dsp_site_load(&dsp_site, conf, explicit, err, sizeof(err))) {
		slurm_error("dispatch_env: %s", err);
		return -1;
	}
	for (struct spank_option *o = options; o->name; o++)
		if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
			slurm_error("dispatch_env: cannot register --%s", o->name);
			return -1;
		}
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_context() == S_CTX_LOCAL || spank_context() == S_CTX_ALLOCATOR)
		return dsp_local_post_opt(sp);
	return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? dsp_remote_user_init(sp) : 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return spank_context() == S_CTX_REMOTE ? dsp_remote_task_init(sp) : 0;
}
