/*
 * slurmstepd, in slurm_spank_user_init (privileges already dropped to the job
 * user): compute this execution's DISPATCH_* values, make sure its exec folder
 * exists, and put the values into every task's environment.
 *
 * A user's mistake must fail the job, never the node: when user_init fails,
 * slurmstepd cannot launch the batch step and slurmctld drains the node and
 * requeues the job. So user_init only remembers the error, and task_init (in each
 * task's own process, after fork) reports it on the task's stderr and fails the
 * task: the job ends FAILED, the node stays in service. A site.conf this node cannot
 * use is such an error too, for dispatch jobs only (config.c).
 *
 * A job with a view (--dispatch-view, or site.conf's view): user_init makes the view folder
 * (as the user, never following a symlink), runs `dispatch-slurm view prepare` (bounded; its
 * failure is such a user error) and starts `dispatch-slurm view publish` in its own session,
 * one per step per node: each step's slurmstepd keeps track of its own publisher, which
 * sees the step's tasks end (task_exit) and stops it, its last pass given DSP_PUBLISH_STOP_MS;
 * exit kills what is left. Each task then binds exec/<attempt>/ over the view (task.c).
 * A step pays for neither command where it has nothing to do (each is a Python start, ~50 ms
 * a task; benchmarks/bench_view.py): the prepare when the execution's folder already holds its
 * record (an earlier step, or another node, prepared it), the publisher for an srun step on a
 * node where the batch step's publisher runs (the batch step outlives every step it starts).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "dispatch.h"
#include "layout.h"
#include "spawn.h"
#include "viewfs.h"

/* A job env variable of any length, NULL when unset; the caller frees it. */
static char *job_env(spank_t sp, const char *name)
{
	for (size_t sz = 256; sz < INT_MAX; sz *= 2) {
		char *buf = malloc(sz);
		spank_err_t rc = buf ? spank_getenv(sp, name, buf, (int)sz) : ESPANK_ERROR;
		if (rc == ESPANK_SUCCESS)
			return buf;
		free(buf);
		if (rc != ESPANK_NOSPACE)
			break;
	}
	return NULL;
}

static char user_error[DSP_ERR];	/* this step's reason to fail its tasks; "" when none */
static struct dsp_out viewed;		/* the execution, once its view is ready; view[0] "" when none */
static struct dsp_child publisher = { -1, -1, -1 };	/* this step's `dispatch-slurm view publish` */
static uint32_t tasks_ended;		/* of this step, on this node */
static pid_t stepd;			/* slurmstepd's pid, as its init saw it */

int dsp_remote_init(spank_t sp, int ac, char **av)
{
	slurm_debug("%s %s: slurmstepd", DSP_PLUGIN, DSP_VERSION);
	stepd = getpid();
	dsp_config_load(ac, av, 1);
	return dsp_opts_register(sp);
}

const struct dsp_out *dsp_remote_view(void)
{
	return viewed.view[0] ? &viewed : NULL;
}

int dsp_remote_task_init(spank_t sp)
{
	(void)sp;
	if (!user_error[0])
		return 0;
	slurm_error("dispatch-slurm: %s", user_error);
	return -1;
}

#define RECORD_MAX 16

/* "<job>.restart" for a job id of digits only; -1 otherwise. */
static int record_name(const char *job, char *out, size_t outsz)
{
	size_t len = job ? strlen(job) : 0;
	if (!len || len > 20 || strspn(job, "0123456789") != len)
		return -1;
	return snprintf(out, outsz, "%s.restart", job) >= (int)outsz ? -1 : 0;
}

