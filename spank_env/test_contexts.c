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
 *
 *   test_contexts view <dir> <view> <scenario>      (as root)
 * runs one step of a job with --dispatch-view=<view> as slurmstepd does (view_step below): dir
 * holds site.conf, the root ckpt/ (its owner is the job user), target/ (what a symlink
 * planted by the user points to) and cmd/, where the view's commands (a stand-in) say
 * publish.started; prints what happened, one "key: value" line each.
 *   test_contexts requeue <dir>                       (built with DSP_RUN_DIR=<dir>/run)
 * a requeued job's batch step: the job Prolog's record gives user_init the restart count.
 *   test_contexts submit <dir> <view>                (as the user)
 * sbatch's side: --dispatch-checkpoint=<dir>/ckpt --dispatch-view=<view>, then post_opt.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <slurm/slurm.h>

#include "dispatch.h"

/* ---- Slurm's side -------------------------------------------------------------------- */

static spank_context_t context;
static struct spank_option *registered[16];
static int nregistered;
static uid_t job_uid;
static gid_t job_gid;
static uint32_t step_id = SLURM_BATCH_SCRIPT;	/* S_JOB_STEPID: the batch step unless a scenario says */
/* The job's env in slurmstepd (spank_setenv adds to it, S_JOB_ENV hands it out): a cluster,
 * no restart yet, a PATH. */
static char *job_env[64] = { "SLURM_CLUSTER_NAME=harness", "SLURM_RESTART_COUNT=0", "PATH=/usr/bin:/bin" };
static char env_buf[64][DSP_PATH + 64];

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
	va_start(ap, item);
	switch (item) {
	case S_JOB_ID:
	case S_JOB_LOCAL_TASK_COUNT:
		*va_arg(ap, uint32_t *) = item == S_JOB_ID ? 42 : 1;
		break;
	case S_JOB_STEPID:
		*va_arg(ap, uint32_t *) = step_id;
		break;
	case S_JOB_UID:
		*va_arg(ap, uid_t *) = job_uid;
		break;
	case S_JOB_GID:
		*va_arg(ap, gid_t *) = job_gid;
		break;
	case S_JOB_SUPPLEMENTARY_GIDS:
		*va_arg(ap, gid_t **) = &job_gid;
		*va_arg(ap, int *) = 1;
		break;
	case S_JOB_ENV:
		*va_arg(ap, char ***) = job_env;
		break;
	default:
		va_end(ap);
		return ESPANK_NOT_AVAIL;
	}
	va_end(ap);
	return ESPANK_SUCCESS;
}

static int env_index(const char *var)
{
	size_t len = strlen(var);
	int i;
	for (i = 0; job_env[i]; i++)
		if (!strncmp(job_env[i], var, len) && job_env[i][len] == '=')
			break;
	return i;
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
	const char *v = job_env[env_index(var)];
	(void)sp;
	if (!v)
		return ESPANK_ENV_NOEXIST;
	v += strlen(var) + 1;
	if ((int)strlen(v) >= len)
		return ESPANK_NOSPACE;
	strcpy(buf, v);
	return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
	int i = env_index(var);
	(void)sp;
	(void)overwrite;
	if (i >= (int)(sizeof(job_env) / sizeof(job_env[0])) - 1)
		return ESPANK_ERROR;
	snprintf(env_buf[i], sizeof(env_buf[i]), "%s=%s", var, val);
	job_env[i] = env_buf[i];
	return ESPANK_SUCCESS;
}

