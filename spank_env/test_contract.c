/*
 * Drives contract.c from tab-separated requests on stdin (tests/test_spank_contract.py
 * feeds it every case of tests/vectors/ (JSON) and compares the answers):
 *   epoch <G> <N> <R>             -> the epoch, or "error: ..."
 *   name  <epoch> <step> <path>   -> the publication name
 *   token <cluster> <job> <epoch> -> DISPATCH_ATTEMPT
 *   env   K=V ...                 -> K=V lines of every DISPATCH_* value, then "end"
 *         (site.grace=S and site.account.<A>=S become site.conf lines)
 *   site  <path> <must_exist>     -> dsp_site_load's answer: grace=S, exec_mode=0NNN,
 *                                    account=<A>=S ... (file order), view=DIR and
 *                                    dispatch_slurm=PATH when set, then "end"
 *   claim-name  <epoch>           -> the claim's name under epochs/
 *   claim-parse <epoch> <hex>     -> what the claim's bytes say: "claim <attempt>", "incomplete", "bad"
 *   claim <0|1> K=V ...           -> dsp_claim_epoch(DISPATCH_CHECKPOINT, the execution K=V computes,
 *                                    create): "ok" or "error: ..." (claim.c, on the real filesystem)
 *   check-submission K=V ...      -> dsp_check_submission at submit time: "ok" or "error: ..."
 *   view <hex root> <hex view>    -> dsp_view_rel("view folder", the root normalized, view): the
 *                                    path below the root, or "error: ..." (hex: a path may hold a tab)
 *   protocol                      -> the root's own entries (layout.c), ", "-separated
 *   view-claim <hex root> <attempt> <0|1>  -> the publisher's claim name on a node (layout.c;
 *                                    1: the batch step's second name)
 * (env: DISPATCH_VIEW=<the view folder> after the DISPATCH_* lines when the execution has one;
 *  site.view=DIR and site.dispatch_slurm=PATH become site.conf lines too)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "claim.h"
#include "contract.h"
#include "layout.h"

#define MAXF 64

static const char *field(char **f, int nf, const char *key)
{
	size_t kl = strlen(key);
	for (int i = 1; i < nf; i++)
		if (!strncmp(f[i], key, kl) && f[i][kl] == '=')
			return f[i] + kl + 1;
	return NULL;
}

#define ARG(v) { field(f, nf, v), v }
#define INPUTS { ARG("DISPATCH_CHECKPOINT"), ARG("DISPATCH_GENERATION"), ARG("DISPATCH_SUBMISSION"), \
	ARG("DISPATCH_GRACE"), ARG("DISPATCH_SHARED_CHECKPOINT"), ARG("DISPATCH_VIEW"), ARG("SLURM_JOB_ID"), ARG("SLURM_CLUSTER_NAME"), \
	ARG("SLURM_JOB_RESTART_COUNT"), ARG("SLURM_RESTART_COUNT"), ARG("SLURM_ARRAY_TASK_ID"), \
	ARG("SLURM_JOB_ACCOUNT"), ARG("DISPATCH_ATTEMPT") }

/* Hex digits decoded in place (a field's bytes that a tab-separated request cannot carry). */
static void unhex(char *s)
{
	size_t len = strlen(s) / 2;
	for (size_t i = 0; i < len; i++)
		sscanf(s + 2 * i, "%2hhx", (unsigned char *)&s[i]);
	s[len] = '\0';
}

