"""Retention: `gc`, which removes the saves a policy does not keep, safely."""

import json

import click

from .. import store
from ..contract.names import STEP_PATTERN
from ..contract.retention import GONE, KEEP, REMOVE, Policy
from ..store import retention as store_gc
from ..supervisor import retention
from . import common


def _say_pins(root: str, pin: tuple, unpin: tuple) -> None:
    for save in pin:
        rel, new = store_gc.pin(root, save)
        click.echo(f"dispatch-slurm: {'pinned' if new else 'already pinned'}: {common.text(rel)}", err=True)
    for save in unpin:
        rel, was = store_gc.unpin(root, save)
        click.echo(f"dispatch-slurm: {'unpinned' if was else 'was not pinned'}: {common.text(rel)}", err=True)


def _summary(verdicts, dry_run: bool) -> str:
    gone = [v for v in verdicts if v.action == REMOVE]
    kept = [v for v in verdicts if v.action == KEEP and v.save.exists]
    waiting = [v for v in kept if v.waiting]
    did = "would remove" if dry_run else "removed"
    freed = sum(v.save.size if dry_run else v.freed for v in gone)
    rotated = sum(not v.save.exists for v in gone)
    return (f"dispatch-slurm gc: {did} {len(gone) - rotated} saves ({common.size(freed)}) and "
            f"{'would retire' if dry_run else 'retired'} {rotated} publications whose save was already gone; "
            f"kept {len(kept)} saves "
            f"({common.size(sum(v.save.size for v in kept))}), {len(waiting)} of them "
            f"({common.size(sum(v.save.size for v in waiting))}) only until their execution has ceased and "
            "gone quiet")


@click.command()
@common.root_argument()
@click.option("--keep-last", type=click.IntRange(1), metavar="K",
              help="keep the K newest saves that still exist (the latest is always kept)")
@click.option("--keep-every", type=click.IntRange(1), metavar="N",
              help="also keep the first save of every window of N steps")
@click.option("--min-age", type=click.FloatRange(0), default=60.0, show_default=True, metavar="SECONDS",
              help="an exec folder modified more recently is still being written: kept")
@click.option("--pin", multiple=True, type=click.Path(), metavar="SAVE",
              help="pin SAVE (or a folder of saves) first: gc never removes it")
@click.option("--unpin", multiple=True, type=click.Path(), metavar="SAVE", help="drop the pin of SAVE first")
@click.option("--ceased", "said", multiple=True, metavar="ATTEMPT",
              help="a person's word that execution ATTEMPT (a name under exec/) has ceased; recorded as an event")
@click.option("--pattern", default=STEP_PATTERN, show_default=True,
              help="how an unpublished save in an exec folder is named (one group: the step)")
@click.option("--dry-run", is_flag=True, help="print what would be removed and why; remove nothing")
@click.option("--json", "as_json", is_flag=True, help="every save's verdict as JSON")
def gc(root, keep_last, keep_every, min_age, pin, unpin, said, pattern, dry_run, as_json):
    """Remove the saves of ROOT the policy does not keep: published saves past
    --keep-last/--keep-every (their publications are retired first, under ROOT/retired/),
    and saves an execution never published. Only saves of executions shown to have
    ceased (Epilog records or a reboot, as `dispatch-slurm ceased` says) and quiet for
    --min-age; never the latest publication's save, a pinned save or through a symlink.

        dispatch-slurm gc /scratch/me/run1 --keep-last 2 --keep-every 1000 --dry-run"""
    _say_pins(root, pin, unpin)
    if keep_last is None:
        if pin or unpin:
            return
        raise click.UsageError("say how many saves to keep: --keep-last K (and --keep-every N to keep milestones)")
    policy = Policy(keep_last=keep_last, keep_every=keep_every, min_age=min_age, pattern=pattern)
    verdicts = retention.gc(root, policy, said=said, dry_run=dry_run)
    if as_json:
        latest = store.latest(root)
        click.echo(json.dumps([v.as_dict(latest) for v in verdicts], indent=2))
    else:
        did = {KEEP: "keep", REMOVE: "would remove" if dry_run else "removed"}
        rows = [(did[v.action] if v.save.exists or v.action == KEEP else "retire" if dry_run else "retired",
                 common.size(v.save.size), common.text(v.save.path), v.why) for v in verdicts if v.action != GONE]
        widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
        for r in rows:
            click.echo("  ".join([r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2]), r[3]]))
    click.echo(_summary(verdicts, dry_run), err=True)


COMMANDS = (gc,)
