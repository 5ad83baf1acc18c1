#include "contract.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "fail.h"
#include "layout.h"

static int set(const struct dsp_arg *a)
{
	return a->value && a->value[0];
}

/* 999999 -> "999,999": the same bound text as the Python messages. */
static const char *grouped(unsigned long long v, char *buf, size_t sz)
{
	char raw[32];
	int n = snprintf(raw, sizeof(raw), "%llu", v), j = 0;
	for (int i = 0; i < n && j < (int)sz - 1; i++) {
		if (i && (n - i) % 3 == 0 && j < (int)sz - 2)
			buf[j++] = ',';
		buf[j++] = raw[i];
	}
	buf[j] = '\0';
	return buf;
}

int dsp_parse_part(const char *label, const char *what, const char *text, unsigned long long lo,
		   unsigned long long hi, unsigned long long *out, char *err, size_t errsz)
{
	char a[32], b[32];
	size_t len = text ? strlen(text) : 0;
	unsigned long long v = 0;
	if (!len || len > 20 || strspn(text, "0123456789") != len)
		return dsp_fail(err, errsz, "%s (%s) must be a decimal integer %llu..%s, got '%s'", label, what,
			    lo, grouped(hi, b, sizeof(b)), text ? text : "");
	for (size_t i = 0; i < len; i++) {
		unsigned int d = (unsigned int)(text[i] - '0');
		if (v > (ULLONG_MAX - d) / 10) {
			v = ULLONG_MAX;	/* saturate: out of range whatever the bound */
			break;
		}
		v = v * 10 + d;
	}
	if (v < lo || v > hi) {
		const char *t = text;
		while (*t == '0' && t[1])
			t++;	/* the Python message shows the integer, without leading zeros */
		return dsp_fail(err, errsz, "%s (%s) %s is out of range %llu..%s", label, what, t, lo,
			    grouped(hi, a, sizeof(a)));
	}
	*out = v;
	return 0;
}

int dsp_epoch(unsigned long long g, unsigned long long n, unsigned long long r, char *out, size_t outsz,
	      char *err, size_t errsz)
{
	char b[32];
	unsigned long long low;
	if (g > DSP_G_MAX)
		return dsp_fail(err, errsz, "generation G %llu is out of range 0..%s", g, grouped(DSP_G_MAX, b, sizeof(b)));
	if (n < 1 || n > DSP_N_MAX)
		return dsp_fail(err, errsz, "submission N %llu is out of range 1..%s", n, grouped(DSP_N_MAX, b, sizeof(b)));
	if (r > DSP_R_MAX)
		return dsp_fail(err, errsz, "restart R %llu is out of range 0..%s", r, grouped(DSP_R_MAX, b, sizeof(b)));
	low = n * 1000000ULL + r;
	if (g)
		snprintf(out, outsz, "%llu%012llu", g, low);
	else
		snprintf(out, outsz, "%llu", low);
	return 0;
}

int dsp_normalize_path(const char *label, const char *path, char *out, size_t outsz, char *err, size_t errsz)
{
	size_t o = 0;
	const char *p;
	if (!path || path[0] != '/')
		return dsp_fail(err, errsz, "%s '%s' must be an absolute path", label, path ? path : "");
	for (p = path; *p;) {
		const char *q;
		size_t len;
		while (*p == '/')
			p++;
		if (!*p)
			break;
		for (q = p; *q && *q != '/'; q++)
			;
		len = (size_t)(q - p);
		if (len == 2 && p[0] == '.' && p[1] == '.')
			return dsp_fail(err, errsz, "%s '%s' must not contain '..'", label, path);
		if (!(len == 1 && p[0] == '.')) {
			if (o + 1 + len + 1 > outsz)
				return dsp_fail(err, errsz, "%s '%s' is too long", label, path);
			out[o++] = '/';
			memcpy(out + o, p, len);
			o += len;
		}
		p = q;
	}
	if (!o)
		out[o++] = '/';
	out[o] = '\0';
	return 0;
}

