/*
 * One epoch per execution: the rules of dispatch_slurm/store/epochs.py, for the plugin.
 * Two jobs of one root at one epoch (a --dispatch-submission=N given twice, variables set
 * by hand) would resume from each other's saves and publish among them. So slurmstepd's
 * user_init (remote.c, as the job user) refuses an epoch another job claimed and an N that
 * sub/ never allocated, makes the exec folder, then claims <root>/epochs/<epoch, 20 digits>:
 * O_EXCL, the attempt token and a newline, fsynced (the file, epochs/, the root). Every
 * node, task and step of one execution computes the same token and finds its own claim.
 * Directories below the root are opened with O_NOFOLLOW; nothing is locked.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "claim.h"
#include "fail.h"

#define DIRFLAGS (O_RDONLY | O_DIRECTORY | O_CLOEXEC)
#define FIX "fix: submit with `dispatch-slurm submit %s -- ...` or `sbatch --dispatch-checkpoint=%s` (each " \
	"allocates a new submission number); never set DISPATCH_SUBMISSION by hand"

int dsp_claim_name(const char *epoch, char *out, size_t outsz)
{
	size_t len = strlen(epoch);
	if (!len || len > 20 || strspn(epoch, "0123456789") != len)
		return -1;
	return snprintf(out, outsz, "%.*s%s", (int)(20 - len), "00000000000000000000", epoch) >= (int)outsz ? -1 : 0;
}

static size_t span(const char *s, size_t len, const char *set)
{
	size_t i = 0;
	while (i < len && s[i] && strchr(set, s[i]))
		i++;
	return i;
}

int dsp_claim_parse(const char *data, size_t len, const char *epoch, char *owner, size_t ownersz)
{
	static const char token[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
	size_t c, j, el = strlen(epoch);
	if (!len || data[len - 1] != '\n')
		return 0;
	len--;	/* <cluster, 1..64 of token>.<job, 1..20 digits>.<epoch>, exactly */
	c = span(data, len, token);
	if (c < 1 || c > 64 || c >= len || data[c] != '.')
		return -1;
	j = span(data + c + 1, len - c - 1, "0123456789");
	if (j < 1 || j > 20 || c + 1 + j >= len || data[c + 1 + j] != '.' || len - (c + 2 + j) != el ||
	    memcmp(data + c + 2 + j, epoch, el) || len >= ownersz)
		return -1;
	memcpy(owner, data, len);
	owner[len] = '\0';
	return 1;
}

/* "<cluster>.<job>" of an attempt token: the job, as its user knows it. */
static const char *job_of(const char *attempt, char *buf, size_t sz)
{
	const char *dot = strrchr(attempt, '.');
	snprintf(buf, sz, "%.*s", dot ? (int)(dot - attempt) : (int)strlen(attempt), attempt);
	return buf;
}

/* The content of epochs/<name> under root_fd into buf: its length, -2 when there is no
 * claim (nor epochs/), -1 with the message in err. */
