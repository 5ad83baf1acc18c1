"""slurmctld's RPC counters, read with ``sdiag`` as root: what the supervisor's Slurm
queries cost the controller (benchmarks/bench_supervisor_rpc.py, tests/cluster/test_fleet.py)."""

from __future__ import annotations

import re
import time

from .bed import CONTROLLER

_ROW = re.compile(r"^\s+(\S+?)\s*\(\s*(\d+)\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)")


def read(c) -> dict:
    """The counters now: {"t", "types": {name: [count, total_us]}, "users": {name: [count, total_us]}}."""
    out = c.exec(CONTROLLER, ["sdiag"]).stdout
    got: dict = {"t": time.time(), "types": {}, "users": {}}
    section = None
    for line in out.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            section = "types"
        elif line.startswith("Remote Procedure Call statistics by user"):
            section = "users"
        elif line and not line[0].isspace():
            section = None
        elif section and (m := _ROW.match(line)):
            got[section][m[1]] = [int(m[3]), int(m[5])]
    return got


def reset(c) -> dict:
    c.exec(CONTROLLER, ["sdiag", "--reset"])  # root (or SlurmUser) only
    return read(c)


def user_rpcs(a: dict, b: dict, user: str) -> int:
    """RPCs ``user`` sent slurmctld between two reads."""
    return b["users"].get(user, [0, 0])[0] - a["users"].get(user, [0, 0])[0]
