/*
 * The site's configuration as this process reads it: the plugstack.conf arguments
 * (conf=PATH) and site.conf (siteconf.c). A bad one never fails slurm_spank_init,
 * which would fail every sbatch/salloc/srun on the site (the plugin is `required`):
 * the problem is logged, remembered, and only jobs that use --dispatch-* options are
 * refused (alloc.c at submission, remote.c in the task), naming it.
 */
#include <stdio.h>
#include <string.h>

#include "dispatch.h"

static struct dsp_site site;	/* set by dsp_config_load, in slurm_spank_init */
static char problem[DSP_ERR];	/* why the configuration cannot be used; "" when it can */

void dsp_config_load(int ac, char **av, int daemon)
{
	const char *conf = DSP_SITE_CONF;
	int explicit = 0;
	dsp_site_free(&site);
	problem[0] = '\0';
	for (int i = 0; i < ac; i++) {
		if (!strncmp(av[i], "conf=", 5)) {
			conf = av[i] + 5;
			explicit = 1;
		} else {
			snprintf(problem, sizeof(problem), "plugstack.conf: unknown argument '%s' for %s (only conf=PATH)",
				 av[i], DSP_PLUGIN);
		}
	}
	if (!problem[0])
		dsp_site_load(&site, conf, explicit, problem, sizeof(problem));
	if (!problem[0])
		return;
	/* for the admin: in the daemons' logs; users who do not use the plugin are not told */
	(daemon ? slurm_error : slurm_verbose)("%s: %s; jobs using --dispatch-* options are refused until "
					       "it is fixed (`dispatch-slurm check-site %s` checks a site.conf)",
					       DSP_PLUGIN, problem, conf);
}

const struct dsp_site *dsp_config_site(void)
{
	return &site;
}

int dsp_config_usable(char *err, size_t errsz)
{
	if (!problem[0])
		return 0;
	return dsp_fail(err, errsz, "dispatch-slurm is misconfigured on this cluster, so --dispatch-* options "
			"cannot be used; please tell your cluster admin: %s", problem);
}

void dsp_config_free(void)
{
	dsp_site_free(&site);
	problem[0] = '\0';
}
