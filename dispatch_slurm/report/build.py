"""The report's data: what happened to a job, read from its root alone.

Every execution (its attempt, epoch, job, nodes, when it started, when it last wrote,
how it ended), the overlaps between an execution and its replacement, each
publication, the holds and cessation answers, and the steps lost to each
interruption. Sources, all under the root, read through the store: its inventory (each
exec folder's saves and times, the publications, retired/ and pinned/), events/
(signals, publications, cessation), ceased/ (the Epilog's evidence) and, when a
supervisor ran, record.jsonl (Slurm's word on how each execution ended). Without a supervisor
record, Slurm is asked once (slurmctld, else its accounting, as gc asks) how each execution of
this cluster ended; a local execution (`env --local`) is answered by its processes on this host
(slurm/cessation/local.py); else what its events say. The retention section is gc's view from the root alone (the
record's `run --keep-last`, retired/ and pinned/; Slurm is not asked, so a save waits
for its execution's cessation until gc has seen it).

Definitions:
  started      when Slurm or the hooks say it started: the supervisor's `started` fact
               (Slurm's start time), the Prolog's `execution_started` event (Slurm's
               start time from 24.11, else when the Prolog ran), whichever is first;
               without either, the trainer's own `execution_started` event, else its
               oldest file (`started_by` in --json says which)
  last write   the newest mtime in its exec folder, or its last event or publication
               (the hooks' own events are not its writes)
  ended        how it ended: the supervisor's record (Slurm's word), else Slurm asked now, else
               (local) its processes on this host, else its events; `cessation`: the root's
               own evidence that its processes are gone (every node that ran it, as the
               Prolog listed them, recorded its Epilog, or a later job's sweep did: `sources`)
  overlap      how long an execution kept writing after its replacement started
               (`gap_s`: how long before the replacement started it stopped, if it did; both
               None when it wrote nothing, or when the replacement's start is unknown)
  resumed from the publication the replacement resumed from: its own `resumed` event (written
               where the package resolves the resume: `latest --resume`, every integration),
               else presumed: the latest publication when it started (`resumed_by` says which;
               `resume_candidates`: publications made after it started and before its first
               write, which it may have read instead)
  steps lost   what the interruption cost: the highest step the execution saved minus the
               step its replacement resumed from, plus what it computed after its last save.
               That last part is known only where the execution's own process says it saved
               at its stop and exited (a `checkpoint_complete` event of the handler or an
               integration): then it is 0. Elsewhere `steps_lost` is None (unknown) and
               `steps_lost_at_least` the saved part: never 0 on no evidence
"""

from __future__ import annotations

from typing import Any, Optional

from .. import store
from ..contract import layout, names
from ..contract.epoch import decompose
from ..errors import BadPath, DispatchError
from ..retention import status
from ..slurm.cessation import executions as cessation
from ..slurm.cessation import local
from ..store import ceased
from ..store import events as eventsmod
from ..store import unpublished
from ..supervisor.record import Record
from . import goodput

RECORD_TYPES = ("started", "ended", "rule", "hold", "cessation", "release", "finished", "stop")


def _token(attempt: str) -> dict:
    """cluster, job and (G, N, R) from an attempt token, read by the contract's parser
    (an exec folder not named like a token has no cluster or job)."""
    epoch = names.attempt_epoch(attempt)
    cluster, job, _ = names.attempt_parts(attempt) or (None, None, None)
    g, n, r = decompose(epoch) if epoch is not None else (None, None, None)
    return {"attempt": attempt, "epoch": epoch, "cluster": cluster, "job": job,
            "generation": g, "submission": n, "restart": r}


HOOKS = ("prolog", "epilog", "epilog (rejoined)", "sweep")  # the `source` of the hooks' own events


def _started(folder: dict, mine: list[dict], facts_starts: list[float]) -> tuple[Optional[float], Optional[str]]:
    """(when the execution started, by whose word): Slurm's or the hooks' evidence first
    (a save published by the old execution just after the new one started must not count
    as the new one's resume point), then the trainer's event, then its oldest file."""
    prolog = [e.get("start_time") if isinstance(e.get("start_time"), (int, float)) else e["t"]
              for e in mine if e["type"] == "execution_started" and e.get("source") == "prolog"]
    trainer = [e["t"] for e in mine if e["type"] == "execution_started" and e.get("source") not in HOOKS]
    for by, ts in (("slurm" if facts_starts else "prolog", facts_starts + prolog),
                   ("execution_started event", trainer), ("oldest file", [folder["first"]] if folder["first"] else [])):
        if ts:
            return min(ts), by
    return None, None


