/*
 * Drives contract.c from tab-separated requests on stdin (tests/test_spank_contract.py
 * feeds it every case of tests/vectors/ (JSON) and compares the answers):
 *   epoch <G> <N> <R>             -> the epoch, or "error: ..."
 *   name  <epoch> <step> <path>   -> the publication name
 *   token <cluster> <job> <epoch> -> DISPATCH_ATTEMPT
 *   env   K=V ...                 -> K=V lines of every DISPATCH_* value, then "end"
 *         (site.grace=S and site.account.<A>=S set the site config)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"

#define MAXF 64

static const char *field(char **f, int nf, const char *key)
{
	size_t kl = strlen(key);
	for (int i = 1; i < nf; i++)
		if (!strncmp(f[i], key, kl) && f[i][kl] == '=')
			return f[i] + kl + 1;
	return NULL;
}

int main(void)
{
	char line[65536], err[DSP_ERR];
	while (fgets(line, sizeof(line), stdin)) {
		char *f[MAXF];
		int nf = 0;
		line[strcspn(line, "\n")] = '\0';
		for (char *s = line, *t; nf < MAXF; s = t + 1) {
			f[nf++] = s;
			if (!(t = strchr(s, '\t')))
				break;
			*t = '\0';
		}
		if (!strcmp(f[0], "epoch") && nf == 4) {
			unsigned long long g, n, r;
			char out[32];
			if (dsp_parse_part("generation G", "G", f[1], 0, DSP_G_MAX, &g, err, sizeof(err)) ||
			    dsp_parse_part("submission N", "N", f[2], 1, DSP_N_MAX, &n, err, sizeof(err)) ||
			    dsp_parse_part("restart R", "R", f[3], 0, DSP_R_MAX, &r, err, sizeof(err)) ||
			    dsp_epoch(g, n, r, out, sizeof(out), err, sizeof(err)))
				printf("error: %s\n", err);
			else
				printf("%s\n", out);
		} else if (!strcmp(f[0], "name") && nf == 4) {
			char out[1024];
			if (dsp_pub_name(f[1], f[2], f[3], out, sizeof(out)))
				printf("error: name\n");
			else
				printf("%s\n", out);
		} else if (!strcmp(f[0], "token") && nf == 4) {
			char out[256];
			if (dsp_token(f[1], f[2], f[3], out, sizeof(out), err, sizeof(err)))
				printf("error: %s\n", err);
			else
				printf("%s\n", out);
		} else if (!strcmp(f[0], "env")) {
			struct dsp_site site;
			struct dsp_out o;
			dsp_site_defaults(&site);
			for (int i = 1; i < nf; i++) {
				if (!strncmp(f[i], "site.grace=", 11))
					site.grace = strtoull(f[i] + 11, NULL, 10);
				else if (!strncmp(f[i], "site.account.", 13)) {
					char *eq = strchr(f[i], '=');
					snprintf(site.account[site.naccounts], 64, "%.*s", (int)(eq - f[i] - 13), f[i] + 13);
					site.account_grace[site.naccounts++] = strtoull(eq + 1, NULL, 10);
				}
			}
#define ARG(v) { field(f, nf, v), v }
			struct dsp_in in = {
				ARG("DISPATCH_CHECKPOINT"), ARG("DISPATCH_GENERATION"), ARG("DISPATCH_SUBMISSION"),
				ARG("DISPATCH_GRACE"), ARG("DISPATCH_SHARED_CHECKPOINT"), ARG("SLURM_JOB_ID"),
				ARG("SLURM_CLUSTER_NAME"), ARG("SLURM_JOB_RESTART_COUNT"), ARG("SLURM_RESTART_COUNT"),
				ARG("SLURM_ARRAY_TASK_ID"), ARG("SLURM_JOB_ACCOUNT"), ARG("DISPATCH_ATTEMPT"),
			};
			if (dsp_compute(&in, &site, &o, err, sizeof(err))) {
				printf("error: %s\nend\n", err);
			} else {
				printf("DISPATCH_CHECKPOINT=%s\nDISPATCH_GENERATION=%s\nDISPATCH_SUBMISSION=%s\n"
				       "DISPATCH_RESTART=%s\nDISPATCH_EPOCH=%s\nDISPATCH_ATTEMPT=%s\n"
				       "DISPATCH_EXEC_DIR=%s\nDISPATCH_GRACE_S=%s\n", o.checkpoint, o.generation,
				       o.submission, o.restart, o.epoch, o.attempt, o.exec_dir, o.grace);
				if (o.shared)
					printf("DISPATCH_SHARED_CHECKPOINT=1\n");
				printf("end\n");
			}
		} else {
			printf("error: bad request '%s'\n", f[0]);
		}
		fflush(stdout);
	}
	return 0;
}
