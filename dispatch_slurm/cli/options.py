"""One grammar per option name, whichever command takes it, as a Slurm user reads it.

``--signal`` is sbatch's ``--signal`` ([{R|B}:]SIG[@T]) wherever it names the job's signal;
``--grace`` is whole seconds, as the job option ``--dispatch-grace`` takes them; ``--poll
SECONDS`` is the time between two looks, at the job or at the exec folder; the root is
``--root ROOT`` in every command about one (common.py). A spelling an earlier release took
still works, for scripts, and says the new one in one line on stderr (``deprecated``);
docs/user-guide.md has the table."""

import math

import click
from click.core import ParameterSource

from ..contract.siteconf import GRACE_CAP
from .common import finite

SIGNAL_METAVAR = "[{R|B}:]SIG[@T]"
SIGNAL_HELP = ("the job's --signal, as sbatch takes it: SIG T seconds before the time limit (T: 60 if left out); "
               "T is the save's grace, so it sets --grace; warns when this root's measured saves do not fit")


def deprecated(old: str, new: str) -> None:
    """An old spelling that still works: one line on stderr saying the new one."""
    click.echo(f"dispatch-slurm: {old} is deprecated: {new}", err=True)


class Grace(click.ParamType):
    """``--grace SECONDS``: whole seconds 0..GRACE_CAP, as sbatch's --dispatch-grace and
    DISPATCH_GRACE take them (Slurm counts its times in whole seconds). ``fractions``: a
    fraction is read too, said deprecated when given on the command line (an environment
    variable may hold one: $DISPATCH_GRACE_S, the handler's own grace)."""

    name = "seconds"

    def __init__(self, fractions: bool = False) -> None:
        self.fractions = fractions

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if text.isdigit() and int(text) <= GRACE_CAP:
            return int(text)
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not (self.fractions and 0 <= seconds <= GRACE_CAP):  # nan too
            self.fail(f"{value!r} is not whole seconds 0..{GRACE_CAP}", param, ctx)
        if ctx is not None and param is not None and \
                ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
            deprecated(f"--grace {text} (a fraction of a second)", f"give whole seconds: --grace {math.ceil(seconds)}")
        return seconds


def grace_option(help_: str = "seconds the save gets after the signal", fractions: bool = False, **kw):
    return click.option("--grace", type=Grace(fractions), help=f"{help_} (whole seconds, 0..{GRACE_CAP})", **kw)


def poll_option(what: str, default: float, minimum: float):
    """``--poll SECONDS``: the time between two looks at ``what``, in every command that polls."""
    return click.option("--poll", type=click.FloatRange(min=minimum, max=3600), default=default, show_default=True,
                        metavar="SECONDS", callback=finite, help=f"seconds between two looks at {what}")


WATCH_POLL = 0.5  # watch's --poll: a folder is cheap to look at


class _Bare:
    """watch's ``--poll`` given without SECONDS: its old spelling, a flag."""

    def __repr__(self) -> str:
        return "--poll"


BARE = _Bare()


class _PollSeconds(click.FloatRange):
    def convert(self, value, param, ctx):
        return value if value is BARE else super().convert(value, param, ctx)


def watch_poll_options(f):
    """watch's ``--poll SECONDS`` (the grammar of every --poll) and ``--no-inotify``; the old
    spellings, ``--poll`` alone (then a flag: poll instead of inotify) and ``--interval
    SECONDS``, still read (watch_polling says them deprecated)."""
    f = click.option("--interval", type=click.FloatRange(min=0.01, max=3600), hidden=True, callback=finite)(f)
    f = click.option("--no-inotify", is_flag=True, help="poll every --poll seconds instead of waiting on "
                     "inotify")(f)
    return click.option("--poll", "poll_s", type=_PollSeconds(min=0.01, max=3600), is_flag=False, flag_value=BARE,
                        default=WATCH_POLL, show_default=True, metavar="SECONDS", callback=finite,
                        help="seconds between two looks at the exec folder where it is polled: an S3 root, "
                             "no inotify, --no-inotify (and at the trainer, without a pidfd)")(f)


def watch_polling(poll, no_inotify: bool, interval: float | None) -> tuple[bool, float]:
    """(poll instead of inotify, seconds between two looks) from watch_poll_options."""
    old, new = [], []
    if poll is BARE:
        old.append("--poll")
        new.append("--no-inotify")
        poll, no_inotify = WATCH_POLL, True
    if interval is not None:
        old.append(f"--interval {interval:g}")
        poll = interval
    if old:
        new.append(f"--poll {poll:g}")
        deprecated(f"watch {' '.join(old)}", f"write {' '.join(new)}")
    return no_inotify, float(poll)


def signal_grace(spec: str | None, grace: int | None) -> tuple[str | None, int | None]:
    """The job's ``--signal`` as sbatch reads it ([{R|B}:]SIG[@T]), with ``--grace``: (the
    signal without its time, the grace), the time being the grace (the seconds a save that
    starts on the signal gets before the limit). Without @T it is sbatch's 60 s; with
    ``--grace`` and no @T, the old spelling (the time was the grace), said deprecated."""
    from ..contract.signals import DEFAULT_WARN_TIME, parse_signal  # here: not for the commands a job starts with
    if spec is None:
        return None, grace
    try:
        sig = parse_signal(spec)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--signal'") from None
    head, colon, _ = spec.strip().partition(":")
    flags = head.upper() if colon and head and set(head.upper()) <= {"R", "B"} else ""
    bare = f"{flags}:{sig.name}" if flags else sig.name
    if "@" not in spec:
        if grace is None:
            return bare, DEFAULT_WARN_TIME
        deprecated(f"--signal {spec} --grace {grace}", f"write --signal {bare}@{grace} (sbatch's --signal: "
                   "its time is the grace)")
        return bare, grace
    if grace is not None and grace != sig.seconds:
        raise click.UsageError(f"--signal {spec} and --grace {grace} disagree: the signal's time is the grace the "
                               f"save gets before the limit; give --signal {bare}@{grace}, or leave --grace out")
    if sig.seconds > GRACE_CAP:
        raise click.BadParameter(f"{spec!r}: its time is the save's grace, at most {GRACE_CAP} s",
                                 param_hint="'--signal'")
    return bare, sig.seconds


def launch_signals(ctx, param, values):
    """launch's ``--signal``, once per signal, each as sbatch's --signal reads it (only its
    SIG matters here) -> the comma list $DISPATCH_SIGNAL holds. A comma list on the command
    line is the old spelling; $DISPATCH_SIGNAL's own is taken as it is."""
    from ..contract.signals import parse_signal
    if not values:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
        return ",".join(values)
    names_ = []
    for value in values:
        parts = [p for p in value.split(",") if p.strip()]
        if len(parts) > 1:
            deprecated(f"--signal {value}", "give --signal once per signal: " +
                       " ".join(f"--signal {p.strip()}" for p in parts))
        for part in parts:
            try:
                names_.append(parse_signal(part).name)
            except ValueError as e:
                raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return ",".join(dict.fromkeys(names_)) or None