def _execution(attempt: str, folder: dict, evs: list[dict], facts: list[dict], pubs: list,
               cessation: Optional[dict] = None) -> dict:
    """One execution as the report shows it: its nodes, publications, signals, start, last
    write and end, from its folder, the events, the supervisor's record and the Epilogs'."""
    ex = {**_token(attempt), "nodes": set(), "publications": [], "signals": [], "ended": None, "rule": None}
    mine = [e for e in evs if e.get("attempt") == attempt]
    ex["nodes"] |= _event_nodes(mine)
    facts_starts = _from_record(ex, attempt, facts)
    ex["publications"] = [{"step": p.step, "path": p.path, "name": p.name, "t": t} for p, t in pubs
                          if p.path.split("/")[:2] == [layout.EXEC, attempt]]
    ex["signals"] = [{"t": e["t"], "signal": e.get("signal"), "grace": e.get("grace")}
                     for e in mine if e["type"] == "preempt_signal"]
    saved = [e["t"] for e in mine if e["type"] == "checkpoint_complete" and e.get("source") not in HOOKS]
    ex["saved_at_stop"] = bool(saved)
    if ex["ended"] is None and saved:
        ex["ended"] = {"state": "PREEMPTED (grace save)", "at": max(saved), "source": "events"}
    ex["started_at"], ex["started_by"] = _started(folder, mine, facts_starts)
    ex["last_write_at"] = _last_write(folder, mine, ex["publications"])
    ex["first_write_at"] = _first_write(folder, mine, ex["publications"])
    ex["resumed_events"] = [{k: e.get(k) for k in ("t", "step", "name", "path", "by")}
                            for e in mine if e["type"] == "resumed"]
    _apply_cessation(ex, cessation, mine)
    ex["saves"] = folder["saves"]
    ex["max_step"] = max([s["step"] for s in folder["saves"]] + [p["step"] for p in ex["publications"]],
                         default=None)
    ex["ceased_on"] = sorted(folder["ceased"])
    ex["nodes"] = sorted(ex["nodes"] | set(folder["ceased"]))
    return ex


def _own_write(e: dict) -> bool:
    """An event the execution wrote itself (not the hooks', not the supervisor's holds)."""
    return e.get("type") not in ("cessation", "hold", "release") and e.get("source") not in HOOKS


def _event_nodes(mine: list[dict]) -> set:
    """The hosts of the execution's own events (the admin side's hosts ran none of it),
    and the nodes the hooks name."""
    return ({e["host"] for e in mine if _own_write(e) and e.get("host")}
            | {e["node"] for e in mine if e.get("source") in HOOKS and isinstance(e.get("node"), str)})


def _from_record(ex: dict, attempt: str, facts: list[dict]) -> list[float]:
    """What the supervisor's record says of the execution: its nodes, its end and the rule
    decided for it (the last rule about (job, R): a held one is applied later). Returns
    the start times it recorded."""
    starts = []
    for f in facts:
        if f.get("attempt") != attempt or f["type"] not in ("started", "ended"):
            continue
        ex["nodes"] |= set(f.get("nodes") or [])
        if f["type"] == "started":
            starts += [f["start_time"]] if f.get("start_time") else []
            continue
        ex["ended"] = {"state": f["state"], "reason": f.get("reason"), "at": f["t"],
                       "cancelled_by": f.get("cancelled_by"), "source": "supervisor record"}
        ref = (f["job"], f["r"])
        ex["rule"] = next(({"rule": g["rule"], "cause": g.get("cause"), "why": g.get("why"),  # the rule's words
                            "held": bool(g.get("held"))}
                           for g in reversed(facts) if g["type"] == "rule" and (g.get("job"), g.get("r")) == ref),
                          None)
    return starts


def _last_write(folder: dict, mine: list[dict], publications: list[dict]) -> Optional[float]:
    lasts = [folder["last"]] + [e["t"] for e in mine if _own_write(e)] + [p["t"] for p in publications]
    return max((t for t in lasts if t), default=None)


def _first_write(folder: dict, mine: list[dict], publications: list[dict]) -> Optional[float]:
    """Its first write after the resume look-up: its oldest file or publication (its
    events before training, `env --local`'s and the resume's own, are not)."""
    firsts = [folder["first"]] + [e["t"] for e in mine if _own_write(e) and e["type"] not in
                                  ("execution_started", "resumed")] + [p["t"] for p in publications]
    return min((t for t in firsts if t), default=None)


