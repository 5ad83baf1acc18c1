/*
 * The filesystem side, in C: the same rules as dispatch_slurm/store/posix.py and
 * store/durable.py. Runs only with the job user's credentials (sbatch itself, or
 * slurmstepd's user_init after privileges are dropped), opens every directory below
 * the root with O_NOFOLLOW,
 * and makes each new entry durable (fsync of its directory) before it is used.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "contract.h"
#include "fail.h"

#define DIRFLAGS (O_RDONLY | O_DIRECTORY | O_CLOEXEC)

/* Close an fd that may be -1 (never opened): the one cleanup path of each function below. */
static void close_fd(int fd)
{
	if (fd >= 0)
		close(fd);
}

/* The root itself may be a symlink (sites alias scratch); it must exist and be ours. */
static int open_root(const char *dir, char *err, size_t errsz)
{
	struct stat st;
	int fd = open(dir, DIRFLAGS);
	if (fd < 0) {
		if (errno == ENOENT)
			return dsp_fail(err, errsz, "checkpoint root %s does not exist (create it first)", dir);
		return dsp_fail(err, errsz, "checkpoint root %s: %s", dir, strerror(errno));
	}
	if (fstat(fd, &st) || st.st_uid != geteuid())
		dsp_fail(err, errsz, "checkpoint root %s belongs to uid %u, not to you (uid %u)", dir,
			 (unsigned)st.st_uid, (unsigned)geteuid());
	else if (faccessat(fd, ".", W_OK | X_OK, AT_EACCESS))
		dsp_fail(err, errsz, "checkpoint root %s is not writable by you", dir);
	else
		return fd;
	close(fd);
	return -1;
}

int dsp_check_root(const char *dir, char *err, size_t errsz)
{
	int fd = open_root(dir, err, errsz);
	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

/* Open name under parent, creating it if missing; a symlink is refused. errno tells why not. */
static int ensure_dir(int parent, const char *name, unsigned int mode, int *created)
{
	int fd = openat(parent, name, DIRFLAGS | O_NOFOLLOW);
	*created = 0;
	if (fd >= 0 || errno != ENOENT)
		return fd;
	if (mkdirat(parent, name, mode) == 0)
		*created = 1;
	else if (errno != EEXIST)
		return -1;
	fd = openat(parent, name, DIRFLAGS | O_NOFOLLOW);
	if (fd >= 0 && *created && fsync(parent)) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* Every failure formats its message (errno still the failing call's) and jumps to out,
 * which closes whatever is open. */
int dsp_allocate_submission(const char *dir, unsigned long long *n, char *err, size_t errsz)
{
	int root, sub = -1, dfd = -1, created, fd, rc = -1;
	unsigned long long max = 0;
	DIR *d = NULL;
	struct dirent *e;
	if ((root = open_root(dir, err, errsz)) < 0)
		return -1;
	if ((sub = ensure_dir(root, "sub", 0777, &created)) < 0 || (dfd = dup(sub)) < 0 ||
	    !(d = fdopendir(dfd))) {
		dsp_fail(err, errsz, "%s/sub: %s", dir, strerror(errno));
		close_fd(dfd);	/* a dup that fdopendir refused (closedir owns it once accepted) */
		goto out;
	}
	while ((e = readdir(d))) {
		unsigned long long v;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (strlen(e->d_name) != 6 || strspn(e->d_name, "0123456789") != 6 ||
		    !(v = strtoull(e->d_name, NULL, 10))) {
			dsp_fail(err, errsz, "bad entry '%s' in %s/sub: not a 6-digit submission number "
				 "000001..999999", e->d_name, dir);
			goto out;
		}
		if (v > max)
			max = v;
	}
	for (*n = max + 1;; (*n)++) {
		char name[16];
		if (*n > DSP_N_MAX) {
			dsp_fail(err, errsz, "%s/sub: no submission number left (N must be <= 999,999)", dir);
			goto out;
		}
		snprintf(name, sizeof(name), "%06llu", *n);
		fd = openat(sub, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
		if (fd >= 0) {
			close(fd);
			break;
		}
		if (errno != EEXIST) {
			dsp_fail(err, errsz, "%s/sub/%s: %s", dir, name, strerror(errno));
			goto out;
		}
	}
	if (fsync(sub) || fsync(root)) {
		dsp_fail(err, errsz, "%s/sub: fsync: %s", dir, strerror(errno));
		goto out;
	}
	rc = 0;
out:
	if (d)
		closedir(d);
	close_fd(sub);
	close(root);
	return rc;
}

/* The hint for a directory that O_NOFOLLOW refused (ELOOP) or that is not one (ENOTDIR). */
static const char *symlink_hint(int e, const char *hint)
{
	return e == ELOOP || e == ENOTDIR ? hint : "";
}

int dsp_make_exec_dir(const char *root, const char *attempt, unsigned int mode, int create_root,
		      char *err, size_t errsz)
{
	int rfd = -1, efd = -1, afd = -1, created, rc = -1;
	struct stat st;
	if (create_root) {	/* an array task's root: its parent must exist and be ours */
		char parent[DSP_PATH];
		const char *leaf = strrchr(root, '/');
		int pfd;
		snprintf(parent, sizeof(parent), "%.*s", leaf == root ? 1 : (int)(leaf - root), root);
		if ((pfd = open_root(parent, err, errsz)) < 0)
			return -1;
		rfd = ensure_dir(pfd, leaf + 1, 0777, &created);
		if (rfd < 0)
			dsp_fail(err, errsz, "%s: %s%s", root, strerror(errno),
				 symlink_hint(errno, " (a symlink is in the way)"));
		close(pfd);
		if (rfd < 0)
			return -1;
	} else if ((rfd = open_root(root, err, errsz)) < 0) {
		return -1;
	}
	if ((efd = ensure_dir(rfd, "exec", 0777, &created)) < 0) {
		dsp_fail(err, errsz, "%s/exec: %s%s", root, strerror(errno),
			 symlink_hint(errno, "; refusing to follow a symlink"));
		goto out;
	}
	if ((afd = ensure_dir(efd, attempt, mode, &created)) < 0) {
		dsp_fail(err, errsz, "%s/exec/%s: %s%s", root, attempt, strerror(errno),
			 symlink_hint(errno, "; refusing to follow a symlink"));
		goto out;
	}
	if (fstat(afd, &st) || st.st_uid != geteuid()) {
		dsp_fail(err, errsz, "%s/exec/%s exists and belongs to uid %u, not to you", root, attempt,
			 (unsigned)st.st_uid);
		goto out;
	}
	if ((st.st_mode & 07777) != mode && fchmod(afd, mode)) {
		dsp_fail(err, errsz, "%s/exec/%s: chmod: %s", root, attempt, strerror(errno));
		goto out;
	}
	rc = 0;
out:
	close_fd(afd);
	close_fd(efd);
	close(rfd);
	return rc;
}
