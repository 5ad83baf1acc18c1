"""Goodput: the share of a run's wall time that became preserved training progress, and
where the rest went, beside what Young's and Daly's checkpoint models predict.

The buckets (``BUCKETS``, in the order that decides an instant two executions share: an old
execution still stepping while its replacement saves is badput only if nothing productive
happens at that instant):

  productive  steps that the final state contains (the lineage the latest save descends from)
  save        time inside saves (the files of a save being written)
  recomputed  steps that were thrown away: done after the save the next execution resumed
              from, or by an execution no later one resumed from; someone does them again
  restore     an execution's start to its first step (loading the save, the model, the data)
  queue       waiting in Slurm's queue: submission (or a requeue's eligibility) to start
  restart     everything else: from an execution's end to the next one's submission or start

``split`` is the arithmetic; ``estimate`` fills the buckets from what the root and the
supervisor's record hold (``report.build``'s data), with no cooperation from the trainer:

- an execution's steps are known only through its publications: its step rate is the
  steps between its first and last publication over the time between them (else the
  run's median rate), its first step is its first publication less that many steps'
  time after its resume point, and it was productive up to the publication the next
  execution of the lineage resumed from (the latest publication, for the last one) and
  recomputed after it, to its end (Slurm's, or its last write);
- a save's time is the span of its files' mtimes (the saves still in the root; their mean
  for those rotated away) plus the grace saves' own measure (``checkpoint_complete``);
- queue: the record's submissions and requeues to Slurm's start of the next execution.

``young_daly`` is the prediction for a fault rate, a save time and a restart time: Young's
first-order waste (the saves' share ``delta/(tau+delta)`` plus ``(tau/2 + R)/M`` lost per
fault) and Daly's complete model,
``T_wall / T_solve = M e^(R/M) (e^((tau+delta)/M) - 1) / tau``, with their optimal intervals.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Optional

from .. import store
from ..errors import DispatchError
from ..store import events as eventsmod

BUCKETS = ("productive", "save", "recomputed", "restore", "queue", "restart")


def split(start: float, end: float, intervals: Iterable[tuple[float, float, str]]) -> dict[str, float]:
    """Seconds of ``[start, end]`` in each bucket. Where intervals overlap the earlier bucket
    of ``BUCKETS`` counts; time that no interval covers is ``restart``."""
    spans = [(max(a, start), min(b, end), BUCKETS.index(k)) for a, b, k in intervals if min(b, end) > max(a, start)]
    cuts = sorted({start, end, *(a for a, _, _ in spans), *(b for _, b, _ in spans)})
    out = dict.fromkeys(BUCKETS, 0.0)
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        ranks = [k for x, y, k in spans if x <= mid < y]
        out[BUCKETS[min(ranks)] if ranks else "restart"] += b - a
    return out


def summary(buckets: dict[str, float]) -> dict:
    """The buckets with the wall time and the goodput (productive / wall)."""
    wall = sum(buckets.values())
    return {"wall_s": wall, "goodput": buckets["productive"] / wall if wall > 0 else None,
            "buckets": {k: round(v, 3) for k, v in buckets.items()}}


def young_daly(tau: float, delta: float, restart: float, mtbf: float) -> dict:
    """The goodput Young's and Daly's models predict for saves every ``tau`` seconds of work,
    each taking ``delta``, a restart taking ``restart``, a fault every ``mtbf`` seconds, and
    the save interval each model calls optimal."""
    out: dict[str, Optional[float]] = {"tau_s": tau, "delta_s": delta, "restart_s": restart, "mtbf_s": mtbf}
    if tau <= 0 or mtbf <= 0:
        return {**out, "young": None, "daly": None, "young_tau_s": None, "daly_tau_s": None}
    waste = delta / (tau + delta) + (tau / 2 + restart) / mtbf
    out["young"] = max(0.0, 1.0 - waste)
    try:
        out["daly"] = tau / (mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf))
    except OverflowError:
        out["daly"] = 0.0
    out["young_tau_s"] = math.sqrt(2 * delta * mtbf)
    out["daly_tau_s"] = (math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(delta / (2 * mtbf)) / 3 + delta / (18 * mtbf))
                         - delta) if delta < 2 * mtbf else mtbf
    return out


# -- the estimate from the root and the record -----------------------------------------------


def _save_times(st: store.Store, r: dict) -> dict[str, float]:
    """save path -> the span of its files' mtimes, for the saves still in the root."""
    out = {}
    for e in r["executions"]:
        for s in e.get("saves") or []:
            rel = f"exec/{e['attempt']}/{s['name']}"
            try:
                times = [t for t in (st.mtime(rel, n) for n in st.listing(rel)) if t is not None]
            except (OSError, DispatchError):
                continue
            if times:
                out[rel] = max(times) - min(times)
    return out


def _lineage(r: dict) -> dict[str, int]:
    """attempt -> the highest step of it that the final state contains: from the latest
    publication back through each execution's resume point."""
    by_path = {p["path"]: p for p in r["publications"]}
    resumed = {i["new"]: i["resumed_from"] for i in r["interruptions"]}
    out: dict[str, int] = {}
    cur = r["latest"]
    while cur is not None:
        attempt = cur["path"].split("/")[1] if cur["path"].startswith("exec/") else None
        if attempt is None or attempt in out:
            break
        out[attempt] = cur["step"]
        nxt = resumed.get(attempt)
        cur = by_path.get(nxt["path"]) if nxt else None
    return out


