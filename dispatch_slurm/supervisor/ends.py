"""How an ended execution ended: its cause, from facts tied to that execution only.

The facts every way in produces: the events the execution wrote itself (the preemption
handler's, the integrations', `dispatch-slurm mark`), Slurm's own (state, start and end time,
time limit, exit status, preempt time) and the job's --signal, read at its submission as
sbatch reads it (contract/signals.py: Slurm does not report it). Never the job's output:
Slurm hands its path over unexpanded (``slurm-%j.out``), and an appended log holds other
executions' lines. Where the facts cannot tell, the cause is "unsure", a continuation that
names what was missing (an execution that had finished training ends at once the next
time, and is done). rules.py's TABLE says what each cause leads to."""

from __future__ import annotations

import time
from typing import NamedTuple, Optional

from ..contract.signals import JobSignal, Signal

# Slurm's end state -> the cause a resubmission is chosen for (TIMEOUT is a continuation).
CAUSES = {"FAILED": "failure", "OUT_OF_MEMORY": "failure", "BOOT_FAIL": "failure",
          "DEADLINE": "failure", "CANCELLED": "cancel", "PREEMPTED": "preemption",
          "NODE_FAIL": "node_failure"}
#: the events an execution writes itself that say it was signalled and saved
SIGNAL_EVENTS = frozenset({"preempt_signal", "checkpoint_complete"})
#: the events of an execution whose trainer started: its resume resolved (`latest --resume`, or
#: the integrations' resume at the trainer's start), a save published, a signal seen
TRAINING_EVENTS = frozenset({"resumed", "published", "training_finished"}) | SIGNAL_EVENTS


class Own(NamedTuple):
    """What the ended execution wrote itself: the types of its events (``types``), or why
    they could not be read (``error``); ``refusal``: why its resume was refused (its
    ``warning`` event of kind "refused"), if it was."""
    types: frozenset = frozenset()
    error: Optional[str] = None
    refusal: Optional[str] = None


def own_events(evs: list[dict]) -> Own:
    """The facts an execution's events give the rule. A ``checkpoint_complete`` an older
    Epilog wrote (source "epilog": it scanned an output path another execution may have
    written too) is no fact of this execution's."""
    mine = [e for e in evs if e.get("source") != "epilog"]
    refused = [e for e in mine if e.get("type") == "warning" and e.get("kind") == "refused"]
    return Own(frozenset(e.get("type") for e in mine), refusal=str(refused[-1].get("message")) if refused else None)


def before_training(ended: dict, own: Own) -> Optional[dict]:
    """How an execution failed before its trainer started, as the fingerprint two failures
    of one cause share (its exit status, the signal that killed it, the refusal it
    recorded), or None: it ended otherwise, its trainer started (it wrote one of
    TRAINING_EVENTS), or its events cannot be read. A failure of the job itself: Slurm's
    FAILED, not a node's or a person's doing."""
    if ended["state"] != "FAILED" or own.error is not None or own.types & TRAINING_EVENTS:
        return None
    return {"exit_code": ended.get("exit_code"), "signal": ended.get("signal"), "refusal": own.refusal}


def failed_before(before: dict) -> str:
    """The sentence for a failure before the trainer started (``before_training``)."""
    if before.get("refusal"):
        return f"was refused its resume: {before['refusal'].rstrip('.')}"
    how = f"killed by signal {before['signal']}" if before.get("signal") else f"exit {before.get('exit_code')}"
    return (f"ended FAILED ({how}) before its trainer started (no resume resolved, nothing published: the "
            "job's output says why)")


def signal_time(ended: dict, warning: JobSignal) -> tuple[Optional[int], Optional[str]]:
    """(the earliest time Slurm may have sent the execution its --signal, None when it sends
    none), or (None, what is missing to tell)."""
    if warning.unknown is not None:
        return None, f"its --signal is unknown: {warning.unknown}"
    if warning.signal is None:
        return None, None
    start, limit = ended.get("start_time"), ended.get("time_limit")
    if not start:
        return None, "Slurm gave no start time for it"
    if ended.get("time_limit_unlimited"):
        return None, None
    if not limit:
        return None, "Slurm gave no time limit for it"
    return int(start + limit - warning.signal.lead()), None


def _clock(t: int) -> str:
    """A time as Slurm prints it, with its day: a signal time is often a day or more away."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def cause_of(ended: dict, own: Own, warning: JobSignal, uid: int) -> tuple[str, str]:
    """(why an execution ended, as the rules see it; the sentence that says so). ``own``: the
    events it wrote itself; ``warning``: the job's --signal, read at its submission."""
    said = _slurm_says(ended, uid)
    if said is not None:
        return said
    end: Optional[int] = ended.get("end_time")
    at, missing = signal_time(ended, warning)
    sig = warning.signal
    after = (end, at) if end is not None and at is not None and end >= at else None
    if ended["state"] == "FAILED":
        return _failed(ended, own, sig, after)
    return _completed(ended, own, warning, after, missing)