static ssize_t read_claim(int root_fd, const char *root, const char *name, char *buf, size_t sz,
			  char *err, size_t errsz)
{
	struct stat st;
	ssize_t got = 0, n;
	int ep = openat(root_fd, "epochs", DIRFLAGS | O_NOFOLLOW), fd, e;
	if (ep < 0)
		return errno == ENOENT ? -2 : dsp_fail(err, errsz, "%s/epochs: %s%s", root, strerror(errno),
						      errno == ELOOP || errno == ENOTDIR ? "; refusing to follow a symlink" : "");
	fd = openat(ep, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	e = errno;
	close(ep);
	if (fd < 0)
		return e == ENOENT ? -2 : dsp_fail(err, errsz, "%s/epochs/%s: %s%s", root, name, strerror(e),
						  e == ELOOP ? "; it is a symlink, which the protocol never follows "
						  "(remove it)" : "");
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return dsp_fail(err, errsz, "%s/epochs/%s is not a regular file: not a claim (remove it)", root, name);
	}
	while ((size_t)got < sz && (n = read(fd, buf + got, sz - (size_t)got)) > 0)
		got += n;
	close(fd);
	return got;
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Who claimed the epoch: 1 (owner set), 0 nobody, -1 error. An incomplete claim is read
 * again until DSP_CLAIM_SETTLE_MS, then refused naming the file. */
static int claimant(int root_fd, const char *root, const char *epoch, char *owner, size_t ownersz,
		    char *err, size_t errsz)
{
	char name[24], buf[DSP_CLAIM_MAX + 1];
	long long deadline = now_ms() + DSP_CLAIM_SETTLE_MS;
	long pause = 10;
	if (dsp_claim_name(epoch, name, sizeof(name)))
		return dsp_fail(err, errsz, "epoch '%s' is not decimal digits", epoch);
	for (;;) {
		ssize_t len = read_claim(root_fd, root, name, buf, sizeof(buf), err, errsz);
		int rc;
		if (len == -2)
			return 0;
		if (len < 0)
			return -1;
		rc = (size_t)len > DSP_CLAIM_MAX ? -1 : dsp_claim_parse(buf, (size_t)len, epoch, owner, ownersz);
		if (rc == 1)
			return 1;
		if (rc < 0)
			return dsp_fail(err, errsz, "bad entry '%s' in %s/epochs: not a claim of epoch %s "
				    "(<cluster>.<job>.%s and a newline)", name, root, epoch, epoch);
		if (now_ms() >= deadline)
			return dsp_fail(err, errsz, "%s/epochs/%s is still %s after %g s: the process that created it "
				    "died before writing it (or the filesystem is stalled), so no job can run at epoch %s: "
				    "if none of this root's jobs runs at it, remove that file, and resubmit "
				    "(`dispatch-slurm submit %s -- ...`)", root, name, len ? "without its newline" : "empty",
				    DSP_CLAIM_SETTLE_MS / 1000.0, epoch, root);
		struct timespec ts = { 0, pause * 1000000L };
		nanosleep(&ts, NULL);
		pause = pause * 2 > 200 ? 200 : pause * 2;
	}
}

/* O_EXCL-create epochs/<name> with "<attempt>\n", fsync it, epochs/ and the root:
 * 1 created, 0 it exists, -1 error. */
static int create_claim(int root_fd, const char *root, const char *epoch, const char *attempt,
			char *err, size_t errsz)
{
	char name[24], body[160];
	int ep, fd, made = 0;
	size_t len = (size_t)snprintf(body, sizeof(body), "%s\n", attempt), off = 0;
	if (dsp_claim_name(epoch, name, sizeof(name)) || len >= sizeof(body))
		return dsp_fail(err, errsz, "cannot name the claim of epoch '%s'", epoch);
	ep = openat(root_fd, "epochs", DIRFLAGS | O_NOFOLLOW);
	if (ep < 0 && errno == ENOENT) {
		if (mkdirat(root_fd, "epochs", 0777) == 0)
			made = 1;
		else if (errno != EEXIST)
			return dsp_fail(err, errsz, "%s/epochs: %s", root, strerror(errno));
		ep = openat(root_fd, "epochs", DIRFLAGS | O_NOFOLLOW);
	}
	if (ep < 0)
		return dsp_fail(err, errsz, "%s/epochs: %s%s", root, strerror(errno),
			    errno == ELOOP || errno == ENOTDIR ? "; refusing to follow a symlink" : "");
	if (made && fsync(root_fd)) {
		close(ep);
		return dsp_fail(err, errsz, "%s: fsync: %s", root, strerror(errno));
	}
	fd = openat(ep, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
	if (fd < 0) {
		int e = errno;
		close(ep);
		return e == EEXIST ? 0 : dsp_fail(err, errsz, "%s/epochs/%s: %s", root, name, strerror(e));
	}
	while (off < len) {
		ssize_t n = write(fd, body + off, len - off);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	if (off < len || fsync(fd) || close(fd) || fsync(ep) || fsync(root_fd)) {
		int e = errno;
		close(ep);
		return dsp_fail(err, errsz, "%s/epochs/%s: %s", root, name, strerror(e));
	}
	close(ep);
	return 1;
}

static int submission_exists(const char *subdir, unsigned long long n, char *err, size_t errsz)
{
	char name[16];
	struct stat st;
	int root = open(subdir, DIRFLAGS), sub;
	if (root < 0)
		return dsp_fail(err, errsz, "checkpoint root %s%s", subdir,
			    errno == ENOENT ? " does not exist (create it first)" : ": cannot open it");
	sub = openat(root, "sub", DIRFLAGS | O_NOFOLLOW);
	close(root);
	snprintf(name, sizeof(name), "%06llu", n);
	if (sub >= 0 && fstatat(sub, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		close(sub);
		return 0;
	}
	if (sub >= 0)
		close(sub);
	return dsp_fail(err, errsz, "--dispatch-submission=%llu was never allocated under %s (no %s/sub/%s): a "
		    "submission number comes from `dispatch-slurm submit %s -- ...`, `dispatch-slurm run` or `sbatch "
		    "--dispatch-checkpoint=%s`, which create sub/<N> and pass N to the job; never set it by hand",
		    n, subdir, subdir, name, subdir, subdir);
}

static int parse_n(const char *text, unsigned long long *n, char *err, size_t errsz)
{
	return dsp_parse_part("--dispatch-submission", "submission N", text, 1, DSP_N_MAX, n, err, errsz);
}

int dsp_check_submission(const char *root, const struct dsp_in *in, char *err, size_t errsz)
{
	char subdir[DSP_PATH], epoch[24], owner[DSP_CLAIM_MAX], job[DSP_CLAIM_MAX], name[24];
	unsigned long long g = 0, n;
	int fd, rc;
	if (parse_n(in->submission.value, &n, err, errsz) || dsp_submission_dir(root, subdir, sizeof(subdir)) ||
	    submission_exists(subdir, n, err, errsz))
		return -1;
	if (getenv("SLURM_JOB_ID") || strstr(root, "%a"))
		return 0;	/* a step of a running job (whose claim it is), or one root per task */
	if (in->generation.value && in->generation.value[0] &&
	    dsp_parse_part(in->generation.label, "generation G", in->generation.value, 0, DSP_G_MAX, &g, err, errsz))
		return -1;
	if (dsp_epoch(g, n, 0, epoch, sizeof(epoch), err, errsz))
		return -1;
	if ((fd = open(root, DIRFLAGS)) < 0)
		return dsp_fail(err, errsz, "checkpoint root %s: %s", root, strerror(errno));
	rc = claimant(fd, root, epoch, owner, sizeof(owner), err, errsz);
	close(fd);
	if (rc > 0 && !dsp_claim_name(epoch, name, sizeof(name)))
		return dsp_fail(err, errsz, "epoch %s of %s is already claimed by job %s (%s/epochs/%s); a new job "
			    "with --dispatch-submission=%llu would share its epoch; " FIX, epoch, root,
			    job_of(owner, job, sizeof(job)), root, name, n, root, root);
	return rc < 0 ? -1 : 0;
}

int dsp_claim_epoch(const char *checkpoint, const struct dsp_out *out, int create, char *err, size_t errsz)
{
	char pattern[DSP_PATH], subdir[DSP_PATH], owner[DSP_CLAIM_MAX], a[DSP_CLAIM_MAX], b[DSP_CLAIM_MAX], name[24];
	unsigned long long n;
	int fd, rc;
	if (dsp_normalize_root(checkpoint, pattern, sizeof(pattern), err, errsz) ||
	    dsp_submission_dir(pattern, subdir, sizeof(subdir)) || dsp_claim_name(out->epoch, name, sizeof(name)))
		return -1;
	fd = open(out->checkpoint, DIRFLAGS);
	if (fd < 0 && !create && errno == ENOENT && strstr(pattern, "%a"))	/* made with the exec folder */
		return parse_n(out->submission, &n, err, errsz) || submission_exists(subdir, n, err, errsz) ? -1 : 0;
	if (fd < 0)
		return dsp_fail(err, errsz, "checkpoint root %s%s", out->checkpoint,
			    errno == ENOENT ? " does not exist (create it first)" : ": cannot open it");
	rc = claimant(fd, out->checkpoint, out->epoch, owner, sizeof(owner), err, errsz);
	if (rc == 0 && !create) {	/* the execution's first process: N must be one a submission allocated */
		rc = parse_n(out->submission, &n, err, errsz) || submission_exists(subdir, n, err, errsz) ? -1 : 0;
	} else if (rc == 0) {
		rc = create_claim(fd, out->checkpoint, out->epoch, out->attempt, err, errsz);
		if (rc == 1)
			snprintf(owner, sizeof(owner), "%s", out->attempt);
		else if (rc == 0 && (rc = claimant(fd, out->checkpoint, out->epoch, owner, sizeof(owner), err, errsz)) == 0)
			rc = dsp_fail(err, errsz, "%s/epochs/%s vanished: something removes claims (dispatch-slurm "
				      "never does)", out->checkpoint, name);
	}
	close(fd);
	if (rc <= 0 || !strcmp(owner, out->attempt))
		return rc < 0 ? -1 : 0;
	return dsp_fail(err, errsz, "epoch %s of %s is already claimed by job %s (%s/epochs/%s); this job (%s) would "
		    "share its epoch: it would resume from that job's saves and publish among them, and the other job's "
		    "lineage could be taken for the latest; " FIX, out->epoch, out->checkpoint,
		    job_of(owner, a, sizeof(a)), out->checkpoint, name, job_of(out->attempt, b, sizeof(b)), pattern, pattern);
}
