"""Which executions have ceased, for gc and the report: the root's records first, then this
host's processes for a local execution, then Slurm's cessation signal (answer.py).

Every node that ran an execution recorded its Epilog (``ceased/<attempt>.<node>``, whose
entries name the execution's nodes): it has ceased, Slurm unasked (``from_root``), so gc
collects plugin jobs nobody supervised. A local execution (`env --local`, cluster
"local") is never asked of Slurm: its processes on this host say it (local.py). Else the
cessation signal: Slurm says the execution ended and nothing of it is completing, and every
node that ran it recorded its Epilog or booted after it started. Which nodes ran it comes
from the supervisor's record (its facts, which the caller passes: ``facts``), else from
Slurm while it still shows the job at that restart count. When neither knows (a user-level
job Slurm has since purged or requeued, an execution of another cluster, Slurm not
answering), cessation cannot be shown and the answer says why, with the way out: a person
who knows better says so with ``gc --ceased ATTEMPT``."""

from __future__ import annotations

from typing import Iterable, Optional

from ...contract import epoch as epochmod
from ...contract import names
from ... import store
from ...contract.env import LOCAL_CLUSTER
from ...errors import DispatchError
from ...store import ceased as ceased_store
from ...store import events
from ..client import Slurm, SlurmError
from . import answer, local


def executions(facts: list[dict]) -> dict[tuple[int, int], dict]:
    """(job, R) -> what the supervisor's facts say about that execution: G, N, epoch,
    attempt, nodes and start time (what the cessation signal needs)."""
    out: dict[tuple[int, int], dict] = {}
    for f in facts:
        if f["type"] in ("started", "ended", "hold") and isinstance(f.get("job"), int) and isinstance(f.get("r"), int):
            info = out.setdefault((f["job"], f["r"]), {})
            for k in ("g", "n", "epoch", "attempt", "nodes", "start_time"):
                if f.get(k) not in (None, []):
                    info[k] = f[k]
    return out


def _by_attempt(facts: list[dict]) -> dict[str, dict]:
    return {info["attempt"]: {**info, "job": job, "r": r}
            for (job, r), info in executions(facts).items() if info.get("attempt")}


def ceased(root: store.Root, attempts: Iterable[str], slurm: Optional[Slurm] = None, said: Iterable[str] = (),
           facts: Iterable[dict] = ()) -> dict[str, tuple[bool, str]]:
    """attempt -> (ceased?, the evidence or why it cannot be shown), asking Slurm only
    about the attempts not in ``said`` (a person's word); ``facts``: the supervisor's record
    of the root, if one ran (which nodes ran each execution)."""
    st = store.at(root)
    root = st.root
    said = set(said)
    out = {a: (True, "a person said so (gc --ceased)") for a in attempts if a in said}
    out.update(from_root(st, set(attempts) - said))
    out.update(from_this_host(st, set(attempts) - set(out)))
    ask = sorted(set(attempts) - set(out))
    if not ask:
        return out
    slurm = slurm or Slurm()
    try:
        here = names.cluster_token(slurm.cluster_name())
    except SlurmError as e:
        return {**out, **{a: (False, f"Slurm did not answer ({e}); if you know it has ceased: gc --ceased {a}")
                          for a in ask}}
    recs = _by_attempt(list(facts))
    for a in ask:
        parts = names.attempt_parts(a)
        if parts is None:
            out[a] = (False, f"exec/{a} is not named by an attempt token; if you know it has ceased: "
                             f"gc --ceased {a}")
            continue
        cluster, job, epoch = parts
        if cluster != here:
            out[a] = (False, f"it ran on cluster {cluster}, not on this one ({here}); if you know it "
                             f"has ceased: gc --ceased {a}")
            continue
        g, n, r = epochmod.decompose(epoch)
        ans = answer.check(slurm, job, r, root=root, known={**recs.get(a, {}), "attempt": a, "g": g, "n": n})
        ok = ans["answer"] == answer.CEASED
        out[a] = (ok, ans.get("why", ans["answer"]) + ("" if ok else f"; if you know it has: gc --ceased {a}"))
    return out