/* RUN_DIR, root's and writable by root alone, never through a symlink. */
static int run_dir(void)
{
	struct stat st;
	int fd = open(DSP_RUN_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) || st.st_uid != 0 || (st.st_mode & 022)) {
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

/* The job's restart count as the Prolog recorded it on this node (dispatch_slurm/slurm/hooks/
 * prolog.py: DSP_RUN_DIR/<job>.restart, root's, 0644, "N\n"), for the batch step: Slurm puts
 * SLURM_RESTART_COUNT into its environment only in the task itself (exec_task's setup_env,
 * after user_init, 22.05 to 26.05) and S_SLURM_RESTART_COUNT is always 0, so without it a
 * requeued batch step would compute the first execution's epoch, attempt and view. 1 with
 * the count in out; 0 without a record only root could have written. */
static int prolog_restart(const char *job, char *out, size_t outsz)
{
	char name[32], buf[RECORD_MAX];
	struct stat st;
	ssize_t n;
	int dir, fd;
	if (record_name(job, name, sizeof(name)) || (dir = run_dir()) < 0)
		return 0;
	fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	close(dir);
	if (fd < 0)
		return 0;
	n = fstat(fd, &st) || st.st_uid != 0 || (st.st_mode & 022) || !S_ISREG(st.st_mode) ? -1 :
	    read(fd, buf, sizeof(buf));
	close(fd);
	if (n < 2 || n >= (ssize_t)sizeof(buf) || buf[n - 1] != '\n' || strspn(buf, "0123456789") != (size_t)n - 1 ||
	    (size_t)n > outsz)
		return 0;	/* not root's record of a count: never trusted */
	memcpy(out, buf, (size_t)n - 1);
	out[n - 1] = '\0';
	return 1;
}

/* The execution's values, from the options and the job env, in out; a user's mistake goes
 * to user_error. -1 only for a broken node (Slurm cannot say the job id). */
static int compute(spank_t sp, const char *checkpoint, const struct dsp_site *site, struct dsp_out *out)
{
	static const char *const names[] = { "SLURM_CLUSTER_NAME", "SLURM_RESTART_COUNT", "SLURM_ARRAY_TASK_ID",
					     "SLURM_JOB_ACCOUNT", "DISPATCH_ATTEMPT" };
	char *env[sizeof(names) / sizeof(names[0])], job_id[16], err[DSP_ERR], restart[16];
	uint32_t id;
	struct dsp_in in;
	int rc;
	if (spank_get_item(sp, S_JOB_ID, &id) != ESPANK_SUCCESS) {
		slurm_error("%s: no job id", DSP_PLUGIN);
		return -1;
	}
	snprintf(job_id, sizeof(job_id), "%u", id);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		env[i] = job_env(sp, names[i]);
	/* S_SLURM_RESTART_COUNT is unreliable (always 0): read the job's own env, or for the batch
	 * step the Prolog's record (prolog_restart) */
	dsp_opts_in(&in);
	in.job_id = (struct dsp_arg){ job_id, "SLURM_JOB_ID" };
	in.cluster = (struct dsp_arg){ env[0], names[0] };
	in.restart = (struct dsp_arg){ env[1], names[1] };
	/* the batch step's env has no SLURM_RESTART_COUNT before its task runs: the Prolog's record */
	if (!env[1] && prolog_restart(job_id, restart, sizeof(restart)))
		in.job_restart = (struct dsp_arg){ restart, "SLURM_JOB_RESTART_COUNT" };
	in.array_task = (struct dsp_arg){ env[2], names[2] };
	in.account = (struct dsp_arg){ env[3], names[3] };
	in.attempt = (struct dsp_arg){ env[4], names[4] };
	/* one epoch per execution (claim.c): refused before anything is written, claimed after */
	rc = dsp_compute(&in, site, out, err, sizeof(err)) || dsp_claim_epoch(checkpoint, out, 0, err, sizeof(err)) ||
	     dsp_make_exec_dir(out->checkpoint, out->attempt, site->exec_mode, strstr(checkpoint, "%a") != NULL,
			       err, sizeof(err)) || dsp_claim_epoch(checkpoint, out, 1, err, sizeof(err));
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		free(env[i]);
	if (rc)
		snprintf(user_error, sizeof(user_error), "%s", err);
	return 0;
}

static void prepare_said(const char *line)
{
	slurm_info("dispatch-slurm view prepare: %s", line);
}

/* The view of the execution `out` ready before any task: its folder, prepared, a publisher.
 * A user's mistake (a symlink, another user's folder, the prepare's refusal) goes to
 * user_error; -1 only when Slurm cannot give the job's env. */
static int view_start(spank_t sp, const struct dsp_out *out)
{
	const char *cmd = dsp_config_site()->dispatch_slurm;
	char path[DSP_PATH], **env = NULL;
	struct dsp_view_fds fds;
	/* slurmstepd's own main thread (not the clone a ContainSpank site runs user_init in,
	 * which exits at once): the publisher may die with it */
	int main_thread = getpid() == stepd && gettid() == stepd, prepared, batch, publish = 1;
	uint32_t step = 0;
	struct stat record;
	if (dsp_view_open(out->checkpoint, out->view_rel, out->attempt, DSP_VIEW_CREATE, geteuid(), &fds, user_error,
			  sizeof(user_error)))
		return 0;
	/* as the user, on the folder just opened without following a symlink: prepare writes the
	 * record last, so a record (a file, never followed) means the placing is done */
	prepared = !fstatat(fds.exec, DSP_VIEW_RECORD, &record, AT_SYMLINK_NOFOLLOW) && S_ISREG(record.st_mode);
	dsp_view_close(&fds);
	if (spank_setenv(sp, "DISPATCH_VIEW", out->view, 1) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS) {
		slurm_error("%s: cannot set DISPATCH_VIEW or read the job's environment or step", DSP_PLUGIN);
		return -1;
	}
	batch = step == SLURM_BATCH_SCRIPT;
	if (!batch && prepared && dsp_batch_publisher_runs(out->checkpoint, out->attempt, geteuid())) {
		slurm_debug("%s: step %u: the batch step's publisher of %s runs on this node", DSP_PLUGIN, step, out->attempt);
		publish = 0;
	}
	if (dsp_command(cmd ? cmd : DSP_DISPATCH_SLURM, env, path, sizeof(path), user_error, sizeof(user_error)) ||
	    (!prepared && dsp_run_prepare(path, env, DSP_PREPARE_TIMEOUT_MS, prepare_said, user_error, sizeof(user_error))) ||
	    (publish && dsp_start_publisher(path, env, batch, STDERR_FILENO, main_thread, &publisher, user_error,
					   sizeof(user_error))))
		return 0;
	if (prepared)	/* at debug: a job of many steps would write a line a step into slurmd's log */
		slurm_debug("%s: %s is prepared already", DSP_PLUGIN, out->attempt);
	viewed = *out;
	return 0;
}

/* A task of this step ended here: once the last has, the publisher makes its last pass. */
int dsp_remote_task_exit(spank_t sp)
{
	uint32_t ntasks = 0;
	if (publisher.pid <= 0)
		return 0;
	if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS || ++tasks_ended >= ntasks)
		dsp_stop_child(&publisher, DSP_PUBLISH_STOP_MS);
	return 0;
}