def _slurm_says(ended: dict, uid: int) -> Optional[tuple[str, str]]:
    """The cause Slurm's state alone gives (None: COMPLETED or FAILED, which need more)."""
    state = ended["state"]
    if ended.get("requeued"):
        return "requeue", "Slurm requeued it"
    if state == "CANCELLED" and ended.get("cancelled_by") in (None, uid):
        return "user_cancel", "cancelled by its own user"
    if state == "TIMEOUT":
        return "time_limit", "Slurm ended it at its time limit"
    if state == "UNKNOWN":
        return "unknown", "known neither to slurmctld nor to sacct"
    if state not in ("COMPLETED", "FAILED"):
        return CAUSES.get(state, "failure"), f"ended {state}"
    return None


def _completed(ended: dict, own: Own, warning: JobSignal, after: Optional[tuple[int, int]],
               missing: Optional[str]) -> tuple[str, str]:
    """A COMPLETED end (exit 0): its own events first, then Slurm's preempt time, then its
    --signal time; a missing fact is the safe side."""
    sig, end = warning.signal, ended.get("end_time")
    if own.error is not None:
        return "unsure", f"its events cannot be read ({own.error})"
    if own.types & SIGNAL_EVENTS:
        which = " and ".join(sorted(own.types & SIGNAL_EVENTS))
        return "signalled", f"it saved on a signal (its {which} event)"
    if "training_finished" in own.types:
        return "finished", "training finished (its training_finished event)"
    if ended.get("preempt_time"):
        return "preempted", f"Slurm preempted it at {_clock(ended['preempt_time'])}"
    if after is not None:
        return "signal_time", f"it ended at {_clock(after[0])}, after its --signal time {_clock(after[1])} ({sig})"
    if missing is None and sig is not None and end is None:
        missing = "Slurm gave no end time for it"
    if missing is not None:
        return "unsure", f"{missing}; taking the safe side"
    if sig is None or end is None:
        return "completed", f"it exited 0 and the job has no --signal ({warning.source})"
    at, _ = signal_time(ended, warning)
    if at is None:
        return "completed", f"it exited 0 and the job has no time limit ({sig})"
    return "completed", f"it exited 0 at {_clock(end)}, before its --signal time {_clock(at)}"


def _failed(ended: dict, own: Own, sig: Optional[Signal], after: Optional[tuple[int, int]]) -> tuple[str, str]:
    """A FAILED end: the job's own --signal killed a trainer that does not trap it (at or after
    its signal time: the batch shell (B:) killed by the signal itself; srun, and a shell's
    `wait`, exit 128 + its number, which sacct's text prints as the number alone), else a failure.
    A trainer whose handler noted a signal (its preempt_signal event) traps it: dying of that
    signal's number is then another task's death, as when Slurm stops a step after one rank
    crashed (srun --kill-on-bad-exit, 26.05's PMI abort: SIGTERM to every task)."""
    code, killed = ended.get("exit_code"), ended.get("signal")
    if sig is not None and "preempt_signal" in own.types and (killed == sig.number
                                                               or code in (sig.number, 128 + sig.number)):
        return "failure", (f"ended FAILED ({f'killed by signal {killed}' if killed else f'exit {code}'}) although "
                           f"its handler trapped SIG{sig.name} (its preempt_signal event): a task's crash, not the "
                           "signal, ended it")
    if after is not None and sig is not None and (killed == sig.number or code in (sig.number, 128 + sig.number)):
        how = f"killed by SIG{sig.name}" if killed == sig.number else f"exit status {code} (SIG{sig.name})"
        return "killed_at_signal", (f"{how} at {_clock(after[0])}, after its --signal time {_clock(after[1])}: a "
                                    "trainer that does not trap the signal")
    return "failure", f"ended FAILED ({f'killed by signal {killed}' if killed else f'exit {code}'})"


def signal_rule(warning: JobSignal) -> str:
    """How an end is told for this job's --signal, in a sentence (``plan`` shows it)."""
    if warning.unknown is not None:
        return (f"its --signal is unknown ({warning.unknown}): an execution that exits 0 without a "
                "training_finished event is continued (the safe side; if training had finished, the next "
                "execution ends at once and is done)")
    sig = warning.signal
    if sig is None:
        return (f"no --signal ({warning.source}): an execution that exits 0 is done, unless its own events say "
                "it saved on a signal (a preemption, a scancel --signal)")
    return (f"{sig} ({warning.source}): Slurm sends SIG{sig.name} {sig.seconds} s before the time limit, at its "
            f"first check within {sig.lead()} s of it; an execution that ends COMPLETED, or killed by SIG{sig.name} "
            f"(exit {sig.number} or {128 + sig.number}), {sig.lead()} s or less before its time limit was "
            "stopped by it: continue; one that exits 0 earlier without a signal event: done")
