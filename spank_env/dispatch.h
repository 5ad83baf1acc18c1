/* State shared by the plugin's context files (pyxis-style: one file per context). */
#ifndef DISPATCH_H
#define DISPATCH_H

#include <slurm/spank.h>

#include "contract.h"

#define DSP_PLUGIN "dispatch_env"
/* Slurm's name for an option's value in the job env (and, prefixed SPANK_, in the
 * Prolog's): _SLURM_SPANK_OPTION_<plugin>_<option, non-alnum -> _>. */
#define DSP_OPTVAR(opt) "_SLURM_SPANK_OPTION_" DSP_PLUGIN "_dispatch_" opt

enum { OPT_CHECKPOINT = 1, OPT_GENERATION, OPT_SUBMISSION, OPT_SHARED, OPT_GRACE };

struct dsp_opts {
	char checkpoint[DSP_PATH];
	char generation[24], submission[24], grace[24];
	int shared;
	int any;	/* some --dispatch-* option was given */
};

extern struct dsp_opts dsp_opts;
extern struct dsp_site dsp_site;

/* plugin.c: the options as contract inputs (named by option in messages) */
void dsp_opts_in(struct dsp_in *in);
/* alloc.c: sbatch / salloc / srun */
int dsp_local_post_opt(spank_t sp);
/* remote.c: slurmstepd */
int dsp_remote_user_init(spank_t sp);
int dsp_remote_task_init(spank_t sp);
/* fsops.c: as the user, never following a symlink inside the root */
int dsp_allocate_submission(const char *dir, unsigned long long *n, char *err, size_t errsz);
int dsp_check_root(const char *dir, char *err, size_t errsz);
int dsp_make_exec_dir(const char *root, const char *attempt, unsigned int mode, int create_root,
		      char *err, size_t errsz);

#endif
