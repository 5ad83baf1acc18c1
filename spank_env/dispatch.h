/*
 * The plugin's internal interface (pyxis style): plugin.c only dispatches on
 * spank_context(); each context file keeps its own static state, cleared by its own exit;
 * options.c owns the option table and values, config.c the site config. State is reached
 * through these functions only: no shared mutable globals.
 */
#ifndef DISPATCH_H
#define DISPATCH_H

#include <slurm/spank.h>

#include "claim.h"
#include "contract.h"
#include "fail.h"

#ifndef DSP_VERSION
#error "DSP_VERSION is unset: build with spank_env/Makefile"
#endif

#define DSP_PLUGIN "dispatch_env"
/* Slurm's name for an option's value in the job env (and, prefixed SPANK_, in the
 * Prolog's): _SLURM_SPANK_OPTION_<plugin>_<option, non-alnum -> _>. */
#define DSP_OPTVAR(opt) "_SLURM_SPANK_OPTION_" DSP_PLUGIN "_dispatch_" opt

/* options.c: --dispatch-* (each value NULL when not given) */
int dsp_opts_register(spank_t sp);
const char *dsp_opt_checkpoint(void);
const char *dsp_opt_submission(void);
const char *dsp_opt_view(void);
int dsp_opt_any(void);	/* some --dispatch-* option was given */
int dsp_opt_set_submission(const char *n);
void dsp_opts_in(struct dsp_in *in);	/* as contract inputs, named by option in messages */
void dsp_opts_free(void);

/* config.c: plugstack.conf arguments and site.conf, read once per process; a problem is
 * logged as an error in slurmd/slurmstepd (daemon), verbosely in the user's commands */
void dsp_config_load(int ac, char **av, int daemon);
const struct dsp_site *dsp_config_site(void);
int dsp_config_usable(char *err, size_t errsz);	/* 0, or -1 with the message for the user */
void dsp_config_free(void);

/* One file per SPANK context, each with its own init and exit; an exit frees exactly what
 * its own init loaded (tests/test_spank_plugin.py checks both). */
/* alloc.c: sbatch / salloc / srun */
int dsp_alloc_init(spank_t sp, int ac, char **av);
int dsp_alloc_post_opt(spank_t sp);
int dsp_alloc_exit(spank_t sp);
/* remote.c: slurmstepd */
int dsp_remote_init(spank_t sp, int ac, char **av);
int dsp_remote_user_init(spank_t sp);
int dsp_remote_task_init(spank_t sp);
int dsp_remote_task_exit(spank_t sp);
int dsp_remote_exit(spank_t sp);
/* the execution whose view this step's tasks get (user_init made it ready); NULL: none */
const struct dsp_out *dsp_remote_view(void);
/* task.c: slurmstepd, each task as root before exec: the view's mount namespace */
int dsp_task_init_privileged(spank_t sp);
/* the hooks' root folder on the node, where the Prolog records the job's restart count
 * (remote.c reads it) */
#ifndef DSP_RUN_DIR
#define DSP_RUN_DIR "/run/dispatch-slurm"	/* root's folder of the hooks (dispatch_slurm/slurm/hooks/node.py) */
#endif
/* slurmd.c: slurmd */
int dsp_slurmd_init(spank_t sp, int ac, char **av);
int dsp_slurmd_exit(spank_t sp);

/* fsops.c: as the user, never following a symlink inside the root */
int dsp_allocate_submission(const char *dir, unsigned long long *n, char *err, size_t errsz);
int dsp_check_root(const char *dir, char *err, size_t errsz);
int dsp_make_exec_dir(const char *root, const char *attempt, unsigned int mode, int create_root,
		      char *err, size_t errsz);

#endif
