"""Probe records: what the preemption handler did, per process, for `dispatch-slurm doctor`.

Why. The usual way a preemption loses progress is not a torn file but a signal that
never reached the process that saves, or reached it too late. Events (store/events.py)
say what happened under a root; probe records say it per rank, with the moments the
doctor needs: the handler installed, the signal received, the stop decided (the next
safe point), the save done, published, the exit. With them the doctor tells "never
installed" from "installed, never signalled" from "signalled, killed mid-save".

Where: ``$DISPATCH_PROBE_DIR`` if set (the doctor's rehearsal sets it), else
``$DISPATCH_EXEC_DIR/dispatch-probe`` (the execution's own folder; no save pattern matches
the name, so watch, gc and the report leave it alone), else nowhere (a run outside
dispatch-slurm records nothing). Each process appends to its own
``<host>.<pid>.jsonl``, one ``os.write`` per line, no fsync, so writing is safe in a signal
handler and costs ~20 us; a failure to write is ignored (a probe must never cost a save).

A record: ``phase`` (installed, signal, stop, saved, published, exit), ``t`` (Unix time),
``host``, ``pid``, ``rank``, ``world``, ``job``, ``step_id``, and per phase: installed
``signals``, ``grace``, ``defer``, ``launcher`` ($DISPATCH_LAUNCHER); signal ``signal``;
saved ``ok``, ``error``; exit ``code``.
"""

import json
import os
import socket
import time

from .. import store
from ..contract import layout
from ..contract.env import Execution
from . import distributed  # now, not inside a signal handler

DIRNAME = layout.PROBES
PHASES = ("installed", "signal", "stop", "saved", "published", "exit")


def directory(environ=os.environ) -> str | None:
    """Where this process's probe records go, or None (see the module doc)."""
    ex = Execution.current(environ)
    if ex.probe_dir:
        return ex.probe_dir
    if ex.exec_dir and store.backend(ex.exec_dir).local:  # an exec folder on S3 is no local path: no records there
        return os.path.join(ex.exec_dir, DIRNAME)
    return None


def _rank(environ) -> tuple[int | None, int | None]:
    r = distributed.rank()
    if r is None:
        for key in ("RANK", "SLURM_PROCID"):
            if environ.get(key, "").isdigit():
                r = int(environ[key])
                break
    world = next((int(environ[k]) for k in ("WORLD_SIZE", "SLURM_NTASKS") if environ.get(k, "").isdigit()), None)
    return r, world


def record(phase: str, **fields) -> None:
    """Append one record for this process; nothing when there is no probe folder."""
    if phase not in PHASES:
        raise ValueError(f"unknown probe phase {phase!r} (one of {', '.join(PHASES)})")
    where = directory()
    if where is None:
        return
    rank, world = _rank(os.environ)
    rec = {"phase": phase, "t": time.time(), "host": socket.gethostname(), "pid": os.getpid(), "rank": rank,
           "world": world, "job": os.environ.get("SLURM_JOB_ID"), "step_id": os.environ.get("SLURM_STEP_ID"),
           **fields}
    line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
    try:
        os.makedirs(where, exist_ok=True)
        fd = os.open(os.path.join(where, f"{socket.gethostname()}.{os.getpid()}.jsonl"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass  # a probe never costs a save


def read(where: str) -> dict[tuple[str, int], dict]:
    """Every process's records in ``where``: {(host, pid): {phase: its first record}}.
    A line that does not parse (a process killed mid-write) is skipped: probes are
    observations, not protocol."""
    out: dict[tuple[str, int], dict] = {}
    try:
        names = sorted(os.listdir(where))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(where, name), encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                out.setdefault((rec.get("host"), rec.get("pid")), {}).setdefault(rec.get("phase"), rec)
    return out
