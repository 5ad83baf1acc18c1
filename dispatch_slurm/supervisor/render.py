"""What people read: one line per fact on the supervisor's stderr, and the plan."""

from __future__ import annotations

import json
import shlex
import time




def _rule(f: dict) -> str:
    extra = " -> HOLD" if f.get("held") else ""
    left = f" ({f['budget_left']} left)" if "budget_left" in f else ""
    why = f" [{f['cause'].replace('_', ' ')}]" if f.get("cause") else ""
    step = f"; latest published step {f['latest_step']}" if f.get("latest_step") is not None else ""
    because = f": {f['why']}" if f.get("why") else ""
    return f"rule: {f['rule']}{why}{left}{step}{extra}{because}"


def _hold(f: dict) -> str:
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["until"]))
    return f"hold #{f['hold']} on job {f['job']} R={f['r']} (instead of {f['replaces']}), until {until}"


_DESCRIBE = {
    "job": lambda f: (f"generation {f['g']}: {'shared checkpoint, ' if f['shared'] else ''}resubmit budget "
                      f"{f['resubmit']}, via {f['via']}: sbatch {shlex.join(f['args'])}"),
    "intent": lambda f: f"submitting G={f['g']} N={f['n']} (tag {f['tag']})",
    "submitted": lambda f: (f"submitted job {f['job']} (G={f['g']} N={f['n']})"
                            f"{' [found after a restart]' if f.get('recovered') else ''}"),
    "started": lambda f: f"job {f['job']} execution R={f['r']} started on {','.join(f['nodes'])} (epoch {f['epoch']})",
    "ended": lambda f: f"job {f['job']} execution R={f['r']} ended: {f['state']} ({f.get('reason') or '-'})",
    "rule": _rule,
    "hold": _hold,
    "cessation": lambda f: f"cessation signal for hold #{f['hold']}: {f['answer']}",
    "release": lambda f: f"hold #{f['hold']} released by {f['by']}",
    "finished": lambda f: f"finished: {f['outcome']}: {f.get('message', '')}",
    "launch_released": lambda f: f['why'],
    "supervisor": lambda f: f"supervisor {'resumed' if f.get('resumed') else 'started'} (pid {f['pid']} on {f['host']})",
}


def describe(f: dict) -> str:
    """One line per fact, for the supervisor's stderr."""
    t = f["type"]
    if t in _DESCRIBE:
        return _DESCRIBE[t](f)
    rest = {k: v for k, v in f.items() if k not in ("v", "seq", "t", "type")}
    return f"{t}: {json.dumps(rest)}"


def render_plan(p: dict) -> str:
    out = [f"root: {p['root']}  generation: {p['generation']}  ({p['state']})",
           f"shared checkpoint: {'yes' if p['shared_checkpoint'] else 'no'}  "
           f"resubmit budget: {p['resubmit_budget']} ({p['budget_left']} left)  continuations: "
           f"{p['continuations_budget']} ({p['continuations_left']} left)  via: {p['via']}",
           "submits: " + shlex.join(p["sbatch"])]
    if p["env"]:
        out.append("with: " + " ".join(f"{k}={v}" for k, v in p["env"].items()))
    out.append("when an execution ends:")
    for r in p["rules"]:
        sub = f" instead of {r['replaces']}" if r.get("replaces") else ""
        out += [f"  {r['when']}", f"      -> {r['rule']}{sub}: {r['then']}"]
    if p["hold"]:
        out.append(f"HOLD: {p['hold']['text']}")
        out.append("while a hold stands, the first of:")
        for s in p["hold"]["stages"]:
            out += [f"  {s['when']}", f"      -> {s['then']}"]
    out += [f"note: {n}" for n in p["notes"]]
    return "\n".join(out) + "\n"
