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


def _ended(e: dict) -> str:
    end, ces = e["ended"], e.get("cessation") or {}
    if ces.get("ceased"):
        gone = f"ceased on {','.join(ces['nodes'])} (Epilog)"
    elif ces.get("ceased") is False:
        gone = f"not shown to have ceased: no Epilog record from {','.join(ces['missing'])}"
    else:
        gone = ""
    if end is None:
        return gone or "running, or unknown (no record)"
    by = f" by uid {end['cancelled_by']}" if end.get("cancelled_by") is not None else ""
    rule = e.get("rule")
    then = ""
    if rule:
        why = f" ({rule['cause'].replace('_', ' ')})" if rule.get("cause") else ""
        then = f" -> {rule['rule']}{why}"
    if end.get("source") == "epilog":
        return gone
    return f"{end['state']}{by}{then}" + (f"; {gone}" if gone else "")


def size(n: float) -> str:
    """Bytes for people (IEC, as du -h and ls -h count): 512 B, 4.0 KiB, 50.0 MiB, 1.2 TiB.
    The one size format of `report`, `ls` and `gc`."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


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
    out += _retention(r.get("retention"))
    out += goodput.text(r.get("goodput"))
    if r["finished"]:
        out += ["", f"supervisor: finished, {r['finished']['outcome']}: {r['finished'].get('message', '')}"]
    return "\n".join(out) + "\n"


def _headline(r: dict) -> str:
    latest = r["latest"]
    if latest:
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


def _interruption(i: dict) -> str:
    resumed = i["resumed_from"]
    if i["overlap_s"] is None:
        wrote = "old kept writing - after the new one started"
    elif i["overlap_s"] == 0 and i.get("gap_s"):
        wrote = f"old stopped writing {i['gap_s']:.1f}s before the new one started"
    else:
        wrote = f"old kept writing {i['overlap_s']:.1f}s after the new one started"
    return (f"  {i['old']} -> {i['new']}: {wrote}; "
            f"resumed from " + (f"step {resumed['step']} ({resumed['path']})" if resumed else "scratch")
            + f"; steps lost: {i['steps_lost'] if i['steps_lost'] is not None else '-'}")


def _hold(h: dict, t0) -> str:
    answers = ", ".join(f"{a['answer']} {_t(a['t'], t0)}" for a in h["answers"]) or "none"
    rel = h["released"]
    return (f"  #{h['hold']} job {h['job']} R={h['r']} instead of {h['replaces']}, from {_t(h['from'], t0)}; "
            f"cessation answers: {answers}; "
            + (f"released {_t(rel['t'], t0)} by {rel['by']}" if rel else "not released"))
