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
    warning: Optional[dict] = None  # the current submission's --signal, as its intent recorded it
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
    gc_pending: bool = False  # `run --keep-last`: collect before the ended execution's rule
    hold_needed: Optional[dict] = None
    hold: Optional[dict] = None
    holds: int = 0
    last_answer_t: Optional[float] = None
    pending_apply: Optional[dict] = None
    used: int = 0  # resubmissions of this generation
    continued: int = 0  # continuations of this generation (time-limit ends)
    stalls: int = 0  # consecutive continuations that published no higher step
    launch_releases: int = 0  # holds Slurm put on this submission after a failed launch, released
    last_step: Optional[int] = None  # the latest published step at the last decision
    repeat: Optional[dict] = None  # the last rule's, when its execution failed before its trainer started
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
        on = getattr(self, f"_on_{f['type']}", None)
        if on is not None:  # superseded, hold_expired, note, torn_tail_dropped: for people, no state
            on(f)

    def _on_supervisor(self, f: dict) -> None:
        self.cluster = f.get("cluster") or self.cluster

    def _on_job(self, f: dict) -> None:
        self.g = f["g"]
        self.defs[self.g] = f
        self.n = self.tag = self.job = self.started = self.last_step = self.warning = self.repeat = None
        self.ended = {}
        self.intent_open, self.need_submit = False, True
        self.submitted_in_g = self.used = self.continued = self.stalls = self.submit_failures = 0
        self.pending_decision = self.hold_needed = self.hold = self.pending_apply = None
        self.gc_pending = False
        self.finished = self.stopping = self.retry_n = None

    def _on_intent(self, f: dict) -> None:
        self.n, self.tag, self.intent_t, self.warning = f["n"], f["tag"], f["t"], f.get("warning")
        self.intent_open, self.need_submit, self.retry_n = True, False, None

    def _on_submit_failed(self, f: dict) -> None:
        self.submit_failures += 1
        self.last_submit_error = f.get("error", "")
        self.refused_by_test = bool(f.get("test_only"))

    def _on_intent_lost(self, f: dict) -> None:
        self.intent_open, self.need_submit = False, True
        # sbatch refused it and Slurm has no job with its tag: no job ever used this N
        self.retry_n = f["n"] if f.get("reuse") else None

    def _on_submitted(self, f: dict) -> None:
        self.job, self.intent_open = f["job"], False
        self.started, self.ended = None, {}
        self.launch_releases = 0
        self.submitted_in_g += 1
        self.submit_failures = 0

    def _on_started(self, f: dict) -> None:
        self.started = f

    def _on_ended(self, f: dict) -> None:
        self.ended[f["r"]] = f
        self.pending_decision = f
        self.gc_pending = bool(self.defn.get("keep_last"))

    def _on_gc(self, f: dict) -> None:
        self.gc_pending = False

    def _on_rule(self, f: dict) -> None:
        self.pending_decision = self.pending_apply = None
        self.gc_pending = False
        self.stalls = f.get("stalls", self.stalls)
        if not f.get("after_hold"):  # a lifted hold applies the rule it held: the same execution's
            self.repeat = f if f.get("before_training") else None
        if f.get("latest_step") is not None:
            self.last_step = f["latest_step"]
        if f.get("held"):
            self.hold_needed = f
            return
        rule = f["rule"]
        self.used += rule == "resubmit"
        self.continued += rule == "continue"
        self.need_submit = self.need_submit or rule in ("resubmit", "continue", "supersede")

    def _on_hold(self, f: dict) -> None:
        self.hold, self.hold_needed = f, None
        self.holds = max(self.holds, f["hold"])
        self.last_answer_t = None

    def _on_cessation(self, f: dict) -> None:
        self.last_answer_t = f["t"]

    def _on_release(self, f: dict) -> None:
        if self.hold is not None:
            self.pending_apply = self.hold
        self.hold = None

    def _on_launch_released(self, f: dict) -> None:
        self.launch_releases = f["n"]

    def _on_stop(self, f: dict) -> None:
        self.stopping = f

    def _on_finished(self, f: dict) -> None:
        self.finished = f

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

