/*
 * The site.conf language (the same in dispatch_slurm/contract/siteconf.py, checked by
 * tests/vectors/siteconf.json), on bytes, whatever their encoding:
 *   - lines end at LF; one CR right before it (or at the end of the file) is dropped;
 *   - '#' starts a comment wherever it is, up to the end of the line (any bytes);
 *   - spaces and tabs around a line and around '=' are ignored; an empty line is skipped;
 *   - every other line is KEY = VALUE, KEY one of grace, grace.<account> (account:
 *     [A-Za-z0-9_.-]+) and exec_mode, whose VALUE is digits, or view and dispatch_slurm, whose
 *     VALUE is a path of [A-Za-z0-9._/+-]; any other byte (non-ASCII, NUL, lone CR...) is an error;
 *   - each setting may appear once; grace values above 300 are read as 300;
 *     exec_mode is 0700, 0710 or 0750 (leading zeros are ignored);
 *   - view is a folder below every job's root (relative, canonical, not one of the root's own
 *     folders: out, runs/out); dispatch_slurm an absolute path (the command the view runs);
 *   - no limit on line length, account names or their number; the file at most DSP_SITE_MAX bytes.
 */
#include "siteconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fail.h"
#include "layout.h"

#define SHOW_MAX 60	/* bytes of a line quoted in a message */
#define EXPECTED "(expected grace = S, grace.<account> = S, exec_mode = 0NNN, view = DIR or dispatch_slurm = PATH)"

void dsp_site_init(struct dsp_site *site)
{
	memset(site, 0, sizeof(*site));
	site->grace = DSP_GRACE_DEFAULT;
	site->exec_mode = 0700;
}

void dsp_site_free(struct dsp_site *site)
{
	for (size_t i = 0; i < site->naccounts; i++)
		free(site->accounts[i].name);
	free(site->accounts);
	free(site->view);
	free(site->dispatch_slurm);
	dsp_site_init(site);
}

/* Quote user bytes in a message: at most SHOW_MAX of them, printable ASCII as is, tab as
 * \t, any other byte as \xNN, "..." when cut (siteconf.py's _shown). buf: 4*SHOW_MAX+4. */
static const char *shown(const char *s, size_t len, char *buf)
{
	static const char hex[] = "0123456789abcdef";
	char *o = buf;
	for (size_t i = 0; i < len && i < SHOW_MAX; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c < 0x7f) {
			*o++ = (char)c;
		} else if (c == '\t') {
			*o++ = '\\';
			*o++ = 't';
		} else {
			*o++ = '\\';
			*o++ = 'x';
			*o++ = hex[c >> 4];
			*o++ = hex[c & 15];
		}
	}
	if (len > SHOW_MAX)
		o = memcpy(o, "...", 3) + 3;
	*o = '\0';
	return buf;
}

static int keychar(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
	       c == '.' || c == '-';
}

static int blank(char c)
{
	return c == ' ' || c == '\t';
}

/* Decimal digits as seconds, capped: any number of digits (leading zeros included). */
static unsigned long long capped(const char *v, size_t n)
{
	unsigned long long x = 0;
	for (size_t i = 0; i < n; i++)
		if ((x = x * 10 + (unsigned)(v[i] - '0')) > DSP_GRACE_CAP)
			return DSP_GRACE_CAP;
	return x;
}

static int duplicate(const char *key, size_t klen, unsigned long first, unsigned long no, const char *path,
		     char *err, size_t errsz)
{
	char show[4 * SHOW_MAX + 4];
	return dsp_fail(err, errsz, "%s:%lu: %s is already set on line %lu (each setting may appear only once)",
			path, no, shown(key, klen, show), first);
}

/* A value's bytes: digits for the numbers, a path for view and dispatch_slurm. */
static int valchar(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
	       c == '_' || c == '/' || c == '+' || c == '-';
}

