"""The Slurm cessation signal: have the processes of one execution of a job stopped?

`dispatch-slurm ceased JOBID --restart R [--root ROOT]` answers with its exit code:
0 ceased, 1 not ceased, 2 cannot tell. "Ceased" needs evidence, never the absence of it:

1. Slurm says execution R ended and the job is no longer COMPLETING (its epilogs are
   done or the nodes were written off); and
2. every node that ran execution R either
   * recorded its Epilog for it (``<root>/ceased/<attempt>.<node>``: the Epilog writes
     it after the execution's processes on that node are gone; where Slurm tracks jobs by
     cgroup v2, only once the job's cgroup is empty or removed, which no process of the
     job can escape, and the entry says so: each node's ``how`` is ``cgroup v2``,
     ``process scan``, or ``epilog`` for an entry that does not say), or
   * booted after execution R started (BootTime > start): a rebooted node runs none of
     its old processes.

Which nodes ran execution R: ``--nodes``, the supervisor's record, Slurm while it shows
the job at restart R, else the root (the Prolog gives every Epilog entry and its
``execution_started`` event the execution's node list).

Why not "the node is up, responding and not running the job": right after a partitioned
node rejoins, slurmctld shows it IDLE and responding while slurmd has not yet killed
the orphaned processes, which keep writing. Only the node itself can say they are
gone, and the Epilog is how it says so. A node that is down or not responding is never
evidence: it may be cut off and still running the job.
"""

from __future__ import annotations

from typing import Any, Optional

from ...contract import epoch as epochmod
from ...contract import layout, names
from ...errors import DispatchError
from ...store import ceased
from ..client import JobInfo, Slurm, SlurmError
from . import cgroup

CEASED, NOT_CEASED, UNKNOWN = "ceased", "not_ceased", "unknown"
EXIT = {CEASED: 0, NOT_CEASED: 1, UNKNOWN: 2}


def slurm_says(j: Optional[JobInfo], restart: int) -> tuple[Optional[bool], str]:
    """(True: execution R ended and nothing is completing | False: not yet | None: cannot tell, why)."""
    if j is None:
        return True, "the job is no longer known to slurmctld (purged after it finished completing)"
    states = "+".join(sorted(j.states))
    if j.restart_count < restart:
        return None, f"the job is at restart {j.restart_count}; execution R={restart} has not happened"
    if "COMPLETING" in j.states:
        return False, f"Slurm says the job is still completing ({states})"
    if j.restart_count > restart:
        return True, f"Slurm requeued the job (now restart {j.restart_count}, {states}): R={restart} ended"
    if j.ended:
        return True, f"Slurm says the job ended ({states})"
    if j.state == "PENDING":
        return None, f"execution R={restart} has not started ({states})"
    return False, f"Slurm says the job is still {states}"


class _Unknown(Exception):
    """Cannot tell: the answer stays UNKNOWN, for this reason."""


def check(slurm: Slurm, job_id: int, restart: int = 0, *, root: Optional[str] = None,
          generation: Optional[int] = None, submission: Optional[int] = None,
          cluster: Optional[str] = None, nodes: Optional[list[str]] = None,
          started: Optional[int] = None, known: Optional[dict] = None) -> dict:
    """The answer and its evidence, as a JSON-able dict (see the module docstring).
    ``known``: what the supervisor's record says of the execution (g, n, epoch, attempt,
    nodes, start_time, cluster); explicit arguments win over it."""
    out: dict[str, Any] = {"job": job_id, "restart": restart, "answer": UNKNOWN, "nodes": {}}
    rec = known or {}
    g = generation if generation is not None else rec.get("g")
    n = submission if submission is not None else rec.get("n")
    try:
        j = _find(slurm, job_id)
        ended, why = slurm_says(j, restart)
        out["slurm"] = {"ended": ended, "says": why}
        if j is not None:
            out["slurm"].update(state=j.state, flags=sorted(j.flags), restart_count=j.restart_count)
        if ended is None:
            raise _Unknown(why)
        now = j if j is not None and j.restart_count == restart else None  # Slurm shows execution R itself
        same = now is not None
        start = started if started is not None else rec.get("start_time") or (now.start_time if now else None)
        attempt = rec.get("attempt") or _attempt(slurm, job_id, restart, g, n, cluster or rec.get("cluster"), j)
        ran_on = _ran_on(out, nodes or rec.get("nodes") or (now.nodes if now else None), same, root, attempt)
        if ran_on is None:
            raise _Unknown(f"{why}; which nodes ran execution R={restart} is unknown: pass --nodes, or --root "
                           "with the supervisor's record or the Epilog's records (those of a plugin job name them)")
        out["attempt"] = attempt
        recorded = _recorded(out, root, attempt)
        known_nodes = _known_nodes(slurm, set(ran_on) - set(recorded))
    except _Unknown as e:
        out["why"] = str(e)
        return out
    for name in ran_on:
        out["nodes"][name] = _node_evidence(name, recorded, known_nodes.get(name), start, root, attempt)
    _conclude(out, ended, why, ran_on)
    return out


def _find(slurm: Slurm, job_id: int) -> Optional[JobInfo]:
    try:
        return slurm.find_job(job_id)
    except SlurmError as e:
        raise _Unknown(f"Slurm did not answer: {e}") from None


