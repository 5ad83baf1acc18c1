"""gc: remove executions' saves the retention policy does not keep, safely, on any store.

The rules are policy.py's; the store reads the root into an inventory and does the
removing (its interface: retire, pins, remove); whether an execution has ceased is an
input (``ceased``: slurm/cessation/executions.py answers). The order is this module's, the same on every
store, so that a gc killed at any moment leaves every publication either intact or
clearly retired:

1. ``pub/`` is made durable (every publication the inventory saw, the latest it keeps
   among them, is then durable: a crash cannot bring back an older latest whose save is
   removed); for every save to remove, ``retired/<publication name>`` is created if absent
   (O_EXCL and durable; on S3 a PUT with If-None-Match: *) for each of its publications
   (for an unpublished leftover: the name it would have had at its execution's epoch and
   step): the publication is retired before a byte of its save is touched;
2. pinned/ and pub/ are read again: a save pinned, or published again (adopted),
   since the inventory is kept (an adopter pins the save before it checks retired/, so
   one of the two always sees the other);
3. the save is removed (POSIX: through directory fds, never following a symlink, then
   its folders up to ``exec/<attempt>`` if they are left empty; S3: DeleteObjects of
   every key under it).

gc never retires the latest publication, and pub/ only grows, so a publication below
the latest stays below it: ``latest`` (the max of pub/) never names a retired save.
A person may retire any publication (``retire``: a marker holding who and why); the
latest is then the greatest publication not retired, for gc as for ``latest``, and the
retired save is removed like any other once its execution has ceased."""

from __future__ import annotations

import time
from typing import Mapping, Optional

from .. import store
from ..contract import layout
from ..errors import BadPath
from ..store import Inventory, events, retired_by, retirement_record
from .policy import KEEP, REMOVE, Policy, Verdict, decide, empty_folders, pinned


def collect(root: store.Root, policy: Policy, ceased: Mapping[str, tuple[bool, str]], *, dry_run: bool = False,
            now: Optional[float] = None) -> list[Verdict]:
    """Apply the policy to the root: every save's verdict, and what was freed. ``ceased``:
    attempt -> (ceased?, evidence); ``dry_run``: decide only."""
    now = time.time() if now is None else now
    st = store.at(root)
    inv = st.inventory(policy.pattern)
    verdicts = decide(inv, policy, ceased, now)
    doomed = [v for v in verdicts if v.action == REMOVE]
    if dry_run:
        return verdicts
    with st:
        st.owned()  # removing under a root someone else controls is never ours to do
        if doomed:
            st.retire([name for v in doomed for name in store.markers(v.save)])
            now_pinned, now_pubs = st.pins(), st.publications()
        for v in doomed:
            again = [p.name for p in now_pubs if p.path == v.save.path and p not in v.save.pubs]
            if pinned(v.save.path, now_pinned) or again:
                v.action = KEEP
                v.why = (f"published again meanwhile ({again[0]}): kept, its older publications retired"
                         if again else "pinned meanwhile: kept, its publications retired")
                continue
            v.freed = st.remove(v.save.path, tuple(v.save.held))
        st.drop_empty(empty_folders(inv, policy, ceased, now))
    return verdicts


def state(root: store.Root, policy: Optional[Policy] = None, ceased: Optional[Mapping[str, tuple[bool, str]]] = None,
          now: Optional[float] = None, inv: Optional[Inventory] = None) -> list[dict]:
    """The retention state of every save gc knows of, as JSON-able rows: ``state`` kept,
    reclaimable (a gc with this policy would remove it now) or retired (removed), with
    ``size`` (bytes on disk; on S3 bytes stored), ``why``, its publications and retired
    markers. Without a policy every published save counts as kept; without ``ceased`` only
    what gc retired before is known to have ceased. ``inv``: the root's inventory, if read."""
    return scan_state(root, policy, ceased, now, inv)[1]


def scan_state(root: store.Root, policy: Optional[Policy] = None, ceased: Optional[Mapping[str, tuple[bool, str]]] = None,
               now: Optional[float] = None, inv: Optional[Inventory] = None) -> tuple[Inventory, list[dict]]:
    """``state``, with the inventory it was decided from (``ls``: the latest, who retired what)."""
    policy = policy or Policy(min_age=0)
    inv = inv or store.at(root).inventory(policy.pattern)
    verdicts = decide(inv, policy, ceased or {}, time.time() if now is None else now)
    return inv, [v.as_dict(inv.latest) for v in verdicts]


def pin(root: store.Root, save) -> tuple[str, bool]:
    """Pin ``save`` (a save or a folder of saves under the root): gc never removes it; (its
    path under the root, whether the pin is new). A ``pinned/`` entry, the store's."""
    return store.at(root).pin(save)


def unpin(root: store.Root, save) -> tuple[str, bool]:
    """Drop the pin of ``save`` (which may be gone); (its path, whether a pin was there)."""
    return store.at(root).unpin(save)


def _publication(root: str, target: str) -> str:
    """The publication name ``target`` names: the name, pub/<name>, or <root>/pub/<name>."""
    for prefix in (f"{root.rstrip('/')}/{layout.PUB}/", f"{layout.PUB}/"):
        if target.startswith(prefix):
            return target[len(prefix):]
    return target


def retire(root: str, target: str | None, reason: str, by: str, host: str) -> dict:
    """A person's retirement of one publication (``target``, or with None the one
    ``latest`` names, or a latest gc retired): ``retired/<name>`` holding who and why,
    so that ``latest`` skips it on purpose and gc removes its save once its execution has
    ceased; recorded as a ``retired`` event. pub/ is never touched. Returns what was
    retired, whether it already was (by whom), and the latest publication now."""
    st = store.at(root)
    pubs = st.publications()  # every entry parsed: a bad one is the first error
    by_name = {p.name: p for p in pubs}
    retired, by_person = st.retired_state()
    if target is None:
        top = store.latest_of(pubs, retired, by_person)
        name = top and top.name
        if name is None:
            raise BadPath(f"nothing to retire: no publication under {root}/{layout.PUB} is left that "
                          "`dispatch-slurm latest` would name")
    else:
        name = _publication(root, target)
        if name not in by_name:
            raise BadPath(f"{name!r} is not a publication of {root} (the names are in "
                          f"`dispatch-slurm ls {root} --json`; or retire the latest: --latest)")
    pub = by_name[name]
    done = {"name": name, "step": pub.step, "path": pub.path}
    if name in by_person:
        return {**done, "already": by_person[name], "latest": st.latest()}
    old = st.person_marker(name, retirement_record(by, reason, host))
    if old is not None:  # a person retired it meanwhile
        return {**done, "already": retired_by(old), "latest": st.latest()}
    events.record("retired", root=root, attempt="retire", name=name, step=pub.step, path=pub.path, by=by,
                  reason=reason, on=host, was_retired_by_gc=name in retired)
    return {**done, "already": None, "latest": st.latest()}