int dsp_remote_user_init(spank_t sp)
{
	const char *checkpoint = dsp_opt_checkpoint();
	struct dsp_out out;
	if (!checkpoint)
		return 0;	/* not a dispatch job */
	/* a user's mistake or an unusable site.conf: reported by task_init (see the top) */
	if (dsp_config_usable(user_error, sizeof(user_error)))
		return 0;
	if (compute(sp, checkpoint, dsp_config_site(), &out))
		return -1;
	if (user_error[0])
		return 0;
	const char *vars[][2] = {
		{ "DISPATCH_CHECKPOINT", out.checkpoint }, { "DISPATCH_GENERATION", out.generation },
		{ "DISPATCH_SUBMISSION", out.submission }, { "DISPATCH_RESTART", out.restart },
		{ "DISPATCH_EPOCH", out.epoch }, { "DISPATCH_ATTEMPT", out.attempt },
		{ "DISPATCH_EXEC_DIR", out.exec_dir }, { "DISPATCH_GRACE_S", out.grace },
	};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		if (spank_setenv(sp, vars[i][0], vars[i][1], 1) != ESPANK_SUCCESS) {
			slurm_error("%s: cannot set %s", DSP_PLUGIN, vars[i][0]);
			return -1;
		}
	if (out.shared && spank_setenv(sp, "DISPATCH_SHARED_CHECKPOINT", "1", 1) != ESPANK_SUCCESS)
		return -1;
	return out.view[0] ? view_start(sp, &out) : 0;
}

/* slurmstepd exit: this step's own state, then what init loaded. */
int dsp_remote_exit(spank_t sp)
{
	(void)sp;
	user_error[0] = '\0';
	dsp_stop_child(&publisher, 1000);	/* one that outlived its last task_exit */
	memset(&viewed, 0, sizeof(viewed));
	tasks_ended = 0;
	stepd = 0;
	dsp_opts_free();
	dsp_config_free();
	return 0;
}