def from_root(root: store.Root, attempts: Iterable[str]) -> dict[str, tuple[bool, str]]:
    """The attempts the root alone shows to have ceased: every node that ran the
    execution recorded its Epilog (store/ceased.py ``execution``); Slurm need not be
    asked about these, whoever submitted them (``run``, sbatch, submitit)."""
    out = {}
    for a in attempts:
        try:
            ev = ceased_store.execution(root, a)
        except (OSError, DispatchError):
            continue
        if ev["ceased"]:
            how = ", ".join(f"{n}: {ev['recorded'][n].get('by') or 'epilog'}" for n in ev["nodes"])
            out[a] = (True, f"every node that ran it recorded its Epilog ({how})")
    return out


def is_local(attempt: str) -> bool:
    """An execution of `env --local` (cluster "local"): no Slurm ran it, none is asked."""
    parts = names.attempt_parts(attempt)
    return parts is not None and parts[0] == LOCAL_CLUSTER


def from_this_host(root: store.Root, attempts: Iterable[str]) -> dict[str, tuple[bool, str]]:
    """The local executions among ``attempts``, answered from their processes on this host
    (local.py), never by Slurm."""
    mine = [a for a in attempts if is_local(a)]
    if not mine:
        return {}
    st = store.at(root)
    try:
        evs = events.read(st, strict=False)
    except (OSError, DispatchError):
        evs = []
    out = {}
    for a in mine:
        ok, why = local.ceased(st.root, a, evs)
        out[a] = (True, why) if ok else (False, f"{why}; if you know it has ceased: gc --ceased {a}")
    return out


def slurm_ends(attempts: Iterable[str], slurm: Optional[Slurm] = None) -> dict[str, dict]:
    """attempt -> how Slurm says that execution (job, R) ended, for executions no
    supervisor recorded: ``state`` (Slurm's state for the job's current execution,
    REQUEUED: requeued since; None: unknown), ``at`` (Slurm's end time, for the current
    execution), ``why`` in words (answer.py's). One read of slurmctld and, for
    the jobs it forgot, one sacct query. Local executions and those not named by an
    attempt token are not asked; another cluster's, or Slurm not answering, is ``state``
    None with the reason."""
    wanted = {a: p for a in attempts if not is_local(a) and (p := names.attempt_parts(a)) is not None}
    if not wanted:
        return {}
    slurm = slurm or Slurm()
    try:
        here = names.cluster_token(slurm.cluster_name())
        mine = {a: p for a, p in wanted.items() if p[0] == here}
        jobs = slurm.find_jobs({p[1] for p in mine.values()})
    except SlurmError as e:
        return {a: {"state": None, "at": None, "why": f"Slurm did not answer ({e})"} for a in wanted}
    out = {a: {"state": None, "at": None, "why": f"it ran on cluster {p[0]}, not on this one ({here})"}
           for a, p in wanted.items() if a not in mine}
    for a, (_, job, epoch) in mine.items():
        out[a] = _slurm_end(jobs.get(job), epochmod.decompose(epoch)[2])
    return out


def _slurm_end(j, r: int) -> dict:
    """How execution R of job ``j`` (None: Slurm knows it no more) ended, as slurm_ends says."""
    if j is None:
        return {"state": None, "at": None,
                "why": "Slurm knows the job no more (slurmctld forgot it and sacct has no record of it)"}
    _, why = answer.slurm_says(j, r)
    if j.restart_count > r:
        return {"state": "REQUEUED", "at": None, "why": why}
    if j.restart_count < r:
        return {"state": None, "at": None, "why": why}
    done = j.ended and "COMPLETING" not in j.states
    return {"state": "+".join([j.state, *sorted(j.flags - {j.state})]), "at": j.end_time if done else None,
            "why": why}
