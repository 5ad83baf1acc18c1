/*
 * The --dispatch-* options: their table and values (this file's alone; others read
 * them through the accessors). Values are checked as soon as Slurm hands them over,
 * so in sbatch/salloc/srun bad input refuses the job before it is queued.
 */
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

enum { OPT_CHECKPOINT = 1, OPT_GENERATION, OPT_SUBMISSION, OPT_SHARED, OPT_GRACE, OPT_VIEW };

static struct {
	char *checkpoint, *generation, *submission, *grace, *view;	/* as given; NULL: not given */
	int shared;
	int any;
} opts;

static int opt_cb(int val, const char *optarg, int remote);

/* Each usage text starts with DSP_HELP, as pyxis's do with "[pyxis]": `sbatch --help` lists
 * every plugin's options together, and the prefix tells ours apart. */
#define DSP_HELP "[dispatch] "

static struct spank_option table[] = {
	{ "dispatch-checkpoint", "DIR", DSP_HELP "checkpoint root of this job; "
	  "for an array job put %a in its last component", 1, OPT_CHECKPOINT, opt_cb },
	{ "dispatch-generation", "G", DSP_HELP "generation G: 0 for a new job, +1 per supersession", 1,
	  OPT_GENERATION, opt_cb },
	{ "dispatch-submission", "N", DSP_HELP "submission number N (default: allocated under DIR/sub/)", 1,
	  OPT_SUBMISSION, opt_cb },
	{ "dispatch-shared-checkpoint", NULL, DSP_HELP "this job cannot isolate its checkpoint writes", 0,
	  OPT_SHARED, opt_cb },
	{ "dispatch-grace", "S", DSP_HELP "seconds to checkpoint after SIGTERM (0.." DSP_STR(DSP_GRACE_CAP_N) ")", 1, OPT_GRACE, opt_cb },
	{ "dispatch-view", "DIR", DSP_HELP "the folder the trainer writes, inside DIR of --dispatch-checkpoint: "
	  "every execution sees its own exec/<attempt>/ there (" DSP_VIEW_NONE ": no view)", 1, OPT_VIEW, opt_cb },
	SPANK_OPTIONS_TABLE_END
};

/* Options reach sbatch and salloc only when registered here, in slurm_spank_init. */
int dsp_opts_register(spank_t sp)
{
	for (struct spank_option *o = table; o->name; o++)
		if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
			slurm_error("%s: cannot register --%s", DSP_PLUGIN, o->name);
			return -1;
		}
	return 0;
}

static int keep(char **dst, const char *name, const char *value)
{
	char *copy = value ? strdup(value) : NULL;
	if (!copy) {
		slurm_error("--%s: %s", name, value ? "out of memory" : "value missing");
		return -1;
	}
	free(*dst);
	*dst = copy;
	return 0;
}

static int number(const char *label, const char *what, const char *value, unsigned long long lo,
		  unsigned long long hi)
{
	char err[DSP_ERR];
	unsigned long long v;
	if (dsp_parse_part(label, what, value, lo, hi, &v, err, sizeof(err))) {
		slurm_error("%s", err);
		return -1;
	}
	return 0;
}

static int opt_cb(int val, const char *optarg, int remote)
{
	char err[DSP_ERR], root[DSP_PATH];
	(void)remote;
	opts.any = 1;
	switch (val) {
	case OPT_CHECKPOINT:
		if (keep(&opts.checkpoint, "dispatch-checkpoint", optarg))
			return -1;
		if (dsp_normalize_root(optarg, root, sizeof(root), err, sizeof(err))) {
			slurm_error("--dispatch-checkpoint=%s: %s", optarg, err);
			return -1;
		}
		return 0;
	case OPT_GENERATION:
		return keep(&opts.generation, "dispatch-generation", optarg) ||
		       number("--dispatch-generation", "generation G", optarg, 0, DSP_G_MAX) ? -1 : 0;
	case OPT_SUBMISSION:
		return keep(&opts.submission, "dispatch-submission", optarg) ||
		       number("--dispatch-submission", "submission N", optarg, 1, DSP_N_MAX) ? -1 : 0;
	case OPT_SHARED:
		opts.shared = 1;
		return 0;
	case OPT_GRACE:
		return keep(&opts.grace, "dispatch-grace", optarg) ||
		       number("--dispatch-grace", "grace seconds", optarg, 0, DSP_GRACE_CAP) ? -1 : 0;
	case OPT_VIEW:	/* absolute, no '..' now; inside the root once every option is read (alloc.c) */
		if (keep(&opts.view, "dispatch-view", optarg))
			return -1;
		if (strcmp(optarg, DSP_VIEW_NONE) &&
		    dsp_normalize_path("view folder", optarg, root, sizeof(root), err, sizeof(err))) {
			slurm_error("--dispatch-view=%s: %s", optarg, err);
			return -1;
		}
		return 0;
	default:
		return -1;
	}
}

const char *dsp_opt_checkpoint(void)
{
	return opts.checkpoint;
}

const char *dsp_opt_submission(void)
{
	return opts.submission;
}

const char *dsp_opt_view(void)
{
	return opts.view;
}

int dsp_opt_any(void)
{
	return opts.any;
}

/* N allocated at submission: from now on it is the job's --dispatch-submission. */
int dsp_opt_set_submission(const char *n)
{
	return keep(&opts.submission, "dispatch-submission", n);
}

void dsp_opts_in(struct dsp_in *in)
{
	memset(in, 0, sizeof(*in));
	in->checkpoint = (struct dsp_arg){ opts.checkpoint, "--dispatch-checkpoint" };
	in->generation = (struct dsp_arg){ opts.generation, "--dispatch-generation" };
	in->submission = (struct dsp_arg){ opts.submission, "--dispatch-submission" };
	in->grace = (struct dsp_arg){ opts.grace, "--dispatch-grace" };
	in->shared = (struct dsp_arg){ opts.shared ? "1" : "", "--dispatch-shared-checkpoint" };
	in->view = (struct dsp_arg){ opts.view, "--dispatch-view" };
}

void dsp_opts_free(void)
{
	free(opts.checkpoint);
	free(opts.generation);
	free(opts.submission);
	free(opts.grace);
	free(opts.view);
	memset(&opts, 0, sizeof(opts));
}
