"""The fault campaign's checker: did a run under faults end where the uninterrupted run ends?

Independent of the code under test: it imports nothing of ``dispatch_slurm`` (a test says
so) and reads only what a run leaves behind:

- the root's files: ``pub/`` (names in DESIGN.md's documented format, parsed here on
  their own; an entry's mtime is when it was made), the saves under ``exec/`` (a resume
  from ``exec/<attempt>/dispatch-resume/<publication name>/<leaf>``, the documented copy,
  counts as a resume from that publication's save), and
  ``events/`` only for the ``gc`` lines that name what gc removed and when;
- Slurm's accounting: ``sacct --json`` of the run's jobs, as ``sacct`` printed it;
- the trainer's own log (``dettrain.py``, ``hftrain.py``): every step applied, save,
  rotation, resume and stop, with its time, execution and rank;
- the run's description (``Run``): its parameters, the faults the nemesis applied and
  when, and how the run ended by the word of whoever decided (the supervisor's
  ``finished`` line of ``record.jsonl``, or the user who resubmitted by hand).

The oracle is the deterministic trainer's ``chain``: the state after every step of the
uninterrupted run, with the id of each save resumed from folded in where the run resumed
(``expected``): along the lineage the greatest publications make (dispatch mode; one save
of another lineage loaded, and the final state is another), along the saves each execution
loaded otherwise (a Hugging Face run: the uninterrupted run's final weights' digest). A
failed or held end is judged by its cause: the faults in force on the execution that ended
the run, never the supervisor's message alone.
Each finding is an ``Anomaly``: a class (``CLASSES``) and what was seen.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

from . import dettrain

#: anomaly class -> what it means
CLASSES = {
    "final-state": "the run's final state is not the uninterrupted run's",
    "resume-not-latest": "an execution resumed from another save than the greatest published (epoch, step) "
                         "at its start",
    "torn-resume": "an execution loaded a save that was incomplete, mixed, or not the state of its step",
    "torn-publication": "a publication names a save that was not complete when published, or is torn",
    "removed-publication": "the latest publication names a save that no longer exists",
    "gc-without-cessation": "a save was removed while the execution that wrote it had not ceased",
    "unexplained-removal": "a published save vanished, removed by neither its own execution nor gc",
    "end-misjudged": "the run ended done while training had not finished (a continuation taken as done), "
                     "ended failed/held/stopped although training finished, or stopped though nobody asked",
    "false-failure": "the run ended failed or held for a cause no fault of the run explains (a removed "
                     "publication, a refusal or a crash with no fault in force), whatever its message says",
    "recompute-excess": "work recomputed after a fault exceeds the save interval plus the signal lead",
    "step-lost-at-time-limit": "a trainer that traps the time-limit signal lost steps at a time limit",
    "unfinished": "the run neither finished nor ended within the campaign's deadline",
    "mixed-save": "one save folder was written by two executions",
    "lost-save": "an execution's rotation deleted another live execution's save",
    "resume-failed": "an execution that was to resume from a save never loaded it nor applied a step (the save "
                     "was removed or torn while it loaded: an old execution's own rotation)",
    "supervisor-exited": "the supervisor (`dispatch-slurm run`) exited before the run ended: its job ran on "
                         "unsupervised until its user started it again (the campaign never stops one)",
}

#: faults after which lost work is not bounded by the save interval: saves fail (a full
#: disk), the run stops on a person's fix (a stray entry), a rank stands still
UNBOUNDED = ("enospc", "stray", "stall")
#: faults that end an execution another way than its time limit
OTHER_ENDS = ("cancel", "preempt", "requeue", "partition", "partition-long", "crash", "stall", "enospc", "stray",
              "ctld-restart", "slurmd-stop")
#: faults that can end any execution in force then, whatever its job or node
ANY_JOB = ("enospc", "stray", "ctld-restart")

_PUB = re.compile(r"([0-9]{20})-([0-9]{20})-([A-Z2-7]+)")


@dataclass
class Anomaly:
    cls: str
    detail: str

    def __post_init__(self) -> None:
        if self.cls not in CLASSES:
            raise ValueError(f"unknown anomaly class {self.cls!r}")


@dataclass
class Publication:
    epoch: int
    step: int
    path: str  # relative to the root
    name: str
    made: float  # the entry's mtime: when it was published

    @property
    def key(self) -> tuple[int, int]:
        return (self.epoch, self.step)


@dataclass
class Run:
    """What the checker is given about one run in one mode (all paths on this machine;
    ``root_in_cluster``/``folder_in_cluster``: how the trainer named them in its log)."""

    mode: str  # dispatch | naive
    trainer: str  # det | hf
    max_steps: int
    save_every: int
    step_time: float
    ranks: int
    seed: int
    trap: str  # handler | own | none | hf
    trainer_log: str
    sacct: Optional[str] = None
    root: Optional[str] = None
    root_in_cluster: Optional[str] = None
    folder: Optional[str] = None  # naive: the one shared folder
    folder_in_cluster: Optional[str] = None
    lead_s: float = 0.0  # the --signal lead (0: no --signal)
    slack_s: float = 3.0  # publication latency beside the save interval
    outcome: dict = field(default_factory=dict)  # {"state": done|failed|held|stopped|unfinished, "message"}
    faults: list = field(default_factory=list)  # [{"kind", "t0", "t1", "jobs", "nodes"}]
    reference: Optional[str] = None  # hf: the uninterrupted run's final digest

    @classmethod
    def from_json(cls, d: dict) -> "Run":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


# -- reading ---------------------------------------------------------------------------------


_COPY = re.compile(r"exec/[^/]+/dispatch-resume/([^/]+)/[^/]+")  # DESIGN.md: the copy resumed from


def b32decode(text: str) -> bytes:
    return base64.b32decode(text + "=" * (-len(text) % 8))


def parse_name(name: str) -> tuple[int, int, str]:
    """(epoch, step, path) from a publication name (DESIGN.md: ``<epoch, 20 digits>-<step,
    20 digits>-<path relative to the root, base32, no padding>``); ValueError otherwise."""
    m = _PUB.fullmatch(name)
    if m is None:
        raise ValueError(f"{name!r} is not a publication name")
    return int(m[1]), int(m[2]), b32decode(m[3]).decode()


def publications(root: str) -> tuple[list[Publication], list[str]]:
    """Every publication under ``root/pub`` and the entries that are none (strays)."""
    pubs, strays = [], []
    pub = os.path.join(root, "pub")
    for name in sorted(os.listdir(pub)) if os.path.isdir(pub) else []:
        try:
            epoch, step, path = parse_name(name)
        except ValueError:
            strays.append(name)
            continue
        pubs.append(Publication(epoch, step, path, name, os.stat(os.path.join(pub, name)).st_mtime))
    return pubs, strays


def attempt_epoch(attempt: str) -> Optional[int]:
    """The epoch at the end of an attempt token ``<cluster>.<job>.<epoch>``."""
    tail = attempt.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() and attempt.count(".") >= 2 else None


def read_log(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:  # a line cut by a node's crash
                    continue
    return sorted(out, key=lambda r: r["t"])


def gc_removals(root: str) -> dict[str, float]:
    """relative path -> when gc said it removed it (its ``gc`` event lines)."""
    out: dict[str, float] = {}
    d = os.path.join(root, "events")
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        with open(os.path.join(d, name)) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("type") == "gc":
                    for p in e.get("removed") or []:
                        out.setdefault(p, e["t"])
    return out


def _num(v: Any) -> Optional[float]:
    if isinstance(v, dict):  # Slurm's {"set": true, "number": N}
        return v.get("number") if v.get("set", True) else None
    return v if isinstance(v, (int, float)) else None


def sacct_executions(path: Optional[str]) -> list[dict]:
    """One entry per execution ``sacct -D --json`` lists: job, state, start, end, reason."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        data = json.load(f)
    out = []
    for j in data.get("jobs", []):
        state = (j.get("state") or {}).get("current")
        state = state[0] if isinstance(state, list) and state else state
        t = j.get("time") or {}
        out.append({"job": int(j.get("job_id", 0)), "state": state or "UNKNOWN", "start": _num(t.get("start")),
                    "end": _num(t.get("end")), "reason": (j.get("state") or {}).get("reason"),
                    "nodes": hostnames(j.get("nodes"))})
    return out


