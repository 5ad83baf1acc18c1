"""`dispatch-slurm doctor` (the doctor package: will the save signal reach every rank in
time?) and `launch` (runtime/launch.py: the launcher wrapper that keeps torchrun's 30 s kill
and exit status from losing a save): the commands' options, over those modules.
Exit 0: nothing found; 1: findings (each with its fix); 2: an error."""

import os
import sys

import click

from ..contract.signals import parse_signal
from ..errors import DispatchError
from . import common, options


def _signal(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_signal(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--script", type=click.Path(exists=True, dir_okay=False), help="the sbatch script: its "
              "#SBATCH --signal and how it starts the trainer (srun, torchrun, accelerate launch, exec, trap)")
@click.option("--signal", "sig", metavar=options.SIGNAL_METAVAR, callback=_signal,
              help="the job's --signal, as sbatch takes it (over the script's), e.g. TERM@90 or B:USR2@120")
@click.option("--where", type=click.Choice(["step", "shell"]), help="where the trainer runs: an srun step, "
              "or the batch shell itself  [default: from --script, else step]")
@click.option("--launcher", type=click.Choice(["none", "torchrun", "accelerate"]),
              help="the launcher between Slurm and the ranks  [default: from --script, else none]")
@click.option("--wrapped/--not-wrapped", default=None, help="the launcher runs under `dispatch-slurm launch`")
@click.option("--processes", type=click.IntRange(1), help="accelerate launch's --num_processes")
@options.grace_option("the grace the handler counts on", fractions=True, envvar="DISPATCH_GRACE_S", show_envvar=True)
@options.duration_option("--save-seconds", help_="a save's measured duration (else: measured by the rehearsal)")
@click.option("--partition", help="the partition whose GraceTime and PreemptMode count  "
              "[default: $SLURM_JOB_PARTITION, else the default partition]")
@click.option("--slurm/--no-slurm", "use_slurm", default=None, help="read scontrol show config/partition  "
              "[default: when scontrol is on PATH]")
@options.duration_option("--kill-wait", help_="KillWait, over Slurm's (30 s without Slurm)")
@options.duration_option("--grace-time", help_="the partition's GraceTime, over Slurm's")
@click.option("--preempt-mode", help="PreemptMode, over Slurm's (OFF without Slurm), e.g. REQUEUE")
@click.option("--send-user-signal/--no-send-user-signal", default=None,
              help="PreemptParameters=send_user_signal, over Slurm's")
@click.option("--preempt", is_flag=True, help="rehearse a preemption (SIGTERM, or the job's signal with "
              "send_user_signal, then the kill when GraceTime ends) instead of the time limit")
@click.option("--every-process", is_flag=True, help="rehearsal: signal every process of COMMAND, as linuxproc "
              "tracking does  [default: its first process only, as cgroup tracking does]")
@click.option("--ranks", type=click.IntRange(1), default=1, show_default=True,
              help="the ranks whose handlers must report")
@options.duration_option("--ready-timeout", minimum=0.1, maximum=3600, default=120, show_default=True,
                         help_="how long to wait for every rank's handler before signalling anyway")
@click.option("--job", "job_id", type=click.IntRange(1), help="rehearse on this running job: scancel sends "
              "the signal as Slurm will (the job ends)")
@click.option("--probe-dir", type=click.Path(file_okay=False), help="where the handlers record (--job: "
              "default: the job's $DISPATCH_EXEC_DIR/dispatch-probe under --root)")
@common.root_option("the job's checkpoint root (--job)")
@click.option("--json", "as_json", is_flag=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def doctor(as_json, **ask):
    """Check that the save signal reaches every rank and the save fits, before the first
    preemption or time limit does. Names each misconfiguration with its one-line fix.
    Exit 0: nothing found, 1: findings, 2: an error.

    \b
    The wiring only (Slurm's config, the job script):
        dispatch-slurm doctor --script train.sbatch
    A local rehearsal (no Slurm: COMMAND plays an srun task and is signalled as Slurm
    signals one: its own process, T s later SIGTERM again, KillWait later SIGKILL):
        dispatch-slurm doctor --signal TERM@20 --kill-wait 5 --ranks 2 -- \\
            torchrun --nproc-per-node 2 train.py
    A running test job (it ends; every rank's handler records under --root):
        dispatch-slurm doctor --script train.sbatch --job 1234 --ranks 4 --root /scratch/me/run1"""
    from .. import doctor as doctor_  # loaded only when the command runs
    try:
        found = doctor_.diagnose(doctor_.Ask(**ask))  # every other option is a field of Ask, by its name
    except doctor_.UsageError as e:
        raise click.UsageError(str(e)) from None
    if as_json:
        click.echo(found.json())
    else:
        click.echo(found.text(), nl=False)
    sys.exit(1 if found.findings else 0)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--signal", "sigs", metavar=options.SIGNAL_METAVAR, multiple=True, envvar="DISPATCH_SIGNAL",
              show_envvar=True, callback=options.launch_signals, help="a save signal besides SIGTERM: the job's "
              "--signal, as sbatch takes it (only SIG matters here); once per signal")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def launch(sigs, command):
    """Run a launcher (torchrun, accelerate launch, python) so that a save signal reaches
    every rank, torchrun does not SIGKILL them 30 s later, and a saved preemption exits 0.

    \b
        srun --ntasks-per-node=1 dispatch-slurm launch -- torchrun --nproc-per-node 4 train.py
        dispatch-slurm launch --signal USR2 -- accelerate launch train.py"""
    from ..runtime.launch import launch as run
    env = dict(os.environ)
    if sigs:
        env["DISPATCH_SIGNAL"] = sigs
    try:
        code = run(list(command), env)
    except FileNotFoundError as e:
        raise DispatchError(f"cannot run {command[0]!r}: {e.strerror}") from None
    except (AttributeError, ValueError) as e:
        raise DispatchError(f"--signal {sigs!r}: not a signal ({e})") from None
    sys.exit(code)


