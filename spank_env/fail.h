/*
 * How every part of the plugin reports an error: a message formatted into the caller's
 * buffer and -1. Its own unit, below contract.c, siteconf.c, claim.c and fsops.c, so that
 * none of them depends on another just to fail (siteconf.c once reached dsp_fail through
 * contract.h, which itself includes siteconf.h: a circle).
 */
#ifndef DISPATCH_FAIL_H
#define DISPATCH_FAIL_H

#include <stddef.h>

/* Format a message into err; returns -1, so `return dsp_fail(...)` reports an error. */
int dsp_fail(char *err, size_t errsz, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
