"""The report as text: times relative to the first execution's start, one line each."""

from __future__ import annotations

import time
from typing import Optional

from . import goodput


def _t(t: Optional[float], t0: Optional[float]) -> str:
    return "-" if t is None or t0 is None else f"+{t - t0:.1f}s"


def _dash(value) -> str:
    """A value, or '-' for one nobody knows (never 'None')."""
    return "-" if value is None else str(value)


_BY = {"epilog": "Epilog", "epilog (rejoined)": "Epilog", "sweep": "a later job's sweep"}


def _gone(ces: dict) -> str:
    """Where the root shows its processes gone, and who recorded each node's evidence."""
    if ces.get("ceased"):
        by: dict[str, list[str]] = {}
        for n in ces["nodes"]:
            by.setdefault(_BY.get(ces.get("sources", {}).get(n), "its ceased/ entry"), []).append(n)
        return "ceased on " + ", ".join(f"{','.join(ns)} ({who})" for who, ns in by.items())
    if ces.get("ceased") is False:
        return f"not shown to have ceased: no Epilog record from {','.join(ces['missing'])}"
    return ""


def _ended(e: dict) -> str:
    end, gone = e["ended"], _gone(e.get("cessation") or {})
    if end is None:
        return "; ".join(x for x in (gone, f"end unknown: {e.get('end_unknown') or 'no record'}") if x)
    if end.get("source") == "this host":
        return f"{end['state']}: {end['why']}"
    by = f" by uid {end['cancelled_by']}" if end.get("cancelled_by") is not None else ""
    rule = e.get("rule")
    then = ""
    if rule:
        why = f" ({rule['cause'].replace('_', ' ')}{': ' + rule['why'] if rule.get('why') else ''})" \
            if rule.get("cause") else ""
        then = f" -> {rule['rule']}{why}"
    if end.get("source") == "epilog":
        return gone
    says = " (Slurm)" if end.get("source") == "slurm" else ""
    return f"{end['state']}{says}{by}{then}" + (f"; {gone}" if gone else "")


def size(n: float) -> str:
    """Bytes for people (IEC, as du -h and ls -h count): 512 B, 4.0 KiB, 50.0 MiB, 1.2 TiB.
    The one size format of `report`, `ls` and `gc`."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"


def plural(n: int, word: str) -> str:
    """'1 save', '2 saves', '0 saves'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _retention(ret: Optional[dict]) -> list[str]:
    """gc's view: totals per state, then every save with its state, size and why."""
    if not ret or not ret["saves"]:
        return []
    keep = ret["policy"]["keep_last"]
    out = ["", f"retention ({'run --keep-last ' + str(keep) if keep else 'no gc policy: every published save kept'}):"]
    out.append("  " + ", ".join(f"{state} {plural(t['saves'], 'save')} {size(t['bytes'])}"
                                for state, t in ret["totals"].items()))
    for s in ret["saves"]:
        mark = " (latest)" if s["latest"] else ""
        out.append(f"  {s['state']:<11} {size(s['size']):>10}  {s['path']}{mark}: {s['why']}")
    return out


def text(r: dict) -> str:
    execs = r["executions"]
    t0 = min((e["started_at"] for e in execs if e["started_at"] is not None), default=None)
    out = [_headline(r)]
    if t0 is not None:
        out.append(f"times are seconds after {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t0))}")
    out.append("")
    out += _table(execs, t0) if execs else ["no execution has written under this root yet"]
    out += _section("interruptions", [_interruption(i) for i in r["interruptions"]])
    out += _section("holds", [_hold(h, t0) for h in r["holds"]])
    out += _section("publications", [f"  {_t(p['t'], t0):>10}  step {p['step']:<8} epoch {p['epoch']:<14} {p['path']}"
                                     for p in r["publications"]])
    out += _section("published saves removed from their execution's folder", [_removed(x, t0)
                                                                              for x in r.get("removed", [])])
    out += _section("warnings", [_warning(w) for w in r.get("warnings", [])])
    out += _retention(r.get("retention"))
    out += goodput.text(r.get("goodput"))
    if r["finished"]:
        out += ["", f"supervisor: finished, {r['finished']['outcome']}: {r['finished'].get('message', '')}"]
    return "\n".join(out) + "\n"


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:6])) + (f" ... {steps[-1]}" if len(steps) > 6 else "")


def _removed(x: dict, t0) -> str:
    """Who removed which of its saves: the execution whose folder held them (nothing else writes there)."""
    when = "" if x["first_t"] is None else (f", seen gone at {_t(x['first_t'], t0)}" if x["first_t"] == x["last_t"]
                                            else f", seen gone {_t(x['first_t'], t0)}..{_t(x['last_t'], t0)}")
    held = f"; step {_steps(x['held'])} kept whole by its publication's held links" if x["held"] else ""
    gone = f"; step {_steps(x['gone'])} gone for good (its links went with a newer save of it)" if x["gone"] else ""
    return (f"  {x['attempt']}: {plural(len(x['steps']), 'save')} removed by that execution (its trainer's rotation, "
            f"or an rm in its job script){when}{held}{gone}")


