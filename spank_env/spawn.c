#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fail.h"
#include "layout.h"
#include "siteconf.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif
#define OUTPUT_MAX 65536	/* bytes of the prepare's output kept (its last ones) */

/* Why a child did not exec: the stage and its errno, sent through a pipe that exec closes. */
struct failure {
	int stage, err;
};
enum { AT_IDS = 1, AT_STDIO, AT_EXEC };

/* After fork, in a process that may have had threads: only async-signal-safe calls. */
static void child(const char *path, char *const argv[], char *const envp[], int in_fd, int out_fd, int report,
		  int max_fd, pid_t parent)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	struct failure f = { AT_IDS, 0 };
	sigset_t none;
	uid_t uid = geteuid();
	gid_t gid = getegid();
	int null;
	for (int s = 1; s < NSIG; s++)
		sigaction(s, &dfl, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	setsid();
	/* all three ids the job user's: with root's real or saved id left, the command could
	 * take root back (setresuid(0, 0, 0)) */
	if (setresgid(gid, gid, gid) || setresuid(uid, uid, uid) || (uid && !setresuid((uid_t)-1, 0, (uid_t)-1)))
		goto fail;
	/* after the ids: a change of them clears it; a parent already gone is seen by getppid */
	if (parent > 0 && (prctl(PR_SET_PDEATHSIG, SIGTERM) || getppid() != parent))
		goto fail;
	f.stage = AT_STDIO;
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || dup2(in_fd >= 0 ? in_fd : null, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 ||
	    dup2(out_fd, STDERR_FILENO) < 0 || chdir("/"))
		goto fail;
	/* slurmstepd's descriptors (its sockets to slurmd, the job's files) stay behind; one by
	 * one where close_range (5.9) is missing */
	if (syscall(SYS_close_range, (unsigned)report + 1, ~0U, 0U) && errno == ENOSYS)
		for (int fd = report + 1; fd < max_fd; fd++)
			close(fd);
	for (int fd = 3; fd < report; fd++)
		close(fd);
	f.stage = AT_EXEC;
	execve(path, argv, envp);
fail:
	f.err = errno;
	if (write(report, &f, sizeof(f)) < 0)
		_exit(126);
	_exit(127);
}

static int pidfd_of(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* 1 once the child has ended (a zombie, or reaped by anyone), waiting at most ms. */
static int ended(const struct dsp_child *c, int ms)
{
	struct timespec pause = { 0, 50 * 1000 * 1000 };
	siginfo_t si;
	if (c->pidfd >= 0) {
		struct pollfd p = { .fd = c->pidfd, .events = POLLIN };
		return poll(&p, 1, ms) > 0;
	}
	for (int waited = 0;; waited += 50) {	/* no pidfd (a kernel before 5.3) */
		memset(&si, 0, sizeof(si));
		if (waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOHANG | WNOWAIT) ? errno == ECHILD : si.si_pid == c->pid)
			return 1;
		if (waited >= ms)
			return 0;
		nanosleep(&pause, NULL);
	}
}

/* 1 when the child has ended and is this process's, not reaped yet: its id, and its process
 * group's, cannot be another's yet. */
static int zombie(const struct dsp_child *c)
{
	siginfo_t si = { 0 };
	int rc = c->pidfd >= 0 ? waitid(P_PIDFD, (id_t)c->pidfd, &si, WEXITED | WNOHANG | WNOWAIT) : -1;
	if (rc && (c->pidfd < 0 || errno == EINVAL))
		rc = waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOHANG | WNOWAIT);
	return !rc && si.si_pid == c->pid;
}

static void reap(const struct dsp_child *c, int *status)
{
	siginfo_t si = { 0 };
	if (c->pidfd < 0 || (waitid(P_PIDFD, (id_t)c->pidfd, &si, WEXITED | WNOHANG) && errno == EINVAL))
		waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOHANG);
	if (status)
		*status = si.si_code == CLD_EXITED ? W_EXITCODE(si.si_status, 0) : si.si_status;
}

void dsp_stop_child(struct dsp_child *c, int grace_ms)
{
	if (c->tell >= 0) {	/* its stdin ends: the step's tasks here are gone (the package's publisher's word) */
		close(c->tell);
		c->tell = -1;
	}
	if (c->pid <= 0)
		return;
	if (!ended(c, 0)) {
		kill(-c->pid, SIGTERM);
		ended(c, grace_ms);
	}
	/* what its group still holds goes with it (the leader's id is still its own) */
	if (!ended(c, 0) || zombie(c)) {
		kill(-c->pid, SIGKILL);
		ended(c, 1000);
	}
	reap(c, NULL);
	if (c->pidfd >= 0)
		close(c->pidfd);
	if (c->tell >= 0)
		close(c->tell);
	c->pid = c->pidfd = c->tell = -1;
}

