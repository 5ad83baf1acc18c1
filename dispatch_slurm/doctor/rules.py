"""The doctor's rules, pure: will the save signal reach every rank in time?

Two kinds of answers, each a ``Finding`` (a name, the problem, the one-line fix):
  * ``check``: from the wiring alone -- the job's ``--signal``, where the trainer runs
    (the batch shell or an srun step), its launcher, Slurm's KillWait, PreemptMode,
    PreemptParameters and the partition's GraceTime -- before anything is sent;
  * ``verdict``: from what every rank's handler recorded (runtime/probe.py) after the
    doctor sent the signal the way Slurm will.

Slurm's rules these follow (slurm.conf(5), sbatch(1), scancel(1)):
  * ``--signal=SIG@T`` sends SIG to the *steps* (srun), not to the batch shell: to each
    task's own process only under cgroup process tracking (measured on 26.05: a
    launcher's children hear nothing unless it passes the signal on), to every process
    of the step under linuxproc; ``--signal=B:SIG@T`` only to the batch shell's own process, not its
    children (bash runs a trap only once its foreground child has exited; without a trap
    SIGTERM and SIGUSR* end the shell, and a step whose first process ends is killed).
  * At the time limit: SIGCONT and SIGTERM to everything, KillWait later SIGKILL.
  * Preemption (PreemptMode CANCEL/REQUEUE): SIGTERM to the steps at the start of the
    partition's GraceTime -- the job's own ``--signal`` signal only with
    ``PreemptParameters=send_user_signal`` -- and when GraceTime ends the job's kill:
    SIGTERM, KillWait, SIGKILL (measured on 26.05 with GraceTime 5 s and KillWait 5 s:
    a 7 s save published, a 12 s one lost).
  * torchrun (and ``accelerate launch`` with several processes, the same elastic agent)
    handles SIGTERM, SIGINT, SIGHUP, SIGQUIT by signalling its workers and SIGKILLing them
    30 s later (``--shutdown-timeout``), then exits 1 with a SignalException traceback;
    another signal's default action ends the launcher itself at once. ``accelerate launch``
    with one process does not handle any: SIGTERM ends it at once.
Each ending of a step's first process ends the step: its other processes are killed, a
save in flight with them.
"""

import re
from dataclasses import dataclass, field

from ..contract.signals import Signal, parse_signal, sbatch_options, script_options

TORCHRUN_KILL_S = 30  # torchrun's default --shutdown-timeout
TORCHRUN_HANDLES = frozenset({"TERM", "INT", "HUP", "QUIT"})  # TORCHELASTIC_SIGNALS_TO_HANDLE's default
MARGIN = 0.8  # a save above this share of its window leaves too little room
LAUNCHERS = ("torchrun", "accelerate")


@dataclass(frozen=True)
class Stack:
    """How the trainer is started. ``where``: "step" (srun) or "shell" (the batch script
    itself); ``launcher``: torchrun, accelerate or None (python itself); ``execs``: the
    shell ``exec``s it; ``forwards``: the shell traps the signal and passes it on;
    ``wrapped``: under ``dispatch-slurm launch``; ``processes``: accelerate's processes;
    ``kill_after``: torchrun's ``--shutdown-timeout``."""
    where: str = "step"
    launcher: str | None = None
    execs: bool = False
    forwards: bool = False
    wrapped: bool = False
    processes: int = 1
    kill_after: int = 30  # torchrun's --shutdown-timeout


@dataclass(frozen=True)
class SlurmConf:
    """What slurm.conf and the partition say: KillWait, PreemptMode (OFF: no preemption),
    whether PreemptParameters has send_user_signal, the partition's GraceTime, PrologFlags
    (where the hooks run: report.py names Contain and RunInJob)."""
    kill_wait: float = 30.0
    preempt_mode: str = "OFF"
    send_user_signal: bool = False
    grace_time: float = 0.0
    prolog_flags: str = ""