def hostnames(text: Any) -> list[str]:
    """The nodes of a Slurm host list (``c1``, ``c[1-2,4]``, ``None assigned``)."""
    out: list[str] = []
    for m in re.finditer(r"([A-Za-z0-9_.-]+?)(?:\[([0-9,-]+)\])?(?:,|$)", str(text or "")):
        if not m[2]:
            out.append(m[1])
            continue
        for part in m[2].split(","):
            lo, _, hi = part.partition("-")
            out += [f"{m[1]}{str(i).zfill(len(lo))}" for i in range(int(lo), int(hi or lo) + 1)]
    return [n for n in out if n and not str(text).startswith("None")]


# -- executions --------------------------------------------------------------------------------


@dataclass
class Execution:
    attempt: str
    job: str
    restart: int
    records: list[dict]

    @property
    def start(self) -> dict:
        return next((r for r in self.records if r["op"] == "start" and r.get("rank", 0) == 0), self.records[0])

    @property
    def first_t(self) -> float:
        return self.records[0]["t"]

    @property
    def last_t(self) -> float:
        return self.records[-1]["t"]

    def ops(self, *ops: str, rank: Optional[int] = 0) -> list[dict]:
        return [r for r in self.records if r["op"] in ops and (rank is None or r.get("rank", 0) == rank)]

    def steps_before(self, t: float) -> Optional[int]:
        done = [r["step"] for r in self.ops("step") if r["t"] < t]
        return max(done) if done else None

    @property
    def last_step(self) -> Optional[int]:
        return max((r["step"] for r in self.ops("step")), default=None)


