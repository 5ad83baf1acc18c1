"""The Prolog (root, on every node of a plugin job at allocation, PrologFlags=Alloc): enter the
execution as the job user (store/epochs.enter: N and the epoch's claim checked, the exec
folder made, the epoch claimed, as the plugin's user_init does), record its start under the
root, then write root's own files: ``<job>.env`` for scripts to source and ``<job>.json``
for the Epilog.

A user's mistake never drains the node: it is logged and the Prolog exits 0 without the
files; the plugin's user_init, which runs the same checks as the job user, then fails the
job's tasks with the message in their stderr (remote.c). Non-zero only for a broken node
(its own /run unwritable)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Optional

from ...contract import env as envmod
from ...contract.siteconf import Site
from ...errors import DispatchError
from ...store import epochs, events
from .. import sitefile
from . import job, node
from .epilog import sweep


def _enter(inputs: Mapping[str, str], site: Site, facts: dict) -> dict[str, str]:
    """As the job user: the execution entered (epochs.enter; its N is sbatch's, never one of
    its own), then its start recorded under the root (an ``execution_started`` event with
    source "prolog": this node, the nodes Slurm gave the execution, Slurm's start time), so
    `report` and gc know it from the root alone."""
    values = epochs.enter(epochs.job_store(inputs), inputs, site, own_number=False, label="--dispatch-submission")
    os.environ.update(values)  # the event's epoch and attempt (this child only)
    try:  # observability: never the Prolog's failure (events.record warns on I/O errors itself)
        events.record("execution_started", root=values["DISPATCH_CHECKPOINT"], attempt=values["DISPATCH_ATTEMPT"],
                      source="prolog", node=facts["node"],
                      **{k: facts[k] for k in ("nodes", "nodelist", "start_time", "sluid") if facts.get(k) is not None})
    except Exception as e:  # noqa: BLE001
        os.write(2, f"dispatch-slurm: warning: no execution_started event: {type(e).__name__}: {e}\n".encode())
    return values


def _record_restart(environ: Mapping[str, str]) -> bool:
    """The job's restart count for the plugin's user_init (node.restart_file), array tasks'
    too; a Slurm that gives none: nothing (user_init keeps 0). False: the node is broken."""
    count = environ.get("SLURM_JOB_RESTART_COUNT", "")
    if not (count.isascii() and count.isdigit() and len(count) < 15):
        return True
    try:
        os.makedirs(node.RUN_DIR, mode=0o755, exist_ok=True)
        node.write_root_file(node.restart_file(environ["SLURM_JOB_ID"]), f"{count}\n".encode())
    except OSError as e:
        node.log(f"broken node: cannot write {node.RUN_DIR}: {e}")
        return False
    return True


def run(environ: Mapping[str, str], site_conf: Optional[str] = None) -> int:
    sweep(environ)  # a record of this job id here too is an earlier execution's: ours comes below
    inputs = job.spank_inputs(environ)
    if inputs is None:
        return 0
    if not _record_restart(environ):
        return 1
    if "%a" in inputs["DISPATCH_CHECKPOINT"]:
        # Slurm gives the node Prolog no SLURM_ARRAY_TASK_ID, so an array task's root
        # is unknown here; the plugin's user_init / the TaskProlog create it per task.
        return 0
    try:
        site = sitefile.load(site_conf, env=False)
    except DispatchError as e:
        node.log(f"user error, job will fail in its tasks: {e}")
        return 0
    facts = job.facts(environ)
    result = node.as_job_user(environ, _enter, inputs, site, facts)
    if "ok" not in result:
        # no .env/.json files: the plugin's user_init, which runs the same checks as the job
        # user, fails the job's tasks with this message in its stderr (remote.c)
        node.log(f"{'BUG' if 'bug' in result else 'user error, job will fail in its tasks'}: "
                 f"{result.get('bug') or result['user_error']}")
        return 0
    values = result["ok"]
    try:  # root's own files, in root's own folder; bytes as the filesystem has them
        os.makedirs(node.RUN_DIR, mode=0o755, exist_ok=True)
        node.write_root_file(node.env_file(environ["SLURM_JOB_ID"]), os.fsencode(envmod.render(values, "sh")))
        node.write_root_file(node.record_file(environ["SLURM_JOB_ID"]),
                             json.dumps({"v": 2, "values": values, "job": facts}).encode())
    except OSError as e:
        node.log(f"broken node: cannot write {node.RUN_DIR}: {e}")
        return 1
    return 0
