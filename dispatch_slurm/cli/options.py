"""One grammar per option name, whichever command takes it, as a Slurm user reads it.

``--signal`` is sbatch's ``--signal`` ([{R|B}:]SIG[@T]) wherever it names the job's signal;
every duration (``--poll``, ``--grace``, ``--hold-for``, ``--timeout``...) is one grammar,
contract/durations.py's (90, 90s, 1.5m, 2h), ``--grace`` in whole seconds as the job option
``--dispatch-grace`` takes them; ``--poll`` is the time between two looks, at the job or at
the exec folder; the root is
``--root ROOT`` in every command about one (common.py). A spelling an earlier release took
still works, for scripts, and says the new one in one line on stderr (``deprecated``);
docs/user-guide.md has the table."""

import math

import click
from click.core import ParameterSource

from ..contract.durations import EXAMPLES, fmt_duration, parse_duration
from ..contract.siteconf import GRACE_CAP
from ..errors import DispatchError

SIGNAL_METAVAR = "[{R|B}:]SIG[@T]"
SIGNAL_HELP = ("the job's --signal, as sbatch takes it: SIG T seconds before the time limit (T: 60 if left out); "
               "T is the save's grace, so it sets --grace; warns when this root's measured saves do not fit")


def deprecated(old: str, new: str) -> None:
    """An old spelling that still works: one line on stderr saying the new one."""
    click.echo(f"dispatch-slurm: {old} is deprecated: {new}", err=True)


class Duration(click.ParamType):
    """Every duration option: contract/durations.py's grammar (90, 90s, 1.5m, 2h, 1d), in
    seconds, ``minimum`` to ``maximum`` (``above``: more than ``minimum``). ``whole``: whole
    seconds, as Slurm counts its times (``--grace``), a fraction refused, or with
    ``fractions`` read and said deprecated when typed (an environment variable may hold one:
    $DISPATCH_GRACE_S, the handler's own grace). A spelling outside the grammar that an
    earlier release read (1e3) is read, and said deprecated when typed."""

    name = "duration"

    def __init__(self, minimum: float = 0.0, maximum: float = math.inf, *, above: bool = False,
                 whole: bool = False, fractions: bool = False) -> None:
        self.minimum, self.maximum, self.above = minimum, maximum, above
        self.whole, self.fractions = whole, fractions

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value  # a default
        text = str(value).strip()
        try:
            seconds, legacy = parse_duration(text)
        except DispatchError as e:
            self.fail(str(e), param, ctx)
        low_ok = seconds > self.minimum if self.above else seconds >= self.minimum
        if not (low_ok and seconds <= self.maximum):
            self.fail(f"{text!r} is not {self.bounds()}", param, ctx)
        typed = ctx is not None and param is not None and \
            ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
        option = param.opts[0] if param is not None and param.opts else "the duration"
        if self.whole and not seconds.is_integer():
            if not self.fractions:
                self.fail(f"{text!r} is not whole seconds ({self.bounds()})", param, ctx)
            if typed:
                deprecated(f"{option} {text} (a fraction of a second)",
                           f"give whole seconds: {option} {math.ceil(seconds)}")
            return seconds
        if legacy and typed:
            deprecated(f"{option} {text}", f"write {option} {fmt_duration(seconds)}")
        return int(seconds) if self.whole else seconds

    def bounds(self) -> str:
        """The range, in the grammar's words."""
        low = f"more than {fmt_duration(self.minimum)}" if self.above else f"at least {fmt_duration(self.minimum)}"
        return low + ("" if math.isinf(self.maximum) else f" and at most {fmt_duration(self.maximum)}")


DURATION_HELP = f"a duration: seconds, or with a unit, e.g. {EXAMPLES}"


def duration_option(*names: str, help_: str, minimum: float = 0.0, maximum: float = math.inf,
                    above: bool = False, **kw):
    """A duration option: DURATION in --help, the grammar named once in its text."""
    return click.option(*names, type=Duration(minimum, maximum, above=above), metavar="DURATION",
                        help=help_, **kw)


def grace_option(help_: str = "seconds the save gets after the signal", fractions: bool = False, **kw):
    return click.option("--grace", type=Duration(0, GRACE_CAP, whole=True, fractions=fractions), metavar="DURATION",
                        help=f"{help_} (whole seconds, at most {fmt_duration(GRACE_CAP)}: 90, 2m)", **kw)


def poll_option(what: str, default: float, minimum: float):
    """``--poll DURATION``: the time between two looks at ``what``, in every command that polls."""
    return duration_option("--poll", minimum=minimum, maximum=3600, default=default, show_default=True,
                           help_=f"the time between two looks at {what}")


WATCH_POLL = 0.5  # watch's --poll: a folder is cheap to look at


class _Bare:
    """watch's ``--poll`` given without SECONDS: its old spelling, a flag."""

    def __repr__(self) -> str:
        return "--poll"


BARE = _Bare()


class _PollDuration(Duration):
    def convert(self, value, param, ctx):
        return value if value is BARE else super().convert(value, param, ctx)


def watch_poll_options(f):
    """watch's ``--poll DURATION`` (the grammar of every --poll) and ``--no-inotify``; the old
    spellings, ``--poll`` alone (then a flag: poll instead of inotify) and ``--interval
    SECONDS``, still read (watch_polling says them deprecated)."""
    f = click.option("--interval", type=Duration(0.01, 3600), hidden=True)(f)
    f = click.option("--no-inotify", is_flag=True, help="poll every --poll instead of waiting on inotify")(f)
    return click.option("--poll", "poll_s", type=_PollDuration(0.01, 3600), is_flag=False, flag_value=BARE,
                        default=WATCH_POLL, show_default=True, metavar="DURATION",
                        help="the time between two looks at the exec folder where it is polled: an S3 root, "
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