def _attempt(slurm: Slurm, job_id: int, restart: int, g, n, cluster, j) -> Optional[str]:
    """The execution's attempt token from G, N and R (None when G or N is not known)."""
    if g is None or n is None:
        return None
    try:
        cl = cluster or (j.cluster if j else "") or slurm.cluster_name()
        return names.attempt_token(cl, str(job_id), epochmod.compose(g, n, restart))
    except (SlurmError, DispatchError) as e:
        raise _Unknown(f"cannot name the execution's attempt: {e}") from None


def _ran_on(out: dict, given: Optional[list[str]], same: bool, root: Optional[str],
            attempt: Optional[str]) -> Optional[list[str]]:
    """The execution's nodes: given (--nodes, the record, Slurm at restart R), else the
    root's (the nodes the Prolog gave its Epilogs and events: ceased.execution); None
    when nobody says (an empty list counts only from Slurm at restart R)."""
    if given is not None and (given or same):
        return given
    if root and attempt:
        try:
            from_root = ceased.execution(root, attempt)["nodes"] or None
        except (OSError, DispatchError):
            from_root = None
        if from_root:
            out["nodes_from"] = "the root (the Prolog's list of the execution's nodes)"
            return from_root
    return None


def _recorded(out: dict, root: Optional[str], attempt: Optional[str]) -> dict[str, dict]:
    if not (root and attempt):
        return {}
    try:
        return ceased.entries(root, attempt)
    except (OSError, DispatchError) as e:
        out["ceased_dir_error"] = f"{root}/{layout.CEASED}: {getattr(e, 'strerror', None) or e}"
        return {}


def _known_nodes(slurm: Slurm, unrecorded: set[str]) -> dict:
    """Slurm's view of the nodes that recorded no Epilog (asked only if there is one)."""
    if not unrecorded:
        return {}
    try:
        return {nd.name: nd for nd in slurm.nodes()}
    except SlurmError as e:
        raise _Unknown(f"Slurm did not list the nodes: {e}") from None


def _conclude(out: dict, ended: bool, why: str, ran_on: list[str]) -> None:
    gone = all(v["ceased"] for v in out["nodes"].values())
    if not ended:
        out["answer"], out["why"] = NOT_CEASED, why
    elif gone:
        out["answer"] = CEASED
        how = ", ".join(f"{k}: {v['how']}" for k, v in sorted(out["nodes"].items()))
        out["why"] = f"{why}; " + (f"every node has evidence ({how})" if ran_on else "it never ran on a node")
    else:
        missing = [k for k, v in out["nodes"].items() if not v["ceased"]]
        out["answer"], out["why"] = NOT_CEASED, f"{why}; no evidence from {', '.join(missing)}"


def describe(ev: dict) -> str:
    """An Epilog's evidence in words ({} for an entry that does not say how)."""
    if ev.get("by") == "cgroup v2":
        state = str(ev.get("state", "?"))
        word = {cgroup.GONE: "removed", cgroup.EMPTY: "empty",
                cgroup.OWN: "holding only the Epilog's own processes (PrologFlags=RunInJob)"}.get(state, state)
        return f"cgroup v2: job cgroup {ev.get('cgroup', '?')} {word}"
    if ev.get("by") == "process scan":
        return "no process carries DISPATCH_ATTEMPT (process scan)"
    return ""


def _node_evidence(name: str, recorded: dict[str, dict], node, start: Optional[int], root: Optional[str],
                   attempt: Optional[str]) -> dict:
    if name in recorded:
        ev = recorded[name]
        said = describe(ev)
        return {"ceased": True, "how": ev.get("by") or "epilog",
                "evidence": f"epilog recorded {layout.CEASED}/{attempt}.{name}" + (f": {said}" if said else "")}
    if node is None:
        return {"ceased": False, "evidence": "Slurm does not know this node"}
    state = "+".join(sorted(node.state))
    if not node.responding:
        return {"ceased": False, "evidence": f"node is {state}: down or not responding is no evidence"}
    if start is not None and node.boot_time is not None and node.boot_time > start:
        return {"ceased": True, "how": "reboot", "evidence": f"node booted at {node.boot_time}, after the "
                                                             f"execution started at {start}"}
    if not root or not attempt:
        need = "--root (and G, N)" if not root else "the attempt (pass --generation and --submission)"
        return {"ceased": False, "evidence": f"node is {state}; without {need} its epilog record "
                                             "cannot be checked, and it has not rebooted since"}
    return {"ceased": False, "evidence": f"node is {state} but recorded no epilog for {attempt} and has "
                                         "not rebooted since the execution started"}


def render(ans: dict) -> str:
    lines = [f"{ans['answer'].replace('_', ' ')}: job {ans['job']} execution R={ans['restart']}: "
             f"{ans.get('why', '')}"]
    for name, ev in sorted(ans.get("nodes", {}).items()):
        lines.append(f"  {name}: {'ceased' if ev['ceased'] else 'NOT ceased'}: {ev['evidence']}")
    return "\n".join(lines) + "\n"


def exit_code(ans: dict) -> int:
    return EXIT[ans["answer"]]


__all__ = ["check", "describe", "render", "exit_code", "CEASED", "NOT_CEASED", "UNKNOWN"]

