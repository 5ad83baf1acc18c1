#include "viewfs.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "contract.h"
#include "fail.h"

/* The new mount API's numbers (linux/mount.h), for C libraries whose headers lack them. */
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef MOVE_MOUNT_T_EMPTY_PATH
#define MOVE_MOUNT_T_EMPTY_PATH 0x00000040
#endif
#ifndef STATX_MNT_ID
#define STATX_MNT_ID 0x00001000U
#endif

#define PATHFLAGS (O_PATH | O_NOFOLLOW | O_CLOEXEC)

/* One walk from '/': the descriptor reached, the path so far (for messages), and what every
 * folder below the root must share with it. */
struct walk {
	int fd;
	char shown[DSP_PATH];
	size_t len;
	uid_t uid;
	dev_t dev;
	unsigned long long mnt;	/* the root's mount id; 0: the kernel does not say */
};

static void close_fd(int fd)
{
	if (fd >= 0)
		close(fd);
}

static unsigned long long mount_id(int fd)
{
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) || !(sx.stx_mask & STATX_MNT_ID))
		return 0;
	return sx.stx_mnt_id;
}

/* The descriptor's folder against the rules: a folder, not a symlink, and, below the root,
 * uid's and on the root's filesystem and mount. */
static int judge(const struct walk *w, int fd, int below, const char *what, char *err, size_t errsz)
{
	struct stat st;
	unsigned long long mnt;
	if (fstat(fd, &st))
		return dsp_fail(err, errsz, "%s: %s: %s", what, w->shown, strerror(errno));
	if (S_ISLNK(st.st_mode))
		return dsp_fail(err, errsz, "%s: %s is a symlink; the view and its root must be real folders (give "
				"the real path: realpath %s)", what, w->shown, w->shown);
	if (!S_ISDIR(st.st_mode))
		return dsp_fail(err, errsz, "%s: %s is not a folder", what, w->shown);
	if (!below)
		return 0;
	if (st.st_uid != w->uid)
		return dsp_fail(err, errsz, "%s: %s belongs to uid %u, not to you (uid %u)", what, w->shown,
				(unsigned)st.st_uid, (unsigned)w->uid);
	mnt = w->mnt ? mount_id(fd) : 0;
	if (st.st_dev != w->dev || mnt != w->mnt)
		return dsp_fail(err, errsz, "%s: %s is on another filesystem or mount than the checkpoint root: "
				"name a folder on the root's own filesystem", what, w->shown);
	return 0;
}

/* Move the walk one component (len bytes of comp) down: 1 when it is missing and may be
 * (mode CHECK, below the root), 0 when reached, -1 with the message. */
static int step(struct walk *w, const char *comp, size_t len, int below, enum dsp_view_mode mode, const char *what,
		char *err, size_t errsz)
{
	char name[NAME_MAX + 1];
	int fd;
	if (len > NAME_MAX || w->len + 1 + len + 1 > sizeof(w->shown))
		return dsp_fail(err, errsz, "%s: %s/%.*s... is too long", what, w->shown, (int)(len > 64 ? 64 : len),
				comp);
	memcpy(name, comp, len);
	name[len] = '\0';
	w->shown[w->len++] = '/';
	memcpy(w->shown + w->len, name, len + 1);
	w->len += len;
	fd = openat(w->fd, name, PATHFLAGS);
	if (fd < 0 && errno == ENOENT && below && mode == DSP_VIEW_CREATE) {
		if (mkdirat(w->fd, name, 0777) && errno != EEXIST)
			return dsp_fail(err, errsz, "%s: cannot create %s: %s", what, w->shown, strerror(errno));
		fd = openat(w->fd, name, PATHFLAGS);
	}
	if (fd < 0 && errno == ENOENT && below && mode == DSP_VIEW_CHECK)
		return 1;
	if (fd < 0)
		return dsp_fail(err, errsz, "%s: %s: %s", what, w->shown, strerror(errno));
	if (judge(w, fd, below, what, err, errsz)) {
		close(fd);
		return -1;
	}
	close(w->fd);
	w->fd = fd;
	return 0;
}

/* Walk path's components (no leading '/') from w: 1 when a missing one stopped it (CHECK). */
static int walk(struct walk *w, const char *path, int below, enum dsp_view_mode mode, const char *what, char *err,
		size_t errsz)
{
	for (const char *p = path; *p;) {
		const char *q = strchr(p, '/');
		size_t len = q ? (size_t)(q - p) : strlen(p);
		int rc = len ? step(w, p, len, below, mode, what, err, errsz) : 0;
		if (rc)
			return rc;
		p += len + (q != NULL);
	}
	return 0;
}

/* A second walk from the root's descriptor (its shown path and rules). */
static int beneath(const struct walk *r, struct walk *w)
{
	*w = *r;
	w->fd = openat(r->fd, ".", PATHFLAGS | O_DIRECTORY);
	return w->fd < 0 ? -1 : 0;
}

