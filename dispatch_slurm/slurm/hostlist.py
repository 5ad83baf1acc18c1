"""Slurm hostlists (``c[1-3,07-08],gpu[1-2]x``) as node names, the one expander: the client
reads every node list Slurm prints through it, and the Prolog records every node of an
execution with it, so that the root alone shows when all of them have recorded their Epilog."""

import subprocess
from collections.abc import Callable
from typing import Optional

HOSTNAMES_TIMEOUT = 10  # `scontrol show hostnames` is local; bounded all the same


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's hostlist grammar in the standard library: ``c[1-3,07-08],gpu[1-2]x`` ->
    c1 c2 c3 c07 c08 gpu1x gpu2x (zero padding kept; several bracket groups in one name
    multiply). ValueError on anything else (unbalanced brackets, a bad range)."""
    names_, depth, item = [], 0, ""
    for ch in hostlist + ",":
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError(f"bad hostlist {hostlist!r}")
        if ch == "," and depth == 0:
            if item:
                names_ += _expand_one(item, hostlist)
            item = ""
        else:
            item += ch
    if depth:
        raise ValueError(f"bad hostlist {hostlist!r}")
    return names_


def _expand_one(item: str, hostlist: str) -> list[str]:
    head, sep, rest = item.partition("[")
    if not sep:
        if "]" in item:
            raise ValueError(f"bad hostlist {hostlist!r}")
        return [item]
    ranges, close, tail = rest.partition("]")
    if not close:
        raise ValueError(f"bad hostlist {hostlist!r}")
    out = []
    for part in ranges.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (dash and int(hi) < int(lo)):
            raise ValueError(f"bad range {part!r} in hostlist {hostlist!r}")
        out += [f"{head}{i:0{len(lo)}d}" for i in range(int(lo), int(hi if dash else lo) + 1)]
    return [a + b for a in out for b in _expand_one(tail, hostlist)] if tail else out


def hostnames(hostlist: str, run: Optional[Callable[[list[str]], str]] = None) -> list[str]:
    """The node names of a hostlist, by Slurm's own expander, `scontrol show hostnames` (it
    asks no daemon): through ``run`` when given (a client's runner, maybe another host's: its
    errors are the caller's), else on this host, bounded, with the standard library's
    expansion when scontrol is missing, fails or hangs (a hook must not depend on it)."""
    if not any(c in hostlist for c in "[,"):
        return [hostlist]
    argv = ["scontrol", "show", "hostnames", hostlist]
    if run is not None:
        return run(argv).split()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=HOSTNAMES_TIMEOUT, check=False,
                           stdin=subprocess.DEVNULL)
        if p.returncode == 0 and p.stdout.split():
            return p.stdout.split()
    except (OSError, subprocess.SubprocessError):
        pass
    return expand_hostlist(hostlist)
