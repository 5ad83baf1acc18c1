"""Retention: which saves a gc keeps and removes, and how it removes them safely.

``policy`` (pure: the rules, in order, that keep a save), ``removal`` (the one removal
order, on any store, through the store interface; a person's ``retire``), ``gc`` (asks
which executions have ceased, slurm/cessation/, then collects; ``run --keep-last``'s
collector; the report's retention state). ``pin``/``unpin``: a save gc never removes (the
store's pinned/ entry). `dispatch-slurm gc`, `retire`, `ls`, the report and
`run --keep-last` all come here."""

from .gc import Collector, gc, recorded_keep_last, status
from .removal import collect, pin, retire, scan_state, state, unpin
from .policy import GONE, KEEP, REMOVE, SHOWN, STATES, VANISHED, Policy, Verdict

__all__ = ["Policy", "Verdict", "KEEP", "REMOVE", "GONE", "STATES", "VANISHED", "SHOWN", "collect",
           "gc", "state", "scan_state", "pin", "unpin", "retire", "status", "Collector", "recorded_keep_last"]
