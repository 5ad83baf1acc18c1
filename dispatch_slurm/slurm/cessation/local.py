"""Whether a local execution (`dispatch-slurm env --local`, cluster "local") has ceased.

No Slurm ran it and no Epilog records its end, so Slurm is never asked about it. What the
root records instead is every process of it that wrote there: the writer of each of its
events (host, pid, time), the shell that ran `env --local` (its ``execution_started``
event's ``shell_pid``: the job script) and each process whose preemption handler kept
probe records in its folder (``dispatch-probe/<host>.<pid>.jsonl``). It has ceased when
all of them ran on this host and none of them runs here any more: no process has that
pid, or the one that has it started after the record was written (a reused pid), or it
is a zombie. A process that never wrote anything is not seen, so gc also waits until the
folder is quiet (``--min-age``), as for every execution. Recorded on another host, or
nothing recorded at all: it cannot be told here (the caller says so, and a person may
say `gc --ceased`)."""

from __future__ import annotations

import os
import socket
from typing import Iterable, Optional

from ... import store
from ...contract import layout
_OTHERS = ("prolog", "epilog", "epilog (rejoined)", "sweep", "person")  # sources that are not the execution's
_NOT_ITS_OWN = ("cessation", "hold", "release", "gc", "retired")


def _boot_time() -> Optional[float]:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return next(float(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def _process(pid: int) -> Optional[tuple[str, float]]:
    """(state letter, start time as a Unix time) of process ``pid`` from /proc, or None
    when /proc cannot say (not Linux)."""
    boot = _boot_time()
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], (boot or 0.0) + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def runs(pid: int, since: float) -> bool:
    """Whether the process that wrote a record at ``since`` still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists (another user's)
    except (OverflowError, ValueError):
        return False
    seen = _process(pid)
    if seen is None:
        return True  # it exists, and nothing tells it is another process: it runs
    state, started = seen
    return state not in ("Z", "X") and started <= since + 2.0  # /proc's start: whole seconds of boot time


def _probe_processes(root: str, attempt: str) -> dict[tuple[str, int], float]:
    """(host, pid) -> when its last probe record was written (the file's names and times)."""
    where = os.path.join(root, layout.EXEC, attempt, layout.PROBES)
    out: dict[tuple[str, int], float] = {}
    try:
        names = os.listdir(where)
    except OSError:
        return out
    for name in names:
        host, _, pid = name.removesuffix(".jsonl").rpartition(".")
        if name.endswith(".jsonl") and pid.isdigit() and host:
            try:
                out[(host, int(pid))] = os.stat(os.path.join(where, name)).st_mtime
            except OSError:
                continue
    return out


def processes(root: str, attempt: str, evs: Iterable[dict]) -> dict[tuple[str, int], float]:
    """Every process the root records for the execution: (host, pid) -> the time of its
    last record (it ran at least until then)."""
    out: dict[tuple[str, int], float] = {}

    def seen(host, pid, t) -> None:
        if isinstance(host, str) and host and isinstance(pid, int) and isinstance(t, (int, float)):
            out[(host, pid)] = max(out.get((host, pid), t), t)
    for e in evs:
        if e.get("attempt") != attempt or e.get("type") in _NOT_ITS_OWN or e.get("source") in _OTHERS:
            continue
        seen(e.get("host"), e.get("pid"), e["t"])
        if e.get("type") == "execution_started":
            seen(e.get("host"), e.get("shell_pid"), e["t"])
    if store.backend(root).local:  # probe records are kept only in a local exec folder
        for (host, pid), t in _probe_processes(root, attempt).items():
            seen(host, pid, t)
    return out


def ceased(root: str, attempt: str, evs: Iterable[dict]) -> tuple[Optional[bool], str]:
    """(True: every recorded process of it is gone from this host | False: one still runs
    here | None: cannot be told here, why)."""
    procs = processes(root, attempt, evs)
    here = socket.gethostname()
    if not procs:
        return None, "no process of it is recorded under the root (no event, no probe record)"
    elsewhere = sorted({h for h, _ in procs} - {here})
    if elsewhere:
        return None, f"it ran on {', '.join(elsewhere)}, not on this host ({here}): ask there"
    live = sorted(pid for (_, pid), t in procs.items() if runs(pid, t))
    if live:
        return False, f"pid {', '.join(map(str, live))} still runs on {here}"
    return True, f"its processes are gone from {here} (pid {', '.join(str(p) for _, p in sorted(procs))})"
