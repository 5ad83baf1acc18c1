#include "layout.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char *const protocol[] = { "ceased", "epochs", "events", "exec", "held", "jobs", "pinned", "pub",
					"record.jsonl", "requests", "retired", "sub", "supervisor" };

int dsp_protocol_entry(const char *name, size_t len)
{
	for (size_t i = 0; i < sizeof(protocol) / sizeof(protocol[0]); i++)
		if (strlen(protocol[i]) == len && !memcmp(protocol[i], name, len))
			return 1;
	return 0;
}

int dsp_protocol_names(char *out, size_t outsz)
{
	size_t o = 0;
	for (size_t i = 0; i < sizeof(protocol) / sizeof(protocol[0]); i++) {
		size_t len = strlen(protocol[i]);
		if (o + len + 3 > outsz)
			return -1;
		if (i) {
			memcpy(out + o, ", ", 2);
			o += 2;
		}
		memcpy(out + o, protocol[i], len);
		o += len;
	}
	out[o] = '\0';
	return 0;
}

int dsp_view_claim_name(const char *root, const char *attempt, int batch, char *out, size_t outsz)
{
	uint64_t h = 0xcbf29ce484222325ULL;	/* FNV-1a: the same in Python with no library */
	size_t rlen = strlen(root), alen = strlen(attempt);
	for (size_t i = 0; i <= rlen + alen; i++) {
		unsigned char c = i < rlen ? (unsigned char)root[i] : i == rlen ? 0 : (unsigned char)attempt[i - rlen - 1];
		h = (h ^ c) * 0x100000001b3ULL;
	}
	int n = snprintf(out, outsz, "dispatch-slurm-view-%016llx%s", (unsigned long long)h, batch ? ".batch" : "");
	return n < 0 || (size_t)n >= outsz ? -1 : 0;
}
