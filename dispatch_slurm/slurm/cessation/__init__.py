"""Cessation: have the processes of an execution stopped? The one home of the evidence and
of how it is read; the store keeps the record of it (store/ceased.py):

* ``node``: on a node, for its Epilog (and the hooks' sweep): no process carries the
  execution's token, no slurmstepd of the job is left and, where Slurm tracks the job by
  cgroup v2, its job cgroup is empty or gone (``cgroup``);
* ``answer``: the cessation signal for one execution of a job, `dispatch-slurm ceased`:
  Slurm's word and every node's evidence;
* ``executions``: which executions under a root have ceased, for gc and the report: the
  root's records, this host's processes for a local execution (``local``), else the signal."""

from .answer import CEASED, EXIT, NOT_CEASED, UNKNOWN, check, describe, exit_code, render, slurm_says

__all__ = ["check", "describe", "render", "exit_code", "slurm_says", "CEASED", "NOT_CEASED", "UNKNOWN", "EXIT"]
