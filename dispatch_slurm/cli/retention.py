"""Retention: `gc`, which removes the saves a policy does not keep, safely; `retire`,
a person's word that a publication is not to be resumed from."""

import getpass
import json
import os
import socket
import sys

import click

from .. import retention, store
from ..contract.names import STEP_PATTERN
from ..report.render import plural, size
from ..retention import GONE, KEEP, REMOVE, Policy
from ..supervisor.record import Record
from . import common, options


def _say_pins(st: store.Store, pin: tuple, unpin: tuple) -> None:
    """Every path checked before any pin is written or dropped: one bad path changes nothing."""
    with st:
        for save in pin:
            st.save_relpath(save)
        for save in unpin:
            st.relpath(save)
    for save in pin:
        rel, new = retention.pin(st, save)
        click.echo(f"dispatch-slurm: {'pinned' if new else 'already pinned'}: {common.text(rel)}", err=True)
    for save in unpin:
        rel, was = retention.unpin(st, save)
        click.echo(f"dispatch-slurm: {'unpinned' if was else 'was not pinned'}: {common.text(rel)}", err=True)


def _summary(verdicts, dry_run: bool) -> str:
    gone = [v for v in verdicts if v.action == REMOVE]
    kept = [v for v in verdicts if v.action == KEEP and v.save.exists]
    waiting = [v for v in kept if v.waiting]
    did = "would remove" if dry_run else "removed"
    freed = sum(v.save.size if dry_run else v.freed for v in gone)
    rotated = sum(not v.save.exists for v in gone)
    return (f"dispatch-slurm gc: {did} {plural(len(gone) - rotated, 'save')} ({size(freed)}) and "
            f"{'would retire' if dry_run else 'retired'} {plural(rotated, 'publication')} whose save was already "
            f"gone; kept {plural(len(kept), 'save')} ({size(sum(v.save.size for v in kept))}), "
            f"{len(waiting)} of them ({size(sum(v.save.size for v in waiting))}) only until their "
            "execution has ceased and gone quiet")


@click.command(cls=common.RootCommand, epilog=common.ROOT_HELP)
@common.root_argument(required=False)
@click.option("--keep-last", type=click.IntRange(1), metavar="K",
              help="keep the K newest saves that still exist (the latest is always kept)")
@click.option("--keep-every", type=click.IntRange(1), metavar="N",
              help="also keep the first save of every window of N steps")
@options.duration_option("--min-age", default=60.0, show_default=True,
                         help_="an exec folder modified more recently is still being written: kept")
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
    ceased (every node that ran it recorded its Epilog, which the root alone shows for
    plugin jobs, or as `dispatch-slurm ceased` says) and quiet for --min-age; never the
    latest publication's save, a pinned save or through a symlink. An execution of
    `env --local` is shown ceased by its processes: every one the root records for it is
    gone from this host (Slurm is not asked). --dry-run without --keep-last shows the
    root's own policy (the supervisor's `run --keep-last`, else every published save kept).

        dispatch-slurm gc /scratch/me/run1 --keep-last 2 --keep-every 1000 --dry-run"""
    if keep_last is None and not (pin or unpin or dry_run):
        raise click.UsageError("say how many saves to keep: --keep-last K (and --keep-every N to keep milestones); "
                               "--dry-run alone shows the root's own policy")
    st = store.at(root)  # the one store every look at the root goes through
    facts = Record(st).read()
    shown = keep_last is None and dry_run
    if shown:  # the dry run shows the root's own policy: the supervisor's `run --keep-last`, else none
        keep_last = retention.recorded_keep_last(facts)
    # every option checked before anything is pinned: bad input changes nothing
    policy = Policy(keep_last=keep_last, keep_every=keep_every, min_age=min_age, pattern=pattern)
    _say_pins(st, pin, unpin)
    if keep_last is None and not shown:
        return
    if shown:
        click.echo("dispatch-slurm gc: no --keep-last given; showing " + (
            f"the root's own policy (`run --keep-last {keep_last}`)" if keep_last else
            "the default: every published save kept (no --keep-last), unpublished saves of ceased executions "
            "removed") + "; pass --keep-last K to choose", err=True)
    _show(st, retention.gc(st, policy, said=said, dry_run=dry_run, facts=facts), dry_run, as_json)


def _show(st: store.Store, verdicts, dry_run: bool, as_json: bool) -> None:
    """gc's answer: every save's verdict (a table, or JSON), then the summary on stderr."""
    if as_json:
        latest = st.latest()
        click.echo(json.dumps([v.as_dict(latest) for v in verdicts], indent=2))
    else:
        did = {KEEP: "keep", REMOVE: "would remove" if dry_run else "removed"}
        rows = [(did[v.action] if v.save.exists or v.action == KEEP else "retire" if dry_run else "retired",
                 size(v.save.size), common.text(v.save.path), v.why) for v in verdicts if v.action != GONE]
        widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
        for r in rows:
            click.echo("  ".join([r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2]), r[3]]))
    click.echo(_summary(verdicts, dry_run), err=True)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a container)
        return f"uid {os.getuid()}"


@click.command(cls=common.RootCommand, epilog=common.ROOT_HELP)
@common.root_argument()
@click.argument("name", required=False)
@click.option("--latest", "latest_", is_flag=True, help="retire the publication `dispatch-slurm latest` names "
              "(or a latest gc retired, which `latest` refuses)")
@click.option("--message", "-m", "reason", required=True, help="why (kept in the marker and the event)")
@click.option("--json", "as_json", is_flag=True)
def retire(root, name, latest_, reason, as_json):
    """Retire one publication of ROOT on purpose: NAME (an entry of ROOT/pub/, as
    `dispatch-slurm ls ROOT --json` names it; pub/NAME or its full path also do), or
    --latest. `latest` then names the previous publication not retired, and gc removes
    the retired save once its execution has ceased (pin it with `gc --pin` to keep it).

    It writes ROOT/retired/NAME holding who and why (gc's own markers are empty) and a
    `retired` event; pub/ is never touched, and a retirement is never undone. Stop the
    job first when retiring its latest save: a running execution keeps publishing.

    \b
        dispatch-slurm retire /scratch/me/run1 --latest -m "loss diverged after step 5000"

    Exit 0 retired (or already retired), 2 error."""
    if (name is None) == (not latest_):
        raise click.UsageError("name one publication (NAME) or pass --latest, not both")
    res = retention.retire(root, name, reason, _user(), socket.gethostname())
    now = res["latest"]
    if as_json:
        click.echo(json.dumps({**{k: v for k, v in res.items() if k != "latest"}, "root": root,
                               "latest": None if now is None else common.publication_json(root, now)}))
        return
    what = f"step {res['step']} ({common.text(res['path'])}, pub/{res['name']})"
    if res["already"]:
        click.echo(f"already retired by {res['already']['by']} ({common.text(res['already']['reason'])}): {what}")
    else:
        click.echo(f"retired {what}: {common.text(reason)}")
    if now is None:
        click.echo("dispatch-slurm: no publication is left to resume from: the next execution starts from step 0",
                   err=True)
    else:
        gone = "" if store.save_exists(root, now.path) else \
            f" (its save no longer exists: `dispatch-slurm retire {common.text(root)} --latest` again, or restore it)"
        click.echo(f"latest is now step {now.step} ({common.text(now.path)}){gone}")
    sys.stdout.flush()


