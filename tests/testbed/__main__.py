"""`python -m testbed trial ...`: overlap trials on docker-slurm or on any sbatch cluster."""

import json
import sys
from dataclasses import asdict

import click

from dispatch_slurm.errors import DispatchError

from . import trial as trialmod
from .cluster import SUITES


@click.group()
def main():
    """dispatch-slurm's test bed (run from a source checkout)."""


@main.command()
@click.option("--scenario", "scenarios", multiple=True, default=("cancel", "preempt", "partition"),
              type=click.Choice(["cancel", "preempt", "partition", "expedite", "local"]), show_default=True,
              help="repeat for several; expedite: a partition with --requeue=expedite (Slurm 25.11+: "
                   "--suite sid); local: processes on this machine, no Slurm")
@click.option("--mode", type=click.Choice(["naive", "dispatch", "both"]), default="both", show_default=True)
@click.option("--trials", type=click.IntRange(1), default=1, show_default=True)
@click.option("--target", type=click.Choice(["docker-slurm", "vm", "slurm"]), default="docker-slurm",
              show_default=True,
              help="docker-slurm: build and start the embedded cluster; vm: restore the two QEMU VMs "
                   "(cgroup v2; docker-slurm/vm/build-vm-image SUITE first); slurm: the cluster your sbatch reaches")
@click.option("--suite", type=click.Choice(sorted(SUITES)), default="trixie", show_default=True)
@click.option("--tracking", type=click.Choice(["linuxproc", "cgroup"]),
              help="docker-slurm's process tracking  [default: the profile's: fast linuxproc, site cgroup]")
@click.option("--profile", type=click.Choice(["fast", "site"]), default="fast", show_default=True,
              help="docker-slurm timings: fast (CI) or site (Slurm's defaults)")
@click.option("--dir", "base", help="--target slurm: a folder on a filesystem every node shares")
@click.option("--nodes", help="--target slurm: comma-separated nodes the trial may use")
@click.option("--interval", type=click.FloatRange(0.05, 60), default=1.0, show_default=True,
              help="seconds between the trainer's saves")
@click.option("--warmup", type=click.FloatRange(0, 600), default=3.0, show_default=True,
              help="seconds a replacement loads before its first step")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write every result as JSON")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="a PNG timeline (needs matplotlib)")
def trial(scenarios, mode, trials, target, suite, tracking, profile, base, nodes, interval, warmup, json_path,
          plot_path):
    """Overlap trials: run a job, cancel / preempt / partition it, start the replacement
    as soon as Slurm says the old execution ended, and measure what the overlap did:
    how long the old one kept writing, mixed folders, lost saves, wrong resumes."""
    if plot_path:
        trialmod.pyplot()  # refuse before hours of trials, not after
    modes = ("naive", "dispatch") if mode == "both" else (mode,)
    results = trialmod.run(list(scenarios), modes, trials, target, suite, profile, base,
                           nodes.split(",") if nodes else None, interval, warmup,
                           log=lambda m: click.echo(m, err=True), tracking=tracking)
    click.echo(trialmod.summarize(results))
    if json_path:
        with open(json_path, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    if plot_path:
        trialmod.plot(results, plot_path)


if __name__ == "__main__":
    try:
        main(standalone_mode=True)
    except DispatchError as e:
        sys.exit(f"testbed: error: {e}")
