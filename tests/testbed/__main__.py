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


@main.command("view")
@click.option("--trainer", "kinds", multiple=True, help="repeat for several  [default: every one]")
def view_(kinds):
    """The unmodified trainers of testbed/unmodified/ under the view, beside the same trainers in
    one shared folder, overlapped by their own old execution (root, on this machine: the
    schedule of testbed/viewbed.py); the table of what each side did."""
    from . import viewbed
    bad = sorted(set(kinds) - set(viewbed.TRAINERS))
    if bad:
        raise click.UsageError(f"no trainer {', '.join(bad)} (there are {', '.join(sorted(viewbed.TRAINERS))})")
    click.echo(viewbed.run_all(list(kinds or viewbed.TRAINERS), log=lambda m: click.echo(m, err=True)))


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


@main.command()
@click.option("--suite", type=click.Choice(sorted(SUITES)), default="trixie", show_default=True,
              help="the Slurm release (bookworm: also the Hugging Face setups, with this machine's torch)")
@click.option("--seed", type=int, default=1, show_default=True,
              help="the first run's seed; run i has seed+i, and one seed replays one run (--runs 1)")
@click.option("--runs", type=click.IntRange(1), help="this many runs  [default: until --faults or --duration]")
@click.option("--faults", type=click.IntRange(1), help="start runs until this many faults were applied")
@click.option("--duration", type=click.FloatRange(1), help="start no run after this many minutes")
@click.option("--setup", "setup", help="fix setup axes, e.g. trainer=own,ranks=2,launcher=run,output=append,"
                                       "signal=1,gc=0 (the others are drawn from the seed)")
@click.option("--mode", type=click.Choice(["naive", "dispatch", "both"]), default="both", show_default=True)
@click.option("--steps", type=click.IntRange(20), default=480, show_default=True,
              help="training steps of a run (0.25 s each; a save every 20)")
@click.option("--kind", "kinds", multiple=True, help="draw faults among these kinds only (repeat; default: all of "
                                                      "timelimit, cancel, preempt, requeue, partition, partition-long, "
                                                      "crash, stall, enospc, ctld-restart, stray, slurmd-stop)")
@click.option("--tracking", type=click.Choice(["linuxproc", "cgroup"]), help="docker-slurm's process tracking")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write every run's result as JSON")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), help="a PNG per run into this folder "
                                                                            "(needs matplotlib)")
@click.option("--keep", "keep_dir", type=click.Path(file_okay=False),
              help="copy each run's files (root, trainer log, job output) here when something happened")
@click.option("--table", "table_path", type=click.Path(dir_okay=False),
              help="write the campaign's table for docs/evidence.md (markdown)")
@click.option("--from-json", "from_json", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="run nothing: print the summary (and --table) of a campaign's --json (repeat: campaigns run "
                   "side by side, as one); with --keep, check its runs again from the kept files first (and --json "
                   "writes the result)")
@click.option("--dry-run", is_flag=True, help="print each run's setup and fault schedule (as if every fault hit), "
                                              "start nothing")
def campaign(suite, seed, runs, faults, duration, setup, mode, steps, kinds, tracking, json_path, plot_dir, keep_dir,
             table_path, from_json, dry_run):
    """The fault campaign: runs under a seeded schedule of overlapping faults (time limits,
    scancel, preemption, requeue, partitions, node crashes, stalls, a full filesystem,
    slurmctld restarts, stray files in pub/), dispatch-slurm beside one shared folder, each
    judged by an independent checker; prints every anomaly with its seed, class and the
    command that replays it, then the goodput of both modes beside Young/Daly's."""
    from pathlib import Path

    from . import campaign as camp
    if from_json:
        done = []
        for path in from_json:
            with open(path) as f:
                done += json.load(f)
        if keep_dir:  # check again from the kept files (the checker changed since)
            done = camp.rejudge(done, Path(keep_dir))
            if json_path:
                with open(json_path, "w") as f:
                    json.dump(done, f, indent=1, default=str)
        click.echo(camp.summarize(done))
        if table_path:
            Path(table_path).write_text(camp.evidence(done) + "\n")
        return
    if not (runs or faults or duration):
        runs = 1
    fixed = camp.parse_setup(setup)
    unknown = sorted(set(kinds) - set(camp.KINDS))
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: one of {', '.join(camp.KINDS)}", param_hint="--kind")
    if plot_dir:
        trialmod.pyplot()  # refuse before hours of runs, not after
        Path(plot_dir).mkdir(parents=True, exist_ok=True)
    if keep_dir:
        Path(keep_dir).mkdir(parents=True, exist_ok=True)
    modes = ("dispatch", "naive") if mode == "both" else (mode,)
    params = camp.Params(steps=steps, hf_steps=min(steps, 240), kinds=tuple(kinds) or None)
    if dry_run:
        click.echo(camp.plan(suite, seed, runs, faults, fixed, params))
        return
    results: list = []

    def save() -> None:
        if json_path:
            with open(json_path, "w") as f:
                json.dump(results, f, indent=1, default=str)

    camp.run(suite=suite, setup_text=setup or "", profile="fast", seed=seed, runs=runs, faults=faults,
             duration=duration * 60 if duration else None, modes=modes, fixed=fixed, params=params,
             say=lambda m: click.echo(m, err=True), plot_dir=Path(plot_dir) if plot_dir else None,
             keep=Path(keep_dir) if keep_dir else None, tracking=tracking, results=results, each=save)
    save()
    click.echo(camp.summarize(results))
    if table_path:
        Path(table_path).write_text(camp.evidence(results) + "\n")
    dispatch_anomalies = sum(len(r["modes"].get("dispatch", {}).get("anomalies", [])) for r in results)
    sys.exit(1 if dispatch_anomalies else 0)


if __name__ == "__main__":
    try:
        main(standalone_mode=True)
    except DispatchError as e:
        sys.exit(f"testbed: error: {e}")