static const char *stage_text(int stage)
{
	return stage == AT_IDS ? "cannot become the job user (or its parent is gone)" : stage == AT_STDIO ? "cannot set up its input and "
	       "output" : "cannot run it";
}

/* fork, the child as above; -1 with err when the child did not get to exec. */
static int spawn(const char *path, char *const argv[], char *const envp[], int in_fd, int out_fd, int with_parent,
		 struct dsp_child *c, char *err, size_t errsz)
{
	struct failure f;
	struct rlimit nofile;
	ssize_t n;
	int report[2], max_fd = getrlimit(RLIMIT_NOFILE, &nofile) || nofile.rlim_cur > 1 << 20 ? 1 << 20 :
									(int)nofile.rlim_cur;
	c->pid = c->pidfd = c->tell = -1;
	if (pipe2(report, O_CLOEXEC))
		return dsp_fail(err, errsz, "%s view %s: pipe: %s", path, argv[2], strerror(errno));
	pid_t parent = with_parent ? getpid() : 0;
	c->pid = fork();
	if (c->pid == 0)
		child(path, argv, envp, in_fd, out_fd, report[1], max_fd, parent);
	close(report[1]);
	if (c->pid < 0) {
		close(report[0]);
		return dsp_fail(err, errsz, "%s view %s: fork: %s", path, argv[2], strerror(errno));
	}
	c->pidfd = pidfd_of(c->pid);
	while ((n = read(report[0], &f, sizeof(f))) < 0 && errno == EINTR)
		;
	close(report[0]);
	if (n != (ssize_t)sizeof(f))
		return 0;	/* exec closed the pipe: it runs */
	dsp_stop_child(c, 0);
	return dsp_fail(err, errsz, "%s view %s: %s: %s%s", path, argv[2], stage_text(f.stage), strerror(f.err),
			f.stage == AT_EXEC ? " (the view needs dispatch-slurm on every node; tell your cluster admin)" : "");
}

int dsp_command(const char *cmd, char *const envp[], char *out, size_t outsz, char *err, size_t errsz)
{
	const char *path = "/usr/local/bin:/usr/bin:/bin";
	if (strchr(cmd, '/'))
		return snprintf(out, outsz, "%s", cmd) < (int)outsz ? 0 : dsp_fail(err, errsz, "%s: too long", cmd);
	for (char *const *e = envp; e && *e; e++)
		if (!strncmp(*e, "PATH=", 5))
			path = *e + 5;
	for (const char *p = path; *p;) {
		size_t len = strcspn(p, ":");
		/* as the job user (effective ids): a command only root could run is no command of the job's */
		if (len && snprintf(out, outsz, "%.*s/%s", (int)len, p, cmd) < (int)outsz &&
		    !faccessat(AT_FDCWD, out, X_OK, AT_EACCESS))
			return 0;
		p += len + (p[len] == ':');
	}
	return dsp_fail(err, errsz, "%s is not on the job's PATH (%s): the view needs it on every node; install "
			"it there, or set dispatch_slurm = PATH in site.conf (tell your cluster admin)", cmd, path);
}

static long long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Read the child's output until it ends (or the deadline): its last OUTPUT_MAX bytes in buf. */
static int collect(struct dsp_child *c, int fd, long long deadline, char *buf, size_t *len)
{
	int eof = 0;
	while (!eof) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		long long left = deadline - now_ms();
		ssize_t n;
		if (left <= 0)
			return -1;
		if (ended(c, 0))
			left = 0;	/* a grandchild may hold the pipe: take what is there, then stop */
		if (poll(&p, 1, (int)(left > 100 ? 100 : left)) <= 0) {
			if (left == 0)
				break;
			continue;
		}
		if (*len == OUTPUT_MAX) {	/* keep the tail: the last line is the one that counts */
			memmove(buf, buf + OUTPUT_MAX / 2, OUTPUT_MAX / 2);
			*len = OUTPUT_MAX / 2;
		}
		n = read(fd, buf + *len, OUTPUT_MAX - *len);
		if (n > 0)
			*len += (size_t)n;
		else if (n == 0 || errno != EINTR)
			eof = 1;
	}
	return ended(c, (int)(deadline - now_ms() > 0 ? deadline - now_ms() : 0)) ? 0 : -1;
}

