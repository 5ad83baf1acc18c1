"""Holds: for a shared checkpoint, every recovery waits for a person or the cessation
signal, because a new execution must not start while the old one may still write into
the one folder. These functions act for the supervisor's loop (``sup``): they record
facts through it and ask Slurm and the site's cessation command."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from typing import Any, Optional

from ..slurm.client import SlurmError
from ..store import events
from . import requests
from .render import fmt_duration


def apply_released(sup, hold: dict) -> None:
    """A lifted hold: the rule it replaced applies now."""
    rule, ref = hold["replaces"], {"job": hold["job"], "r": hold["r"]}
    if rule == "resubmit":
        sup.fact("rule", rule="resubmit", after_hold=hold["hold"],
                  budget_left=sup.state.defn["resubmit"] - sup.state.used - 1, **ref)
    elif rule == "continue":
        sup.fact("rule", rule="continue", after_hold=hold["hold"], cause=hold.get("cause"),
                  budget_left=sup.state.defn.get("continuations", 0) - sup.state.continued - 1, **ref)
    elif rule == "requeue":
        if hold.get("slurm_held"):
            try:
                sup.slurm.release(hold["job"])
            except SlurmError as e:
                sup.fact("note", text=f"scontrol release {hold['job']} failed: {e}")
        sup.fact("rule", rule="requeue", after_hold=hold["hold"], **ref)
    else:
        sup.fact("rule", rule=rule, after_hold=hold["hold"], **ref)

def open_hold(sup, rule: dict) -> None:
    st = sup.state
    ex = st.ended.get(rule["r"]) if rule.get("job") == st.job else None
    ex = ex or rule.get("execution") or {}
    h = sup.fact("hold", hold=st.holds + 1, replaces=rule["rule"], cause=rule.get("cause"),
                  job=rule["job"], r=rule["r"], g=ex.get("g"), n=ex.get("n"), epoch=ex.get("epoch"),
                  attempt=ex.get("attempt"), nodes=ex.get("nodes", []), start_time=ex.get("start_time"),
                  slurm_held=bool(rule.get("slurm_held")), until=round(sup.clock() + st.defn["hold_for"], 3),
                  cessation_cmd=st.defn["cessation_cmd"], interval=st.defn["cessation_interval"])
    events.record("hold", root=sup.root, attempt=h.get("attempt") or "supervisor",
                  hold=h["hold"], replaces=h["replaces"], job=h["job"], until=h["until"])
    sup.say(f"HOLD #{h['hold']}: the checkpoint is shared, so {h['replaces']} waits until execution "
             f"R={h['r']} of job {h['job']} has ceased (asked every "
             f"{fmt_duration(h['interval'])}) or a person runs `dispatch-slurm release {sup.root}`")

def step(sup) -> float:
    """One look at the standing hold: a person's release, the cessation signal when due,
    or its expiry; the seconds until the next look."""
    st = sup.state
    h = st.hold
    rel = requests.read(sup.root, f"release.{h['hold']}")
    if rel is not None:
        who = {k: rel[k] for k in ("user", "uid", "host", "message", "entry") if k in rel}
        sup.fact("release", hold=h["hold"], by="person", requested_t=rel.get("t"), **who)
        events.record("release", root=sup.root, attempt=h.get("attempt") or "supervisor",
                      hold=h["hold"], by="person")
        return 0
    now = sup.clock()
    due = st.last_answer_t is None or now - st.last_answer_t >= h["interval"]
    expired = now >= h["until"]
    if due or (expired and not sup.asked_this_run):
        ans = sup.ask(h)
        sup.asked_this_run = True
        sup.fact("cessation", hold=h["hold"], job=h["job"], r=h["r"], **ans)
        events.record("cessation", root=sup.root, attempt=h.get("attempt") or "supervisor",
                      hold=h["hold"], answer=ans["answer"], source="supervisor")
        if ans["answer"] == "ceased":
            sup.fact("release", hold=h["hold"], by="cessation signal")
            events.record("release", root=sup.root, attempt=h.get("attempt") or "supervisor",
                          hold=h["hold"], by="cessation signal")
            return 0
        now = sup.clock()
    if expired:
        sup.fact("hold_expired", hold=h["hold"], until=h["until"])
        sup.finish("held", f"hold #{h['hold']} expired after {fmt_duration(st.defn['hold_for'])} with "
                            f"no answer: job {h['job']} stays held ({h['replaces']} not applied). When "
                            f"it is safe: `dispatch-slurm release {sup.root}`, then "
                            f"`dispatch-slurm run {sup.root}` to continue")
    next_ask = (st.last_answer_t or now) + h["interval"]
    return max(0.05, min(sup.poll, next_ask - now, h["until"] - now))

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
