/*
 * The view's two commands, run from slurmstepd's user_init (no Slurm headers): `dispatch-slurm
 * view prepare`, waited for (bounded), and `dispatch-slurm view publish`, left running in its
 * own session until the plugin stops it. Both run as the job user and only as the job user:
 * slurmstepd's user_init has dropped only its effective ids (its real and saved ids are
 * root's), so the child sets all three to the job user's before exec, and nothing of
 * slurmstepd's (descriptors, signal mask or handlers) reaches the command.
 */
#ifndef DISPATCH_SPAWN_H
#define DISPATCH_SPAWN_H

#include <stddef.h>
#include <sys/types.h>

#ifndef DSP_PREPARE_TIMEOUT_MS	/* how long `view prepare` may take before the tasks fail */
#define DSP_PREPARE_TIMEOUT_MS 120000
#endif
#ifndef DSP_PUBLISH_STOP_MS	/* how long the publisher has for its last pass once the tasks are gone */
#define DSP_PUBLISH_STOP_MS 10000
#endif

/* A command the plugin started and must stop: -1 fields when none. */
struct dsp_child {
	pid_t pid;	/* its session's and process group's id too */
	int pidfd;	/* the process itself, whoever reaps it */
	int tell;	/* the publisher's: the write end of its stdin, closed when its step's tasks are gone */
};

/* cmd (site.conf's dispatch_slurm, or DSP_DISPATCH_SLURM looked up on envp's PATH, as the
 * job's own shell would) as an executable path in out. */
int dsp_command(const char *cmd, char *const envp[], char *out, size_t outsz, char *err, size_t errsz);
/* Run `path view prepare` with envp and wait at most timeout_ms: 0 when it exits 0 (its
 * output lines logged by info), else -1 and err says why, with its last line. */
int dsp_run_prepare(const char *path, char *const envp[], int timeout_ms, void (*info)(const char *line),
		    char *err, size_t errsz);
/* Start `path view publish` with envp, stdout and stderr on out_fd (the job's stderr), its
 * stdin a pipe whose end (dsp_stop_child) tells it the step's tasks here are gone, which
 * DISPATCH_VIEW_STEP_END=stdin says; batch: the batch step's, told by DISPATCH_VIEW_BATCH=1
 * (a user's own value of either dropped);
 * with_parent: it gets SIGTERM when this thread's process dies (slurmstepd killed or crashed:
 * only from a process's main thread, the thread the kernel watches). */
int dsp_start_publisher(const char *path, char *const envp[], int batch, int out_fd, int with_parent,
			struct dsp_child *c, char *err, size_t errsz);
/* 1 when the batch step's publisher of (root, attempt) runs on this node as uid: it holds the
 * batch claim (dsp_view_claim_name), and an srun step here needs no publisher of its own (the
 * batch step outlives every step it starts). 0 when none answers within a second. */
int dsp_batch_publisher_runs(const char *root, const char *attempt, uid_t uid);
/* Stop it: its stdin's end and SIGTERM to its process group, grace_ms for it to end, then SIGKILL; reaped when it
 * is this process's child. Nothing when it is gone or was never started; c is then empty. */
void dsp_stop_child(struct dsp_child *c, int grace_ms);

#endif