int dsp_normalize_root(const char *root, char *out, size_t outsz, char *err, size_t errsz)
{
	if (dsp_normalize_path("checkpoint root", root, out, outsz, err, errsz))
		return -1;
	if (strstr(out, "%a") && strstr(out, "%a") < strrchr(out, '/'))
		return dsp_fail(err, errsz, "checkpoint root '%s': %%a may only appear in the last component", root);
	return 0;
}

int dsp_view_rel(const char *label, const char *root, const char *view, char *rel, size_t relsz, char *err,
		 size_t errsz)
{
	char norm[DSP_PATH];
	size_t rl = strcmp(root, "/") ? strlen(root) : 0;
	const char *below, *slash;
	if (dsp_normalize_path(label, view, norm, sizeof(norm), err, errsz))
		return -1;
	if (!strcmp(norm, root))
		return dsp_fail(err, errsz, "%s '%s' is the checkpoint root itself: name a folder inside it (e.g. "
				"%s/out)", label, view, root);
	if (strncmp(norm, root, rl) || norm[rl] != '/')
		return dsp_fail(err, errsz, "%s '%s' is not inside the checkpoint root %s: name a folder inside it "
				"(e.g. %s/out)", label, view, root, root);
	below = norm + rl + 1;
	slash = strchr(below, '/');
	if (dsp_protocol_entry(below, slash ? (size_t)(slash - below) : strlen(below)))
		return dsp_fail(err, errsz, "%s '%s' is in %s/%.*s, dispatch-slurm's own folder: name another folder "
				"inside the root (e.g. %s/out)", label, view, root,
				slash ? (int)(slash - below) : (int)strlen(below), below, root);
	if (snprintf(rel, relsz, "%s", below) >= (int)relsz)
		return dsp_fail(err, errsz, "%s '%s' is too long", label, view);
	return 0;
}

int dsp_expand_root(const char *root, const char *task, char *out, size_t outsz, char *err, size_t errsz)
{
	const char *leaf = strrchr(root, '/'), *s;
	size_t o;
	if (!strstr(root, "%a")) {
		snprintf(out, outsz, "%s", root);
		return 0;
	}
	s = strstr(root, "%a");
	if (s < leaf)
		return dsp_fail(err, errsz, "checkpoint root '%s': %%a may only appear in the last component", root);
	if (!task || !task[0])
		return dsp_fail(err, errsz, "checkpoint root '%s' has %%a but this job is not an array task", root);
	if (strspn(task, "0123456789") != strlen(task))
		return dsp_fail(err, errsz, "SLURM_ARRAY_TASK_ID '%s' must be decimal digits", task);
	while (task[0] == '0' && task[1])
		task++;
	o = 0;
	for (s = root; *s;) {
		if (s[0] == '%' && s[1] == 'a') {
			size_t tl = strlen(task);
			if (o + tl + 1 > outsz)
				return dsp_fail(err, errsz, "checkpoint root '%s' is too long", root);
			memcpy(out + o, task, tl);
			o += tl;
			s += 2;
		} else {
			if (o + 2 > outsz)
				return dsp_fail(err, errsz, "checkpoint root '%s' is too long", root);
			out[o++] = *s++;
		}
	}
	out[o] = '\0';
	return 0;
}

int dsp_submission_dir(const char *root, char *out, size_t outsz)
{
	const char *leaf = strrchr(root, '/');
	if (!strstr(root, "%a") || !leaf)
		return snprintf(out, outsz, "%s", root) >= (int)outsz ? -1 : 0;
	if (leaf == root)
		return snprintf(out, outsz, "/") >= (int)outsz ? -1 : 0;
	return snprintf(out, outsz, "%.*s", (int)(leaf - root), root) >= (int)outsz ? -1 : 0;
}

