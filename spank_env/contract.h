/*
 * The dispatch-slurm contract in C: the same rules as dispatch_slurm/contract/
 * (epoch.py, names.py, env.py), checked against tests/vectors/ (JSON) by
 * test_contract. Pure: no Slurm, no I/O, so every context (sbatch, slurmstepd,
 * the unit test) computes identically.
 */
#ifndef DISPATCH_CONTRACT_H
#define DISPATCH_CONTRACT_H

#include <stddef.h>

#include "siteconf.h"

#define DSP_G_MAX 99999999ULL
#define DSP_N_MAX 999999ULL
#define DSP_R_MAX 999999ULL
#define DSP_PATH 4096
#define DSP_ERR (DSP_PATH + 512)	/* a message may quote a whole path */

/* One input: its value (NULL when absent) and the name to blame in messages. */
struct dsp_arg {
	const char *value;
	const char *label;
};

struct dsp_in {
	struct dsp_arg checkpoint, generation, submission, grace, shared, view;
	struct dsp_arg job_id, cluster, job_restart, restart, array_task, account, attempt;
};

struct dsp_out {
	char checkpoint[DSP_PATH];
	char generation[24], submission[24], restart[24], epoch[24];
	char attempt[128];
	char exec_dir[DSP_PATH];
	char grace[24];
	int shared;
	char view[DSP_PATH];		/* the view folder, its root's %a expanded; "" when the job has none */
	char view_rel[DSP_PATH];	/* the same, relative to the root */
};

/* Decimal digits only (no sign, no space), at most 20 digits, then lo..hi. */
int dsp_parse_part(const char *label, const char *what, const char *text, unsigned long long lo,
		   unsigned long long hi, unsigned long long *out, char *err, size_t errsz);
/* The epoch as a decimal string: G*10^12 + N*10^6 + R may exceed 64 bits. */
int dsp_epoch(unsigned long long g, unsigned long long n, unsigned long long r, char *out, size_t outsz,
	      char *err, size_t errsz);
/* An absolute path with '//', '/./' and a trailing '/' removed; '..' refused; label names it. */
int dsp_normalize_path(const char *label, const char *path, char *out, size_t outsz, char *err, size_t errsz);
int dsp_normalize_root(const char *root, char *out, size_t outsz, char *err, size_t errsz);
/* The word a job gives --dispatch-view to have no view where site.conf sets one. */
#define DSP_VIEW_NONE "none"
/* The view folder `view` of the job whose (normalized) root is `root`, as rel: the path below
 * the root (absolute and normalized like the root; not the root itself, not outside it, not
 * one of the root's own folders, layout.h). label names it in messages. The same
 * rule as contract/names.py's view_relpath (tests/vectors/view.json). */
int dsp_view_rel(const char *label, const char *root, const char *view, char *rel, size_t relsz, char *err,
		 size_t errsz);
int dsp_expand_root(const char *root, const char *task, char *out, size_t outsz, char *err, size_t errsz);
/* Where N is allocated: the root, or the parent of a %a pattern. */
int dsp_submission_dir(const char *root, char *out, size_t outsz);
int dsp_token(const char *cluster, const char *job_id, const char *epoch, char *out, size_t outsz,
	      char *err, size_t errsz);
int dsp_b32(const unsigned char *in, size_t len, char *out, size_t outsz);
int dsp_pub_name(const char *epoch, const char *step, const char *path, char *out, size_t outsz);
/* The job's view below its (normalized) root in rel ("": none): --dispatch-view, unless it
 * says DSP_VIEW_NONE, else site.conf's view; a shared job has none (it cannot isolate), and
 * asking for both is refused. rel may be NULL (only checked). */
int dsp_view_of(const struct dsp_in *in, const struct dsp_site *site, const char *root, char *rel, size_t relsz,
		char *err, size_t errsz);
/* Submission-time checks (what sbatch can refuse before anything is queued). */
int dsp_check_inputs(const struct dsp_in *in, const struct dsp_site *site, int need_submission,
		     char *root, size_t rootsz, char *err, size_t errsz);
/* Every DISPATCH_* value of the execution. */
int dsp_compute(const struct dsp_in *in, const struct dsp_site *site, struct dsp_out *out,
		char *err, size_t errsz);

#endif
