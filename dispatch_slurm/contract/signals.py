"""sbatch's ``--signal`` from the grace a save needs, and whether measured saves fit it.

``--signal=[B:]SIG@T`` makes Slurm send SIG T seconds before the time limit (up to 60 s
earlier: its event loop's resolution); at the limit it sends SIGTERM, waits KillWait,
then SIGKILLs. With T = the grace, a save that starts on SIG has the grace (plus
KillWait) to finish. ``B:`` signals only the batch shell (which must then pass it on, or
``exec`` the trainer); without it, only the steps' tasks are signalled -- where a
trainer run with srun has its handler. Preemption ignores ``--signal``: it sends SIGTERM
to the steps at the start of the partition's GraceTime.
"""

import os
import re
import shlex
import signal as _signal
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional, Sequence

from ..errors import DispatchError

_SPEC = re.compile(r"(?:(?P<where>[BR]{1,2}):)?(?P<sig>(?:SIG)?[A-Z][A-Z0-9]*|[0-9]{1,2})")
# The line a saved preemption prints on stdout, alone on its line, for people reading the job's
# output. Nothing reads it back: how an execution ended is decided from facts tied to it
# (supervisor/rules.py), never from an output path another execution may also write.
SENTINEL = "dispatch-checkpoint-complete"
MARGIN = 0.8  # a save measured above this share of the grace leaves too little room


def signal_option(spec: str, grace: int) -> str:
    """``TERM``, ``B:USR2``, ``10`` ... -> ``--signal=B:USR2@<grace>``; refused: a time (it is
    the grace), a malformed spec, a grace under 1 s (Slurm's minimum is 1)."""
    m = _SPEC.fullmatch(spec or "")
    if not m:
        raise DispatchError(f"--signal {spec!r}: give a signal name or number, optionally prefixed "
                            "B: (batch shell only), e.g. TERM, USR2, B:TERM; the time is the grace")
    if not 1 <= grace <= 65535:
        raise DispatchError(f"--signal needs a grace of 1..65535 s to send the signal that early, got {grace}")
    return f"--signal={spec}@{grace}"


def slowest_save(evs) -> float | None:
    """The longest signal-to-saved time the preemption handler recorded (checkpoint_complete
    events' ``elapsed``), or None if no save was measured yet."""
    times = [e["elapsed"] for e in evs if e.get("type") == "checkpoint_complete" and "elapsed" in e]
    return max(times) if times else None


def fit_warning(grace: float, measured: float | None) -> str | None:
    """A warning when the saves measured so far do not fit the grace window (with room)."""
    if measured is None or measured <= grace * MARGIN:
        return None
    return (f"warning: saves of this root took up to {measured:.1f} s after the signal, "
            f"{'more than' if measured > grace else 'close to'} the grace of {grace:g} s: "
            f"raise --grace (e.g. {int(measured / MARGIN) + 1}) or save faster")


# -- the job's warning signal, as sbatch reads it ------------------------------------------
#
# Slurm keeps a job's --signal to itself: its job info (scontrol, squeue, sacct JSON) does not
# carry it. Whoever submits can know it, by reading what sbatch reads, in sbatch's order:
# the script's #SBATCH lines, then SBATCH_SIGNAL, then the command line (each later one wins).

#: Slurm's signal names (proc_args.c signals_mapping): sbatch accepts these, with or
#: without SIG, in any case, or a number.
SLURM_SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ABRT": 6, "KILL": 9, "ALRM": 14, "TERM": 15, "CHLD": 17,
                 "USR1": 10, "USR2": 12, "PIPE": 13, "URG": 23, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21,
                 "TTOU": 22, "XCPU": 24}
DEFAULT_WARN_TIME = 60  # sbatch's @TIME when the spec has none
PERIODIC_TIMEOUT = 30  # slurmctld checks time limits (and sends the warning) this often


@dataclass(frozen=True)
class Signal:
    """A job's ``--signal=[{R|B}:]SIG[@T]``: ``name`` without SIG (TERM, USR2), ``batch`` for
    ``B:``, ``seconds`` T before the time limit (Slurm's default 60; 0: never sent)."""
    name: str
    batch: bool = False
    seconds: int = DEFAULT_WARN_TIME

    def __str__(self) -> str:
        return f"--signal={'B:' if self.batch else ''}{self.name}@{self.seconds}"

    @property
    def number(self) -> int:
        """The signal's number on Linux."""
        if self.name.isdigit():
            return int(self.name)
        return SLURM_SIGNALS.get(self.name) or int(getattr(_signal, "SIG" + self.name))

    @property
    def sent(self) -> bool:
        """Whether Slurm sends it before the limit at all (``@0`` never is)."""
        return self.seconds > 0

    def lead(self) -> int:
        """How long before the time limit an execution may already have it: Slurm sends it at
        its first time-limit check within T + PERIODIC_TIMEOUT s of the end."""
        return self.seconds + PERIODIC_TIMEOUT