int dsp_token(const char *cluster, const char *job_id, const char *epoch, char *out, size_t outsz,
	      char *err, size_t errsz)
{
	size_t cl = cluster ? strlen(cluster) : 0, o = 0;
	if (!cl || cl > 64)
		return dsp_fail(err, errsz, "cluster name '%s' must be 1..64 characters", cluster ? cluster : "");
	if (!job_id || !job_id[0] || strspn(job_id, "0123456789") != strlen(job_id))
		return dsp_fail(err, errsz, "Slurm job id '%s' must be decimal digits", job_id ? job_id : "");
	if (cl + strlen(job_id) + strlen(epoch) + 3 > outsz)
		return dsp_fail(err, errsz, "attempt token too long");
	for (size_t i = 0; i < cl; i++) {
		unsigned char c = (unsigned char)cluster[i];
		out[o++] = (isascii(c) && (isalnum(c) || c == '_' || c == '-')) ? (char)c : '_';
	}
	snprintf(out + o, outsz - o, ".%s.%s", job_id, epoch);
	return 0;
}

int dsp_b32(const unsigned char *in, size_t len, char *out, size_t outsz)
{
	static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
	size_t o = 0;
	unsigned int buf = 0, bits = 0;
	for (size_t i = 0; i < len; i++) {
		buf = (buf << 8) | in[i];
		bits += 8;
		while (bits >= 5) {
			if (o + 1 >= outsz)
				return -1;
			out[o++] = A[(buf >> (bits - 5)) & 31];
			bits -= 5;
		}
	}
	if (bits) {
		if (o + 1 >= outsz)
			return -1;
		out[o++] = A[(buf << (5 - bits)) & 31];
	}
	out[o] = '\0';
	return 0;
}

/* Epoch and step as digit strings: both may need all 20 digits (beyond 64 bits). */
int dsp_pub_name(const char *epoch, const char *step, const char *path, char *out, size_t outsz)
{
	static const char zeros[] = "00000000000000000000";
	char b32[1024];
	size_t el = strlen(epoch), sl = strlen(step);
	if (!el || el > 20 || strspn(epoch, "0123456789") != el || !sl || sl > 20 ||
	    strspn(step, "0123456789") != sl || dsp_b32((const unsigned char *)path, strlen(path), b32, sizeof(b32)))
		return -1;
	return snprintf(out, outsz, "%.*s%s-%.*s%s-%s", (int)(20 - el), zeros, epoch, (int)(20 - sl), zeros,
			step, b32) >= (int)outsz ? -1 : 0;
}

int dsp_view_of(const struct dsp_in *in, const struct dsp_site *site, const char *root, char *rel, size_t relsz,
		char *err, size_t errsz)
{
	char buf[DSP_PATH];
	int shared = in->shared.value && !strcmp(in->shared.value, "1");
	if (rel)
		rel[0] = '\0';
	if (set(&in->view) && !strcmp(in->view.value, DSP_VIEW_NONE))
		return 0;
	if (set(&in->view)) {
		if (shared)
			return dsp_fail(err, errsz, "%s cannot be used with %s: a view gives every execution its own "
					"folder, which a shared checkpoint cannot have", in->view.label, in->shared.label);
		if (dsp_view_rel(in->view.label, root, in->view.value, buf, sizeof(buf), err, errsz))
			return -1;
	} else if (site->view && !shared) {
		snprintf(buf, sizeof(buf), "%s", site->view);
	} else {
		return 0;
	}
	if (rel && snprintf(rel, relsz, "%s", buf) >= (int)relsz)
		return dsp_fail(err, errsz, "%s: view folder too long", in->view.label);
	return 0;
}

int dsp_check_inputs(const struct dsp_in *in, const struct dsp_site *site, int need_submission,
		     char *root, size_t rootsz, char *err, size_t errsz)
{
	unsigned long long v;
	if (!set(&in->checkpoint))
		return dsp_fail(err, errsz, "%s is not set: name the job's checkpoint root", in->checkpoint.label);
	if (dsp_normalize_root(in->checkpoint.value, root, rootsz, err, errsz))
		return -1;
	if (set(&in->generation) &&
	    dsp_parse_part(in->generation.label, "generation G", in->generation.value, 0, DSP_G_MAX, &v, err, errsz))
		return -1;
	if (set(&in->submission)) {
		if (dsp_parse_part(in->submission.label, "submission N (use `dispatch-slurm submit`)",
				   in->submission.value, 1, DSP_N_MAX, &v, err, errsz))
			return -1;
	} else if (need_submission) {
		return dsp_fail(err, errsz, "%s is not set: submission N (use `dispatch-slurm submit`) is required",
			    in->submission.label);
	}
	if (set(&in->grace) &&
	    dsp_parse_part(in->grace.label, "grace seconds", in->grace.value, 0, DSP_GRACE_CAP, &v, err, errsz))
		return -1;
	if (in->shared.value && strcmp(in->shared.value, "") && strcmp(in->shared.value, "0") &&
	    strcmp(in->shared.value, "1"))
		return dsp_fail(err, errsz, "%s must be 1 or 0, got '%s'", in->shared.label, in->shared.value);
	return dsp_view_of(in, site, root, NULL, 0, err, errsz);
}

