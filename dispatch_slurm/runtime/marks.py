"""What an execution says of its own end, for the supervisor's rule: one event each.

    mark_saved()      # my handler saved on the signal: a continuation, not the end
    mark_finished()   # training reached its end: the run is done

`dispatch-slurm mark saved` / `mark finished` are the same from a shell (a job script, or a
handler that runs a command). The supervisor tells how an execution ended from facts tied to
that execution: these events, the preemption handler's and the integrations' (which write
them themselves), and Slurm's own (state, times, exit status). Without either mark it still
decides right for the common cases (supervisor/rules.py): a COMPLETED end after the job's
--signal time is continued, one before it is done; a mark says it for sure, whatever the
timing. Each is one event line under ``$DISPATCH_CHECKPOINT/events/`` (os-level writes only,
so a signal handler may call it)."""

from ..contract.env import Execution
from ..store import events


def _mark(type_: str, **fields) -> dict:
    """One event of this execution; refused (EnvError naming the variables) outside one, so
    a mark never lands under an attempt nobody can tell."""
    root, attempt = Execution.current().need("root", "attempt")
    return events.emit(type_, root=root, attempt=attempt, **fields) or {}


def mark_saved(**fields) -> dict:
    """This execution saved on its stop signal (the time limit's --signal, a preemption): a
    ``checkpoint_complete`` event, so its end is a continuation however it exits."""
    return _mark("checkpoint_complete", source="mark", **fields)


def mark_finished(**fields) -> dict:
    """Training reached its end in this execution: a ``training_finished`` event, so a
    COMPLETED end is done however close to the time limit it came (unless it also saved on
    a signal: then the next execution ends at once and is done)."""
    return _mark("training_finished", **fields)