static int digits(const char *v, size_t vlen)
{
	for (size_t i = 0; i < vlen; i++)
		if (v[i] < '0' || v[i] > '9')
			return 0;
	return 1;
}

/* view: canonical, relative, and not one of the root's own folders (its first component). */
static int view_ok(const char *v, size_t vlen)
{
	const char *p = v, *end = v + vlen;
	if (*v == '/')
		return 0;
	while (p <= end) {
		const char *q = memchr(p, '/', (size_t)(end - p));
		size_t len = (size_t)((q ? q : end) - p);
		if (!len || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.') ||
		    (p == v && dsp_protocol_entry(p, len)))
			return 0;
		p += len + 1;
	}
	return 1;
}

/* view = DIR or dispatch_slurm = PATH: 0, or -1 with err. */
static int path_setting(char **dst, unsigned long *line, const char *key, size_t klen, const char *v,
			size_t vlen, unsigned long no, const char *path, char *err, size_t errsz)
{
	char show[4 * SHOW_MAX + 4], names[256];
	if (*line)
		return duplicate(key, klen, *line, no, path, err, errsz);
	if (klen == 4 && !view_ok(v, vlen)) {
		dsp_protocol_names(names, sizeof(names));
		return dsp_fail(err, errsz, "%s:%lu: view %s must name a folder inside every job's root: relative "
				"(e.g. out), without empty, '.' or '..' components, and none of the root's own (%s)",
				path, no, shown(v, vlen, show), names);
	}
	if (klen != 4 && *v != '/')
		return dsp_fail(err, errsz, "%s:%lu: dispatch_slurm %s must be an absolute path (e.g. "
				"/usr/bin/dispatch-slurm)", path, no, shown(v, vlen, show));
	if (!(*dst = strndup(v, vlen)))
		return dsp_fail(err, errsz, "%s:%lu: out of memory", path, no);
	*line = no;
	return 0;
}

/* One `key = value` line: 0, 1 when it is no setting (an unknown key, or a number that is
 * not digits), or -1 with err. */
static int setting(struct dsp_site *site, const char *key, size_t klen, const char *v, size_t vlen,
		   unsigned long no, const char *path, char *err, size_t errsz)
{
	char show[4 * SHOW_MAX + 4];
	if (klen == 4 && !memcmp(key, "view", 4))
		return path_setting(&site->view, &site->view_line, key, klen, v, vlen, no, path, err, errsz);
	if (klen == 14 && !memcmp(key, "dispatch_slurm", 14))
		return path_setting(&site->dispatch_slurm, &site->dispatch_slurm_line, key, klen, v, vlen, no, path,
				    err, errsz);
	if (!digits(v, vlen))
		return 1;
	if (klen == 5 && !memcmp(key, "grace", 5)) {
		if (site->grace_line)
			return duplicate(key, klen, site->grace_line, no, path, err, errsz);
		site->grace = capped(v, vlen);
		site->grace_line = no;
	} else if (klen == 9 && !memcmp(key, "exec_mode", 9)) {
		if (site->exec_mode_line)
			return duplicate(key, klen, site->exec_mode_line, no, path, err, errsz);
		const char *m = v;	/* without leading zeros */
		while (m < v + vlen && *m == '0')
			m++;
		if (v + vlen - m != 3 || (memcmp(m, "700", 3) && memcmp(m, "710", 3) && memcmp(m, "750", 3)))
			return dsp_fail(err, errsz, "%s:%lu: exec_mode %s must be 0700, 0710 or 0750 (owner rwx; group "
					"at most r-x; never world)", path, no, shown(v, vlen, show));
		site->exec_mode = 0700 + (unsigned)(m[1] - '0') * 010;
		site->exec_mode_line = no;
	} else if (klen > 6 && !memcmp(key, "grace.", 6)) {
		const char *name = key + 6;
		size_t nlen = klen - 6;
		struct dsp_account *a;
		for (size_t i = 0; i < site->naccounts; i++)
			if (!strncmp(site->accounts[i].name, name, nlen) && !site->accounts[i].name[nlen])
				return duplicate(key, klen, site->accounts[i].line, no, path, err, errsz);
		if (!(a = realloc(site->accounts, (site->naccounts + 1) * sizeof(*a))))
			return dsp_fail(err, errsz, "%s:%lu: out of memory", path, no);
		site->accounts = a;
		if (!(a[site->naccounts].name = strndup(name, nlen)))
			return dsp_fail(err, errsz, "%s:%lu: out of memory", path, no);
		a[site->naccounts].grace = capped(v, vlen);
		a[site->naccounts++].line = no;
	} else {
		return 1;
	}
	return 0;
}

