/*
 * The view's filesystem side (no Slurm headers): the view folder and the execution's folder
 * opened as the job user without following any symlink, and, in a task's own mount namespace,
 * the execution's folder bound over the view from those descriptors. No path is resolved
 * twice: what is checked (fstat of a descriptor) is what is mounted.
 */
#ifndef DISPATCH_VIEWFS_H
#define DISPATCH_VIEWFS_H

#include <stddef.h>
#include <sys/types.h>

/* What dsp_view_open does with a missing folder below the root. */
enum dsp_view_mode {
	DSP_VIEW_CHECK,		/* sbatch: check what exists; a missing view is made at start */
	DSP_VIEW_CREATE,	/* user_init: make the missing folders of the view */
	DSP_VIEW_OPEN,		/* the task: everything must exist */
};

struct dsp_view_fds {
	int root, view, exec;	/* O_PATH descriptors; -1: not open (view: missing, CHECK only) */
};

/* As the calling process's credentials (the job user's: uid): open the root from '/' and the
 * view `rel` below it, one component at a time, O_PATH|O_NOFOLLOW, refusing a symlink
 * anywhere, a component that is not a folder, a root, view or folder in between that is not
 * uid's, and a view on another filesystem (or mount) than the root; with attempt, open
 * exec/<attempt> below the root by the same rules. -1 with the message, nothing left open. */
int dsp_view_open(const char *root, const char *rel, const char *attempt, enum dsp_view_mode mode, uid_t uid,
		  struct dsp_view_fds *fds, char *err, size_t errsz);
void dsp_view_close(struct dsp_view_fds *fds);

/* As root, in the task: a mount namespace of its own, '/' recursively a slave of the one it
 * leaves (the host's new mounts still arrive; nothing mounted here goes back). */
int dsp_view_namespace(char *err, size_t errsz);
/* As root, after dsp_view_namespace and a dsp_view_open made there: bind fds->exec over
 * fds->view (open_tree/move_mount, or mount(2) through /proc/self/fd where the kernel or a
 * seccomp filter lacks them). view names the folder in messages. */
int dsp_view_bind(const struct dsp_view_fds *fds, const char *view, char *err, size_t errsz);

/* The job user's credentials, and the process's own to go back to. */
struct dsp_cred {
	uid_t uid;
	gid_t gid;
	int ngroups;
	gid_t *groups;
};
/* As root: take the effective ids and groups of `to` (saved gets the current ones; its
 * groups are allocated), and back. */
int dsp_cred_enter(const struct dsp_cred *to, struct dsp_cred *saved, char *err, size_t errsz);
int dsp_cred_leave(struct dsp_cred *saved, char *err, size_t errsz);

#endif
