/*
 * slurmd (at start and on reconfigure): nothing to register, but reading the
 * configuration here puts a bad site.conf into slurmd's log before any job meets it.
 */
#include "dispatch.h"

int dsp_slurmd_init(spank_t sp, int ac, char **av)
{
	(void)sp;
	slurm_debug("%s %s: slurmd", DSP_PLUGIN, DSP_VERSION);
	dsp_config_load(ac, av, 1);
	return 0;
}

/* slurmd exit (slurm_spank_slurmd_exit): the configuration, all its init loaded; slurmd
 * registers no options, so it has none to free. */
int dsp_slurmd_exit(spank_t sp)
{
	(void)sp;
	dsp_config_free();
	return 0;
}
