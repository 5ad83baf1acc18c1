"""Holds: for a shared checkpoint, every recovery waits for a person or the cessation
signal, because a new execution must not start while the old one may still write into
the one folder. Pure functions of the state (what a hold fact, a release or an expiry
says, and when to look again), which the loop records and acts on; ``ask_command`` runs
the site's cessation command."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from typing import Any, Optional

from .render import fmt_duration


def applied(st, hold: dict) -> dict:
    """A lifted hold: the rule fact of the rule it replaced, applied now. (A requeue that
    Slurm was told to hold is also released in Slurm: the loop does that.)"""
    rule, ref = hold["replaces"], {"job": hold["job"], "r": hold["r"], "after_hold": hold["hold"]}
    if rule == "resubmit":
        return {"rule": "resubmit", "budget_left": st.defn["resubmit"] - st.used - 1, **ref}
    if rule == "continue":
        return {"rule": "continue", "cause": hold.get("cause"),
                "budget_left": st.defn.get("continuations", 0) - st.continued - 1, **ref}
    return {"rule": rule, **ref}


def opened(st, rule: dict, now: float) -> dict:
    """The hold fact standing in for ``rule`` (a held rule fact)."""
    ex = st.ended.get(rule["r"]) if rule.get("job") == st.job else None
    ex = ex or rule.get("execution") or {}
    return {"hold": st.holds + 1, "replaces": rule["rule"], "cause": rule.get("cause"),
            "job": rule["job"], "r": rule["r"], "g": ex.get("g"), "n": ex.get("n"), "epoch": ex.get("epoch"),
            "attempt": ex.get("attempt"), "nodes": ex.get("nodes", []), "start_time": ex.get("start_time"),
            "slurm_held": bool(rule.get("slurm_held")), "until": round(now + st.defn["hold_for"], 3),
            "cessation_cmd": st.defn["cessation_cmd"], "interval": st.defn["cessation_interval"]}


def announcement(h: dict, root: str) -> str:
    return (f"HOLD #{h['hold']}: the checkpoint is shared, so {h['replaces']} waits until execution "
            f"R={h['r']} of job {h['job']} has ceased (asked every {fmt_duration(h['interval'])}) or a person "
            f"runs `dispatch-slurm release {root}`")


def released_by_person(h: dict, req: dict) -> dict:
    """The release fact for a person's request entry (`dispatch-slurm release`)."""
    who = {k: req[k] for k in ("user", "uid", "host", "message", "entry") if k in req}
    return {"hold": h["hold"], "by": "person", "requested_t": req.get("t"), **who}


def due(st, h: dict, now: float, asked_this_run: bool) -> bool:
    """Whether the cessation signal is to be asked now: every interval, and once more on
    expiry if this process has not asked yet (a resumed supervisor's first look)."""
    return st.last_answer_t is None or now - st.last_answer_t >= h["interval"] or \
        (now >= h["until"] and not asked_this_run)


def expired(st, h: dict, root: str) -> tuple[dict, tuple[str, str]]:
    """The hold_expired fact and the finish it leads to."""
    return {"hold": h["hold"], "until": h["until"]}, (
        "held", f"hold #{h['hold']} expired after {fmt_duration(st.defn['hold_for'])} with no answer: job "
                f"{h['job']} stays held ({h['replaces']} not applied). When it is safe: `dispatch-slurm release "
                f"{root}`, then `dispatch-slurm run {root}` to continue")


def next_look(st, h: dict, now: float, poll: float) -> float:
    """Seconds until the hold is looked at again."""
    next_ask = (st.last_answer_t or now) + h["interval"]
    return max(0.05, min(poll, next_ask - now, h["until"] - now))


def ask_command(h: dict, root: str, cluster: Optional[str]) -> dict:
    """Run the site's cessation command for the held execution: exit 0 ceased, 1 not
    ceased, anything else (or no answer in time) cannot tell."""
    values = {"job": h["job"], "restart": h["r"], "root": root, "generation": h.get("g"),
              "submission": h.get("n"), "epoch": h.get("epoch"), "attempt": h.get("attempt"),
              "cluster": cluster, "nodes": ",".join(h.get("nodes") or []),
              "started": h.get("start_time")}
    values = {k: "" if v is None else str(v) for k, v in values.items()}
    argv = [part.format(**values) for part in shlex.split(h["cessation_cmd"])]
    if argv[0] == "dispatch-slurm" and shutil.which("dispatch-slurm") is None:
        argv[:1] = [sys.executable, "-m", "dispatch_slurm"]  # e.g. run from a venv not on PATH
    timeout = max(30.0, h["interval"])
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        return {"answer": "unknown", "exit": None, "error": f"{argv[0]}: not found ({e})"}
    except subprocess.TimeoutExpired:
        return {"answer": "unknown", "exit": None, "error": f"no answer within {timeout:g} s"}
    answer = {0: "ceased", 1: "not_ceased"}.get(p.returncode, "unknown")
    out: dict[str, Any] = {"answer": answer, "exit": p.returncode}
    try:
        out["evidence"] = json.loads(p.stdout)
    except ValueError:
        out["output"] = p.stdout.strip()[-1000:]
    if p.stderr.strip():
        out["stderr"] = p.stderr.strip()[-500:]
    return out
