"""The view's two commands, which the SPANK plugin runs as the job user (view.py)."""

import os
import sys

import click

from ..contract.env import Execution


@click.group()
def view():
    """The view's two halves, run by the SPANK plugin for a job submitted with
    --dispatch-view=DIR, as the job user, on each node before each step's tasks: `prepare`,
    then `publish` (detached). DIR is the folder the trainer already uses; in every task it is
    the execution's own folder, $DISPATCH_EXEC_DIR.

    Without the plugin (plain sbatch, `env --local`) there is no view: use the README's job
    script (eval "$(dispatch-slurm env)", latest --resume, watch)."""


def _execution() -> Execution:
    ex = Execution.current()
    if ex.view is None:
        raise click.UsageError("DISPATCH_VIEW is not set: the SPANK plugin sets it for a job submitted with "
                               "--dispatch-view=DIR; without the plugin there is no view (use the README's job "
                               "script: eval \"$(dispatch-slurm env)\", latest --resume, watch)")
    return ex


@view.command()
def prepare():
    """Before the execution's first task: put the latest publication into its folder under
    the name its trainer looks for (clones, else hard links to the published, read-only
    files: a write into them fails), and the framework's pointer beside it (DeepSpeed's
    `latest`, Megatron's tracker, Lightning's last-v0.ckpt for ckpt_path="last"). Once per
    execution: a later step's, or another node's, changes nothing. Exit 0, or 2 with one line
    naming the fix."""
    from .. import view as viewmod
    sys.exit(viewmod.prepare(_execution()))


@view.command()
@click.option("--once", is_flag=True, help="one scan, then exit (the Epilog's, once the processes are gone)")
def publish(once):
    """Publish each save of the execution's folder once its framework completed it (the rule
    told from the save's layout), never what `prepare` placed; until the execution's processes
    on this node are gone (SIGTERM is ignored: the save of the grace window comes after it).
    One per node and execution publishes: a later step's finds it running and waits as its
    standby (taking over if it ends first), exit 0 once the execution's processes on this node
    are gone. Exit 1 when it
    leaves saves unpublished above the last one published (each is named on stderr)."""
    from .. import view as viewmod
    ex = _execution()
    rc = viewmod.publisher(ex, once=once)
    if ex.view_step_end and not once:
        # the plugin's publisher: the step's end waits for this process, and the interpreter's
        # shutdown (its modules torn down, ~15 ms) publishes nothing
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