int dsp_site_parse(struct dsp_site *site, const char *text, size_t len, const char *path, char *err,
		   size_t errsz)
{
	const char *p = text, *end = text + len;
	unsigned long no = 0;
	if (len > DSP_SITE_MAX)
		return dsp_fail(err, errsz, "site config %s is larger than %d bytes", path, DSP_SITE_MAX);
	while (p < end) {
		char show[4 * SHOW_MAX + 4];
		const char *nl = memchr(p, '\n', (size_t)(end - p)), *s = p, *e = nl ? nl : end, *hash, *k, *v;
		size_t klen;
		p = nl ? nl + 1 : end;
		no++;
		if (e > s && e[-1] == '\r')
			e--;
		if ((hash = memchr(s, '#', (size_t)(e - s))))
			e = hash;
		while (s < e && blank(*s))
			s++;
		while (e > s && blank(e[-1]))
			e--;
		if (s == e)
			continue;
		const char *line = s;
		for (k = s; s < e && keychar(*s); s++)
			;
		klen = (size_t)(s - k);
		while (s < e && blank(*s))
			s++;
		if (klen && s < e && *s == '=') {
			for (s++; s < e && blank(*s); s++)
				;
			for (v = s; s < e && valchar(*s); s++)
				;
			if (s > v && s == e) {
				int rc = setting(site, k, klen, v, (size_t)(e - v), no, path, err, errsz);
				if (!rc)
					continue;
				if (rc < 0) {
					dsp_site_free(site);
					return -1;
				}
			}
		}
		dsp_site_free(site);
		return dsp_fail(err, errsz, "%s:%lu: cannot parse '%s' " EXPECTED, path, no,
				shown(line, (size_t)(e - line), show));
	}
	return 0;
}

int dsp_site_load(struct dsp_site *site, const char *path, int must_exist, char *err, size_t errsz)
{
	size_t n = 0;
	ssize_t r;
	char *buf;
	int fd, rc;
	dsp_site_init(site);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		if (errno == ENOENT)
			return must_exist ? dsp_fail(err, errsz, "site config %s does not exist", path) : 0;
		return dsp_fail(err, errsz, "site config %s: %s", path, strerror(errno));
	}
	if (!(buf = malloc(DSP_SITE_MAX + 1))) {
		close(fd);
		return dsp_fail(err, errsz, "site config %s: out of memory", path);
	}
	/* one byte more than allowed: enough to tell a too large file */
	while (n < DSP_SITE_MAX + 1 && (r = read(fd, buf + n, DSP_SITE_MAX + 1 - n)) != 0) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = dsp_fail(err, errsz, "site config %s: %s", path, strerror(errno));
			free(buf);
			close(fd);
			return rc;
		}
		n += (size_t)r;
	}
	close(fd);
	rc = dsp_site_parse(site, buf, n, path, err, errsz);
	free(buf);
	return rc;
}

unsigned long long dsp_site_grace(const struct dsp_site *site, const char *account)
{
	for (size_t i = 0; account && i < site->naccounts; i++)
		if (!strcmp(site->accounts[i].name, account))
			return site->accounts[i].grace;
	return site->grace;
}
