"""What every command shares: the root convention, the DISPATCH_* fallbacks, output.

Root convention: a command about a root takes it as its first argument, ROOT (run,
plan, supersede, release, stop, latest, ls, gc, report, retire, submit); a command about
something inside a root takes ``--root`` (publish SAVE, watch, ceased JOBID, doctor).
Every one of them takes ``--root ROOT`` too, so a script can name the root one way
throughout. Either falls back to $DISPATCH_CHECKPOINT where it may be omitted. Every
fallback to a DISPATCH_* variable is click's ``envvar=``, so ``--help`` names the variable.

One rule for relative roots, in every command: a root named on the command line is made
absolute at once (lexically: symlinks are kept), so what a command prints or records is
absolute; a relative $DISPATCH_CHECKPOINT is refused, as `env` refuses it inside a job
(every node and task of a job must read the same path).

Every option's grammar is in options.py."""

import os
import signal
import sys

import click
from click.core import ParameterSource

from .. import store
from ..contract import names
from ..contract.epoch import EPOCH_MAX, parse_part
from ..errors import DispatchError

ROOT_HELP = "ROOT (or --root ROOT) defaults to $DISPATCH_CHECKPOINT."
def root_argument(required: bool = True):
    """ROOT, from $DISPATCH_CHECKPOINT when omitted, or ``--root ROOT`` (the command's class
    must be RootCommand, which reads it as ROOT). ``required=False`` shows it as [ROOT] in
    the usage (commands with no argument after it); one of the two must be given either way."""
    def add(f):
        f = click.option("--root", "root_given", metavar="ROOT", expose_value=False, callback=_root_twice,
                         help="the same as ROOT, before the other arguments (as publish, watch, ceased and "
                              "doctor take the root)")(f)
        return click.argument("root", envvar="DISPATCH_CHECKPOINT", required=required, callback=_root)(f)
    return add


def _root_twice(ctx, param, value):
    if value is not None:  # RootCommand moved a --root before the arguments: this one came after one
        raise click.UsageError("name the root once, first: ROOT, or --root ROOT before the other arguments",
                               ctx=ctx)


def roots_first(args: list[str], takes_value: set[str]) -> list[str]:
    """``--root X`` and ``--root=X`` given before the command's first argument moved to the
    front, where ROOT is read: the same command line as naming ROOT first. Words after an
    argument are left as they are (sbatch's and the script's own, in run and submit); a
    ``--root`` there reaches the option, which refuses it. ``takes_value``: the options
    whose next word is their value (not an argument)."""
    roots: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--root" and i + 1 < len(args):
            roots.append(args[i + 1])
            del args[i:i + 2]
            continue
        if a.startswith("--root="):
            roots.append(a[len("--root="):])
            del args[i]
            continue
        if a == "--" or not a.startswith("-") or a == "-":
            break  # the first argument
        i += 2 if a in takes_value else 1  # an option, and its value
    return roots + args


class RootCommand(click.Command):
    """A command whose ROOT may also be given as ``--root ROOT`` (root_argument)."""

    def roots_first(self, args: list[str]) -> list[str]:
        takes_value = {name for p in self.params if isinstance(p, click.Option) and not p.is_flag and not p.count
                       for name in p.opts}
        return roots_first(list(args), takes_value)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        moved = self.roots_first(args)
        try:
            return super().parse_args(ctx, moved)
        except click.UsageError as e:
            if moved != args and "unexpected extra argument" in e.format_message():
                raise click.UsageError("name the root once: ROOT or --root ROOT", ctx=ctx) from None
            raise


def root_option(help_: str = "checkpoint root"):
    return click.option("--root", metavar="ROOT", envvar="DISPATCH_CHECKPOINT", show_envvar=True, help=help_,
                        callback=_root_option)


def _root(ctx, param, value):
    if value is None:
        raise click.UsageError("no checkpoint root: name ROOT or set DISPATCH_CHECKPOINT", ctx=ctx)
    return absolute_root(value, ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT)


def _root_option(ctx, param, value):
    if value is None:
        return None
    return absolute_root(value, ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT)


def absolute_root(value: str, from_env: bool) -> str:
    """The relative-root rule (module doc), the root's store's (an S3 root checked, never
    rewritten into another prefix; a path made absolute when named here, refused when
    relative in $DISPATCH_CHECKPOINT)."""
    if not value:
        raise click.BadParameter("the checkpoint root is empty" + (" ($DISPATCH_CHECKPOINT)" if from_env else ""))
    try:
        return store.backend(value).absolute(value, from_env)
    except DispatchError as e:
        raise click.BadParameter(str(e)) from None


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
    bytes, not as an encoding error), for `p=$(dispatch-slurm latest --path)`."""
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


def retention_summary(saves) -> str:
    """One paragraph: what is kept, gone, retired and reclaimable, with sizes (``ls``)."""
    from ..report.render import plural, size

    def total(pred, word="save"):
        rows = [r for r in saves if pred(r)]
        return plural(len(rows), word), size(sum(r["size"] for r in rows))
    saves = list(saves)
    copies = total(lambda r: r.get("copy") and r["state"] != "retired", "folder")  # what resumes load: no saves
    saves = [r for r in saves if not r.get("copy")]
    kept = total(lambda r: r["state"] == "kept")
    unpublished = total(lambda r: r["state"] == "kept" and not r["publications"])
    gone = total(lambda r: r["state"] == "gone")
    retired = total(lambda r: r["state"] == "retired")
    reclaimable = total(lambda r: r["state"] == "reclaimable")
    return (f"kept: {kept[0]}, {kept[1]} (unpublished among them: {unpublished[0]}, {unpublished[1]}); "
            f"resume copies (of published saves; the bytes they do not share with them): {copies[0]}, {copies[1]}; "
            f"gone (the trainer's rotation removed them, not retired): {gone[0]}; "
            f"retired: {retired[0]}, {retired[1]} still on disk; reclaimable now: {reclaimable[0]}, "
            f"{reclaimable[1]}")


def die_by(signum: int) -> None:
    """End this process by ``signum`` (after its cleanup), not by exit(128+n): a shell
    running a script stops at Ctrl-C only when its foreground child died of SIGINT;
    one that exited 130 is a command that failed, and the script runs on."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)  # only if the signal is blocked