def _apply_cessation(ex: dict, cessation: Optional[dict], mine: list[dict]) -> None:
    """The Epilogs' evidence: shown with who recorded each node's (``sources``: node -> the
    cessation event's source: "epilog", "epilog (rejoined)", or "sweep" when a later job's
    hook on that node did), its nodes added, and the end when nothing else says it."""
    ex["cessation"] = None
    if cessation is None:
        return
    ex["cessation"] = {k: cessation[k] for k in ("ceased", "nodes", "missing", "at", "why")}
    ex["cessation"]["sources"] = {e["node"]: e.get("source") for e in mine if e["type"] == "cessation"
                                  and isinstance(e.get("node"), str) and e.get("node") in cessation["recorded"]}
    ex["nodes"] |= set(cessation["nodes"])
    if ex["ended"] is None and cessation["ceased"]:
        ex["ended"] = {"state": "ceased", "at": cessation["at"], "source": "epilog"}


def _pub_times(st: store.Store, pubs: list, evs: list[dict]) -> list:
    """(publication, when it was made): the `published` event's time, else when the store
    says the entry was made (a POSIX mtime; on S3 the event is the only time)."""
    by_name = {e.get("name"): e["t"] for e in evs if e["type"] == "published" and not e.get("existed")}
    return [(p, by_name[p.name] if p.name in by_name else st.published_at(p.name)) for p in pubs]


def _steps(entries) -> list[dict]:
    """The saves among an exec folder's entries (named ``checkpoint-<step>``), by step."""
    out = []
    for name in sorted(entries):
        try:
            out.append({"step": names.step_of(name), "name": name})
        except BadPath:
            continue
    return sorted(out, key=lambda s: s["step"])


def _folders(st: store.Store, inv: store.Inventory) -> dict[str, dict]:
    """attempt -> {first, last (times), saves [{step, name}], ceased [nodes]}: every folder
    under exec/, from the inventory, with the Epilogs' entries under ceased/."""
    out: dict[str, dict] = {a: {"first": f.first, "last": f.last, "saves": _steps(f.entries), "ceased": []}
                            for a, f in sorted(inv.folders.items())}
    for entry in st.listing(layout.CEASED):
        for attempt, info in out.items():
            if entry.startswith(attempt + "."):
                info["ceased"].append(entry[len(attempt) + 1:])
    return out


def _resume_point(pubs: list, before: Optional[float], epoch: int, withdrawn: dict[str, float]) -> Optional[dict]:
    """The latest publication of a lower epoch that existed when an execution started,
    less those a person had retired by then (``withdrawn``: name -> when)."""
    seen = [(p, t) for p, t in pubs if p.epoch < epoch and (before is None or (t is not None and t <= before))
            and not (p.name in withdrawn and (before is None or withdrawn[p.name] <= before))]
    if not seen:
        return None
    p, t = max(seen, key=lambda pt: (pt[0].epoch, pt[0].step, pt[0].name))
    return {"step": p.step, "path": p.path, "epoch": p.epoch}


def _resumed(new: dict, pubs: list, withdrawn: dict[str, float]) -> tuple[Optional[dict], str, list[dict]]:
    """(what ``new`` resumed from, by whose word, the other publications it may have read):
    its own last ``resumed`` event, else the latest publication when it started, with the
    publications made after that and before its first write."""
    said = new["resumed_events"]
    if said:
        e = said[-1]
        if e.get("step") is None:
            return None, "its resume event", []
        p = next((p for p, _ in pubs if p.name == e.get("name")), None)
        return {"step": e["step"], "path": e.get("path"), "epoch": p.epoch if p else None}, "its resume event", []
    point = _resume_point(pubs, new["started_at"], new["epoch"] or 0, withdrawn)
    start, first = new["started_at"], new["first_write_at"]
    later = [] if start is None or first is None else \
        [{"step": p.step, "path": p.path, "epoch": p.epoch, "after_start_s": t - start} for p, t in pubs
         if p.epoch < (new["epoch"] or 0) and t is not None and start < t <= first and p.name not in withdrawn
         and (point is None or (p.epoch, p.step) > (point["epoch"], point["step"]))]
    return point, "the latest publication when it started", later


