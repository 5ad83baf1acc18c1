"""The protocol's commands: publish, latest, ls, epoch."""

import json
import os
import sys

import click

from .. import store
from ..contract import epoch as epochmod
from ..contract import layout, names
from ..contract.env import Execution
from ..errors import DispatchError
from . import common


@click.command()
@click.argument("save", type=click.Path())
@click.option("--step", type=click.IntRange(0, names.STEP_MAX), help="training step; a checkpoint-<step> name must agree (unless "
              "--adopt)  [default: from a checkpoint-<step> name]")
@common.root_option()
@common.epoch_option()
@click.option("--adopt", is_flag=True, help="publish a save this execution did not write (e.g. an older "
              "execution's) as its own; recorded in the event")
@click.option("--no-sync", is_flag=True, help="do not fsync the save's files first (they are already durable)")
@click.option("--json", "as_json", is_flag=True, help="print the publication as JSON")
def publish(save, step, root, epoch_, adopt, no_sync, as_json):
    """Publish SAVE (a folder or file in this execution's exec folder) at (epoch, step).

    The save is fsynced, then its publication; durable when this returns. Publishing
    the same save again confirms its durability once more (exit 0, "already published")."""
    res = store.publish(save, step, root=root, epoch=epoch_, by="publish", sync=not no_sync, adopt=adopt)
    pub = res.publication
    if adopt and res.adopted:
        click.echo(f"dispatch-slurm: adopted {common.text(pub.path)} as a save of epoch {pub.epoch}", err=True)
    if as_json:
        click.echo(json.dumps({**common.publication_json(store.env_root(root), pub), "existed": res.existed}))
    else:
        what = "already published (durability confirmed)" if res.existed else "published"
        click.echo(f"{what}: step {pub.step} of {common.text(pub.path)} at epoch {pub.epoch} as {layout.PUB}/{pub.name}")


def _refused(root: str, error: Exception) -> None:
    """Record, as an event of this execution (its first rank), that its resume was refused
    and why: the supervisor tells a refusal that repeats from one worth another try by it
    (its job's output is no fact it reads)."""
    ex = Execution.current(root=root)
    if ex.attempt and ex.rank in (None, 0):
        store.events.record("warning", root=root, kind="refused", by="latest --resume", message=str(error))


@click.command(cls=common.RootCommand, epilog=common.ROOT_HELP)
@common.root_argument(required=False)
@click.option("--path", "path_only", is_flag=True, help="print only the save's absolute path")
@click.option("--json", "as_json", is_flag=True)
@click.option("--resume", is_flag=True, help="for a resume point: print the path, or nothing (exit 0) "
              "when nothing is published yet; any error still exits 2")
def latest(root, path_only, as_json, resume):
    """The latest publication of ROOT: the greatest (epoch, step) not retired by a
    person (`dispatch-slurm retire`), and its save, which must still exist.

    Exit 0 found, 1 none published yet, 2 error (an entry of pub/ that does not parse,
    a latest save that no longer exists: the message names the fix). With --resume,
    "none yet" is exit 0 with no output, and inside a job the path printed is the
    execution's own copy of the save (in its dispatch-resume/: clones, else links to the
    published, read-only files), which an older execution still running cannot remove by
    rotating its saves, and through which no write reaches the published save. In a job script
    assign it to a variable first: `set -e` stops the script when an assignment fails,
    not when a command substitution inside an argument does.

    \b
        resume=$(dispatch-slurm latest --resume)
        srun python train.py ${resume:+--resume-from "$resume"}"""
    if resume:  # inside an execution: its private copy of the save (store/resume.py says why)
        try:
            store.execdir.check_current(root)  # refused as resume_point() refuses, before any copy
            pub, path = store.resume_from(root)
        except (DispatchError, OSError) as e:
            _refused(root, e)
            raise
        store.resumed(root, pub, "latest --resume", path)
    else:  # the save's own path, or its publication's held links once the trainer removed it
        pub, where = store.located(root)
        path = None if where is None else os.path.join(root, where)
    if pub is None:
        store.unpublished.check(root, by="latest")  # saves nothing published: said, never silent
        if as_json:
            click.echo("null")
        if not resume:
            click.echo(f"dispatch-slurm: nothing published under {common.text(root)}/{layout.PUB} yet", err=True)
        sys.exit(0 if resume else 1)
    if path_only or resume:
        common.echo_path(path or os.path.join(root, pub.path))
    elif as_json:
        click.echo(json.dumps(common.publication_json(root, pub)))
    else:
        g, n, r = pub.parts
        click.echo(f"{common.text(path or os.path.join(root, pub.path))}\tstep {pub.step}\tG={g} N={n} R={r}")


