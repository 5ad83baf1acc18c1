"""Cessation evidence: ``<root>/ceased/<attempt>.<node>``, written by the Epilog (as
the job user) once the execution's processes on that node are gone, read by the
cessation signal (slurm/cessation/). O_EXCL and durable like a publication, and
idempotent: Slurm may run an Epilog twice for one execution (TERMINATE_JOB retries).

The entry holds how the Epilog knows, as one JSON object (``{"by": "cgroup v2",
"cgroup": ..., "state": "gone"}`` or ``{"by": "process scan"}``), and which nodes ran the
execution (``"nodes"``: what Slurm gave the Prolog); an entry of an older Epilog is
empty, and says only that it was recorded.

``execution`` reads an execution's cessation from the root alone: its nodes are those
its entries (and the Prolog's ``execution_started`` events) name, and it has ceased once
every one of them has its entry. No node of an execution runs its processes after its
Epilog ran there (slurmd revokes the job's credential first), so nothing else is needed."""

import json
from typing import Any

from ..contract import layout
from ..errors import BadPath, DispatchError, StoreError
from . import events
from .roots import Root, at

MAX_EVIDENCE = 256 << 10  # one JSON object: how, and the execution's node list (~20,000 names fit)


def record(root: Root, attempt: str, node: str, evidence: dict | None = None, nodes: list[str] | None = None) -> bool:
    """Record that ``attempt``'s processes on ``node`` are gone (``evidence``: how that is
    known; ``nodes``: every node of the execution); True if recorded now, False if it
    already was (a second Epilog run changes nothing)."""
    if not attempt or "/" in attempt or not node or "/" in node:
        raise BadPath(f"bad attempt {attempt!r} or node {node!r}")
    body = {**(evidence or {}), **({"nodes": sorted(nodes)} if nodes else {})}
    return at(root).create(layout.CEASED, f"{attempt}.{node}", json.dumps(body, sort_keys=True).encode() if body else b"")


def nodes(root: Root, attempt: str) -> set[str]:
    """The nodes whose Epilog recorded that this execution's processes are gone."""
    prefix = f"{attempt}."
    return {e[len(prefix):] for e in at(root).listing(layout.CEASED) if e.startswith(prefix)}


def _evidence(data: bytes | None) -> dict:
    try:
        ev = json.loads(data) if data else {}
    except ValueError:
        ev = {}
    return ev if isinstance(ev, dict) else {}


def entries(root: Root, attempt: str) -> dict[str, dict]:
    """node -> the evidence its Epilog recorded for this execution (``{}``: an empty entry,
    one that is not a JSON object, or one that cannot be read)."""
    st = at(root)
    out: dict[str, dict] = {}
    prefix = f"{attempt}."
    with st:
        for n in (e[len(prefix):] for e in st.listing(layout.CEASED) if e.startswith(prefix)):
            try:
                out[n] = _evidence(st.read(layout.CEASED, f"{attempt}.{n}", MAX_EVIDENCE))
            except StoreError:
                out[n] = {}
    return out


def _names(value) -> set[str]:
    """A recorded node list, or nothing if it is not a list of names."""
    if isinstance(value, list) and all(isinstance(n, str) and n and "/" not in n for n in value):
        return set(value)
    return set()


def execution(root: Root, attempt: str, evs: list[dict] | None = None) -> dict:
    """The execution's cessation from the root alone: ``nodes`` (every node the Epilogs'
    entries and the Prolog's ``execution_started`` events name; [] when none names them),
    ``recorded`` (node -> its Epilog's evidence), ``missing`` (nodes without an entry),
    ``ceased`` (True once every node has its entry; False while some has not; None when
    the nodes are unknown), ``at`` (the last Epilog's ``cessation`` event, when every node
    recorded one) and ``why`` in words. ``evs``: the root's events, if already read (else
    this attempt's are read; a root without events/ has none)."""
    st = at(root)
    recorded = entries(st, attempt)
    if evs is None:
        try:
            evs = events.read(st, attempt, strict=False)
        except (OSError, DispatchError):  # an events file nobody can read is no evidence either way
            evs = []
    mine = [e for e in evs if e.get("attempt") == attempt]
    nodes = set().union(*(_names(ev.get("nodes")) for ev in recorded.values()))
    nodes |= set().union(*(_names(e.get("nodes")) for e in mine
                           if e.get("type") == "execution_started" and e.get("source") == "prolog"))
    out: dict[str, Any] = {"nodes": sorted(nodes), "recorded": recorded, "missing": sorted(nodes - set(recorded)),
                           "at": None}
    if not nodes:
        out["ceased"] = None
        out["why"] = ("no Epilog or Prolog record under the root names the nodes that ran it" if not recorded else
                      f"the Epilogs of {', '.join(sorted(recorded))} recorded it but not which nodes ran it "
                      "(an older Epilog)")
        return out
    out["ceased"] = not out["missing"]
    if out["missing"]:
        out["why"] = (f"no Epilog record from {', '.join(out['missing'])} (of {', '.join(sorted(nodes))})"
                      + (f"; recorded by {', '.join(sorted(recorded))}" if recorded else ""))
        return out
    ts = {e.get("node"): e["t"] for e in mine if e.get("type") == "cessation"
          and str(e.get("source", "")).startswith("epilog")}
    if nodes <= set(ts):
        out["at"] = max(ts[n] for n in nodes)
    out["why"] = f"every node that ran it recorded its Epilog ({', '.join(sorted(nodes))})"
    return out
