/*
 * The job's Prolog and Epilog (slurm_spank_job_prolog/epilog, S_CTX_JOB_SCRIPT: root, in
 * `slurmstepd spank prolog`, with the Prolog's environment): this node's record of the job's
 * restart count, for the batch step.
 *
 * Slurm puts SLURM_RESTART_COUNT into the batch step's environment only in the task itself
 * (exec_task's setup_env, after user_init and task_init_privileged, 22.05 to 26.05), and
 * S_SLURM_RESTART_COUNT is always 0; so a requeued batch step's user_init computed the first
 * execution's epoch and attempt, and bound the first execution's folder over the view. The
 * Prolog runs on the batch node before the batch step of each execution (at allocation, or
 * before the node's first step) and is given SLURM_JOB_RESTART_COUNT: it writes
 * RUN_DIR/<job>.restart (root's, 0644, in root's own folder); user_init reads it where the
 * step's environment has no SLURM_RESTART_COUNT; the Epilog removes it (a requeued job
 * starts again only once every node's Epilog ended). A failure here is logged, never
 * returned: a required plugin whose job_prolog fails drains the node.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dispatch.h"

#define RECORD_MAX 16

/* "<job>.restart" for a job id of digits only; -1 otherwise. */
static int record_name(const char *job, char *out, size_t outsz)
{
	size_t len = job ? strlen(job) : 0;
	if (!len || len > 20 || strspn(job, "0123456789") != len)
		return -1;
	return snprintf(out, outsz, "%s.restart", job) >= (int)outsz ? -1 : 0;
}

/* RUN_DIR, root's and writable by root alone, never through a symlink (made when missing). */
static int run_dir(int create)
{
	struct stat st;
	int fd = open(DSP_RUN_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && create && !mkdir(DSP_RUN_DIR, 0755))
		fd = open(DSP_RUN_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) || st.st_uid != 0 || (st.st_mode & 022)) {
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

int dsp_job_prolog(void)
{
	const char *job = getenv("SLURM_JOB_ID"), *count = getenv("SLURM_JOB_RESTART_COUNT");
	char name[32], line[RECORD_MAX];
	int dir, fd, len;
	if (!count || !*count || strlen(count) >= RECORD_MAX - 1 || strspn(count, "0123456789") != strlen(count) ||
	    record_name(job, name, sizeof(name)))
		return 0;	/* no count to record (a Slurm that does not give it): user_init keeps 0 */
	if ((dir = run_dir(1)) < 0) {
		slurm_error("%s: job %s: cannot use %s: %s", DSP_PLUGIN, job, DSP_RUN_DIR, strerror(errno));
		return 0;
	}
	len = snprintf(line, sizeof(line), "%s\n", count);
	fd = openat(dir, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0 || fchmod(fd, 0644) || write(fd, line, (size_t)len) != len) {
		slurm_error("%s: job %s: cannot write %s/%s: %s", DSP_PLUGIN, job, DSP_RUN_DIR, name, strerror(errno));
		goto out;
	}
out:
	if (fd >= 0)
		close(fd);
	close(dir);
	return 0;
}

int dsp_job_epilog(void)
{
	char name[32];
	int dir;
	if (record_name(getenv("SLURM_JOB_ID"), name, sizeof(name)) || (dir = run_dir(0)) < 0)
		return 0;
	if (unlinkat(dir, name, 0) && errno != ENOENT)
		slurm_error("%s: cannot remove %s/%s: %s", DSP_PLUGIN, DSP_RUN_DIR, name, strerror(errno));
	close(dir);
	return 0;
}

int dsp_job_restart(const char *job, char *out, size_t outsz)
{
	char name[32], buf[RECORD_MAX];
	struct stat st;
	ssize_t n;
	int dir, fd;
	if (record_name(job, name, sizeof(name)) || (dir = run_dir(0)) < 0)
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
