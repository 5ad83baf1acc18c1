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

#endif
