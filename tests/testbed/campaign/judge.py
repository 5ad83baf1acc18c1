"""The judge: each side's checker run (``checker.check``), the lineage the checker keeps, the
goodput measured from the trainer's log beside the report's estimate."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from dispatch_slurm.report import goodput

from .. import checker
from .schedule import Params

if TYPE_CHECKING:
    from .runs import Side


def rejudge(results: list[dict], keep: Path) -> list[dict]:
    """Check a finished campaign again from the files ``--keep`` copied (a checker changed
    since): each mode's anomalies replaced by what the checker says of its kept files now."""
    for r in results:
        for mode, m in r["modes"].items():
            d = keep / r.get("id", "") / mode
            if "check" not in m or not d.is_dir():
                continue
            c = checker.Run.from_json(m["check"])
            c.trainer_log, c.sacct = str(d / "train.jsonl"), str(d / "sacct.json")
            c.root = str(d / "root") if c.root else None
            c.folder = str(d / "shared") if c.folder else None
            m["anomalies"] = checker.as_dicts(checker.check(c))
    return results


def lineage(execs: list[checker.Execution], rel: Callable[[Optional[str]], Optional[str]]) -> set[tuple[str, int]]:
    """(attempt, step) of every step the final state contains: from the last ``done`` back
    through each resume to the execution whose save it loaded."""
    out: set[tuple[str, int]] = set()
    done = [(r, e) for e in execs for r in e.ops("done")]
    if not done:
        return out
    r, ex = max(done, key=lambda re: re[0]["t"])
    upto, until = r["step"], r["t"]
    seen = set()
    while ex is not None and ex.attempt not in seen:
        seen.add(ex.attempt)
        res = next(iter(ex.ops("resume")), None)
        low = res["step"] if res else 0
        out |= {(ex.attempt, s["step"]) for s in ex.ops("step") if low < s["step"] <= upto and s["t"] <= until}
        if res is None:
            break
        path = rel(res["path"])
        writes = [(w["t"], w, e) for e in execs for w in e.ops("save") if rel(w["path"]) == path and w["t"] <= res["t"]]
        if not writes:
            break
        _, w, ex = max(writes, key=lambda x: x[0])
        upto, until = w["step"], w["t"]
    return out


def measured_goodput(run: checker.Run, faults: int, p: Params) -> dict:
    """The run's wall time in goodput's buckets, from the trainer's log and Slurm's
    accounting, and Young/Daly's prediction for its fault rate, save and restart times."""
    c = checker.Checker(run)
    execs = c.execs
    if not execs:
        return {"goodput": None}
    keep = lineage(execs, c.rel)
    intervals: list[tuple[float, float, str]] = []
    saves, restarts = [], []
    prev_last: Optional[float] = None
    for ex in execs:
        recs = [r for r in ex.records if r.get("rank", 0) == 0]
        start = min(ex.start["t"], ex.first_t)  # a Hugging Face trainer's launch, before its imports
        steps = [r for r in recs if r["op"] == "step"]
        first = steps[0]["t"] - run.step_time if steps else ex.last_t
        intervals.append((start, first, "restore"))
        if prev_last is not None and steps:
            restarts.append(max(0.0, first - prev_last))
        t = first
        begin = None
        for r in recs:
            if r["op"] == "step":
                intervals.append((max(t, r["t"] - 1.5 * run.step_time), r["t"],
                                  "productive" if (ex.attempt, r["step"]) in keep else "recomputed"))
            elif r["op"] == "save_begin":
                begin = r["t"]
            elif r["op"] in ("save", "save_failed") and begin is not None:
                intervals.append((begin, r["t"], "save"))
                saves.append(r["t"] - begin)
                begin = None
            if r["op"] in ("step", "save", "save_failed"):
                t = r["t"]
        if steps:
            prev_last = steps[-1]["t"]
    sacct_raw = json.loads(Path(run.sacct).read_text()) if run.sacct else {"jobs": []}
    wall0 = min(e.first_t for e in execs)
    for j in sacct_raw.get("jobs", []):
        tm = j.get("time") or {}
        sub, elig, st = (checker._num(tm.get(k)) for k in ("submission", "eligible", "start"))
        a = elig or sub
        if a and st and st > a:
            intervals.append((a, st, "queue"))
        if sub:
            wall0 = min(wall0, sub)
    done = [r["t"] for r in c.log if r["op"] == "done"]
    wall1 = max(done) if done else max(e.last_t for e in execs)
    out = goodput.summary(goodput.split(wall0, wall1, intervals))
    tau = p.save_every * p.step_time
    delta = statistics.mean(saves) if saves else 0.0
    r_mean = statistics.mean(restarts) if restarts else 0.0
    out["prediction"] = goodput.young_daly(tau, delta, r_mean, out["wall_s"] / faults if faults else math.inf) \
        if faults else None
    out["faults"] = faults
    out["finished"] = bool(done)
    return out


def report_estimate(root: str) -> Optional[dict]:
    """What `dispatch-slurm report` says of the run's goodput, from the root alone."""
    from dispatch_slurm import report
    try:
        return report.build(root).get("goodput")
    except Exception as e:  # the report's failure is a finding, not the campaign's end
        return {"error": str(e)[-500:]}


def _quick_run(side: Side) -> checker.Run:
    """The checker's view of a side without asking Slurm again (for the picture)."""
    s, p = side.run.setup, side.camp.params
    return checker.Run(mode=side.mode, trainer="hf" if s.trainer == "hf" else "det",
                       max_steps=p.hf_steps if s.trainer == "hf" else p.steps, save_every=p.save_every,
                       step_time=p.step_time, ranks=s.ranks, seed=side.run.seed % 1000, trap=side.trap,
                       trainer_log=str(side.bed.path(side.log)), root=str(side.hroot) if side.hroot else None,
                       root_in_cluster=side.root, folder_in_cluster=side.shared,
                       folder=str(side.bed.path(side.shared)) if side.shared else None)
