"""This node's evidence that an execution's processes are gone, for its Epilog and the hooks'
sweep: no process carries the execution's ``DISPATCH_ATTEMPT`` (a process scan of /proc),
no slurmstepd of the job is left (one that outlives its tasks, retrying the completion
towards slurmctld, still holds the job), and, where Slurm tracks the job by cgroup v2 on this
node, its job cgroup is empty or gone (cgroup.py: a process that dropped its environment
stays in the cgroup). A node that cannot show it records nothing: absence of evidence is
never evidence."""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from ...contract import layout
from . import cgroup

WAIT_S = 30.0  # how long an Epilog waits for the execution's processes to go
POLL_S = 0.2
STEPD = b"slurmstepd:"  # its process title, in the task's process until it execs the program


def lineage() -> frozenset[int]:
    """This process and its ancestors: the hook itself, never evidence of the execution (under
    PrologFlags=RunInJob the Epilog and its slurmstepd run inside the job, cgroup.py)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            pid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return frozenset(out)


#: in the environment of each publisher the plugin starts (spank_env/spawn.c): a process that
#: publishes the execution's work, not a part of it
PUBLISHER = b"DISPATCH_VIEW_STEP_END=stdin"


def processes_with(attempt: str, job: Optional[str] = None, root: Optional[str] = None,
                   publishers: bool = True) -> list[int]:
    """Pids on this node, this hook and its ancestors left out, whose environment carries this
    execution's token (and, given, its ``root``) or, given the ``job`` id, that are one of its
    slurmstepds (``slurmstepd: [<job>.<step>]``); without the plugin's ``publishers``."""
    needle = f"DISPATCH_ATTEMPT={attempt}".encode()
    rooted = f"DISPATCH_CHECKPOINT={root}".encode() if root else None
    stepd = f"slurmstepd: [{job}.".encode() if job else None
    found, mine = [], lineage()
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) not in mine:
            try:
                if stepd is not None:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read(len(stepd)) == stepd:
                            found.append(int(pid))
                            continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                if needle in env and (rooted is None or rooted in env) and (publishers or PUBLISHER not in env):
                    found.append(int(pid))
            except OSError:
                pass
    return found


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _stepd(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(len(STEPD)) == STEPD
    except OSError:
        return False


def _task_of(pid: int) -> int:
    """The task a TaskProlog (or a process of it) runs for: Slurm's task process, a fork of
    slurmstepd titled as it, runs the TaskProlog as its child, then execs the program in that
    same pid. Counted alone, the prolog's exit would end the publisher in the gap before the
    exec; the task's process lasts."""
    p: int | None = pid
    for _ in range(64):
        if p is None or p <= 1:
            break
        parent = _parent(p)
        if parent is not None and _stepd(p) and _stepd(parent):
            return p
        p = parent
    return pid


def running_on(attempt: str, root: str, mine: Optional[set[int]] = None) -> list[int]:
    """The execution's processes on this node (its token and its root in their environment)
    that this process's parent did not start (its job script's own commands, this process
    itself): a step's tasks, children of their slurmstepd, which run on when the step's
    ``srun`` ended (a frozen slurmd: the controller took the node for dead, nothing here
    killed them). What `watch` publishes for. ``mine``: the processes whose descendants are
    not counted (default this one and its parent; the view's publisher, which no job
    script started, passes itself alone). Another step's publisher is none of them: two steps'
    publishers on one node would each last as long as the other."""
    mine = {os.getpid(), os.getppid()} if mine is None else mine
    out: list[int] = []
    for pid in processes_with(attempt, root=root, publishers=False):
        pid = _task_of(pid)
        if pid in out:
            continue
        p: int | None = pid
        for _ in range(64):  # up the tree to init (or a subreaper), bounded
            if p is None or p in mine or p <= 1:
                break
            p = _parent(p)
        if p not in mine:
            out.append(pid)
    return out


def lingering(st, attempt: Optional[str], root: Optional[str], here: Optional[str],
              mine: Optional[set[int]] = None) -> Optional[Callable[[], list[int]]]:
    """What a publisher on this node lasts for (runtime/watch.py's Ending): the execution's
    processes here (``running_on``), none once its Epilog recorded their end here (in the
    root's store ``st``); None outside an execution."""
    if not attempt or not root:
        return None

    def linger() -> list[int]:
        if here and st.has(layout.CEASED, f"{attempt}.{here}"):
            return []
        return running_on(attempt, root, mine)
    return linger


def wait_ceased(attempt: str, job: str, sluid: Optional[str], wait: float = WAIT_S) -> tuple[Optional[dict], str]:
    """Wait (``wait`` seconds at most) until no process carries the execution's token and,
    where Slurm tracks the job by cgroup v2 here, its job cgroup is empty or gone:
    (the evidence, "") or (None, what is still there)."""
    paths = cgroup.job_cgroups(job, sluid)
    deadline, mine = time.monotonic() + wait, lineage()
    while True:
        left = processes_with(attempt)
        cg, there = cgroup.state(paths, mine) if paths is not None else (None, [])
        if not left and cg != cgroup.POPULATED:
            break
        if time.monotonic() >= deadline:
            if cg == cgroup.POPULATED:
                left = sorted(set(left) | (set(cgroup.pids(there)) - mine))
                return None, f"{attempt}: job cgroup {', '.join(there)} still holds processes {left[:5]}"
            return None, f"{attempt}: processes {left[:5]} still alive"
        time.sleep(POLL_S)
    if cg is None or paths is None:
        return {"by": "process scan"}, ""
    return {"by": "cgroup v2", "cgroup": " or ".join(there or paths), "state": cg}, ""
