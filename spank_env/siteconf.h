/*
 * site.conf in C: the same language, results and messages as dispatch_slurm/contract/siteconf.py
 * (both run tests/vectors/siteconf.json). Pure: no Slurm headers; the only I/O is
 * reading the file in dsp_site_load.
 */
#ifndef DISPATCH_SITECONF_H
#define DISPATCH_SITECONF_H

#include <stddef.h>

#define DSP_SITE_CONF "/etc/dispatch-slurm/site.conf"
#define DSP_GRACE_DEFAULT 60ULL
#define DSP_GRACE_CAP_N 300  /* = contract/siteconf.py GRACE_CAP (tests/test_spank_plugin.py) */
#define DSP_GRACE_CAP ((unsigned long long)DSP_GRACE_CAP_N)
#define DSP_XSTR(x) #x
#define DSP_STR(x) DSP_XSTR(x)
/* The one fixed limit, the same in siteconf.py: a site.conf holds a few settings, and
 * slurmstepd reads it at every step start. */
#define DSP_SITE_MAX 1048576
/* The command site.conf's dispatch_slurm names when it is not set (looked up on the job's PATH). */
#define DSP_DISPATCH_SLURM "dispatch-slurm"

struct dsp_account {
	char *name;
	unsigned long long grace;	/* capped at DSP_GRACE_CAP */
	unsigned long line;
};

struct dsp_site {
	unsigned long long grace;	/* site default grace, seconds, capped at DSP_GRACE_CAP */
	unsigned int exec_mode;		/* 0700, 0710 or 0750 */
	size_t naccounts;
	struct dsp_account *accounts;	/* per-project (Slurm account) defaults, in file order */
	char *view;			/* every job's view folder below its root; NULL: none */
	char *dispatch_slurm;		/* the command the view runs as the job user; NULL: on its PATH */
	unsigned long grace_line, exec_mode_line, view_line, dispatch_slurm_line;	/* 0: the default */
};

/* The built-in defaults (the site holds nothing allocated afterwards). */
void dsp_site_init(struct dsp_site *site);
/* Release the accounts and return to the defaults. */
void dsp_site_free(struct dsp_site *site);
/* Parse len bytes of site.conf text into an initialised, empty site; returns 0, or -1
 * with err naming path:line (the site is then back to the defaults). */
int dsp_site_parse(struct dsp_site *site, const char *text, size_t len, const char *path, char *err,
		   size_t errsz);
/* Read and parse path; a missing file gives the defaults unless must_exist. */
int dsp_site_load(struct dsp_site *site, const char *path, int must_exist, char *err, size_t errsz);
/* The default grace of a job of this account (NULL: none): its grace.<account>, else grace. */
unsigned long long dsp_site_grace(const struct dsp_site *site, const char *account);

#endif
