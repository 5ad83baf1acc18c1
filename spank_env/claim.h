/*
 * One epoch per execution, in C: the same rules as dispatch_slurm/store/epochs.py.
 * <root>/epochs/<epoch, 20 digits> holds the attempt token of the one execution that runs
 * at that epoch and a newline; another job at that epoch is refused, naming the first.
 * No Slurm headers: test_contract drives these functions (tests/test_spank_contract.py).
 */
#ifndef DISPATCH_CLAIM_H
#define DISPATCH_CLAIM_H

#include <stddef.h>

#include "contract.h"

#ifndef DSP_CLAIM_SETTLE_MS	/* an incomplete claim is read again this long, then refused */
#define DSP_CLAIM_SETTLE_MS 5000
#endif
#define DSP_CLAIM_MAX 4096		/* a claim is one token and a newline; more is not a claim */

/* epochs/<name> of an epoch (decimal digits): the 20-digit form of a publication name. */
int dsp_claim_name(const char *epoch, char *out, size_t outsz);
/* What a claim's bytes say about epoch: 1 (its attempt copied to owner), 0 incomplete
 * (empty, or no final newline: being written, or its writer died), -1 not a claim. */
int dsp_claim_parse(const char *data, size_t len, const char *epoch, char *owner, size_t ownersz);
/* sbatch/salloc/srun, given --dispatch-submission=N for the job whose (normalized)
 * checkpoint root is `root`: refuse an N that sub/ never allocated and, for a new job (not
 * a step inside one) with a plain root, an N whose first epoch (G, N, 0) another job claimed. */
int dsp_check_submission(const char *root, const struct dsp_in *in, char *err, size_t errsz);
/* As the job user, for the execution `out` of the job whose --dispatch-checkpoint is
 * `checkpoint` (a %a pattern included). create=0, before the exec folder: refuse an epoch
 * another job claimed and, when nobody has, an N never allocated; create=1, after it: claim
 * the epoch (O_EXCL, fsynced) or find it ours. -1 with the message (the other job, the fix). */
int dsp_claim_epoch(const char *checkpoint, const struct dsp_out *out, int create, char *err, size_t errsz);
#endif