spank_err_t spank_job_control_setenv(spank_t sp, const char *name, const char *value, int overwrite)
{
	(void)sp;
	(void)name;
	(void)value;
	(void)overwrite;
	return ESPANK_SUCCESS;
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

/* ---- one step of a job with a view, as slurmstepd runs it (test_contexts view ...) ---- */

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What a scenario does to the task's system calls (a seccomp filter): none, or the new mount
 * API refused (ENOSYS: a kernel before 5.2; EPERM: a container's filter), and whether the
 * bind itself stops until this process (the "attacker") has swapped the view for a symlink. */
struct scenario {
	const char *name;
	int new_api_errno;	/* 0: the calls work */
	int race;		/* swap the view while the bind mount is entered */
	int swap_before_task;	/* swap it between user_init and the task */
	int other_fs;		/* the view is a mount point of its own */
	int stepd_dies;		/* "slurmstepd" ends without task_exit or exit (killed) */
	int srun_step;		/* step 0 (srun's), its env carrying the user's own DISPATCH_VIEW_BATCH=1 */
};

static const struct scenario scenarios[] = {
	{ "plain", 0, 0, 0, 0, 0, 0 }, { "old-kernel", ENOSYS, 0, 0, 0, 0, 0 },
	{ "container-seccomp", EPERM, 0, 0, 0, 0, 0 }, { "race", 0, 1, 0, 0, 0, 0 },
	{ "race-old-kernel", ENOSYS, 1, 0, 0, 0, 0 }, { "swap-before-task", 0, 0, 1, 0, 0, 0 },
	{ "other-fs", 0, 0, 0, 1, 0, 0 }, { "stepd-killed", 0, 0, 0, 0, 1, 0 }, { "srun-step", 0, 0, 0, 0, 0, 1 },
};

/* The filter: refuse open_tree and move_mount with e (0: allow), and stop the bind (move_mount,
 * or mount with MS_BIND) for this process's listener when race. Returns the listener, or 0. */
static int filter(int e, int race)
{
	unsigned int deny = e ? SECCOMP_RET_ERRNO | (unsigned)e : SECCOMP_RET_ALLOW;
	unsigned int bind_new = race && !e ? SECCOMP_RET_USER_NOTIF : deny;
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_open_tree, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, deny),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_move_mount, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, bind_new),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mount, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[3])),
		BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, MS_BIND, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, race && e ? SECCOMP_RET_USER_NOTIF : SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { sizeof(f) / sizeof(f[0]), f };
	int fd = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, race ? SECCOMP_FILTER_FLAG_NEW_LISTENER : 0, &prog);
	return fd < 0 ? -1 : race ? fd : 0;
}

/* The user's move: the checked folder renamed away, a symlink to target in its place. */
static void swap(const char *view, const char *target)
{
	char moved[DSP_PATH + 8];
	snprintf(moved, sizeof(moved), "%s.moved", view);
	if (rename(view, moved) || symlink(target, view))
		printf("swap: %s\n", strerror(errno));
	else
		printf("swap: done\n");
}

/* As the "attacker": answer the task's stopped bind once the swap is done. */
static void answer_binds(pid_t task, int listener_no, const char *view, const char *target)
{
	int pidfd = (int)syscall(SYS_pidfd_open, task, 0), fd = -1, swapped = 0;
	struct seccomp_notif_sizes sizes;
	struct seccomp_notif *req = NULL;
	struct seccomp_notif_resp *resp = NULL;
	if (pidfd < 0 || (fd = (int)syscall(SYS_pidfd_getfd, pidfd, listener_no, 0)) < 0 ||
	    syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes)) {
		printf("listener: %s\n", strerror(errno));
		kill(task, SIGKILL);	/* its bind would wait for an answer forever */
		goto out;
	}
	req = calloc(1, sizes.seccomp_notif);
	resp = calloc(1, sizes.seccomp_notif_resp);
	for (; req && resp;) {
		struct pollfd p[2] = { { .fd = fd, .events = POLLIN }, { .fd = pidfd, .events = POLLIN } };
		if (poll(p, 2, 30000) <= 0 || !(p[0].revents & POLLIN))
			break;
		memset(req, 0, sizes.seccomp_notif);
		if (ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, req))
			break;
		if (!swapped++)
			swap(view, target);
		memset(resp, 0, sizes.seccomp_notif_resp);
		resp->id = req->id;
		resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
		ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, resp);
	}
	printf("binds stopped: %d\n", swapped);
out:
	if (fd >= 0)
		close(fd);
	if (pidfd >= 0)
		close(pidfd);
	free(req);
	free(resp);
}

static const char *same(const char *path, const struct stat *as)
{
	struct stat st;
	return stat(path, &st) ? strerror(errno) : st.st_ino == as->st_ino && st.st_dev == as->st_dev ? "yes" : "no";
}

