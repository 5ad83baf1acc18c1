"""The supervisor's state: a pure replay of the record's facts.

``State.apply`` is the only way it changes, for replayed facts and new ones alike, so
a restarted supervisor is in exactly the state its predecessor left."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class State:
    """What the facts so far say. ``apply`` is the only way it changes, for replayed
    facts and new ones alike, so a restarted supervisor is in the state its predecessor
    left."""

    defs: dict[int, dict] = field(default_factory=dict)
    g: Optional[int] = None
    n: Optional[int] = None
    tag: Optional[str] = None
    intent_t: Optional[float] = None
    job: Optional[int] = None
    intent_open: bool = False
    need_submit: bool = False
    submitted_in_g: int = 0
    submit_failures: int = 0
    last_submit_error: str = ""
    started: Optional[dict] = None
    ended: dict[int, dict] = field(default_factory=dict)
    pending_decision: Optional[dict] = None
    hold_needed: Optional[dict] = None
    hold: Optional[dict] = None
    holds: int = 0
    last_answer_t: Optional[float] = None
    pending_apply: Optional[dict] = None
    used: int = 0  # resubmissions of this generation
    continued: int = 0  # continuations of this generation (time-limit ends)
    stalls: int = 0  # consecutive continuations that published no higher step
    last_step: Optional[int] = None  # the latest published step at the last decision
    finished: Optional[dict] = None
    stopping: Optional[dict] = None  # a person asked to stop (`dispatch-slurm stop`)
    retry_n: Optional[int] = None  # an N sbatch refused: reused, never allocated anew
    refused_by_test: bool = False  # the last failure was `sbatch --test-only`'s: the job itself is bad
    cluster: Optional[str] = None
    facts: int = 0

    @property
    def defn(self) -> dict:
        return self.defs[self.g] if self.g is not None else {}

    def apply(self, f: dict) -> None:
        self.facts += 1
        t = f["type"]
        if t == "supervisor":
            self.cluster = f.get("cluster") or self.cluster
        elif t == "job":
            self.g = f["g"]
            self.defs[self.g] = f
            self.n = self.tag = self.job = self.started = None
            self.ended = {}
            self.intent_open = False
            self.need_submit = True
            self.submitted_in_g = self.used = self.continued = self.stalls = self.submit_failures = 0
            self.last_step = None
            self.pending_decision = self.hold_needed = self.hold = self.pending_apply = None
            self.finished = self.stopping = self.retry_n = None
        elif t == "intent":
            self.n, self.tag, self.intent_t = f["n"], f["tag"], f["t"]
            self.intent_open, self.need_submit, self.retry_n = True, False, None
        elif t == "submit_failed":
            self.submit_failures += 1
            self.last_submit_error = f.get("error", "")
            self.refused_by_test = bool(f.get("test_only"))
        elif t == "intent_lost":
            self.intent_open, self.need_submit = False, True
            # sbatch refused it and Slurm has no job with its tag: no job ever used this N
            self.retry_n = f["n"] if f.get("reuse") else None
        elif t == "submitted":
            self.job, self.intent_open = f["job"], False
            self.started, self.ended = None, {}
            self.submitted_in_g += 1
            self.submit_failures = 0
        elif t == "started":
            self.started = f
        elif t == "ended":
            self.ended[f["r"]] = f
            self.pending_decision = f
        elif t == "rule":
            self.pending_decision = self.pending_apply = None
            self.stalls = f.get("stalls", self.stalls)
            if f.get("latest_step") is not None:
                self.last_step = f["latest_step"]
            if f.get("held"):
                self.hold_needed = f
            elif f["rule"] == "resubmit":
                self.used += 1
                self.need_submit = True
            elif f["rule"] == "continue":
                self.continued += 1
                self.need_submit = True
            elif f["rule"] == "supersede":
                self.need_submit = True
        elif t == "hold":
            self.hold, self.hold_needed = f, None
            self.holds = max(self.holds, f["hold"])
            self.last_answer_t = None
        elif t == "cessation":
            self.last_answer_t = f["t"]
        elif t == "release":
            if self.hold is not None:
                self.pending_apply = self.hold
            self.hold = None
        elif t == "stop":
            self.stopping = f
        elif t == "finished":
            self.finished = f
        # superseded, hold_expired, note, torn_tail_dropped, gc: facts for people, no state

    @classmethod
    def replay(cls, facts: list[dict]) -> "State":
        st = cls()
        for f in facts:
            st.apply(f)
        return st

    def summary(self) -> str:
        if self.g is None:
            return "nothing submitted yet"
        where = f"generation {self.g}"
        if self.job is not None:
            where += f", job {self.job} (N={self.n})"
        if self.finished and self.finished["outcome"] != "held":
            return f"{where}: finished, {self.finished['outcome']}"
        if self.hold:
            return f"{where}: HELD (hold #{self.hold['hold']}, replaces {self.hold['replaces']})"
        return f"{where}: running"