def _lost(old: dict, resumed: Optional[dict], candidates: list[dict]) -> dict:
    """``steps_lost`` (None: unknown), ``steps_lost_at_least`` and why: see the module doc."""
    base = max([resumed["step"] if resumed else 0] + [c["step"] for c in candidates])
    saved = 0 if old["max_step"] is None else max(0, old["max_step"] - base)
    if candidates:
        why = (f"it is not known whether the replacement resumed from step {resumed['step'] if resumed else 0} or "
               f"a later save (step {', '.join(str(c['step']) for c in candidates)}): it wrote no resume event")
        return {"steps_lost": None, "steps_lost_at_least": saved, "steps_lost_why": why}
    if old["max_step"] is not None and old["saved_at_stop"]:
        return {"steps_lost": saved, "steps_lost_at_least": saved, "steps_lost_why": "its handler saved at its stop "
                "and exited (checkpoint_complete): nothing computed after its last save"}
    what = f"after its last save (step {old['max_step']})" if old["max_step"] is not None else "(it saved nothing)"
    return {"steps_lost": None, "steps_lost_at_least": saved,
            "steps_lost_why": f"nothing under the root tells what it computed {what}"}


def build(root: store.Root, slurm: Any = None, ask_slurm: bool = True) -> dict[str, Any]:
    """The report's data (what `report --json` prints). ``slurm``: the client to ask how
    the executions no supervisor recorded ended (default: this host's); ``ask_slurm``
    False: not asked (their end then comes from the root alone). The root's store is
    opened once and every reader below is given it."""
    st = store.at(root)
    root = st.root
    inv = st.inventory()
    every_fact = Record(st).read()
    facts = [f for f in every_fact if f["type"] in RECORD_TYPES]
    pubs = _pub_times(st, sorted((p for s in inv.saves.values() for p in s.pubs), key=lambda p: p.name),
                      evs := eventsmod.read(st))
    folders = _folders(st, inv)
    execs = sorted((_execution(a, folders[a], evs, facts, pubs, _cessation(st, a, evs)) for a in folders),
                   key=lambda e: (e["epoch"] is None, e["epoch"] or 0, e["attempt"]))
    _unrecorded_ends(root, execs, evs, slurm if ask_slurm else False)
    withdrawn = {e["name"]: e["t"] for e in evs if e["type"] == "retired" and "name" in e}
    interruptions = [_interruption(old, new, pubs, withdrawn) for old, new in zip(execs, execs[1:])]
    latest = inv.latest  # what `latest` names
    r = {"root": root, "executions": execs, "interruptions": interruptions, "holds": _holds(facts),
            "publications": [{"epoch": p.epoch, "step": p.step, "path": p.path, "name": p.name, "t": t}
                             for p, t in pubs],
            "latest": None if latest is None else {"step": latest.step, "path": latest.path, "name": latest.name,
                                                   "exists": inv.saves[latest.path].exists,
                                                   "held": inv.saves[latest.path].held_only},
            "removed": _removed(inv, evs),
            "finished": next((f for f in reversed(facts) if f["type"] == "finished"), None),
            "warnings": _warnings(evs) + ([] if pubs else _left_unpublished(st, evs, execs)),
            "retention": status(st, ask=False, facts=every_fact, inv=inv)}
    r["goodput"] = goodput.of_report(r, every_fact, st, evs)
    return r


def _removed(inv: store.Inventory, evs: list[dict]) -> list[dict]:
    """Per execution, its published saves gone from its folder: only it writes there, so its
    trainer's rotation (or an rm in its job script, or a person) removed them; when its watch
    saw each go, and which its publication's held links still keep."""
    seen = {e["path"]: e["t"] for e in evs if e["type"] == "removed" and "path" in e}
    out: dict[str, dict] = {}
    for s in sorted(inv.saves.values(), key=lambda s: (s.attempt or "", s.step or 0, s.path)):
        if not s.pubs or s.attempt is None or (s.exists and not s.held_only) or any(p.name in inv.retired
                                                                                  for p in s.pubs):
            continue
        row = out.setdefault(s.attempt, {"attempt": s.attempt, "steps": [], "held": [], "gone": [], "first_t": None,
                                         "last_t": None})
        step = max(p.step for p in s.pubs)
        row["steps"].append(step)
        row["held" if s.held_only else "gone"].append(step)
        if (t := seen.get(s.path)) is not None:
            row["first_t"] = t if row["first_t"] is None else min(row["first_t"], t)
            row["last_t"] = t if row["last_t"] is None else max(row["last_t"], t)
    return list(out.values())


def _warnings(evs: list[dict]) -> list[dict]:
    """What the executions warned of (``warning`` events: saves left unpublished, Lightning's
    own requeue), once per execution and kind, the first time it was said."""
    seen: dict[tuple, dict] = {}
    for e in evs:
        if e["type"] == "warning":
            seen.setdefault((e.get("attempt"), e.get("kind")), {k: e.get(k) for k in (
                "t", "attempt", "kind", "by", "message", "paths", "count")})
    return list(seen.values())


