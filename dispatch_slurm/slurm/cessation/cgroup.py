"""cgroup v2 evidence for the Epilog: is the execution's job cgroup gone or empty?

A process scan (an environment carrying DISPATCH_ATTEMPT) misses a process that dropped
its environment. Under ``ProctrackType=proctrack/cgroup`` on the unified hierarchy no
process of the job can leave its job cgroup (moving out needs write access to another
cgroup's ``cgroup.procs``, which the job user lacks): a job cgroup that is empty
(``cgroup.events``: ``populated 0``) or removed (slurmstepd removes it, and rmdir succeeds
only on an empty cgroup) says no process of the job runs on this node. That is evidence;
a missing cgroup without cgroup tracking is not (nothing ever made one).

Where Slurm puts it (src/plugins/cgroup/v2/cgroup_v2.c, 22.05 to 26.05):
``<cgroup root>/<CgroupSlice, default system.slice>/slurmstepd.scope/<job>``, the scope
prefixed ``<node>_`` in a multiple-slurmd build; ``<job>`` is ``job_<id>`` up to 25.11 and
the job's SLUID (``SLURM_JOB_SLUID``) from 26.05 on, unless ``CgroupJobIdPaths=yes``.

``PrologFlags=RunInJob`` (24.11 on) runs the Prolog and Epilog in the job's extern step:
the Epilog and the slurmstepd that runs it are then in the job cgroup themselves, which
stays populated until the Epilog ends (measured on the VM bed: 24.11 and 26.05). By then
slurmstepd has SIGKILLed the extern step's processes and waited for the job's other steps
(src/slurmd/slurmstepd/mgr.c); a job cgroup that holds nothing but the hook and its
ancestors (OWN) holds no process of the job.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Optional

ROOT = "/sys/fs/cgroup"
GONE, EMPTY, OWN, POPULATED = "gone", "empty", "the hook's own", "populated"


def unified(root: str = ROOT) -> bool:
    """The cgroup v2 (unified) hierarchy is mounted at ``root``, and only it: this process
    is in no v1 hierarchy (Slurm refuses hybrid mode too)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line for line in f.read().splitlines() if line]
    except OSError:
        return False
    return bool(lines) and all(line.startswith("0::") for line in lines) and os.path.exists(
        os.path.join(root, "cgroup.controllers"))


def _conf_lines(path: str, depth: int = 0) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.lower().startswith("include ") and depth < 3:
            inc = line.split(None, 1)[1].strip()
            out += _conf_lines(inc if os.path.isabs(inc) else os.path.join(os.path.dirname(path), inc), depth + 1)
        elif line:
            out.append(line)
    return out


def proctrack(conf: Optional[str] = None) -> Optional[str]:
    """ProctrackType of the slurm.conf slurmd reads (SLURM_CONF, set by slurmd for its
    hooks), Slurm's default proctrack/cgroup when unset; None without a readable file."""
    path = conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    lines = _conf_lines(path)
    if not lines:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "proctracktype":
            return value.strip()
    return "proctrack/cgroup"


def job_cgroups(job_id: str, sluid: Optional[str] = None, *, root: str = ROOT,
                conf: Optional[str] = None) -> Optional[list[str]]:
    """The paths the job's cgroup may have on this node (``job_<id>``, its SLUID), when
    Slurm tracks the job's processes there by cgroup v2; None when it does not (cgroup
    v1, linuxproc, pgid: the Epilog then has only its process scan)."""
    if proctrack(conf) != "proctrack/cgroup" or not unified(root):
        return None
    scopes = sorted(glob.glob(os.path.join(root, "*", "slurmstepd.scope")) +
                    glob.glob(os.path.join(root, "*", "*_slurmstepd.scope")))
    if not scopes:
        return None  # slurmd made no scope: it does not run cgroup/v2 here
    if not sluid and any(_SLUID.match(e) for scope in scopes for e in _entries(scope)):
        return None  # job cgroups keyed by SLUID (26.05) and none given: this job's is unknown
    names = [f"job_{job_id}"] + ([sluid] if sluid else [])
    return [os.path.join(scope, name) for scope in scopes for name in names]


_SLUID = re.compile(r"^[sS][0-9A-Za-z]{13}$")


def _entries(scope: str) -> list[str]:
    try:
        return os.listdir(scope)
    except OSError:
        return []


def state(paths: list[str], ours: frozenset[int] = frozenset()) -> tuple[str, list[str]]:
    """(GONE: none of the paths exists | EMPTY: ``populated 0`` in each that does | OWN: every
    process in them is one of ``ours``, the hook and its ancestors (RunInJob) | POPULATED,
    the paths that exist)."""
    there = [p for p in paths if _state(p) != GONE]
    if not there:
        return GONE, []
    if not any(_state(p) == POPULATED for p in there):
        return EMPTY, there
    return (OWN if ours and not set(pids(there)) - ours else POPULATED), there


def _state(path: str) -> str:
    """GONE (no such cgroup), EMPTY (``populated 0``: no process in it or below) or
    POPULATED."""
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            events = dict(line.split(None, 1) for line in f.read().splitlines() if " " in line)
    except FileNotFoundError:
        return GONE
    except NotADirectoryError:
        return GONE
    return EMPTY if events.get("populated", "1").strip() == "0" else POPULATED


def pids(paths: list[str]) -> list[int]:
    """Every process in the cgroups and below them."""
    found = []
    for d, _, files in (w for p in paths for w in os.walk(p)):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    found += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                pass
    return sorted(found)