@dataclass(frozen=True)
class Finding:
    code: str
    problem: str
    fix: str

    def __str__(self):
        return f"{self.code}: {self.problem}\n  fix: {self.fix}"


@dataclass
class Row:
    """One rank's measured path from the signal to its exit (seconds; None: never)."""
    rank: int | None
    host: str
    pid: int
    signals: list = field(default_factory=list)
    delay: float | None = None      # signal sent -> handler ran
    to_stop: float | None = None    # handler ran -> the save started (the next safe point)
    save: float | None = None       # the save started -> this rank's part written
    left: float | None = None       # the window's end - the exit
    published: bool = False
    exit: int | None = None


def parse_script(text: str) -> tuple[Signal | None, Stack]:
    """The ``--signal`` of an sbatch script's ``#SBATCH`` lines (read as sbatch reads them)
    and how it starts the trainer, read from its commands (a heuristic: say ``--stack`` when
    it guesses wrong)."""
    found = sbatch_options(script_options(text)).signal
    sig = parse_signal(found) if found is not None else None
    body = [ln.split("#", 1)[0] for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    code = "\n".join(body)
    launcher = ("torchrun" if re.search(r"\btorchrun\b|torch\.distributed\.(run|launch)\b", code)
                else "accelerate" if re.search(r"\baccelerate\s+launch\b", code) else None)
    procs = re.search(r"--num[_-]processes[= ](\d+)", code)
    kill = re.search(r"--shutdown[_-]timeout[= ](\d+)", code)
    return sig, Stack(where="step" if re.search(r"(^|[;&|(]\s*|\s)srun\s", code) else "shell",
                      launcher=launcher, execs=bool(re.search(r"(^|;)\s*exec\s+\S", code, re.M)),
                      forwards=bool(re.search(r"\btrap\b[^\n]*\bkill\b", code)),
                      wrapped=bool(re.search(r"dispatch-slurm\s+launch\b", code)),
                      processes=int(procs.group(1)) if procs else 1,
                      kill_after=int(kill.group(1)) if kill else TORCHRUN_KILL_S)


def parse_conf(config: dict, partition: dict | None = None) -> SlurmConf:
    """SlurmConf from ``scontrol show config`` and ``scontrol show partition`` (text forms,
    as dicts), the partition's PreemptMode over the cluster's."""
    def seconds(v, default):
        m = re.match(r"\s*(\d+)", str(v or ""))
        return float(m.group(1)) if m else default
    partition = partition or {}
    mode = (partition.get("PreemptMode") or config.get("PreemptMode") or "OFF").upper()
    if (config.get("PreemptType") or "preempt/none") == "preempt/none":
        mode = "OFF"
    return SlurmConf(kill_wait=seconds(config.get("KillWait"), 30.0), preempt_mode=mode,
                     send_user_signal="send_user_signal" in (config.get("PreemptParameters") or "")
                     or "preempt_send_user_signal" in (config.get("SlurmctldParameters") or ""),
                     grace_time=seconds(partition.get("GraceTime"), 0.0),
                     prolog_flags="" if config.get("PrologFlags") in (None, "(null)") else config["PrologFlags"])


def reaches_trainer(sig: Signal, stack: Stack) -> bool:
    """Whether a signal sent as Slurm sends ``sig`` gets to the trainer's processes."""
    if stack.where == "step":
        return not sig.batch or stack.forwards
    return sig.batch and (stack.execs or stack.forwards)


def _elastic(stack: Stack) -> bool:
    return stack.launcher == "torchrun" or (stack.launcher == "accelerate" and stack.processes > 1)


def launcher_survives(name: str, stack: Stack) -> bool:
    """Whether the launcher lives on after signal ``name`` (its death ends the step)."""
    if stack.launcher is None or stack.wrapped:
        return True
    return _elastic(stack) and name in TORCHRUN_HANDLES


def window(first_seen: float, stack: Stack) -> float:
    """Seconds a save has after the signal, with the launcher's own kill taken off."""
    return min(first_seen, stack.kill_after) if _elastic(stack) and not stack.wrapped else first_seen


@dataclass(frozen=True)
class Limit:
    """The window a save has on one way the job ends, and what sets it: ``by`` is
    "signal" (the job's --signal lead, then KillWait), "kill-wait" (only the limit's or
    the kill's SIGTERM reaches the trainer, KillWait before SIGKILL), "grace-time" (the
    partition's GraceTime, then KillWait), "launcher" (the launcher SIGKILLs its workers
    ``stack.kill_after`` s after the signal, whatever Slurm allows) or "none" (0 s: the
    save cannot happen); ``slurm_s``: the window Slurm itself allows."""
    seconds: float
    by: str
    slurm_s: float


def _limit(slurm_s: float, by: str, stack: Stack) -> Limit:
    w = window(slurm_s, stack)
    return Limit(w, "launcher" if w < slurm_s else by, slurm_s)


def limits(sig: Signal | None, stack: Stack, conf: SlurmConf, handled=None) -> dict[str, Limit]:
    """{"time limit": Limit, "preemption": Limit}: from the first signal the trainer's
    handler catches to its SIGKILL, for each way the job can end, and what sets it.
    ``handled``: the signals the handler is installed for (default: the job's, else TERM)."""
    handled = set(handled or ([sig.name] if sig else ["TERM"]))
    at_limit = conf.kill_wait if "TERM" in handled else 0.0  # SIGTERM to everything, then KillWait
    term = _limit(at_limit, "kill-wait", stack) if launcher_survives("TERM", stack) else Limit(0.0, "none", 0.0)
    out = {}
    if sig and sig.name in handled and reaches_trainer(sig, stack) and launcher_survives(sig.name, stack):
        out["time limit"] = _limit(sig.seconds + conf.kill_wait, "signal", stack)
    else:
        out["time limit"] = term
    if conf.preempt_mode not in ("OFF", "SUSPEND", "GANG,SUSPEND"):
        sent = sig.name if sig and conf.send_user_signal else "TERM"
        as_sent = Signal(sent, bool(sig and sig.batch and conf.send_user_signal), 0)
        if sent in handled and reaches_trainer(as_sent, stack) and launcher_survives(sent, stack):
            out["preemption"] = _limit(conf.grace_time + conf.kill_wait, "grace-time", stack)
        else:  # the kill's SIGTERM when GraceTime ends, at best
            out["preemption"] = term
    return out


def windows(sig: Signal | None, stack: Stack, conf: SlurmConf, handled=None) -> dict[str, float]:
    """{"time limit": s, "preemption": s}: ``limits``' seconds (0: the save cannot happen)."""
    return {path: lim.seconds for path, lim in limits(sig, stack, conf, handled).items()}


def check(sig: Signal | None, stack: Stack, conf: SlurmConf, grace: float | None = None,
          measured: float | None = None, handled=None) -> list[Finding]:
    """Every misconfiguration the wiring shows, each with its fix (see the module doc)."""
    out = []
    handled = set(handled or ([sig.name] if sig else ["TERM"]))
    if sig is None:
        out.append(Finding("no-signal", "the job has no --signal: at the time limit the trainer gets SIGTERM "
                           f"only KillWait ({conf.kill_wait:g} s) before SIGKILL",
                           "add `#SBATCH --signal=TERM@<seconds a save needs>` (B:TERM@... if the trainer "
                           "runs in the batch shell itself)"))
    elif sig.batch and stack.where == "step" and not stack.forwards:
        out.append(Finding("signal-to-shell", f"{sig} signals only the batch shell; the trainer runs in an "
                           "srun step and never gets it (the shell dies of it, or waits)",
                           f"use `#SBATCH --signal={sig.name}@{sig.seconds}` (no B:): Slurm signals the steps"))
    elif not sig.batch and stack.where == "shell":
        out.append(Finding("signal-to-steps", f"{sig} signals the srun steps; the trainer runs in the batch "
                           "shell itself and gets nothing until the limit's SIGTERM, KillWait "
                           f"({conf.kill_wait:g} s) before SIGKILL",
                           f"use `#SBATCH --signal=B:{sig.name}@{sig.seconds}` and `exec` the trainer, or "
                           "start it with srun"))
    elif sig.batch and stack.where == "shell" and not (stack.execs or stack.forwards):
        out.append(Finding("shell-keeps-it", f"{sig} reaches the batch shell, which runs the trainer as a "
                           "child: the shell ends (or defers its trap) and the trainer never gets it",
                           "`exec python train.py ...` in the script, or start the trainer with srun and "
                           f"drop B: (`--signal={sig.name}@{sig.seconds}`)"))
    if sig and sig.name not in handled:
        out.append(Finding("handler-signal", f"the handler is installed for {'/'.join(sorted(handled))}, the "
                           f"job sends SIG{sig.name}: its default action ends the trainer",
                           f"install_preemption_handler(save, signals=[signal.SIG{sig.name}, signal.SIGTERM])"))
    out += _launcher(sig, stack, conf, grace)
    out += _preemption(sig, stack, conf, handled)
    out += _fit(sig, stack, conf, grace, measured, handled)
    return out


def _launcher(sig, stack, conf, grace) -> list[Finding]:
    if stack.launcher is None or stack.wrapped:
        return []
    out = []
    names = {sig.name} if sig else set()
    if conf.preempt_mode != "OFF":
        names.add(sig.name if sig and conf.send_user_signal else "TERM")
    dying = sorted(n for n in names if not launcher_survives(n, stack))
    if dying:
        what = "accelerate launch (one process)" if stack.launcher == "accelerate" and not _elastic(stack) \
            else stack.launcher
        out.append(Finding("launcher-dies", f"SIG{'/SIG'.join(dying)} ends {what} at once (it does not handle "
                           "it); the step ends with it and Slurm kills the ranks before they save",
                           f"`dispatch-slurm launch -- {stack.launcher} ...` (it shields the launcher and "
                           "passes the signal to the ranks), or srun one task per rank"))
    if _elastic(stack):
        longest = max([grace or 0, (sig.seconds + conf.kill_wait) if sig else 0, conf.grace_time])
        if longest > stack.kill_after:
            out.append(Finding("launcher-kill", f"{stack.launcher} SIGKILLs its workers {stack.kill_after} s after "
                               f"the signal, before the {longest:g} s the job allows, and exits 1 "
                               "(SignalException) even when every rank saved",
                               f"`dispatch-slurm launch -- {stack.launcher} ...` (the ranks keep the whole "
                               "window, exit status 0 once every rank saved)"))
    return out


def _preemption(sig, stack, conf, handled) -> list[Finding]:
    if conf.preempt_mode in ("OFF", "SUSPEND", "GANG,SUSPEND"):
        return []
    out = []
    if sig and sig.name != "TERM" and not conf.send_user_signal and "TERM" not in handled:
        out.append(Finding("send-user-signal", f"preemption sends SIGTERM, not the job's SIG{sig.name} "
                           "(PreemptParameters lacks send_user_signal): the handler never runs, SIGTERM ends "
                           "the trainer", "ask the admins for `PreemptParameters=send_user_signal` in "
                           "slurm.conf, or install the handler for SIGTERM too"))
    if stack.where == "shell":
        out.append(Finding("preempt-to-steps", "preemption signals the srun steps, not the batch shell the "
                           "trainer runs in: it gets SIGTERM only when GraceTime ends, KillWait "
                           f"({conf.kill_wait:g} s) before SIGKILL", "start the trainer with srun"))
    if conf.grace_time <= 0:
        out.append(Finding("no-grace-time", f"the partition preempts (PreemptMode={conf.preempt_mode}) with "
                           "GraceTime=0: the job is killed without time to save",
                           "ask the admins for the partition's GraceTime=<seconds a save needs>"))
    return out


def _fit(sig, stack, conf, grace, measured, handled) -> list[Finding]:
    out = []
    for path, lim in limits(sig, stack, conf, handled).items():
        w = lim.seconds
        if grace is not None and 0 < w < grace:
            out.append(Finding("grace-too-long", f"{path}: the handler counts on a grace of {grace:g} s, the "
                               f"save has {w:g} s: time_remaining() overstates the time left",
                               f"set the job's grace to at most {w:g} s (--dispatch-grace / DISPATCH_GRACE_S)"))
        if measured is not None and w > 0 and measured > w * MARGIN:
            out.append(save_too_long(path, measured, lim, sig, stack, conf))
    return out


def binding(path: str, lim: Limit, sig: Signal | None, stack: Stack, conf: SlurmConf,
            need: int | None = None) -> tuple[str, str]:
    """(what sets the window, the fix that lengthens it) for a save that needs ``need``
    seconds: the one limit that binds, so the fix never raises a limit that does not."""
    if lim.by == "launcher":
        return (f"{stack.launcher} SIGKILLs its workers {stack.kill_after} s after the signal: that binds, not "
                f"the {lim.slurm_s:g} s Slurm allows",
                f"`dispatch-slurm launch -- {stack.launcher} ...` (the ranks keep the {lim.slurm_s:g} s Slurm "
                "allows), or a faster save")
    if lim.by == "grace-time":
        return (f"the partition's GraceTime ({conf.grace_time:g} s) + KillWait ({conf.kill_wait:g} s)",
                f"the partition's GraceTime >= {need} s (the admins), or a faster save" if need else
                "a longer GraceTime (the admins), or a faster save")
    name = f"{'B:' if sig and sig.batch else ''}{sig.name if sig else 'TERM'}"
    lead = f"`--signal={name}@{need}`" if need else "a longer `--signal` lead"
    if lim.by == "signal" and sig is not None:
        return (f"the job's --signal lead ({sig.seconds} s) + KillWait ({conf.kill_wait:g} s)", f"{lead} or a faster save")
    return (f"only the {'time limit' if path == 'time limit' else 'kill'}'s SIGTERM reaches the trainer, KillWait "
            f"({conf.kill_wait:g} s) before SIGKILL",
            f"{lead} that reaches the trainer, or a faster save" if path == "time limit" else
            "a handler for the preemption signal that reaches the trainer, or a faster save")


def save_too_long(path: str, measured: float, lim: Limit, sig: Signal | None, stack: Stack,
                  conf: SlurmConf) -> Finding:
    what, fix = binding(path, lim, sig, stack, conf, int(measured / MARGIN) + 1)
    return Finding("save-too-long", f"{path}: the save took {measured:.1f} s of a {lim.seconds:g} s window ({what})",
                   fix)


def rows(records: dict, sent_at: float, end_at: float) -> list[Row]:
    """One Row per process whose handler was installed (probe.read's shape), by rank."""
    out = []
    for (host, pid), phases in records.items():
        inst = phases.get("installed")
        if inst is None:
            continue
        t = {k: v["t"] for k, v in phases.items()}
        r = Row(inst.get("rank"), host, pid, inst.get("signals") or [])
        r.delay = _diff(t.get("signal"), sent_at)
        r.to_stop = _diff(t.get("stop"), t.get("signal"))
        r.save = _diff(t.get("saved"), t.get("stop"))
        r.left = _diff(end_at, t.get("exit"))
        r.published = "published" in phases
        r.exit = phases["exit"].get("code") if "exit" in phases else None
        if "saved" in phases and not phases["saved"].get("ok"):
            r.save = None
        out.append(r)
    return sorted(out, key=lambda r: (r.rank is None, r.rank or 0, r.host, r.pid))


def _diff(a, b):
    return None if a is None or b is None else round(a - b, 3)


def verdict(table: list[Row], expected: int, window_s: float, exit_code: int | None = None,
            launcher: str | None = None, limit_at: float | None = None,
            binds: tuple[str, str] | None = None) -> list[Finding]:
    """What the measured run says: every rank's handler installed, signalled, stopped,
    saved in time, published once; the launcher's exit status. ``limit_at``: seconds
    after the early signal when the limit's SIGTERM goes to everything (a rank whose
    handler ran only then never got the early signal). One check per finding, in the
    order a run goes through them. ``binds``: (what sets the window, its fix), ``binding``'s."""
    run = _Run(table, expected, window_s, exit_code, launcher, limit_at, binds)
    return [f for check in _CHECKS if (f := check(run)) is not None]


@dataclass
class _Run:
    table: list
    expected: int
    window_s: float
    exit_code: int | None
    launcher: str | None
    limit_at: float | None
    binds: tuple[str, str] | None = None


def _not_installed(run: _Run) -> Finding | None:
    if len(run.table) >= run.expected:
        return None
    return Finding("handler-not-installed", f"{run.expected - len(run.table)} of {run.expected} rank(s) never "
                   "installed the preemption handler (no probe record)", "install it before the first step: "
                   "DispatchCallback (HF), DispatchCheckpoint (Lightning), install_preemption_handler "
                   "(plain loops), on every rank")


def _not_delivered(run: _Run) -> Finding | None:
    limit = run.limit_at
    unsignalled = [r for r in run.table if r.delay is None or (limit is not None and r.delay >= limit - 0.25)]
    if not unsignalled:
        return None
    via = f"{run.launcher} " if run.launcher else "a launcher or shell "
    late = limit is not None and all(r.delay is not None for r in unsignalled)
    how = "only the limit's SIGTERM came, KillWait before SIGKILL" if late else "nothing came"
    return Finding("signal-not-delivered", f"rank {_who(unsignalled)}: handler installed, the early signal never "
                   f"arrived ({how}): {via}in between swallowed it",
                   f"`dispatch-slurm launch -- {run.launcher or 'CMD'} ...`, or signal the steps (--signal without B:)")


def _no_safe_point(run: _Run) -> Finding | None:
    stuck = [r for r in run.table if r.delay is not None and r.to_stop is None]
    if not stuck:
        return None
    return Finding("no-safe-point", f"rank {_who(stuck)}: the signal arrived, no safe point came before "
                   "the kill (evaluation, warm-up, data loading?)", "call preemption_point() (or "
                   "stop_requested()) in the eval and data-loading loops too; the integrations do")


def _save_failed(run: _Run) -> Finding | None:
    failed = [r for r in run.table if r.exit == 1]
    if not failed:
        return None
    return Finding("save-failed", f"rank {_who(failed)}: the save ran and failed (exit 1, no sentinel)",
                   "read the rank's stderr: the save's own error is printed there")


def _save_too_long(run: _Run) -> Finding | None:
    slow = [r for r in run.table if r.to_stop is not None and (r.exit is None or (r.left is not None and r.left < 0))]
    if not slow:
        return None
    what, fix = run.binds or ("", "a longer window than the save (--signal=SIG@T, the partition's GraceTime, "
                                  "the launcher's own kill) or a faster save")
    return Finding("save-too-long", f"rank {_who(slow)}: killed before its save ended (the window: "
                   f"{run.window_s:g} s{'; ' + what if what else ''})", fix)


def _exit_status(run: _Run) -> Finding | None:
    every_rank_saved = run.table and len(run.table) >= run.expected and all(r.exit == 0 for r in run.table)
    if run.exit_code in (None, 0) or not every_rank_saved:
        return None
    return Finding("exit-status", f"every rank saved and exited 0, the command exited {run.exit_code} "
                   "(torchrun's SignalException): the job script reads it as a failure",
                   f"`dispatch-slurm launch -- {run.launcher or 'torchrun'} ...` (exits 0 once every rank saved)")


_CHECKS = (_not_installed, _not_delivered, _no_safe_point, _save_failed, _save_too_long, _exit_status)


def _who(rs) -> str:
    return ", ".join(str(r.rank if r.rank is not None else f"pid {r.pid}") for r in rs)