def _resume_step(r: dict, attempt: str) -> int:
    for i in r["interruptions"]:
        if i["new"] == attempt and i["resumed_from"]:
            return i["resumed_from"]["step"]
    return 0


def _published(e: dict) -> list[dict]:
    """The execution's publications with a time, oldest first."""
    return sorted((p for p in e["publications"] if p["t"] is not None), key=lambda p: p["t"])


def _rate(ps: list[dict]) -> Optional[float]:
    """Steps per second between an execution's first and last publication."""
    if len(ps) >= 2 and ps[-1]["t"] > ps[0]["t"] and ps[-1]["step"] > ps[0]["step"]:
        return (ps[-1]["step"] - ps[0]["step"]) / (ps[-1]["t"] - ps[0]["t"])
    return None


def _end(e: dict) -> float:
    """When the execution ended: Slurm's word (the record), else its last write."""
    end = (e["ended"] or {}).get("at") or e["last_write_at"] or e["started_at"]
    return max(end, e["last_write_at"] or end)


def _execution(r: dict, e: dict, rate: Optional[float], upto: Optional[int], saves: dict[str, float],
               mean_save: float) -> list[tuple[float, float, str]]:
    """One execution's intervals: restore to its first step, productive to the save the
    lineage kept (``upto``), recomputed after it, and its saves."""
    ps, end = _published(e), _end(e)
    if not ps:
        return [(e["started_at"], end, "recomputed" if upto is None else "restore")]
    rate = _rate(ps) or rate
    begin = _resume_step(r, e["attempt"])
    first = min(ps[0]["t"] - (ps[0]["step"] - begin) / rate if rate else e["started_at"], ps[0]["t"])
    # a start known only from the folder's oldest file comes after rotation removed the older
    # ones: never later than its first step
    started = min(e["started_at"], first)
    first = max(first, started)
    cut = max((p["t"] for p in ps if upto is not None and p["step"] <= upto), default=first)
    out = [(started, first, "restore"), (first, cut, "productive"), (cut, end, "recomputed")]
    return out + [(p["t"] - saves.get(p["path"], mean_save), p["t"], "save") for p in ps]


def estimate(r: dict, facts: Iterable[dict] = (), root: Optional[store.Root] = None,
             evs: Optional[list[dict]] = None) -> Optional[dict]:
    """The buckets of a run from its report (``report.build``) and the supervisor's facts;
    None while no execution has published. ``root``: the store the report read (default:
    the report's root, opened here), ``evs``: the events it read (default: read again)."""
    execs = [e for e in r["executions"] if e["started_at"] is not None]
    if not any(e["publications"] for e in execs):
        return None
    st = store.at(root if root is not None else r["root"])
    saves = _save_times(st, r)
    mean_save = statistics.mean(saves.values()) if saves else 0.0
    rates = [x for x in (_rate(_published(e)) for e in execs) if x]
    median_rate = statistics.median(rates) if rates else None
    kept = _lineage(r)
    intervals: list[tuple[float, float, str]] = []
    for e in execs:
        intervals += _execution(r, e, median_rate, kept.get(e["attempt"]), saves, mean_save)
    intervals += _grace_saves(eventsmod.read(st) if evs is None else evs)
    intervals += [(a, b, "queue") for a, b in _queued(list(facts))]
    out = summary(split(min(a for a, _, _ in intervals), max(_end(e) for e in execs), intervals))
    out["source"] = "estimate from the root and the record"
    out["save_s"] = mean_save
    return out


def _grace_saves(evs: list[dict]) -> list[tuple[float, float, str]]:
    """The grace saves the handler measured (``checkpoint_complete``: elapsed since the signal)."""
    return [(e["t"] - e["elapsed"], e["t"], "save") for e in evs
            if e["type"] == "checkpoint_complete" and isinstance(e.get("elapsed"), (int, float))]


def _queued(facts: list[dict]) -> list[tuple[float, float]]:
    """(queued, started) for each execution the record saw start: a submission's time, or a
    requeue's end, to Slurm's start time of the next execution of that job."""
    out = []
    waiting: dict[int, float] = {}
    for f in facts:
        if f["type"] == "submitted":
            waiting[f["job"]] = f["t"]
        elif f["type"] == "ended" and f.get("requeued"):
            waiting[f["job"]] = f["t"]
        elif f["type"] == "started" and f["job"] in waiting and f.get("start_time"):
            a = waiting.pop(f["job"])
            if f["start_time"] > a:
                out.append((a, float(f["start_time"])))
    return out


def of_report(r: dict, facts: Iterable[dict] = (), root: Optional[store.Root] = None,
              evs: Optional[list[dict]] = None) -> Optional[dict]:
    """``estimate`` that never stops the report: a root whose names cannot be read has none."""
    try:
        return estimate(r, facts, root, evs)
    except (OSError, DispatchError, ZeroDivisionError, ValueError):
        return None


def text(g: Optional[dict]) -> list[str]:
    """The report's goodput lines."""
    if not g:
        return []
    b = g["buckets"]
    wall = g["wall_s"] or 1.0
    parts = ", ".join(f"{k} {v:.0f}s ({100 * v / wall:.0f}%)" for k, v in b.items() if k != "productive" and v > 0)
    return ["", f"goodput: {100 * (g['goodput'] or 0):.1f}% of {wall:.0f}s wall time was productive steps "
                f"({b['productive']:.0f}s); badput: {parts or 'none'}",
            "  (estimated from the publications' times and the record: see `dispatch_slurm.report.goodput`)"]
