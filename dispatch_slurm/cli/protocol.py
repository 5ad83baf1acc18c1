"""The protocol's commands: publish, latest, ls, epoch."""

import json
import os
import sys

import click

from .. import store
from ..contract import epoch as epochmod
from ..contract import layout
from ..store import retention
from . import common


@click.command()
@click.argument("save", type=click.Path())
@click.option("--step", type=click.IntRange(0), help="training step  [default: from a checkpoint-<step> name]")
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


@click.command()
@common.root_argument()
@click.option("--path", "path_only", is_flag=True, help="print only the save's absolute path")
@click.option("--json", "as_json", is_flag=True)
@click.option("--resume", is_flag=True, help="for a resume argument: print the path, or nothing (exit 0) "
              "when nothing is published yet; any error still exits 2")
def latest(root, path_only, as_json, resume):
    """The latest publication of ROOT: the greatest (epoch, step).

    Exit 0 found, 1 none published yet, 2 error (e.g. an entry that does not parse).
    With --resume, "none yet" is exit 0 with no output, so a job script can write
    --resume-from "$(dispatch-slurm latest --resume)" and still stop on an error."""
    pub = store.latest(root)
    if pub is None:
        if as_json:
            click.echo("null")
        if not resume:
            click.echo(f"dispatch-slurm: nothing published under {root}/{layout.PUB} yet", err=True)
        sys.exit(0 if resume else 1)
    if path_only or resume:
        common.echo_path(os.path.join(root, pub.path))
    elif as_json:
        click.echo(json.dumps(common.publication_json(root, pub)))
    else:
        g, n, r = pub.parts
        click.echo(f"{common.text(os.path.join(root, pub.path))}\tstep {pub.step}\tG={g} N={n} R={r}")


@click.command("ls")
@common.root_argument()
@click.option("--json", "as_json", is_flag=True)
def ls_(root, as_json):
    """Every publication of ROOT in (epoch, step) order: whether its save still exists,
    its size on disk and its state (latest, kept, or retired by gc); then, on stderr,
    unpublished saves and what gc can reclaim (`dispatch-slurm gc --dry-run` says more).
    On an s3:// root the size is the bytes stored."""
    saves = {r["path"]: r for r in retention.state(root)}
    pubs, rows = store.publications(root), []
    for p in pubs:
        d = common.publication_json(root, p)
        retired = p.name in saves[p.path]["retired"]
        d.update(state="retired" if retired else "latest" if p == pubs[-1] else "kept")
        d.update(exists=saves[p.path]["exists"], size=saves[p.path]["size"], why=saves[p.path]["why"])
        rows.append(d)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    head = ("G", "N", "R", "STEP", "EXISTS", "SIZE", "STATE", "PATH")
    table = [head] + [(str(d["generation"]), str(d["submission"]), str(d["restart"]), str(d["step"]),
                       "yes" if d["exists"] else "NO", common.size(d["size"]),
                       d["state"], common.text(d["path"])) for d in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    for row in table:
        click.echo("  ".join([c.rjust(w) for c, w in zip(row, widths)] + [row[-1]]))
    if not rows:
        click.echo(f"(no publication under {root}/{layout.PUB})", err=True)
    click.echo(common.retention_summary(saves.values()), err=True)


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


COMMANDS = (publish, latest, ls_, epoch)
