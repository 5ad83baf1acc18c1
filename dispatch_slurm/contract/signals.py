"""sbatch's ``--signal`` from the grace a save needs, and whether measured saves fit it.

``--signal=[B:]SIG@T`` makes Slurm send SIG T seconds before the time limit (up to 60 s
earlier: its event loop's resolution); at the limit it sends SIGTERM, waits KillWait,
then SIGKILLs. With T = the grace, a save that starts on SIG has the grace (plus
KillWait) to finish. ``B:`` signals only the batch shell (which must then pass it on, or
``exec`` the trainer); without it, only the steps' tasks are signalled -- where a
trainer run with srun has its handler. Preemption ignores ``--signal``: it sends SIGTERM
to the steps at the start of the partition's GraceTime.
"""

import re

from ..errors import DispatchError

_SPEC = re.compile(r"(?:(?P<where>[BR]{1,2}):)?(?P<sig>(?:SIG)?[A-Z][A-Z0-9]*|[0-9]{1,2})")
# The line a saved preemption prints on stdout, alone on its line: the Epilog reads it in the
# job's output to tell a saved stop from a kill (the handler prints it, slurm/hooks.py reads).
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