/* A file written as the job user through path; "ok" or why not. */
static const char *write_as_user(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
	if (fd < 0)
		return strerror(errno);
	close(fd);
	return "ok";
}

/* The task: task_init_privileged as root, then the job user's, task_init, and what it sees. */
static void task(const struct scenario *sc, const char *view, const char *exec, const char *target, int report)
{
	char path[DSP_PATH + 16], moved[DSP_PATH + 8];
	char *av[] = { NULL };
	struct stat ex, tg;
	struct timespec t0, t1;
	int rc, listener = sc->race || sc->new_api_errno ? filter(sc->new_api_errno, sc->race) : 0;
	if (listener < 0 || write(report, &listener, sizeof(listener)) != sizeof(listener))
		_exit(3);
	stat(exec, &ex);
	stat(target, &tg);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = slurm_spank_task_init_privileged(NULL, 0, av);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("task_init_privileged: %d\n", rc);
	printf("task_init_privileged_us: %ld\n", (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000);
	if (setgroups(1, &job_gid) || setresgid(job_gid, job_gid, job_gid) || setresuid(job_uid, job_uid, job_uid))
		_exit(4);
	printf("task_init: %d\n", slurm_spank_task_init(NULL, 0, av));
	printf("view is the exec folder: %s\n", same(view, &ex));
	snprintf(moved, sizeof(moved), "%s.moved", view);
	if (sc->race)
		printf("checked folder is the exec folder: %s\n", same(moved, &ex));
	printf("symlink target is the exec folder: %s\n", same(target, &ex));
	printf("symlink target is itself: %s\n", same(target, &tg));
	snprintf(path, sizeof(path), "%s/by-task", view);
	printf("write by-task: %s\n", write_as_user(path));
	fflush(stdout);
	if (fork() == 0) {	/* a child of the task (torchrun's worker) */
		snprintf(path, sizeof(path), "%s/by-child", view);
		printf("write by-child: %s\n", write_as_user(path));
		_exit(0);
	}
	wait(NULL);
	_exit(0);
}

static int view_step(const char *dir, const char *view, const char *name)
{
	char conf[DSP_PATH], arg[DSP_PATH + 8], root[DSP_PATH], exec[DSP_PATH + 32], target[DSP_PATH];
	char started[DSP_PATH + 32], *av[] = { arg };
	const struct scenario *sc = NULL;
	struct stat st;
	gid_t groups[64];
	int ngroups = getgroups(64, groups), report[2], listener = 0, status = 0, viewed;
	pid_t pid;
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		if (!strcmp(scenarios[i].name, name))
			sc = &scenarios[i];
	snprintf(conf, sizeof(conf), "%s/site.conf", dir);
	snprintf(arg, sizeof(arg), "conf=%s", conf);
	snprintf(root, sizeof(root), "%s/ckpt", dir);
	snprintf(target, sizeof(target), "%s/target", dir);
	snprintf(exec, sizeof(exec), "%s/exec/harness.42.1000000", root);
	if (!sc || stat(root, &st) || ngroups < 0 || pipe(report))
		return 2;
	setvbuf(stdout, NULL, _IONBF, 0);
	job_uid = st.st_uid;
	job_gid = st.st_gid;
	if (sc->other_fs && (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
			     mount("viewfs", view, "tmpfs", 0, NULL) || chown(view, job_uid, job_gid)))
		return 2;
	context = S_CTX_REMOTE;
	if (sc->srun_step) {
		step_id = 0;
		spank_setenv(NULL, "DISPATCH_VIEW_BATCH", "1", 1);
	}
	printf("init: %d\n", slurm_spank_init(NULL, 1, av));
	printf("options: %d\n", give("dispatch-checkpoint", root, 1) || give("dispatch-submission", "1", 1) ||
	       give("dispatch-view", view, 1));
	/* slurmstepd's user_init: effective ids and groups the job user's, real and saved root's */
	if (setgroups(1, &job_gid) || setegid(job_gid) || seteuid(job_uid))
		return 2;
	printf("user_init: %d\n", slurm_spank_user_init(NULL, 1, av));
	viewed = dsp_remote_view() != NULL;
	if (seteuid(0) || setegid(0) || setgroups((size_t)ngroups, groups))
		return 2;
	if (sc->swap_before_task)
		swap(view, target);
	if ((pid = fork()) == 0) {
		close(report[0]);
		task(sc, view, exec, target, report[1]);
	}
	close(report[1]);
	if (read(report[0], &listener, sizeof(listener)) == sizeof(listener) && listener > 0)
		answer_binds(pid, listener, view, target);
	waitpid(pid, &status, 0);
	printf("task exit: %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	/* a publisher the plugin started says so in dir/cmd/publish.started (the caller's stand-in) */
	snprintf(started, sizeof(started), "%s/cmd/publish.started", dir);
	for (int i = 0; viewed && i < 100 && access(started, F_OK); i++)
		usleep(50000);
	if (sc->stepd_dies)
		_exit(0);
	printf("task_exit: %d\n", slurm_spank_task_exit(NULL, 1, av));
	printf("exit: %d\n", slurm_spank_exit(NULL, 1, av));
	return 0;
}

/* sbatch's side of the same job, as the submitting user: the view's option, then post_opt. */
static int view_submit(const char *dir, const char *view)
{
	char conf[DSP_PATH], arg[DSP_PATH + 8], root[DSP_PATH];
	char *av[] = { arg };
	int rc;
	snprintf(conf, sizeof(conf), "%s/site.conf", dir);
	snprintf(arg, sizeof(arg), "conf=%s", conf);
	snprintf(root, sizeof(root), "%s/ckpt", dir);
	context = S_CTX_ALLOCATOR;
	printf("init: %d\n", slurm_spank_init(NULL, 1, av));
	rc = give("dispatch-checkpoint", root, 0) || give("dispatch-view", view, 0);
	printf("options: %d\n", rc);
	if (!rc)
		printf("post_opt: %d\n", slurm_spank_init_post_opt(NULL, 1, av));
	printf("exit: %d\n", slurm_spank_exit(NULL, 1, av));
	return 0;
}

/* The job user's env value of var, NULL when unset. */
static const char *env_value(const char *var)
{
	const char *v = job_env[env_index(var)];
	return v ? v + strlen(var) + 1 : NULL;
}

/* A batch step, whose env has no SLURM_RESTART_COUNT before its task runs: user_init takes the
 * Prolog's record (dispatch_slurm/slurm/hooks/prolog.py writes it; built with
 * DSP_RUN_DIR=<dir>/run), 0 without one or with one others could have written. */
static int requeue(const char *dir)
{
	const char *name = "requeue";
	char conf[DSP_PATH], arg[DSP_PATH + 8], root[DSP_PATH], record[DSP_PATH + 32], restart[4][4] = { "" };
	char *av[] = { arg };
	spank_t sp = NULL;
	int i = env_index("SLURM_RESTART_COUNT");
	snprintf(conf, sizeof(conf), "%s/site.conf", dir);
	snprintf(arg, sizeof(arg), "conf=%s", conf);
	snprintf(root, sizeof(root), "%s/ckpt", dir);
	snprintf(record, sizeof(record), "%s/42.restart", DSP_RUN_DIR);
	if (write_file(conf, "grace = 30\n") || (mkdir(root, 0700) && errno != EEXIST))
		return 2;
	for (; job_env[i]; i++)	/* the batch step's env, before its task */
		job_env[i] = job_env[i + 1];
	context = S_CTX_ALLOCATOR;	/* sbatch allocates N = 1 */
	CHECK(slurm_spank_init(sp, 1, av) == 0 && give("dispatch-checkpoint", root, 0) == 0);
	CHECK(slurm_spank_init_post_opt(sp, 1, av) == 0 && slurm_spank_exit(sp, 1, av) == 0);
	setenv("SLURM_JOB_ID", "42", 1);
	for (int run = 0; run < 4; run++) {
		/* 0: no record; 1: the Prolog's of a requeue; 2: a record not root's alone; 3: the
		 * Epilog removed it */
		if (run == 1)
			CHECK((mkdir(DSP_RUN_DIR, 0755) == 0 || errno == EEXIST) && write_file(record, "2\n") == 0 &&
			      chmod(record, 0644) == 0);
		if (run == 2)
			CHECK(chmod(record, 0666) == 0);
		if (run == 3)
			CHECK(unlink(record) == 0);
		nregistered = 0;
		context = S_CTX_REMOTE;
		CHECK(slurm_spank_init(sp, 1, av) == 0 && give("dispatch-checkpoint", root, 1) == 0 &&
		      give("dispatch-submission", "1", 1) == 0);
		CHECK(slurm_spank_user_init(sp, 1, av) == 0 && slurm_spank_task_init(sp, 1, av) == 0);
		snprintf(restart[run], sizeof(restart[run]), "%s", env_value("DISPATCH_RESTART") ? env_value("DISPATCH_RESTART") : "-");
		CHECK(slurm_spank_exit(sp, 1, av) == 0);
	}
	CHECK(!strcmp(restart[0], "0") && !strcmp(restart[1], "2") && !strcmp(restart[2], "0") && !strcmp(restart[3], "0"));
	if (failures)
		printf("%s: restart counts %s %s %s %s\n", name, restart[0], restart[1], restart[2], restart[3]);
	else
		printf("%s: ok\n", name);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct { const char *name; spank_context_t ctx; } contexts[] = {
		{ "local", S_CTX_LOCAL }, { "allocator", S_CTX_ALLOCATOR }, { "remote", S_CTX_REMOTE },
		{ "slurmd", S_CTX_SLURMD },
	};
	char conf[DSP_PATH], arg[DSP_PATH + 8], root[DSP_PATH], view[DSP_PATH + 8], err[DSP_ERR];
	const char *name = argc == 3 ? argv[1] : "?";
	char *av[] = { arg };
	spank_t sp = NULL;
	size_t i;
	if (argc == 5 && !strcmp(argv[1], "view"))
		return view_step(argv[2], argv[3], argv[4]);
	if (argc == 3 && !strcmp(argv[1], "requeue"))
		return requeue(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "submit"))
		return view_submit(argv[2], argv[3]);
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
	if (write_file(conf, "grace = 30\ngrace.acct = 10\nview = out\ndispatch_slurm = /nowhere/dispatch-slurm\n") ||
	    (mkdir(root, 0700) && errno != EEXIST))
		return 2;

	CHECK(slurm_spank_init(sp, 1, av) == 0);
	CHECK(dsp_config_site()->naccounts == 1);	/* something for the exit to free */
	CHECK(dsp_config_usable(err, sizeof(err)) == 0);
	if (context == S_CTX_SLURMD) {
		CHECK(nregistered == 0);	/* slurmd takes no options */
		CHECK(slurm_spank_slurmd_exit(sp, 1, av) == 0);
	} else {
		int remote = context == S_CTX_REMOTE;
		CHECK(nregistered == 6);
		for (int o = 0; o < nregistered; o++)	/* `sbatch --help` names the plugin */
			CHECK(!strncmp(registered[o]->usage, "[dispatch] ", 11));
		CHECK(give("dispatch-checkpoint", root, remote) == 0);
		CHECK(give("dispatch-grace", "5", remote) == 0);
		CHECK(give("dispatch-view", "relative", remote) == -1);	/* refused as it is read */
		snprintf(view, sizeof(view), "%s/out2", root);
		CHECK(give("dispatch-view", view, remote) == 0);
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
		CHECK(dsp_opt_view() == NULL);
		CHECK(dsp_remote_view() == NULL);
		CHECK(!dsp_opt_any());
		if (remote)
			CHECK(slurm_spank_task_init(sp, 1, av) == 0);	/* the step's error is gone */
	}
	CHECK(dsp_config_site()->naccounts == 0 && dsp_config_site()->accounts == NULL);
	CHECK(dsp_config_site()->grace == DSP_GRACE_DEFAULT);
	CHECK(dsp_config_site()->view == NULL && dsp_config_site()->dispatch_slurm == NULL);
	if (!failures)
		printf("%s: ok\n", name);
	return failures ? 1 : 0;
}