int dsp_compute(const struct dsp_in *in, const struct dsp_site *site, struct dsp_out *out,
		char *err, size_t errsz)
{
	char root[DSP_PATH];
	unsigned long long g = 0, n = 0, r = 0, grace;
	const struct dsp_arg *rc;
	memset(out, 0, sizeof(*out));
	if (dsp_check_inputs(in, site, 1, root, sizeof(root), err, errsz))
		return -1;
	if (set(&in->generation))
		dsp_parse_part(in->generation.label, "", in->generation.value, 0, DSP_G_MAX, &g, err, errsz);
	dsp_parse_part(in->submission.label, "", in->submission.value, 1, DSP_N_MAX, &n, err, errsz);
	if (dsp_expand_root(root, set(&in->array_task) ? in->array_task.value : NULL, out->checkpoint,
			    sizeof(out->checkpoint), err, errsz))
		return -1;
	rc = set(&in->job_restart) ? &in->job_restart : set(&in->restart) ? &in->restart : NULL;
	if (rc && dsp_parse_part(rc->label, "restart count R", rc->value, 0, DSP_R_MAX, &r, err, errsz))
		return -1;
	if (dsp_epoch(g, n, r, out->epoch, sizeof(out->epoch), err, errsz))
		return -1;
	if (!set(&in->job_id))
		return dsp_fail(err, errsz, "%s is not set: not inside a Slurm job", in->job_id.label);
	if (!set(&in->cluster))
		return dsp_fail(err, errsz, "%s is not set: not inside a Slurm job", in->cluster.label);
	if (dsp_token(in->cluster.value, in->job_id.value, out->epoch, out->attempt, sizeof(out->attempt),
		      err, errsz))
		return -1;
	if (set(&in->array_task) && !strstr(root, "%a") &&
	    !(set(&in->attempt) && !strcmp(in->attempt.value, out->attempt)))
		return dsp_fail(err, errsz, "array task %s: every array task needs its own root; put %%a in the "
			    "checkpoint root's last component (e.g. %s/task-%%a)", in->array_task.value, root);
	if (set(&in->grace))
		dsp_parse_part(in->grace.label, "", in->grace.value, 0, DSP_GRACE_CAP, &grace, err, errsz);
	else
		grace = dsp_site_grace(site, set(&in->account) ? in->account.value : NULL);
	snprintf(out->generation, sizeof(out->generation), "%llu", g);
	snprintf(out->submission, sizeof(out->submission), "%llu", n);
	snprintf(out->restart, sizeof(out->restart), "%llu", r);
	snprintf(out->grace, sizeof(out->grace), "%llu", grace);
	if (snprintf(out->exec_dir, sizeof(out->exec_dir), "%s/exec/%s", out->checkpoint, out->attempt)
	    >= (int)sizeof(out->exec_dir))
		return dsp_fail(err, errsz, "exec folder path too long");
	if (dsp_view_of(in, site, root, out->view_rel, sizeof(out->view_rel), err, errsz))
		return -1;
	if (out->view_rel[0] && snprintf(out->view, sizeof(out->view), "%s/%s", out->checkpoint, out->view_rel)
	    >= (int)sizeof(out->view))
		return dsp_fail(err, errsz, "%s: view folder path too long", in->view.label);
	out->shared = in->shared.value && !strcmp(in->shared.value, "1");
	return 0;
}
