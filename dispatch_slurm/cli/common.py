"""What every command shares: the root convention, the DISPATCH_* fallbacks, output.

Root convention: a command about a root takes it as its first argument, ROOT (run,
plan, supersede, release, stop, latest, ls, submit); a command about something inside
a root takes ``--root`` (publish SAVE, watch, ceased JOBID). Either falls back to
$DISPATCH_CHECKPOINT where it may be omitted. Every fallback to a DISPATCH_* variable
is click's ``envvar=``, so ``--help`` names the variable."""

import os
import sys

import click

from ..contract import names
from ..contract.epoch import EPOCH_MAX, parse_part
from ..errors import DispatchError


def root_argument(required: bool = True):
    """ROOT, from $DISPATCH_CHECKPOINT when omitted."""
    return click.argument("root", envvar="DISPATCH_CHECKPOINT", required=required, callback=_normalize_root)


def root_option(help_: str = "checkpoint root"):
    return click.option("--root", envvar="DISPATCH_CHECKPOINT", show_envvar=True, help=help_)


def finite(ctx, param, value):
    """A number option must be a real number: nan passes click's range checks."""
    if value is not None and value != value:
        raise click.BadParameter(f"{value} is not a number", ctx=ctx, param=param)
    return value


def _normalize_root(ctx, param, value):
    if value is not None and value.startswith(names.S3_SCHEME):
        return names.normalize_root(value)  # checked, never rewritten into another prefix
    return value if value is None else value.rstrip("/") or "/"


class EpochType(click.ParamType):
    """An epoch, read with the contract's own rule (digits only, bounds)."""

    name = "EPOCH"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_part("epoch", str(value), 0, EPOCH_MAX)
        except DispatchError as e:
            self.fail(str(e), param, ctx)


def epoch_option():
    return click.option("--epoch", "epoch_", type=EpochType(), envvar="DISPATCH_EPOCH", show_envvar=True,
                        help="this execution's epoch")


def echo_path(path: str) -> None:
    """Print a path exactly as the filesystem has it (a non-UTF-8 name is printed as its
    bytes, not as an encoding error), for `$(dispatch-slurm latest --path)`."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        click.echo(path)
        return
    sys.stdout.flush()
    out.write(os.fsencode(path) + b"\n")
    out.flush()


def text(value: str) -> str:
    """A value that may hold undecodable bytes, printable on any terminal."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(value, str) else value


def publication_json(root: str, p: names.Publication) -> dict:
    g, n, r = p.parts
    return {"name": p.name, "epoch": p.epoch, "generation": g, "submission": n, "restart": r,
            "step": p.step, "path": p.path, "abspath": os.path.join(root, p.path)}


def size(n: float) -> str:
    """Bytes for people, one word (a table column): 512B, 4.0KB, 50.0MB, 1.2GB (powers of
    1000, as df -H)."""
    if n < 1000:
        return f"{n}B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f}{unit}"
    return f"{n / 1000:.1f}TB"


def retention_summary(saves) -> str:
    """One paragraph: what is kept, retired and reclaimable, with sizes (``ls``, ``gc``)."""
    def total(pred):
        rows = [r for r in saves if pred(r)]
        return len(rows), size(sum(r["size"] for r in rows))
    kept = total(lambda r: r["state"] == "kept")
    unpublished = total(lambda r: not r["publications"] and not r["retired"])
    retired = total(lambda r: r["retired"])
    reclaimable = total(lambda r: r["state"] == "reclaimable")
    return (f"kept: {kept[0]} saves, {kept[1]} (unpublished among them: {unpublished[0]}, {unpublished[1]}); "
            f"retired: {retired[0]} saves, {retired[1]} still on disk; reclaimable now: {reclaimable[0]} saves, "
            f"{reclaimable[1]}")
