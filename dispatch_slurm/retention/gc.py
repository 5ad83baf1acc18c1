"""gc: remove the saves a policy no longer keeps, of executions shown to have ceased.

gc removes saves of ceased executions only (policy.py), and asks which have ceased of the
cessation home (slurm/cessation/executions.py: the root's Epilog records, a local
execution's processes, else Slurm). A person who knows better says so with ``gc --ceased
ATTEMPT`` (recorded as a ``cessation`` event; it counts for that gc, and once gc has
retired a save of the execution, for every later one). ``Collector``: the supervisor's gc
(``run --keep-last``); ``status``: the report's retention state."""

from __future__ import annotations

import getpass
import socket
import time
from typing import Callable, Iterable, Optional

from .. import store
from ..errors import DispatchError
from ..slurm.cessation.executions import ceased, from_root
from ..slurm.client import Slurm
from ..store import events
from . import removal
from .policy import REMOVE, SHOWN, Policy, Verdict, needs


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
        self.at, self.waiting = 0.0, 0
        self.latest: str | None | bool = False  # False: no gc yet in this run

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