def parse_signal(spec: str) -> Signal:
    """``--signal``'s value read as sbatch reads it (get_signal_opts): an optional ``R``, ``B``
    (either order) and ``:``, a signal name (with or without SIG, any case) or number, and
    ``@T`` (default 60 s; ``@`` alone is 0). ValueError naming the spec otherwise."""
    bad = ValueError(f"--signal {spec!r}: expected [B:]SIG[@SECONDS], e.g. TERM@90 or B:USR2@120")
    rest, batch = (spec or "").strip(), False
    for flag in "RBR":
        if rest[:1].upper() == flag:
            batch, rest = batch or flag == "B", rest[1:]
    rest = rest.removeprefix(":")
    name, at, when = rest.partition("@")
    number = _signal_number(name)
    if number is None or not 1 <= number <= 0xFFFF:
        raise bad
    seconds = DEFAULT_WARN_TIME
    if at:
        if not re.fullmatch(r"\s*\+?[0-9]*", when) or int(when.strip() or "0") > 0xFFFF:
            raise bad
        seconds = int(when.strip() or "0")
    named = {v: k for k, v in SLURM_SIGNALS.items()}.get(number)
    if named is None:
        try:
            named = _signal.Signals(number).name[3:]
        except ValueError:
            named = str(number)
    return Signal(named, batch, seconds)


def _signal_number(name: str) -> Optional[int]:
    """sig_name2num: a number, or one of SLURM_SIGNALS (SIG optional, any case); None if neither."""
    text = name.strip()
    if re.fullmatch(r"[+-]?[0-9]+", text):
        return int(text)
    text = text.upper().removeprefix("SIG")
    return SLURM_SIGNALS.get(text)


def script_options(text: str) -> list[str]:
    """The options of a batch script's ``#SBATCH`` (or ``#SLURM``) lines, as sbatch reads them:
    only those before the first command (a line with anything but blanks before a ``#``), only
    the first component of a heterogeneous job, words split the shell's way up to an unquoted
    ``#``."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.startswith(("#SBATCH", "#SLURM")):
            if line.strip() and not line.lstrip().startswith("#"):
                break  # the first command: sbatch reads no further
            continue
        words = _directive_words(line[7 if line.startswith("#SBATCH") else 6:])
        if words and words[0].lower() in ("hetjob", "packjob"):
            break
        out += words
    return out


def _directive_words(rest: str) -> list[str]:
    """One directive line's words (get_argument): quotes group, a backslash escapes, an
    unquoted ``#`` ends the line."""
    lex = shlex.shlex(rest, posix=True, punctuation_chars=False)
    lex.whitespace_split, lex.commenters = True, "#"
    try:
        return list(lex)
    except ValueError:  # an unmatched quote: sbatch refuses the script
        return []


# sbatch's options that take no argument, or only one attached with `=` (slurm_opt.c): every
# other long option takes the next word when it has no `=`. Short options: the same split.
_NO_ARG_LONG = frozenset({"consolidate-segments", "contiguous", "external", "get-user-env", "help", "hold",
                          "ignore-pbs", "no-requeue", "overcommit", "oversubscribe", "parsable", "quiet", "reboot",
                          "spread-job", "spread-segments", "stepmgr", "test-only", "usage", "use-min-nodes",
                          "verbose", "version", "wait", "exclusive", "nice", "no-kill", "oom-kill-step",
                          "propagate", "requeue", "resv-ports",
                          # the SPANK plugin's own flag (spank_env/options.c: has_arg 0), which
                          # `run --shared-checkpoint --via spank` passes before the script
                          "dispatch-shared-checkpoint"})
_ARG_SHORT = frozenset("ABCDFGJLMNSabcdeimnopqtwx")


class Options(NamedTuple):
    """What the supervisor needs of sbatch's arguments: the last ``--signal`` and ``--time``
    values, the batch script (the first word that is not an option: sbatch stops reading
    options there) and ``--wrap``'s command."""
    signal: Optional[str] = None
    time: Optional[str] = None
    script: Optional[str] = None
    wrap: Optional[str] = None


def _long(name: str) -> Optional[str]:
    """The option of ours a long option names, as getopt_long takes it (a unique prefix:
    --si... is --signal; --time only whole, beside --time-min), or None."""
    if len(name) >= 2 and "signal".startswith(name):
        return "signal"
    if name == "time":
        return "time"
    if len(name) >= 2 and "wrap".startswith(name):
        return "wrap"
    return None


def sbatch_options(argv: Sequence[str]) -> Options:
    """``argv`` read as sbatch reads its options (see Options). Values of options that take
    one are skipped, so they are never taken for the script."""
    found: dict[str, Optional[str]] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-") or word == "-":
            found["script"] = (argv[i + 1] if i + 1 < len(argv) else None) if word == "--" else word
            break
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            if name not in _NO_ARG_LONG and not eq:
                value, i = (argv[i + 1] if i + 1 < len(argv) else ""), i + 1
            if _long(name):
                found[str(_long(name))] = value
        else:
            for k, ch in enumerate(word[1:], 1):
                if ch in _ARG_SHORT:
                    value = word[k + 1:]
                    if not value:
                        value, i = (argv[i + 1] if i + 1 < len(argv) else ""), i + 1
                    if ch == "t":
                        found["time"] = value
                    break
        i += 1
    return Options(**found)