def executions(log: list[dict]) -> list[Execution]:
    by: dict[str, list[dict]] = {}
    for r in log:
        by.setdefault(r["attempt"], []).append(r)
    out = [Execution(a, str(rs[0].get("job")), int(rs[0].get("restart", 0)), rs) for a, rs in by.items()]
    return sorted(out, key=lambda e: e.first_t)


# -- the checks ----------------------------------------------------------------------------------


class Checker:
    def __init__(self, run: Run):
        self.run = run
        self.log = read_log(run.trainer_log)
        self.execs = executions(self.log)
        self.sacct = sacct_executions(run.sacct)
        self.ref = dettrain.chain(run.seed, run.ranks, run.max_steps) if run.trainer == "det" else None
        self.by_attempt = {e.attempt: e for e in self.execs}
        self.folds = any(r["op"] == "start" and r.get("lineage") for r in self.log)  # resumes fold in the save's id
        self._states: dict[tuple[str, bool], Optional[tuple[int, list[str]]]] = {}
        if run.root:
            self.pubs, self.strays = publications(run.root)
        else:
            self.pubs, self.strays = [], []
        self.found: list[Anomaly] = []

    def flag(self, cls: str, detail: str) -> None:
        self.found.append(Anomaly(cls, detail))

    def rel(self, path: Optional[str]) -> Optional[str]:
        """A path the trainer logged, relative to the root (dispatch) or folder (naive); a
        copy an execution resumed from, the path of the save its publication names."""
        if path is None:
            return None
        base = self.run.root_in_cluster if self.run.mode == "dispatch" else self.run.folder_in_cluster
        if base and (path == base or path.startswith(base.rstrip("/") + "/")):
            path = path[len(base.rstrip("/")) + 1:]
        m = _COPY.fullmatch(path) if self.run.mode == "dispatch" else None
        if m:
            try:
                return parse_name(m[1])[2]
            except ValueError:
                return path
        return path

    def host(self, rel: str) -> str:
        base = self.run.root if self.run.mode == "dispatch" else self.run.folder
        return os.path.join(base or "/nonexistent", rel)

    def check(self) -> list[Anomaly]:
        self.final_state()
        self.end()
        self.resumes()
        if self.run.mode == "dispatch":
            self.resume_points()
            self.publications()
            self.removals()
            self.supervisors()
        else:
            self.shared_folder()
        self.recompute()
        return self.found

    # the final state and how the run ended

    def _good(self, step: int, h: Optional[str]) -> bool:
        """The Hugging Face run's final weights are the uninterrupted run's (its ``reference``)."""
        return self.run.reference is None or h == self.run.reference or step < self.run.max_steps or h is None

    # the deterministic trainer's states: ``chain`` from scratch; a resume folds the loaded save's
    # id into that save's state (dettrain.resumed), then the execution's own steps follow

    def expected(self, attempt: Optional[str], step: int, right: bool = False) -> Optional[str]:
        """The state execution ``attempt`` holds after ``step`` if it applied every step right
        from the save it loaded (its log's resume line: the save's id names its writer, whose
        state is worked out the same way); ``right``: from the save it should have loaded
        instead (``right_point``: the greatest publication when it started), and so on back
        along that lineage. None: it cannot be told (a writer without a log line)."""
        if self.ref is None:
            return None
        if attempt is None:  # a save of a trainer that records no id: the step alone tells its state
            return self.ref[step] if 0 <= step < len(self.ref) else ""
        got = self.states(attempt, right, ())
        if got is None:
            return None
        first, hs = got
        return hs[step - first] if first <= step < first + len(hs) else ""

    def states(self, attempt: str, right: bool, seen: tuple[str, ...]) -> Optional[tuple[int, list[str]]]:
        """(s, [h_s .. h_max]): the states ``expected`` gives execution ``attempt`` from the
        step it resumed at on."""
        key = (attempt, right)
        if key not in self._states:
            self._states[key] = self._compute(attempt, right, seen)
        return self._states[key]

    def _compute(self, attempt: str, right: bool, seen: tuple[str, ...]) -> Optional[tuple[int, list[str]]]:
        assert self.ref is not None
        ex = self.by_attempt.get(attempt)
        if ex is None or attempt in seen:
            return None
        src = self.source(ex, right)
        if src is None:
            return 0, self.ref
        writer, at, sid = src
        if writer is None:
            base: Optional[str] = self.ref[at] if 0 <= at < len(self.ref) else None
        else:
            parent = self.states(writer, right, (*seen, attempt))
            base = parent[1][at - parent[0]] if parent and parent[0] <= at < parent[0] + len(parent[1]) else None
        if base is None:
            return None
        hs = [dettrain.resumed(base, sid) if sid is not None else base]
        for k in range(at + 1, self.run.max_steps + 1):
            hs.append(dettrain.step_hash(hs[-1], k, self.run.seed, self.run.ranks))
        return at, hs

    def source(self, ex: Execution, right: bool) -> Optional[tuple[Optional[str], int, Optional[str]]]:
        """(the writer of the save ``ex`` resumed from, its step, its id; None: from scratch),
        as its log says or, ``right``, the save it should have resumed from."""
        if right and self.run.mode == "dispatch" and attempt_epoch(ex.attempt) is not None:
            p = self.right_point(ex)
            if p is None:
                return None
            writer = p.path.split("/")[1] if p.path.startswith("exec/") else None
            return writer, p.step, dettrain.save_id(writer, p.step) if self.folds and writer else None
        res = next(iter(ex.ops("resume")), None)
        if res is None:
            return None
        sid = res.get("save_id")
        if sid is None:
            return None, res["step"], None
        return str(sid).rpartition(":")[0], res["step"], sid

    def state_ok(self, attempt: Optional[str], step: int, h: Optional[str]) -> bool:
        want = self.expected(attempt, step)
        return want is None or h == want

    def final_state(self) -> None:
        for r in (r for r in self.log if r["op"] == "done" and r.get("rank", 0) == 0):
            if self.ref is None:
                # a Trainer resumed from its final save counts one more step (at learning rate 0):
                # its weights are what counts
                if r["step"] < self.run.max_steps or not self._good(self.run.max_steps, r.get("h")):
                    self.flag("final-state", f"{r['attempt']} finished at step {r['step']} with state {r.get('h')}, "
                                             f"not the uninterrupted run's (step {self.run.max_steps}, "
                                             f"{self.run.reference})")
                continue
            want = self.expected(r["attempt"], self.run.max_steps, right=True)
            if r["step"] != self.run.max_steps or (want is not None and r.get("h") != want):
                self.flag("final-state", f"{r['attempt']} finished at step {r['step']} with state {r.get('h')}, "
                                         f"not the uninterrupted run's along the lineage of the greatest "
                                         f"publications (step {self.run.max_steps}, {want})")

    def finished(self) -> bool:
        return any(r["op"] == "done" and r.get("rank", 0) == 0 for r in self.log)

    def end(self) -> None:
        state = self.run.outcome.get("state", "unfinished")
        msg = self.run.outcome.get("message", "")
        done = self.finished()
        if state == "unfinished":
            self.flag("unfinished", f"the run did not end by the deadline ({msg})")
        elif state == "done" and not done:
            self.flag("end-misjudged", f"the run ended done but training stopped at step {self.last_step()} of "
                                       f"{self.run.max_steps} (a continuation taken as done): {msg}")
        elif state != "done" and done:
            self.flag("end-misjudged", f"training finished but the run ended {state}: {msg}")
        elif state == "stopped" and not done:
            self.flag("end-misjudged", f"the run ended stopped at step {self.last_step()} of {self.run.max_steps} "
                                       f"though nobody asked it to stop: {msg}")
        elif state in ("failed", "held") and (why := self.unexplained(msg)):
            self.flag("false-failure", f"the run ended {state} ({msg}), but {why}")

    def last_step(self) -> int:
        return max((r["step"] for r in self.log if r["op"] == "step"), default=0)

    def unexplained(self, msg: str) -> Optional[str]:
        """Why a failed or held end has no true reason (None: the run's faults explain it),
        judged by its cause, whatever the message says (a budget spent on refusals is no
        reason): the latest publication's save is gone (every later execution is refused its
        resume), or an execution that ended the run (those after the last one that applied a
        step; that one when none came after) ended outside every fault that could end it."""
        latest = max(self.pubs, key=lambda p: p.key, default=None)
        if latest is not None and not os.path.isdir(self.host(latest.path)):
            return f"the latest publication's save {latest.path} is gone: no execution could resume"
        started = sorted((s for s in self.sacct if s["start"]), key=lambda s: s["start"])
        if not started:  # no accounting to judge by: only the decider's word
            return None if "no resubmission is left" in msg or "budget" in msg else "nothing says why"
        stepped = [i for i, s in enumerate(started) if self.stepped(s)]
        ended_it = started[stepped[-1] + 1:] or started[stepped[-1]:] if stepped else started
        alone = [s for s in ended_it if not self.explained(s)]
        if alone:
            s = alone[0]
            return (f"job {s['job']}'s execution that started at {s['start']:.0f} ended {s['state']} "
                    f"{'before any step ' if not self.stepped(s) else ''}with no fault to end it")
        return None

    def stepped(self, s: dict) -> bool:
        """Whether the execution Slurm lists as ``s`` applied a step (by the trainer's log)."""
        return any(str(s["job"]) == ex.job and ex.ops("step") and s["start"] - 1 <= ex.first_t and
                   (not s["end"] or ex.first_t <= s["end"] + 1) for ex in self.execs)

    def explained(self, s: dict) -> bool:
        """Whether a fault could have ended the execution Slurm lists as ``s``: one in force
        while it ran (or ending shortly before it ended: a node comes back, its Epilog
        runs) on every job (a full filesystem, a stray entry, the controller), on its job,
        or on its node."""
        t0, t1 = s["start"] or 0.0, s["end"] or float("inf")
        for f in self.run.faults:
            if f["t0"] > t1 + 5 or (f.get("t1") or f["t0"]) + 60 < t0:
                continue
            if f["kind"] in ANY_JOB or str(s["job"]) in map(str, f.get("jobs") or []) or \
                    set(f.get("nodes") or []) & set(s["nodes"]):
                return True
        return False

    # resumes

    def resumes(self) -> None:
        for ex in self.execs:
            for r in ex.ops("resume_failed", rank=None):
                self.flag("torn-resume", f"{ex.attempt} rank {r.get('rank', 0)} could not load "
                                         f"{self.rel(r['path'])}: {r.get('error')}")
            for r in ex.ops("resume", rank=None):
                sid = r.get("save_id")
                writer, _, at = str(sid).rpartition(":") if sid is not None else (None, "", str(r["step"]))
                if self.ref is not None and (at != str(r["step"]) or not self.state_ok(writer, r["step"], r.get("h"))):
                    self.flag("torn-resume", f"{ex.attempt} rank {r.get('rank', 0)} loaded {self.rel(r['path'])} "
                                             f"at step {r['step']} with a state that is not step {r['step']}'s"
                                             + (f" of save {sid}" if sid is not None else ""))

    def window(self, ex: Execution) -> tuple[float, float]:
        """When the execution chose its resume point: from Slurm's start of it (sacct) to
        its trainer's resume line (or start line)."""
        start = ex.start
        chose = next((r["t"] for r in ex.ops("resume", "resume_failed")), start["t"])
        begin = None
        for s in self.sacct:
            if str(s["job"]) == ex.job and s["start"] and s["start"] <= start["t"] + 1 and \
                    (not s["end"] or s["end"] + 1 >= start["t"]):
                begin = s["start"] - 1  # whole seconds
        return (begin if begin is not None else start["t"] - 1.0), chose

    def choice(self, ex: Execution) -> tuple[Optional[Publication], Optional[Publication], Optional[str], float]:
        """What execution ``ex`` (of a known epoch) chose from: (the greatest publication of an
        earlier epoch made before Slurm started it, the publication of the save its log says it
        resumed from, that save's path, when it chose)."""
        epoch = attempt_epoch(ex.attempt)
        assert epoch is not None
        begin, chose = self.window(ex)
        earlier = [p for p in self.pubs if p.epoch < epoch]
        best = max((p for p in earlier if p.made < begin), key=lambda p: p.key, default=None)
        src = self.rel(ex.start.get("resume_from"))
        loaded = max((p for p in earlier if p.path == src), key=lambda p: p.key, default=None)
        return best, loaded, src, chose

    def right_point(self, ex: Execution) -> Optional[Publication]:
        """The publication ``ex`` should have resumed from: the one it did when ``resume_points``
        finds nothing wrong with that (published in time, not below the greatest), else the
        greatest published before it started (None: from scratch)."""
        best, loaded, src, chose = self.choice(ex)
        if src is not None and loaded is not None and loaded.made <= chose + 0.5 and \
                (best is None or loaded.key >= best.key):
            return loaded
        return best

    def resume_points(self) -> None:
        for ex in self.execs:
            if attempt_epoch(ex.attempt) is None:
                continue
            best, loaded, src, chose = self.choice(ex)
            if src is None:
                if best is not None:
                    self.flag("resume-not-latest", f"{ex.attempt} started from scratch while {best.path} (epoch "
                                                   f"{best.epoch}, step {best.step}) was published")
                continue
            if loaded is None:
                self.flag("resume-not-latest", f"{ex.attempt} resumed from {src}, which no publication names")
            elif loaded.made > chose + 0.5:
                self.flag("resume-not-latest", f"{ex.attempt} resumed from {src}, published only after it chose")
            elif best is not None and loaded.key < best.key:
                self.flag("resume-not-latest", f"{ex.attempt} resumed from {src} (epoch {loaded.epoch}, step "
                                               f"{loaded.step}) while {best.path} (epoch {best.epoch}, step "
                                               f"{best.step}) was published before it started")

    # publications and removals

    def saves(self) -> dict[str, list[dict]]:
        """relative save path -> its complete-save lines (rank 0)."""
        out: dict[str, list[dict]] = {}
        for r in self.log:
            if r["op"] == "save" and r.get("rank", 0) == 0:
                out.setdefault(self.rel(r["path"]) or "", []).append(r)
        return out

    def intact(self, rel: str, step: int) -> Optional[str]:
        """Why the save at ``rel`` is not a whole save of ``step`` (None: it is)."""
        d = self.host(rel)
        try:
            with open(os.path.join(d, dettrain.STATE)) as f:
                if int(json.load(f)["global_step"]) != step:
                    return "its trainer_state.json names another step"
            if self.run.trainer == "hf":
                return None
            owner = rel.split("/")[1] if rel.startswith("exec/") else None
            with open(os.path.join(d, "model.bin")) as f:
                h = f.readline().strip()
            if not self.state_ok(owner, step, h):
                return "its model.bin is not the state of its step"
            with open(os.path.join(d, "data.json")) as f:
                data = json.load(f)
            if int(data["cursor"]) != step * self.run.ranks:
                return "its data cursor is not its step's"
            if owner and self.folds and data.get("save_id") != dettrain.save_id(owner, step):
                return f"its data.json names another save ({data.get('save_id')})"
            for r in range(1, self.run.ranks):
                with open(os.path.join(d, f"rank-{r}.bin")) as f:
                    if f.readline().strip() != h:
                        return f"its rank-{r}.bin is of another state"
        except FileNotFoundError as e:
            return f"{os.path.basename(e.filename or '?')} is missing"
        except (OSError, ValueError, KeyError) as e:
            return f"unreadable: {e}"
        return None

    def publications(self) -> None:
        saves = self.saves()
        for p in self.pubs:
            owner = p.path.split("/")[1] if p.path.startswith("exec/") else None
            if owner and attempt_epoch(owner) not in (None, p.epoch):
                self.flag("torn-publication", f"{p.name} publishes {p.path} at epoch {p.epoch}, not its writer's")
            made = [s for s in saves.get(p.path, []) if s["step"] == p.step]
            if self.ref is not None and made and \
                    not any(self.state_ok(s["attempt"], p.step, s.get("h")) for s in made):
                self.flag("torn-publication", f"{p.path} (step {p.step}) was saved with a wrong state")
            if os.path.isdir(self.host(p.path)):
                why = self.intact(p.path, p.step)
                if why:
                    self.flag("torn-publication", f"{p.path} (epoch {p.epoch}, step {p.step}) is published but {why}")
            elif not made:
                self.flag("torn-publication", f"{p.path} (epoch {p.epoch}, step {p.step}) is published but no "
                                              "execution ever completed that save")
        latest = max(self.pubs, key=lambda p: p.key, default=None)
        if latest is not None and not os.path.isdir(self.host(latest.path)):
            self.flag("removed-publication", f"the latest publication {latest.name} names {latest.path}, which "
                                             "no longer exists")

    def removals(self) -> None:
        gc = gc_removals(self.run.root or "")
        deleted = {(self.rel(r["path"]), r["attempt"]) for r in self.log if r["op"] == "delete"}
        last = {ex.attempt: ex.last_t for ex in self.execs}
        for p in self.pubs:
            if os.path.isdir(self.host(p.path)):
                continue
            owner = p.path.split("/")[1] if p.path.startswith("exec/") else ""
            if (p.path, owner) in deleted:
                continue  # its own rotation
            if p.path in gc:
                if last.get(owner, 0) > gc[p.path]:
                    self.flag("gc-without-cessation", f"gc removed {p.path} at {gc[p.path]:.1f} while {owner} "
                                                      f"still ran (its last line at {last[owner]:.1f})")
                continue
            self.flag("unexplained-removal", f"{p.path} (published) vanished; neither {owner} nor gc removed it")

    def supervisors(self) -> None:
        """Every process that supervised the root announced itself in its ``record.jsonl``
        (a ``supervisor`` line with its host and pid): more than one, beside those a person's
        supersession started, is a supervisor that exited and was started again."""
        path = os.path.join(self.run.root or "", "record.jsonl")
        if not os.path.exists(path):
            return  # plugin-only: Slurm requeues, nothing supervises
        facts = []
        with open(path) as f:
            for line in f:
                try:
                    fact = json.loads(line)
                except ValueError:
                    continue
                if isinstance(fact, dict):
                    facts.append(fact)
        seen = []
        for fact, then in zip(facts, facts[1:] + [{}]):
            # a person's `supersede` starts a supervisor of its own on purpose: its first fact says so
            if fact.get("type") == "supervisor" and then.get("type") != "superseded" and \
                    (fact.get("host"), fact.get("pid")) not in seen:
                seen.append((fact.get("host"), fact.get("pid")))
        if len(seen) > 1:
            self.flag("supervisor-exited", f"{len(seen)} supervisor processes followed the root in turn "
                                           f"({', '.join(f'pid {p} on {h}' for h, p in seen)})")

    def shared_folder(self) -> None:
        """Naive mode: one folder for every execution."""
        writers: dict[str, set[str]] = {}
        for r in self.log:
            if r["op"] in ("save_begin", "save"):
                writers.setdefault(self.rel(r["path"]) or "", set()).add(r["attempt"])
        for path, both in sorted(writers.items()):
            if len(both) > 1:
                self.flag("mixed-save", f"{path} written by {', '.join(sorted(both))}")
        last = {ex.attempt: ex.last_t for ex in self.execs}
        latest_writer: dict[str, tuple[float, str]] = {}
        for r in self.log:
            rel = self.rel(r["path"]) if "path" in r else None
            if r["op"] == "save" and rel:
                latest_writer[rel] = (r["t"], r["attempt"])
            elif r["op"] == "delete" and rel in latest_writer:
                _, who = latest_writer[rel]
                if who != r["attempt"] and last.get(who, 0) > r["t"]:
                    self.flag("lost-save", f"{r['attempt']} deleted {rel}, saved by {who}, which still ran")

    # work recomputed, steps lost at a time limit

    def faults_near(self, t0: float, t1: float, kinds: Iterable[str]) -> list[dict]:
        kinds = tuple(kinds)
        return [f for f in self.run.faults if f["kind"] in kinds and f["t0"] <= t1 and (f.get("t1") or f["t0"]) >= t0]

    def recompute(self) -> None:
        """Work recomputed after each fault: the most steps an earlier execution applied before
        it was replaced (its successor started; what an overlapping old execution does after
        that is the overlap's, not the fault's) less the step the new execution resumed at."""
        interval = self.run.save_every + (self.run.lead_s + self.run.slack_s) / self.run.step_time
        starts = [e.start["t"] for e in self.execs]
        for i, ex in enumerate(self.execs[1:], 1):
            start = ex.start
            if ex.ops("resume_failed", rank=None):
                continue
            if start.get("resume_from") and not ex.ops("resume") and not ex.ops("step"):
                self.flag("resume-failed", f"{ex.attempt} was to resume from {self.rel(start['resume_from'])} and "
                                           "never loaded it nor applied a step")
                continue  # it recomputed nothing: the next execution's resume is weighed on its own
            resumed = next((r["step"] for r in ex.ops("resume")), 0)
            applied = [(s, e) for j, e in enumerate(self.execs[:i]) if (s := e.steps_before(starts[j + 1])) is not None]
            if not applied:
                continue
            done, prev = max(applied, key=lambda se: se[0])
            lost = done - resumed
            prev_end = prev.last_t
            excuse = self.faults_near(prev_end - interval * self.run.step_time - 30, start["t"], UNBOUNDED)
            if lost > interval and not excuse:
                self.flag("recompute-excess", f"{ex.attempt} resumed at step {resumed} while {prev.attempt} had "
                                              f"applied {done}: {lost} steps recomputed, more than the save interval "
                                              f"plus the signal lead ({interval:.0f} steps)")
            if self.run.trap in ("handler", "own", "hf") and lost > 0 and self.timed_out(prev) and \
                    not self.faults_near(prev_end - 60, prev_end + 5, OTHER_ENDS):
                self.flag("step-lost-at-time-limit", f"{prev.attempt} stopped at its time limit at step {done}; "
                                                     f"{ex.attempt} resumed at {resumed}")

    def timed_out(self, ex: Execution) -> bool:
        """Whether Slurm ended the execution at its time limit (sacct TIMEOUT, or a time-limit
        fault on its job that it saw as a signal)."""
        for s in self.sacct:
            if str(s["job"]) == ex.job and s["state"] == "TIMEOUT" and s["start"] and \
                    s["start"] <= ex.first_t + 1 and (not s["end"] or s["end"] + 1 >= ex.last_t):
                return True
        return bool(ex.ops("signal", rank=0)) and any(
            f["kind"] == "timelimit" and str(ex.job) in [str(j) for j in f.get("jobs", [])] and f["t0"] <= ex.last_t
            for f in self.run.faults) and not self.faults_near(ex.last_t - 60, ex.last_t, OTHER_ENDS)


def check(run: Run) -> list[Anomaly]:
    return Checker(run).check()


def as_dicts(found: list[Anomaly]) -> list[dict]:
    return [asdict(a) for a in found]