def _left_unpublished(st: store.Store, evs: list[dict], execs: list[dict]) -> list[dict]:
    """With nothing published: the saves the exec folders hold, when no execution said so
    (a trainer that calls no resume of dispatch-slurm, such as plain Lightning's
    ``fit(ckpt_path=None)`` under its own requeue, warns of nothing). Named for the first
    execution started after the oldest of them (it started from step 0), else for the next
    one, with the command that publishes the newest."""
    if any(e["type"] == "warning" and e.get("kind") == "unpublished_saves" for e in evs):
        return []
    found = unpublished.find(st)
    if not found:
        return []
    oldest = min(f.epoch for f in found)
    after = next((e for e in execs if e["epoch"] is not None and e["epoch"] > oldest), None)
    return [{"t": None, "attempt": after and after["attempt"], "kind": "unpublished_saves", "by": "report",
             "message": unpublished.message(st.root, found), "paths": [f.path for f in found[-20:]],
             "count": len(found), "fix": unpublished.publish_command(st.root, found)}]


def _interruption(old: dict, new: dict, pubs: list, withdrawn: dict[str, float]) -> dict:
    """One execution and the next: how long the old one wrote on (or stopped before), what
    the new one resumed from (and by whose word), and the steps lost."""
    resumed, by, candidates = _resumed(new, pubs, withdrawn)
    overlap = gap = None
    if old["last_write_at"] is not None and new["started_at"] is not None:
        overlap = max(0.0, old["last_write_at"] - new["started_at"])
        gap = max(0.0, new["started_at"] - old["last_write_at"])
    return {"old": old["attempt"], "new": new["attempt"], "old_ended": old["ended"], "old_wrote":
            old["last_write_at"] is not None, "new_started_at": new["started_at"], "overlap_s": overlap,
            "gap_s": gap, "resumed_from": resumed, "resumed_by": by, "resume_candidates": candidates,
            **_lost(old, resumed, candidates)}


def _unrecorded_ends(root: str, execs: list[dict], evs: list[dict], slurm: Any) -> None:
    """How the executions the supervisor's record says nothing of ended: a local one by its
    processes on this host, the others by Slurm (one query; ``slurm`` False: not asked).
    Slurm's word replaces what the events alone suggested; ``end_unknown`` says why an
    end stays unknown."""
    todo = [e for e in execs if e["ended"] is None or e["ended"]["source"] in ("events", "epilog")]
    for e in todo:
        e["end_unknown"] = "no supervisor record"
        if cessation.is_local(e["attempt"]):
            ok, why = local.ceased(root, e["attempt"], evs)
            if ok is None:
                e["end_unknown"] = why
            else:
                e["ended"] = {"state": "ended" if ok else "running", "at": None, "source": "this host", "why": why}
    asked = [e for e in todo if not cessation.is_local(e["attempt"])]
    if not asked or slurm is False:
        return
    said = cessation.slurm_ends([e["attempt"] for e in asked], slurm)
    for e in asked:
        ans = said.get(e["attempt"])
        if ans is None:
            continue
        if ans["state"] is None:
            e["end_unknown"] = f"no supervisor record; {ans['why']}"
            continue
        grace = e["ended"] is not None and e["ended"]["source"] == "events"
        e["ended"] = {"state": ans["state"], "at": ans["at"], "source": "slurm", "why": ans["why"],
                      "grace_save": grace}


def _cessation(st: store.Store, attempt: str, evs: list[dict]) -> Optional[dict]:
    """The root's own cessation evidence for the execution (store/ceased.py); None when
    it cannot be read."""
    try:
        return ceased.execution(st, attempt, evs)
    except (OSError, DispatchError):
        return None


def _holds(facts: list[dict]) -> list[dict]:
    holds: dict[int, dict] = {}
    for f in facts:
        if f["type"] == "hold":
            holds[f["hold"]] = {"hold": f["hold"], "job": f["job"], "r": f["r"], "replaces": f["replaces"],
                                "attempt": f.get("attempt"), "from": f["t"], "answers": [], "released": None}
        elif f["type"] == "cessation" and f["hold"] in holds:
            holds[f["hold"]]["answers"].append({"t": f["t"], "answer": f["answer"]})
        elif f["type"] == "release" and f["hold"] in holds:
            holds[f["hold"]]["released"] = {"t": f["t"], "by": f["by"]}
    return list(holds.values())