static void claim_requests(char **f, int nf, char *err, size_t errsz)
{
	if (!strcmp(f[0], "claim-name") && nf == 2) {
		char out[32];
		printf("%s\n", dsp_claim_name(f[1], out, sizeof(out)) ? "error: name" : out);
	} else if (!strcmp(f[0], "claim-parse") && nf == 3) {
		char data[DSP_CLAIM_MAX + 1], owner[DSP_CLAIM_MAX];
		size_t len = strlen(f[2]) / 2;
		for (size_t i = 0; i < len && i < sizeof(data); i++)
			sscanf(f[2] + 2 * i, "%2hhx", (unsigned char *)&data[i]);
		int rc = len > DSP_CLAIM_MAX ? -1 : dsp_claim_parse(data, len, f[1], owner, sizeof(owner));
		if (rc == 1)
			printf("claim %s\n", owner);
		else
			printf("%s\n", rc ? "bad" : "incomplete");
	} else if (!strcmp(f[0], "claim") && nf >= 2) {
		struct dsp_in in = INPUTS;
		struct dsp_site site;
		struct dsp_out o;
		dsp_site_init(&site);
		if (dsp_compute(&in, &site, &o, err, errsz) ||
		    dsp_claim_epoch(in.checkpoint.value, &o, atoi(f[1]), err, errsz))
			printf("error: %s\n", err);
		else
			printf("ok\n");
		dsp_site_free(&site);
	} else if (!strcmp(f[0], "view") && nf == 3) {
		char root[DSP_PATH], rel[DSP_PATH];
		unhex(f[1]);
		unhex(f[2]);
		if (dsp_normalize_root(f[1], root, sizeof(root), err, errsz) ||
		    dsp_view_rel("view folder", root, f[2], rel, sizeof(rel), err, errsz))
			printf("error: %s\n", err);
		else
			printf("%s\n", rel);
	} else if (!strcmp(f[0], "view-claim") && nf == 4) {
		char name[64];
		unhex(f[1]);
		printf("%s\n", dsp_view_claim_name(f[1], f[2], atoi(f[3]), name, sizeof(name)) ? "error: name" : name);
	} else if (!strcmp(f[0], "protocol") && nf == 1) {
		char names[256];
		printf("%s\n", dsp_protocol_names(names, sizeof(names)) ? "error: names" : names);
	} else if (!strcmp(f[0], "check-submission")) {
		struct dsp_in in = INPUTS;
		char root[DSP_PATH];
		if (dsp_normalize_root(in.checkpoint.value, root, sizeof(root), err, errsz) ||
		    dsp_check_submission(root, &in, err, errsz))
			printf("error: %s\n", err);
		else
			printf("ok\n");
	} else {
		printf("error: bad request '%s'\n", f[0]);
	}
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
		} else if (!strcmp(f[0], "site") && nf == 3) {
			struct dsp_site site;
			if (dsp_site_load(&site, f[1], atoi(f[2]), err, sizeof(err))) {
				printf("error: %s\n", err);
			} else {
				printf("grace=%llu\nexec_mode=%04o\n", site.grace, site.exec_mode);
				for (size_t i = 0; i < site.naccounts; i++)
					printf("account=%s=%llu\n", site.accounts[i].name, site.accounts[i].grace);
				if (site.view)
					printf("view=%s\n", site.view);
				if (site.dispatch_slurm)
					printf("dispatch_slurm=%s\n", site.dispatch_slurm);
			}
			dsp_site_free(&site);
			printf("end\n");
		} else if (!strcmp(f[0], "env")) {
			struct dsp_site site;
			struct dsp_out o;
			char *conf = NULL;
			size_t conflen = 0;
			FILE *text = open_memstream(&conf, &conflen);
			for (int i = 1; i < nf; i++) {
				if (!strncmp(f[i], "site.grace=", 11))
					fprintf(text, "grace = %s\n", f[i] + 11);
				else if (!strncmp(f[i], "site.account.", 13))
					fprintf(text, "grace.%s\n", f[i] + 13);
				else if (!strncmp(f[i], "site.view=", 10))
					fprintf(text, "view = %s\n", f[i] + 10);
			}
			fclose(text);
			dsp_site_init(&site);
			if (dsp_site_parse(&site, conf, conflen, "<env request>", err, sizeof(err))) {
				printf("error: %s\nend\n", err);
				free(conf);
				fflush(stdout);
				continue;
			}
			free(conf);
			struct dsp_in in = INPUTS;
			if (dsp_compute(&in, &site, &o, err, sizeof(err))) {
				printf("error: %s\nend\n", err);
			} else {
				printf("DISPATCH_CHECKPOINT=%s\nDISPATCH_GENERATION=%s\nDISPATCH_SUBMISSION=%s\n"
				       "DISPATCH_RESTART=%s\nDISPATCH_EPOCH=%s\nDISPATCH_ATTEMPT=%s\n"
				       "DISPATCH_EXEC_DIR=%s\nDISPATCH_GRACE_S=%s\n", o.checkpoint, o.generation,
				       o.submission, o.restart, o.epoch, o.attempt, o.exec_dir, o.grace);
				if (o.shared)
					printf("DISPATCH_SHARED_CHECKPOINT=1\n");
				if (o.view[0])
					printf("DISPATCH_VIEW=%s\n", o.view);
				printf("end\n");
			}
			dsp_site_free(&site);
		} else {
			claim_requests(f, nf, err, sizeof(err));
		}
		fflush(stdout);
	}
	return 0;
}