def parse_time_limit(text: str) -> Optional[int]:
    """sbatch's ``--time`` in seconds (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS);
    None for UNLIMITED/INFINITE; ValueError for anything else."""
    t = text.strip().upper()
    if t in ("UNLIMITED", "INFINITE", "-1"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
    if not m:
        raise ValueError(f"--time {text!r} is not a time limit")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if days is None:  # minutes | MM:SS | HH:MM:SS
        parts = [x for x in (a, b, c) if x is not None]
        h, mi, sec = [0] * (3 - len(parts)) + parts if len(parts) > 1 else (0, parts[0], 0)
        return int(h) * 3600 + int(mi) * 60 + int(sec)
    return days * 86400 + int(a or 0) * 3600 + int(b or 0) * 60 + int(c or 0)


def lead_problem(sig: Optional[Signal], limit: Optional[int]) -> Optional[str]:
    """Why a --signal with this time limit cannot tell a stop from a finish, or None: its lead
    (T + 30 s) is as long as the limit, so Slurm sends it at its first check, whenever the
    trainer ends; every end would look stopped, and a finished run would never be done."""
    if sig is None or not sig.sent or limit is None or sig.lead() < limit:
        return None
    return (f"{sig} with a time limit of {limit} s: Slurm sends the signal at its first check, as its lead "
            f"({sig.seconds} s + its {PERIODIC_TIMEOUT} s check) is as long as the limit, so an end cannot be told "
            f"from a stop; give --time more than {sig.lead()} s, or a shorter --signal time")


@dataclass(frozen=True)
class JobSignal:
    """A job's warning signal and where it was read: ``signal`` None when the job asks for
    none; ``unknown`` says what could not be read (then nothing is known)."""
    signal: Optional[Signal]
    source: str
    unknown: Optional[str] = None

    def as_fact(self) -> dict:
        """What the supervisor's record keeps of it (``from_fact`` reads it back)."""
        if self.unknown is not None:
            return {"unknown": self.unknown}
        sig = self.signal
        return {"from": self.source, **({"signal": sig.name, "batch": sig.batch, "seconds": sig.seconds}
                                        if sig else {"signal": None})}

    @classmethod
    def from_fact(cls, fact: Optional[dict]) -> "JobSignal":
        if not isinstance(fact, dict):
            return cls(None, "", "the supervisor that submitted this execution did not record its --signal")
        if "unknown" in fact:
            return cls(None, "", str(fact["unknown"]))
        sig = fact.get("signal")
        return cls(Signal(sig, bool(fact.get("batch")), int(fact.get("seconds", DEFAULT_WARN_TIME))) if sig else None,
                   str(fact.get("from") or ""))

    def __str__(self) -> str:
        if self.unknown is not None:
            return f"unknown ({self.unknown})"
        return f"{self.signal} ({self.source})" if self.signal else f"none ({self.source})"


def job_signal(argv: Sequence[str], environ: Mapping[str, str], script: Optional[str],
               script_name: Optional[str] = None) -> JobSignal:
    """The warning signal of a job submitted as ``sbatch ARGV`` with ``environ``: the command
    line's ``--signal`` over ``SBATCH_SIGNAL`` over the script's ``#SBATCH --signal``, as sbatch
    reads them. ``script``: the batch script's text (None: it could not be read, so unless the
    command line or the environment says, the signal is unknown; ``script_name`` names it)."""
    spec, _, named, wrap = sbatch_options(argv)
    where = "sbatch's command line"
    if spec is None and environ.get("SBATCH_SIGNAL"):
        spec, where = environ["SBATCH_SIGNAL"], "SBATCH_SIGNAL"
    if spec is None and wrap is None:
        if script is None:
            what = script_name or named or "(none given: sbatch would read it from stdin)"
            return JobSignal(None, "", f"the batch script {what} could not be read, so its #SBATCH --signal is unknown")
        spec = sbatch_options(script_options(script)).signal
        where = f"#SBATCH in {os.path.basename(script_name or named or 'the script')}"
    if spec is None:
        return JobSignal(None, "none on sbatch's command line, in SBATCH_SIGNAL or in the script's #SBATCH lines")
    try:
        sig = parse_signal(spec)
    except ValueError as e:
        return JobSignal(None, "", f"{where}: {e}")
    return JobSignal(sig if sig.sent else None, f"{spec!r} from {where}" + ("; @0: never sent" if not sig.sent else ""))


def job_time_limit(argv: Sequence[str], environ: Mapping[str, str], script: Optional[str]) -> Optional[int]:
    """The job's time limit in seconds as sbatch reads it (the command line over
    SBATCH_TIMELIMIT over the script's #SBATCH lines); None when none is given (the
    partition's default), it is unlimited, or it cannot be read."""
    spec = sbatch_options(argv).time or environ.get("SBATCH_TIMELIMIT")
    if spec is None and script:
        spec = sbatch_options(script_options(script)).time
    try:
        return None if spec is None else parse_time_limit(spec)
    except ValueError:
        return None
