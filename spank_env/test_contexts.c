/*
 * Drives the whole plugin through its slurm_spank_* callbacks in one SPANK context, as
 * Slurm would in that context's process, with Slurm's side stubbed below (against the real
 * slurm/spank.h, so the callbacks' types are Slurm's):
 *   test_contexts <local|allocator|remote|slurmd> <dir>
 * dir: an empty directory of the caller's (site.conf and a checkpoint root are made there).
 * Each context takes state (options, the site config with an account, the allocated N or
 * the step's user error; every option's help says "[dispatch] "), exits by the callback
 * Slurm calls there, and must then hold nothing: every accessor back to empty, and nothing
 * left allocated (valgrind, run by tests/test_spank_plugin.py, sees the heap). Prints
 * "<context>: ok", or each failed check, and exits 1.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dispatch.h"

/* ---- Slurm's side -------------------------------------------------------------------- */

static spank_context_t context;
static struct spank_option *registered[16];
static int nregistered;

spank_context_t spank_context(void)
{
	return context;
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
	(void)sp;
	if (nregistered == (int)(sizeof(registered) / sizeof(registered[0])))
		return ESPANK_ERROR;
	registered[nregistered++] = opt;
	return ESPANK_SUCCESS;
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	va_list ap;
	(void)sp;
	if (item != S_JOB_ID)
		return ESPANK_NOT_AVAIL;
	va_start(ap, item);
	*va_arg(ap, uint32_t *) = 42;
	va_end(ap);
	return ESPANK_SUCCESS;
}

/* The job's env in slurmstepd: a cluster, no restart yet. */
spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
	static const char *const env[][2] = { { "SLURM_CLUSTER_NAME", "harness" }, { "SLURM_RESTART_COUNT", "0" } };
	(void)sp;
	for (size_t i = 0; i < sizeof(env) / sizeof(env[0]); i++)
		if (!strcmp(var, env[i][0])) {
			if ((int)strlen(env[i][1]) >= len)
				return ESPANK_NOSPACE;
			strcpy(buf, env[i][1]);
			return ESPANK_SUCCESS;
		}
	return ESPANK_ENV_NOEXIST;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
	(void)sp;
	(void)var;
	(void)val;
	(void)overwrite;
	return ESPANK_SUCCESS;
}

spank_err_t spank_job_control_setenv(spank_t sp, const char *name, const char *value, int overwrite)
{
	return spank_setenv(sp, name, value, overwrite);
}

#define LOG(fn, tag)                                    \
	void fn(const char *format, ...)                \
	{                                               \
		va_list ap;                             \
		va_start(ap, format);                   \
		fputs("[" tag "] ", stderr);            \
		vfprintf(stderr, format, ap);           \
		fputc('\n', stderr);                    \
		va_end(ap);                             \
	}
LOG(slurm_error, "error")
LOG(slurm_info, "info")
LOG(slurm_verbose, "verbose")
LOG(slurm_debug, "debug")

/* ---- the checks ---------------------------------------------------------------------- */

static int failures;

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (!(cond)) {                                                           \
			printf("%s: check failed: %s (test_contexts.c:%d)\n", name, #cond, __LINE__); \
			failures++;                                                      \
		}                                                                        \
	} while (0)

/* Slurm hands an option's value to its callback, as the command line gave it. */
static int give(const char *option, const char *value, int remote)
{
	for (int i = 0; i < nregistered; i++)
		if (!strcmp(registered[i]->name, option))
			return registered[i]->cb(registered[i]->val, value, remote);
	return -1;
}

static int write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

int main(int argc, char **argv)
{
	static const struct { const char *name; spank_context_t ctx; } contexts[] = {
		{ "local", S_CTX_LOCAL }, { "allocator", S_CTX_ALLOCATOR }, { "remote", S_CTX_REMOTE },
		{ "slurmd", S_CTX_SLURMD },
	};
	char conf[DSP_PATH], arg[DSP_PATH + 8], root[DSP_PATH], err[DSP_ERR];
	const char *name = argc == 3 ? argv[1] : "?";
	char *av[] = { arg };
	spank_t sp = NULL;
	size_t i;
	for (i = 0; i < sizeof(contexts) / sizeof(contexts[0]) && strcmp(contexts[i].name, name); i++)
		;
	if (argc != 3 || i == sizeof(contexts) / sizeof(contexts[0])) {
		fprintf(stderr, "usage: test_contexts local|allocator|remote|slurmd DIR\n");
		return 2;
	}
	context = contexts[i].ctx;
	snprintf(conf, sizeof(conf), "%s/site.conf", argv[2]);
	snprintf(arg, sizeof(arg), "conf=%s", conf);
	snprintf(root, sizeof(root), "%s/ckpt", argv[2]);
	if (write_file(conf, "grace = 30\ngrace.acct = 10\n") || (mkdir(root, 0700) && errno != EEXIST))
		return 2;

	CHECK(slurm_spank_init(sp, 1, av) == 0);
	CHECK(dsp_config_site()->naccounts == 1);	/* something for the exit to free */
	CHECK(dsp_config_usable(err, sizeof(err)) == 0);
	if (context == S_CTX_SLURMD) {
		CHECK(nregistered == 0);	/* slurmd takes no options */
		CHECK(slurm_spank_slurmd_exit(sp, 1, av) == 0);
	} else {
		int remote = context == S_CTX_REMOTE;
		CHECK(nregistered == 5);
		for (int o = 0; o < nregistered; o++)	/* `sbatch --help` names the plugin */
			CHECK(!strncmp(registered[o]->usage, "[dispatch] ", 11));
		CHECK(give("dispatch-checkpoint", root, remote) == 0);
		CHECK(give("dispatch-grace", "5", remote) == 0);
		if (remote) {
			/* N was never allocated under sub/: a user's mistake, kept for task_init */
			CHECK(give("dispatch-submission", "7", remote) == 0);
			CHECK(slurm_spank_init_post_opt(sp, 1, av) == 0);
			CHECK(slurm_spank_user_init(sp, 1, av) == 0);
			CHECK(slurm_spank_task_init(sp, 1, av) == -1);
		} else {
			CHECK(slurm_spank_init_post_opt(sp, 1, av) == 0);	/* allocates N = 1 */
			CHECK(dsp_opt_submission() && !strcmp(dsp_opt_submission(), "1"));
		}
		CHECK(dsp_opt_any());
		CHECK(slurm_spank_exit(sp, 1, av) == 0);
		CHECK(dsp_opt_checkpoint() == NULL);
		CHECK(dsp_opt_submission() == NULL);
		CHECK(!dsp_opt_any());
		if (remote)
			CHECK(slurm_spank_task_init(sp, 1, av) == 0);	/* the step's error is gone */
	}
	CHECK(dsp_config_site()->naccounts == 0 && dsp_config_site()->accounts == NULL);
	CHECK(dsp_config_site()->grace == DSP_GRACE_DEFAULT);
	if (!failures)
		printf("%s: ok\n", name);
	return failures ? 1 : 0;
}