int dsp_view_open(const char *root, const char *rel, const char *attempt, enum dsp_view_mode mode, uid_t uid,
		  struct dsp_view_fds *fds, char *err, size_t errsz)
{
	struct walk r = { .fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC), .uid = uid }, v = { .fd = -1 },
		    x = { .fd = -1 };
	struct stat st;
	int rc = -1, missing = 0;
	fds->root = fds->view = fds->exec = -1;
	/* the root's parents need only be folders (they are the site's); the root must be the user's */
	if (r.fd < 0) {
		dsp_fail(err, errsz, "checkpoint root %s: cannot open /: %s", root, strerror(errno));
		goto out;
	}
	if (walk(&r, root + 1, 0, DSP_VIEW_OPEN, "checkpoint root", err, errsz))
		goto out;
	if (fstat(r.fd, &st)) {
		dsp_fail(err, errsz, "checkpoint root %s: %s", root, strerror(errno));
		goto out;
	}
	if (st.st_uid != uid) {
		dsp_fail(err, errsz, "checkpoint root %s belongs to uid %u, not to you (uid %u)", root,
			 (unsigned)st.st_uid, (unsigned)uid);
		goto out;
	}
	r.dev = st.st_dev;
	r.mnt = mount_id(r.fd);
	if (beneath(&r, &v) || (attempt && beneath(&r, &x))) {
		dsp_fail(err, errsz, "checkpoint root %s: %s", root, strerror(errno));
		goto out;
	}
	if ((missing = walk(&v, rel, 1, mode, "view folder", err, errsz)) < 0)
		goto out;
	if (attempt && (walk(&x, "exec", 1, DSP_VIEW_OPEN, "exec folder", err, errsz) ||
			walk(&x, attempt, 1, DSP_VIEW_OPEN, "exec folder", err, errsz)))
		goto out;
	fds->root = r.fd;
	r.fd = -1;
	if (!missing) {
		fds->view = v.fd;
		v.fd = -1;
	}
	if (attempt) {
		fds->exec = x.fd;
		x.fd = -1;
	}
	rc = 0;
out:
	close_fd(x.fd);
	close_fd(v.fd);
	close_fd(r.fd);
	return rc;
}

void dsp_view_close(struct dsp_view_fds *fds)
{
	close_fd(fds->exec);
	close_fd(fds->view);
	close_fd(fds->root);
	fds->root = fds->view = fds->exec = -1;
}

int dsp_view_namespace(char *err, size_t errsz)
{
	if (unshare(CLONE_NEWNS))
		return dsp_fail(err, errsz, "the task cannot have a mount namespace of its own (unshare: %s): the view "
				"needs slurmd to run as root with CAP_SYS_ADMIN; tell your cluster admin",
				strerror(errno));
	if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL))
		return dsp_fail(err, errsz, "the task's mount namespace: making / a slave: %s; tell your cluster admin",
				strerror(errno));
	return 0;
}

int dsp_view_bind(const struct dsp_view_fds *fds, const char *view, char *err, size_t errsz)
{
	char src[32], dst[32];
	int tree = (int)syscall(SYS_open_tree, fds->exec, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
	if (tree >= 0) {
		int rc = (int)syscall(SYS_move_mount, tree, "", fds->view, "",
				      MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH), e = errno;
		close(tree);
		if (!rc)
			return 0;
		errno = e;
	}
	/* ENOSYS: a kernel before 5.2; EPERM: a seccomp filter (a container's) that does not know
	 * the calls. mount(2) takes the same descriptors through /proc/self/fd. */
	if (errno != ENOSYS && errno != EPERM)
		return dsp_fail(err, errsz, "cannot bind the execution's folder over %s: %s", view, strerror(errno));
	snprintf(src, sizeof(src), "/proc/self/fd/%d", fds->exec);
	snprintf(dst, sizeof(dst), "/proc/self/fd/%d", fds->view);
	if (mount(src, dst, NULL, MS_BIND, NULL))
		return dsp_fail(err, errsz, "cannot bind the execution's folder over %s: %s", view, strerror(errno));
	return 0;
}

int dsp_cred_enter(const struct dsp_cred *to, struct dsp_cred *saved, char *err, size_t errsz)
{
	int n = getgroups(0, NULL);
	saved->uid = geteuid();
	saved->gid = getegid();
	saved->ngroups = 0;
	saved->groups = n > 0 ? malloc((size_t)n * sizeof(gid_t)) : NULL;
	if (n < 0 || (n > 0 && (!saved->groups || (saved->ngroups = getgroups(n, saved->groups)) < 0))) {
		free(saved->groups);
		saved->groups = NULL;
		return dsp_fail(err, errsz, "cannot read the task's groups: %s", strerror(errno));
	}
	if (setgroups((size_t)to->ngroups, to->groups) || setegid(to->gid) || seteuid(to->uid)) {
		int e = errno;
		dsp_cred_leave(saved, err, errsz);
		return dsp_fail(err, errsz, "cannot take the job user's credentials (uid %u): %s", (unsigned)to->uid,
				strerror(e));
	}
	return 0;
}

int dsp_cred_leave(struct dsp_cred *saved, char *err, size_t errsz)
{
	int rc = seteuid(saved->uid) || setegid(saved->gid) || setgroups((size_t)saved->ngroups, saved->groups);
	int e = errno;
	free(saved->groups);
	saved->groups = NULL;
	return rc ? dsp_fail(err, errsz, "cannot take back the task's credentials: %s", strerror(e)) : 0;
}