def _state(p, inv, exists: bool) -> tuple[str, str | None, str | None]:
    """(state, retired by, reason) of one publication in `ls`."""
    if p.name in inv.retired:
        who = inv.by_person.get(p.name)
        return "retired", who["by"] if who else "gc", who["reason"] if who else None
    if inv.latest is not None and p.name == inv.latest.name:
        return "latest", None, None
    return ("kept" if exists else "gone"), None, None


@click.command("ls", cls=common.RootCommand, epilog=common.ROOT_HELP)
@common.root_argument(required=False)
@click.option("--json", "as_json", is_flag=True)
def ls_(root, as_json):
    """Every publication of ROOT in (epoch, step) order: whether its save still exists,
    its size on disk and its state: latest (what `latest` names), kept, gone (the save no
    longer exists: the trainer's rotation removed it) or retired (by gc, or by a person
    with `dispatch-slurm retire`); then, on stderr, unpublished saves and what gc can
    reclaim (`dispatch-slurm gc --dry-run` says more). On an s3:// root the size is the
    bytes stored. EXISTS "held": the execution's folder no longer holds the save (its
    rotation), the publication's own links to its files do."""
    from .. import retention
    from ..report.render import size
    inv, state = retention.scan_state(root)
    saves = {r["path"]: r for r in state}
    pubs, rows = sorted((p for s in inv.saves.values() for p in s.pubs), key=lambda p: p.name), []
    for p in pubs:
        d = common.publication_json(root, p)
        st, by, reason = _state(p, inv, saves[p.path]["exists"])
        d.update(state=st, retired_by=by, reason=reason)
        d.update(exists=saves[p.path]["exists"], held_only=saves[p.path]["held_only"], size=saves[p.path]["size"],
                 why=saves[p.path]["why"])
        rows.append(d)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _ls_table(rows, size)
    if not rows:
        click.echo(f"(no publication under {common.text(root)}/{layout.PUB})", err=True)
    for d in rows:
        if d["reason"] is not None:
            click.echo(f"retired by {d['retired_by']}: step {d['step']} ({common.text(d['path'])}): "
                       f"{common.text(d['reason'])}", err=True)
    top = inv.latest
    if top is not None and top.name in inv.retired:
        click.echo(f"dispatch-slurm: the latest publication (step {top.step}) is retired by gc, which never "
                   "retires the latest: `latest` refuses it; to resume from the previous one: "
                   f"dispatch-slurm retire {common.text(root)} --latest -m REASON", err=True)
    elif top is not None and not saves[top.path]["exists"]:
        click.echo(f"dispatch-slurm: the latest publication's save {common.text(top.path)} no longer exists: "
                   "`latest` refuses it; to resume from the previous publication: "
                   f"dispatch-slurm retire {common.text(root)} --latest -m 'save vanished'", err=True)
    click.echo(common.retention_summary(saves.values()), err=True)


def _ls_table(rows: list[dict], size) -> None:
    head = ("G", "N", "R", "STEP", "EXISTS", "SIZE", "STATE", "PATH")
    table = [head] + [(str(d["generation"]), str(d["submission"]), str(d["restart"]), str(d["step"]),
                       ("held" if d["held_only"] else "yes") if d["exists"] else "NO", size(d["size"]),
                       d["state"] + (f" by {d['retired_by']}" if d["retired_by"] else ""),
                       common.text(d["path"])) for d in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    for row in table:
        click.echo("  ".join([c.rjust(w) for c, w in zip(row, widths)] + [row[-1]]))


@click.group()
def epoch():
    """Compose or decompose DISPATCH_EPOCH = G*10^12 + N*10^6 + R."""


@epoch.command()
@click.argument("generation", type=int)
@click.argument("submission", type=int)
@click.argument("restart", type=int)
def compose(generation, submission, restart):
    """Print the epoch of (G, N, R)."""
    click.echo(epochmod.compose(generation, submission, restart))


@epoch.command()
@click.argument("value", type=common.EpochType())
@click.option("--json", "as_json", is_flag=True)
def decompose(value, as_json):
    """Print G N R of an epoch."""
    g, n, r = epochmod.decompose(value)
    if as_json:
        click.echo(json.dumps({"generation": g, "submission": n, "restart": r}))
    else:
        click.echo(f"G={g} N={n} R={r}")