/* The last non-empty line of buf (len bytes), NUL-terminated in place. */
static const char *last_line(char *buf, size_t len)
{
	char *line = NULL;
	buf[len] = '\0';
	for (char *s = strtok(buf, "\n"); s; s = strtok(NULL, "\n"))
		if (s[strspn(s, " \t\r")])
			line = s;
	return line;
}

int dsp_run_prepare(const char *path, char *const envp[], int timeout_ms, void (*info)(const char *line),
		    char *err, size_t errsz)
{
	char *argv[] = { (char *)path, "view", "prepare", NULL }, *buf = malloc(OUTPUT_MAX + 1);
	const char *line;
	struct dsp_child c;
	size_t len = 0;
	int out[2], status = 0, rc;
	if (!buf || pipe2(out, O_CLOEXEC)) {
		free(buf);
		return dsp_fail(err, errsz, "%s view prepare: %s", path, strerror(errno));
	}
	rc = spawn(path, argv, envp, -1, out[1], 0, &c, err, errsz);
	close(out[1]);
	if (!rc && collect(&c, out[0], now_ms() + timeout_ms, buf, &len))
		rc = dsp_fail(err, errsz, "%s view prepare did not finish in %d s (killed)", path, timeout_ms / 1000);
	close(out[0]);
	if (c.pid > 0 && zombie(&c)) {
		kill(-c.pid, SIGKILL);	/* what it left in its session goes with it */
		reap(&c, &status);
	}
	dsp_stop_child(&c, 0);	/* one that timed out */
	if (rc) {
		free(buf);
		return -1;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		buf[len] = '\0';
		for (char *s = strtok(buf, "\n"); s && info; s = strtok(NULL, "\n"))
			info(s);
		free(buf);
		return 0;
	}
	line = last_line(buf, len);
	if (WIFEXITED(status) && WEXITSTATUS(status) == 2 && line)	/* its own one line, naming the fix */
		dsp_fail(err, errsz, "%s", line);
	else if (WIFEXITED(status))
		dsp_fail(err, errsz, "%s view prepare exited %d%s%s", path, WEXITSTATUS(status), line ? ": " : "",
			 line ? line : "");
	else
		dsp_fail(err, errsz, "%s view prepare was killed by signal %d", path, WTERMSIG(status));
	free(buf);
	return -1;
}

#define BATCH_VAR "DISPATCH_VIEW_BATCH="
#define END_VAR "DISPATCH_VIEW_STEP_END="

int dsp_start_publisher(const char *path, char *const envp[], int batch, int out_fd, int with_parent,
			struct dsp_child *c, char *err, size_t errsz)
{
	char *argv[] = { (char *)path, "view", "publish", NULL }, flag[] = BATCH_VAR "1", end[] = END_VAR "stdin";
	char **env;
	size_t n = 0, k = 0;
	int rc, tell[2];
	while (envp && envp[n])
		n++;
	if (!(env = calloc(n + 3, sizeof(*env))) || pipe2(tell, O_CLOEXEC)) {
		free(env);
		return dsp_fail(err, errsz, "%s view publish: %s", path, strerror(errno));
	}
	/* both are the plugin's word alone: a user's own value (srun would carry it into every
	 * step) never reaches the publisher */
	for (size_t i = 0; i < n; i++)
		if (strncmp(envp[i], BATCH_VAR, sizeof(BATCH_VAR) - 1) && strncmp(envp[i], END_VAR, sizeof(END_VAR) - 1))
			env[k++] = envp[i];
	if (batch)
		env[k++] = flag;
	env[k++] = end;
	rc = spawn(path, argv, env, tell[0], out_fd, with_parent, c, err, errsz);
	close(tell[0]);
	if (rc || c->pid <= 0)
		close(tell[1]);
	else
		c->tell = tell[1];	/* closed by dsp_stop_child: the publisher's stdin ends */
	free(env);
	return rc;
}

int dsp_batch_publisher_runs(const char *root, const char *attempt, uid_t uid)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct timeval limit = { 1, 0 };	/* a holder too busy to be asked is taken as none */
	struct ucred peer;
	socklen_t len = sizeof(peer);
	int fd, runs = 0;
	/* abstract: sun_path[0] is NUL, the name follows, not NUL-terminated */
	if (dsp_view_claim_name(root, attempt, 1, addr.sun_path + 1, sizeof(addr.sun_path) - 1))
		return 0;
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return 0;
	if (!setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit)) &&
	    !connect(fd, (struct sockaddr *)&addr,
		     (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(addr.sun_path + 1))) &&
	    !getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len))
		runs = peer.uid == uid;	/* another user's socket of that name stops nothing */
	close(fd);
	return runs;
}
