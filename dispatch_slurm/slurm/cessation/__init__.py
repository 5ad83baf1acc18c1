"""Cessation: have the processes of an execution stopped? The one home of the evidence and
of how it is read; the store keeps the record of it (store/ceased.py):

* ``node``: on a node, for its Epilog (and the hooks' sweep): no process carries the
  execution's token, no slurmstepd of the job is left and, where Slurm tracks the job by
  cgroup v2, its job cgroup is empty or gone (``cgroup``);
* ``answer``: the cessation signal for one execution of a job, `dispatch-slurm ceased`:
  Slurm's word and every node's evidence;
* ``executions``: which executions under a root have ceased, for gc and the report: the
  root's records, this host's processes for a local execution (``local``), else the signal."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .answer import CEASED, EXIT, NOT_CEASED, UNKNOWN, check, describe, exit_code, render, slurm_says


def __getattr__(name: str) -> Any:
    """The signal's names, imported when first asked for: a node's publisher needs ``node``
    alone, and ``answer`` brings the Slurm client (its dialects, subprocess, hostlists) with it."""
    if name in __all__:
        from . import answer
        return getattr(answer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["check", "describe", "render", "exit_code", "slurm_says", "CEASED", "NOT_CEASED", "UNKNOWN", "EXIT"]
