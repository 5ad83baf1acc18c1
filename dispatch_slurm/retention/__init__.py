"""Retention: which saves a gc keeps and removes, and how it removes them safely.

``policy`` (pure: the rules, in order, that keep a save), ``removal`` (the one removal
order, on any store, through the store interface; a person's ``retire``), ``cessation``
(which executions have ceased: the root's Epilog records, a local execution's processes
on this host (``local``), else Slurm; ``gc`` asks, then collects; ``run --keep-last``'s collector; the report's retention state). ``pin``/``unpin``: a save gc never removes (the store's pinned/ entry).
`dispatch-slurm gc`, `retire`, `ls`, the report and `run --keep-last` all come here."""

from . import local
from .cessation import Collector, ceased, executions, from_root, gc, is_local, recorded_keep_last, slurm_ends, status
from .removal import collect, pin, retire, scan_state, state, unpin
from .policy import GONE, KEEP, REMOVE, SHOWN, STATES, VANISHED, Policy, Verdict

__all__ = ["Policy", "Verdict", "KEEP", "REMOVE", "GONE", "STATES", "VANISHED", "SHOWN", "collect",
           "gc", "state", "scan_state", "pin", "unpin", "retire", "ceased", "from_root", "status", "Collector", "executions",
           "is_local", "slurm_ends", "local", "recorded_keep_last"]
