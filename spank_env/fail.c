#include "fail.h"

#include <stdarg.h>
#include <stdio.h>

int dsp_fail(char *err, size_t errsz, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errsz, fmt, ap);
	va_end(ap);
	return -1;
}