def _headline(r: dict) -> str:
    latest = r["latest"]
    if latest and latest.get("exists") is False:
        says = (f"step {latest['step']} ({latest['path']}), whose save is GONE: `latest` refuses it, and nothing "
                "can resume from it")
    elif latest:
        says = f"step {latest['step']} ({latest['path']})"
    else:
        says = "none left to resume from (every publication retired)" if r["publications"] else "nothing published"
    return (f"{r['root']}: {plural(len(r['executions']), 'execution')}, "
            f"{plural(len(r['publications']), 'publication')}; latest: {says}")


def _table(execs: list[dict], t0) -> list[str]:
    rows = [("EXECUTION", "JOB", "G", "N", "R", "NODES", "STARTED", "LAST WRITE", "PUBS", "MAX STEP", "ENDED")]
    for e in execs:
        rows.append((e["attempt"], _dash(e["job"]), _dash(e["generation"]), _dash(e["submission"]),
                     _dash(e["restart"]), ",".join(e["nodes"]) or "-", _t(e["started_at"], t0),
                     _t(e["last_write_at"], t0), str(len(e["publications"])), _dash(e["max_step"]), _ended(e)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]) for row in rows]


def _section(title: str, lines: list[str]) -> list[str]:
    return ["", f"{title}:", *lines] if lines else []


def _wrote(i: dict) -> str:
    """How the old execution's writing relates to the new one's start, as far as known."""
    if not i["old_wrote"]:
        end = (i["old_ended"] or {}).get("at")
        start = i.get("new_started_at")
        if end is None or start is None:
            return "old wrote nothing"
        return f"old wrote nothing and ended {abs(start - end):.1f}s {'before' if end <= start else 'after'} " \
               "the new one started"
    if i["overlap_s"] is None:
        return "old wrote until -; when the new one started is unknown"
    if i["overlap_s"] == 0 and i.get("gap_s"):
        return f"old stopped writing {i['gap_s']:.1f}s before the new one started"
    return f"old kept writing {i['overlap_s']:.1f}s after the new one started"


def _resume(i: dict) -> str:
    r = i["resumed_from"]
    what = f"step {r['step']} ({r['path']})" if r else "scratch"
    if i["resumed_by"] == "its resume event":
        return f"resumed from {what}"
    others = "; ".join(f"step {c['step']} was published {c['after_start_s']:.1f}s after it started, before its "
                       "first write" for c in i["resume_candidates"])
    return f"resumed from {what} (presumed: the latest when it started; no resume event{'; ' + others if others else ''})"


def _lost(i: dict) -> str:
    if i["steps_lost"] is not None:
        return f"steps lost: {i['steps_lost']}"
    least = i.get("steps_lost_at_least")
    return f"steps lost: unknown{f', at least {least}' if least else ''} ({i['steps_lost_why']})"


def _interruption(i: dict) -> str:
    return f"  {i['old']} -> {i['new']}: {_wrote(i)}; {_resume(i)}; {_lost(i)}"


WARNINGS = {
    "unpublished_saves": "started from step 0 while earlier executions had left saves nothing published",
    "never_complete": "its publisher (watch, or the view's) ended with saves it never published",
    "lightning_auto_requeue": "ran with Lightning's SLURMEnvironment(auto_requeue=True): its hpc_ckpt saves are "
                              "never published",
}


def _warning(w: dict) -> str:
    paths = w.get("paths") or []
    shown = f": {', '.join(paths[-3:])}" + (f" ({w['count']} in all)" if (w.get("count") or 0) > 3 else "") \
        if paths else ""
    said = (f"  {w['attempt']}: {WARNINGS.get(w['kind'], w['kind'])}" if w["attempt"] is not None
            else "  next execution: starts from step 0 unless one is published")  # report's own look: none yet
    return f"{said}{shown}" + (f"\n    to resume from one: {w['fix']}" if w.get("fix") else "")


def _hold(h: dict, t0) -> str:
    answers = ", ".join(f"{a['answer']} {_t(a['t'], t0)}" for a in h["answers"]) or "none"
    rel = h["released"]
    return (f"  #{h['hold']} job {h['job']} R={h['r']} instead of {h['replaces']}, from {_t(h['from'], t0)}; "
            f"cessation answers: {answers}; "
            + (f"released {_t(rel['t'], t0)} by {rel['by']}" if rel else "not released"))
