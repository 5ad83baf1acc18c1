"""Holds: the hold's part of the rule table (rules.py has the rest: what an ended
execution leads to). For a shared checkpoint every recovery waits for a person or the
cessation signal, because a new execution must not start while the old one may still
write into the one folder.

Pure functions of the state and of what was observed (a person's release request, the
cessation signal's answer, the time): the facts to record and what to do next. The loop
(loop.py) reads those inputs, records the facts and acts (events, scontrol). ``STAGES``
is the table ``plan`` and docs/supervisor.md show (``rules.hold_table``); ``stage``
picks its row, ``look`` says what the row leads to."""

from __future__ import annotations

from typing import NamedTuple, Optional

from ..contract.durations import fmt_duration

#: while a hold stands, the first of these that applies: (stage, when, then); ``{interval}``
#: and ``{hold_for}`` are the job's --cessation-interval and --hold-for
STAGES = (
    ("person", "a person ran `dispatch-slurm release ROOT`",
     "the hold is lifted: the replaced rule applies now (a resubmission with budget left submits)"),
    ("asking", "the cessation signal asked is still running (it may run for {interval}, at least {timeout})",
     "look again at the next poll (the other roots of the process go on meanwhile); past that time it is killed "
     "and its answer is 'unknown'"),
    ("ask", "the cessation signal is due: at the hold, then every {interval}, and once more at expiry by a "
            "supervisor that has not asked it yet (one restarted after the expiry)",
     "start it (`--cessation-cmd`): its answer is recorded when it exits"),
    ("ceased", "its answer is 'ceased'", "the hold is lifted: the replaced rule applies now"),
    ("expired", "{hold_for} passed since the hold, with neither",
     "recorded; the job stays held and `run` exits 3 (`dispatch-slurm release ROOT`, then `dispatch-slurm run "
     "ROOT`, continue it later)"),
    ("wait", "any other answer, or none due yet", "look again at the next poll, question or expiry"),
)


#: the least time the cessation command is given before it is killed (more when --cessation-interval is longer)
ASK_TIMEOUT = 30.0


def stages(interval: str, hold_for: str) -> list[dict]:
    """STAGES as rows, ``interval`` and ``hold_for`` filled in (the job's, or the options')."""
    return [{"stage": s, "when": when.format(interval=interval, hold_for=hold_for,
                                             timeout=fmt_duration(ASK_TIMEOUT)), "then": then}
            for s, when, then in STAGES]


def ask_timeout(h: dict) -> float:
    """How long the cessation command of hold ``h`` may run before it is killed, unanswered."""
    return max(ASK_TIMEOUT, h["interval"])


class Look(NamedTuple):
    """What one look at the standing hold leads to: its ``stage`` (a row of STAGES), the
    facts to record in order ((type, fields)), the finish (outcome, message) or None, and
    the seconds until the next look. Stage ``ask``: start the cessation signal; ``asking``:
    it runs, look again with its answer once it exited."""
    stage: str
    facts: tuple[tuple[str, dict], ...] = ()
    finish: Optional[tuple[str, str]] = None
    wait: float = 0.0

    @property
    def ask(self) -> bool:
        return self.stage == "ask"


def stage(st, now: float, request: Optional[dict], answer: Optional[dict], asked_this_run: bool,
          asking: bool = False) -> str:
    """The row of STAGES that applies to the standing hold ``st.hold``: ``request`` a
    person's release entry (or None), ``answer`` the cessation signal's, just collected (or
    None), ``asked_this_run`` whether this process asked it before, ``asking`` whether the
    question it asked is still running (no answer yet)."""
    h = st.hold
    if request is not None:
        return "person"
    if asking and answer is None:
        return "asking"
    if answer is None and due(st, h, now, asked_this_run):
        return "ask"
    if answer is not None and answer["answer"] == "ceased":
        return "ceased"
    return "expired" if now >= h["until"] else "wait"


def look(st, now: float, poll: float, root: str, request: Optional[dict] = None, answer: Optional[dict] = None,
         asked_this_run: bool = False, asking: bool = False) -> Look:
    """One look at the standing hold (see ``stage``); an answer is always recorded."""
    h = st.hold
    s = stage(st, now, request, answer, asked_this_run, asking)
    heard = () if answer is None else (("cessation", {"hold": h["hold"], "job": h["job"], "r": h["r"], **answer}),)
    if s == "person" and request is not None:
        return Look(s, (*heard, ("release", released_by_person(h, request))))
    if s == "ceased":
        return Look(s, (*heard, ("release", {"hold": h["hold"], "by": "cessation signal"})))
    if s == "expired":
        fact, finish = expired(st, h, root)
        return Look(s, (*heard, ("hold_expired", fact)), finish)
    if s == "ask":
        return Look(s)
    if s == "asking":
        return Look(s, wait=poll)
    return Look(s, heard, wait=next_look(h, now if answer is not None else st.last_answer_t, now, poll))


#: the facts of a hold that are also events (events/: for `report` and people): fact -> its fields the event keeps
EVENTS = {"hold": ("replaces", "job", "until"), "cessation": ("answer",), "release": ("by",)}


def event(f: dict) -> Optional[dict]:
    """The fields of the event a hold's fact ``f`` is also written as, or None (no event)."""
    keep = EVENTS.get(f["type"])
    if keep is None:
        return None
    return {**{k: f[k] for k in keep}, **({"source": "supervisor"} if f["type"] == "cessation" else {})}


def applied(st, hold: dict) -> tuple[dict, Optional[int]]:
    """A lifted hold: the rule fact of the rule it replaced, applied now, and the job to
    `scontrol release` before it is recorded (a requeue Slurm was told to hold), or None."""
    rule, ref = hold["replaces"], {"job": hold["job"], "r": hold["r"], "after_hold": hold["hold"]}
    if rule == "resubmit":
        return {"rule": "resubmit", "budget_left": st.defn["resubmit"] - st.used - 1, **ref}, None
    if rule == "continue":
        return {"rule": "continue", "cause": hold.get("cause"),
                "budget_left": st.defn.get("continuations", 0) - st.continued - 1, **ref}, None
    return {"rule": rule, **ref}, (hold["job"] if rule == "requeue" and hold.get("slurm_held") else None)


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


def next_look(h: dict, last_answer_t: Optional[float], now: float, poll: float) -> float:
    """Seconds until the hold is looked at again: the next poll, question or expiry."""
    next_ask = (last_answer_t or now) + h["interval"]
    return max(0.05, min(poll, next_ask - now, h["until"] - now))
