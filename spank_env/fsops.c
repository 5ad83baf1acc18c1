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
	if (fstat(fd, &st) || st.st_uid != geteuid()) {
		close(fd);
		return dsp_fail(err, errsz, "checkpoint root %s belongs to uid %u, not to you (uid %u)", dir,
			    (unsigned)st.st_uid, (unsigned)geteuid());
	}
	if (faccessat(fd, ".", W_OK | X_OK, AT_EACCESS)) {
		close(fd);
		return dsp_fail(err, errsz, "checkpoint root %s is not writable by you", dir);
	}
	return fd;
}

int dsp_check_root(const char *dir, char *err, size_t errsz)
{
	int fd = open_root(dir, err, errsz);
	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

/* Open name under parent, creating it if missing; a symlink is refused. */
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
		close(fd);
		return -1;
	}
	return fd;
}

int dsp_allocate_submission(const char *dir, unsigned long long *n, char *err, size_t errsz)
{
	int root, sub, created, fd;
	unsigned long long max = 0;
	DIR *d;
	struct dirent *e;
	if ((root = open_root(dir, err, errsz)) < 0)
		return -1;
	if ((sub = ensure_dir(root, "sub", 0777, &created)) < 0) {
		close(root);
		return dsp_fail(err, errsz, "%s/sub: %s", dir, strerror(errno));
	}
	if (!(d = fdopendir(dup(sub)))) {
		close(sub);
		close(root);
		return dsp_fail(err, errsz, "%s/sub: %s", dir, strerror(errno));
	}
	while ((e = readdir(d))) {
		unsigned long long v;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (strlen(e->d_name) != 6 || strspn(e->d_name, "0123456789") != 6 ||
		    !(v = strtoull(e->d_name, NULL, 10))) {
			closedir(d);
			close(sub);
			close(root);
			return dsp_fail(err, errsz, "bad entry '%s' in %s/sub: not a 6-digit submission number "
				    "000001..999999", e->d_name, dir);
		}
		if (v > max)
			max = v;
	}
	closedir(d);
	for (*n = max + 1;; (*n)++) {
		char name[16];
		if (*n > DSP_N_MAX) {
			close(sub);
			close(root);
			return dsp_fail(err, errsz, "%s/sub: no submission number left (N must be <= 999,999)", dir);
		}
		snprintf(name, sizeof(name), "%06llu", *n);
		fd = openat(sub, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
		if (fd >= 0) {
			close(fd);
			break;
		}
		if (errno != EEXIST) {
			close(sub);
			close(root);
			return dsp_fail(err, errsz, "%s/sub/%s: %s", dir, name, strerror(errno));
		}
	}
	if (fsync(sub) || fsync(root)) {
		close(sub);
		close(root);
		return dsp_fail(err, errsz, "%s/sub: fsync: %s", dir, strerror(errno));
	}
	close(sub);
	close(root);
	return 0;
}

int dsp_make_exec_dir(const char *root, const char *attempt, unsigned int mode, int create_root,
		      char *err, size_t errsz)
{
	int rfd, efd, afd, created;
	struct stat st;
	if (create_root) {	/* an array task's root: its parent must exist and be ours */
		char parent[DSP_PATH];
		const char *leaf = strrchr(root, '/');
		int pfd;
		snprintf(parent, sizeof(parent), "%.*s", leaf == root ? 1 : (int)(leaf - root), root);
		if ((pfd = open_root(parent, err, errsz)) < 0)
			return -1;
		rfd = ensure_dir(pfd, leaf + 1, 0777, &created);
		close(pfd);
		if (rfd < 0)
			return dsp_fail(err, errsz, "%s: %s%s", root, strerror(errno),
				    errno == ELOOP || errno == ENOTDIR ? " (a symlink is in the way)" : "");
	} else if ((rfd = open_root(root, err, errsz)) < 0) {
		return -1;
	}
	efd = ensure_dir(rfd, "exec", 0777, &created);
	close(rfd);
	if (efd < 0)
		return dsp_fail(err, errsz, "%s/exec: %s%s", root, strerror(errno),
			    errno == ELOOP || errno == ENOTDIR ? "; refusing to follow a symlink" : "");
	afd = ensure_dir(efd, attempt, mode, &created);
	close(efd);
	if (afd < 0)
		return dsp_fail(err, errsz, "%s/exec/%s: %s%s", root, attempt, strerror(errno),
			    errno == ELOOP || errno == ENOTDIR ? "; refusing to follow a symlink" : "");
	if (fstat(afd, &st) || st.st_uid != geteuid()) {
		close(afd);
		return dsp_fail(err, errsz, "%s/exec/%s exists and belongs to uid %u, not to you", root, attempt,
			    (unsigned)st.st_uid);
	}
	if ((st.st_mode & 07777) != mode && fchmod(afd, mode)) {
		close(afd);
		return dsp_fail(err, errsz, "%s/exec/%s: chmod: %s", root, attempt, strerror(errno));
	}
	close(afd);
	return 0;
}
