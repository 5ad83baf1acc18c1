/*
 * The entries of a checkpoint root that are dispatch-slurm's own, in C: contract/layout.py's
 * PROTOCOL and EXEC (tests/test_spank_contract.py compares the two). Its own unit, below
 * contract.c and siteconf.c, which both refuse a view that is one of them.
 */
#ifndef DISPATCH_LAYOUT_H
#define DISPATCH_LAYOUT_H

#include <stddef.h>

/* 1 when the first len bytes of name are one of the root's own entries (exec, pub, sub...). */
int dsp_protocol_entry(const char *name, size_t len);
/* Their names, ", "-separated, for messages; -1 when they do not fit in outsz. */
int dsp_protocol_names(char *out, size_t outsz);

/* exec/<attempt>/DSP_VIEW_RECORD: what `view prepare` placed, written last (view.py's
 * layout.VIEW): once it exists, the execution's folder is prepared. */
#define DSP_VIEW_RECORD "dispatch-view"
/* The name of the abstract socket by which the publisher of (root, attempt) holds its claim on
 * a node, with batch the one the batch step's publisher binds beside it (view.py's claim_name,
 * tests/test_spank_contract.py compares them): "dispatch-slurm-view-<FNV-1a 64 of root NUL
 * attempt, 16 hex>[.batch]". -1 when it does not fit in outsz. */
int dsp_view_claim_name(const char *root, const char *attempt, int batch, char *out, size_t outsz);

#endif
