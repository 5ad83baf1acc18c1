"""gc with Slurm's answers: which executions have ceased, then the store's gc.

gc removes saves of ceased executions only (policy.py). The evidence is
the cessation signal's (slurm/cessation.py): Slurm says the execution ended and nothing
of it is completing, and every node that ran it recorded its Epilog
(``ceased/<attempt>.<node>``) or booted after it started. Which nodes ran it comes
from the supervisor's record (its facts, which the caller passes: ``facts``), else from
Slurm while it still shows the job at that
restart count. When neither knows (a user-level job Slurm has since purged or
requeued, an execution of another cluster, Slurm not answering), cessation cannot be
shown and gc keeps the execution's saves and says why. Before any of that, the root
alone: an execution every node of which recorded its Epilog (the entries name the
execution's nodes) has ceased, Slurm unasked (``from_root``), so gc collects plugin jobs
nobody supervised. A person who knows better says
so with ``gc --ceased ATTEMPT`` (recorded as a ``cessation`` event; it counts for
that gc, and once gc has retired a save of the execution, for every later one). A local
execution (`env --local`, cluster "local") is never asked of Slurm: its processes on this
host say it (local.py)."""

from __future__ import annotations

import getpass
import socket
import time
from typing import Callable, Iterable, Optional

from .. import store
from ..contract import epoch as epochmod
from ..contract import names
from ..contract.env import LOCAL_CLUSTER
from ..errors import DispatchError
from ..slurm import cessation
from ..slurm.client import Slurm, SlurmError
from ..store import ceased as ceased_store
from ..store import events
from . import local, removal
from .policy import REMOVE, SHOWN, Policy, Verdict, needs


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
        ans = cessation.check(slurm, job, r, root=root, known={**recs.get(a, {}), "attempt": a, "g": g, "n": n})
        ok = ans["answer"] == cessation.CEASED
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
    execution), ``why`` in words (slurm/cessation.py's). One read of slurmctld and, for
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
    _, why = cessation.slurm_says(j, r)
    if j.restart_count > r:
        return {"state": "REQUEUED", "at": None, "why": why}
    if j.restart_count < r:
        return {"state": None, "at": None, "why": why}
    done = j.ended and "COMPLETING" not in j.states
    return {"state": "+".join([j.state, *sorted(j.flags - {j.state})]), "at": j.end_time if done else None,
            "why": why}


def gc(root: store.Root, policy: Policy, *, slurm: Optional[Slurm] = None, said: Iterable[str] = (),
       dry_run: bool = False, facts: Iterable[dict] = ()) -> list[Verdict]:
    """Ask about the executions the policy would remove something of, then collect
    (``root``: its name, or the store a caller keeps: every look at the root goes through it)."""
    st = store.at(root)
    root = st.root
    said = list(said)
    for a in said:
        if not a or "/" in a or a in (".", ".."):
            raise DispatchError(f"--ceased {a!r} is not an execution's name (a folder name under exec/)")
        if not dry_run:
            events.record("cessation", root=st, attempt=a, answer="ceased", source="person",
                          by=getpass.getuser(), on=socket.gethostname())
    want = needs(st.inventory(policy.pattern), policy, time.time())
    verdicts = removal.collect(st, policy, ceased(st, want, slurm, said, facts), dry_run=dry_run)
    gone = [v for v in verdicts if v.action == REMOVE]
    if gone and not dry_run:
        events.record("gc", root=st, attempt="gc", removed=[v.save.path for v in gone],
                      freed=sum(v.freed for v in gone), keep_last=policy.keep_last, keep_every=policy.keep_every)
    return verdicts


def after_execution(root: store.Root, keep_last: int, slurm: Slurm, facts: Iterable[dict] = ()) -> dict:
    """The supervisor's gc (``run --keep-last``): the fields of its ``gc`` fact; ``waiting``
    counts the saves kept only until their execution is shown to have ceased and goes
    quiet, ``latest`` names the latest publication before it ran. A failure is recorded,
    never the supervisor's end."""
    st = store.at(root)
    try:
        latest = st.latest()
        verdicts = gc(st, Policy(keep_last=keep_last), slurm=slurm, facts=facts)
    except (DispatchError, OSError) as e:
        return {"removed": 0, "freed": 0, "error": str(e)[-500:]}
    gone = [v for v in verdicts if v.action == REMOVE]
    return {"removed": sum(v.save.exists for v in gone), "freed": sum(v.freed for v in gone),
            "retired": len(gone), "keep_last": keep_last, "paths": [v.save.path for v in gone if v.save.exists][:50],
            "kept": sum(v.action != REMOVE and v.save.exists for v in verdicts),
            "waiting": sum(v.waiting and v.save.exists for v in verdicts), "latest": latest and latest.name}


class Collector:
    """The supervisor's gc (``run --keep-last K``; ``facts``: its record, read when gc runs):
    once an execution has ended (``run``),
    and while the job runs (``again``) when a new publication pushes an older save out of
    the K kept, and every --cessation-interval while saves wait only for their execution
    to cease and go quiet. It works through the root's store the supervisor keeps."""

    def __init__(self, root: store.Root, slurm: Slurm, clock: Callable[[], float], facts: Callable[[], list[dict]]):
        self.store = store.at(root)
        self.slurm, self.clock, self.facts = slurm, clock, facts
        self.at, self.waiting, self.latest = 0.0, 0, False  # latest False: no gc yet in this run

    def run(self, keep_last: int) -> dict:
        """The fields of a ``gc`` fact."""
        f = after_execution(self.store, keep_last, self.slurm, self.facts())
        self.at, self.waiting, self.latest = self.clock(), f.get("waiting", 0), f.get("latest")
        return f

    def again(self, defn: dict) -> Optional[dict]:
        """A ``gc`` fact's fields when a gc ran now and removed or retired something (or
        failed); None otherwise."""
        if not defn.get("keep_last") or self.latest is False:
            return None
        due = self.waiting and self.clock() - self.at >= defn["cessation_interval"]
        if not due:
            try:
                latest = self.store.latest()
            except (DispatchError, OSError):
                return None  # gc would fail the same way; the next execution's end records it
            due = latest is not None and latest.name != self.latest
        f = self.run(defn["keep_last"]) if due else {}
        return f if f.get("retired") or f.get("error") else None


def recorded_keep_last(facts: Iterable[dict]) -> Optional[int]:
    """The root's own gc policy: the supervisor's `run --keep-last` (its last job
    definition), None when it has none."""
    return next((f.get("keep_last") for f in reversed(list(facts)) if f["type"] == "job"), None)


def status(root: store.Root, policy: Optional[Policy] = None, slurm: Optional[Slurm] = None, ask: bool = True,
           facts: Iterable[dict] = (), inv: Optional[store.Inventory] = None) -> dict:
    """The retention state of ROOT for the report: every save gc knows of as kept,
    reclaimable (a gc with ``policy`` would remove it now) or retired, with its size
    and why, and the totals. ``policy`` defaults to the supervisor's ``run --keep-last``
    (its ``facts``), else none (every published save kept). Slurm is asked which
    executions ceased, unless ``ask`` is false (from the root alone: what gc retired
    before, and the executions every node of which recorded its Epilog). ``inv``: the
    root's inventory, if already read with the policy's pattern."""
    st = store.at(root)
    facts = list(facts)
    if policy is None:
        policy = Policy(keep_last=recorded_keep_last(facts))
    inv = inv or st.inventory(policy.pattern)
    want = needs(inv, policy, time.time())
    said = (ceased(st, want, slurm, facts=facts) if ask else from_root(st, want)) if want else {}
    rows = removal.state(st, policy, said, inv=inv)
    totals = {state: {"saves": sum(r["state"] == state for r in rows),
                      "bytes": sum(r["size"] for r in rows if r["state"] == state)} for state in SHOWN}
    return {"root": st.root, "policy": {"keep_last": policy.keep_last, "keep_every": policy.keep_every,
                                     "min_age": policy.min_age}, "saves": rows, "totals": totals}
