"""The supervisor: follow a job through Slurm and apply the recovery rules.

`dispatch-slurm run ROOT -- SBATCH_ARGS` submits the job (allocating N under
``<root>/sub/``), follows it with the Slurm client (CLI JSON), and when an execution
ends applies a rule:

    COMPLETED                        done
    FAILED, TIMEOUT, OUT_OF_MEMORY,  resubmit while budget (--resubmit) is left,
    BOOT_FAIL, DEADLINE, CANCELLED,  else fail
    PREEMPTED, NODE_FAIL
    requeued by Slurm (R+1)          nothing to do: Slurm restarts it (no budget used)

For a shared checkpoint (``--shared-checkpoint``: the job cannot isolate its writes)
every recovery rule is replaced by a *hold* for a person: a new execution must not
start while the old one may still write into the one folder. While a hold stands the
cessation signal (a site command) is asked every ``--cessation-interval``; "ceased"
lifts the hold and the replaced rule applies; so does ``dispatch-slurm release ROOT``.
A hold that expires unanswered leaves the job held (exit 3).

Everything the supervisor learns or decides is a *fact* appended to
``<root>/record.jsonl`` (one JSON object per line, fsynced before anything is done
on it), and its state is a pure replay of those facts, so a restarted supervisor
continues exactly where the record stops. One writer at a time: supervisors claim
the root with O_EXCL-numbered entries under ``<root>/supervisor/`` (see Claim).

Submission is crash-safe: the intent (G, N and a tag) is recorded before sbatch runs
and the job carries the tag as ``--comment``; a restarted supervisor that finds an
intent without a job id asks Slurm for a job with that tag before submitting again.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import epoch as epochmod
from . import events, names, store
from .errors import DispatchError
from .slurm import Slurm, SlurmError

RECORD, CLAIMS, REQUESTS = "record.jsonl", "supervisor", "requests"
SCHEMA = 1
DEFAULT_CESSATION_CMD = "dispatch-slurm ceased {job} --restart {restart} --root {root} --json"
DEFAULTS = {"resubmit": 0, "shared": False, "via": "spank", "hold_for": 24 * 3600.0,
            "cessation_interval": 60.0, "cessation_cmd": DEFAULT_CESSATION_CMD, "grace": None}
DEFAULT_POLL = 10.0
SUBMIT_TRIES = 3  # consecutive sbatch failures before a resubmission is given up

# Exit codes of `run` / `supersede`.
EXIT_DONE, EXIT_FAILED, EXIT_ERROR, EXIT_HELD = 0, 1, 2, 3

TERMINAL = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                      "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})
# Slurm's end state -> the cause a rule is chosen for.
CAUSES = {"FAILED": "failure", "TIMEOUT": "failure", "OUT_OF_MEMORY": "failure", "BOOT_FAIL": "failure",
          "DEADLINE": "failure", "CANCELLED": "cancel", "PREEMPTED": "preemption",
          "NODE_FAIL": "node_failure"}
PLACEHOLDERS = ("job", "restart", "root", "generation", "submission", "epoch", "attempt", "cluster",
                "nodes", "started")


class Finished(Exception):
    """The supervisor stops: ``code`` is the process exit code, ``message`` says why."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def parse_duration(text: str, what: str) -> float:
    """'90' (seconds), '30s', '15m', '24h', '2d' -> seconds; anything else is refused."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", str(text))
    if not m:
        raise DispatchError(f"{what} {text!r} is not a duration (e.g. 90, 30s, 15m, 24h, 2d)")
    value = float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]
    if value <= 0:
        raise DispatchError(f"{what} must be more than 0 seconds, got {text!r}")
    return value


def _fmt_duration(s: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n and s % n == 0 and not (unit == "d" and s < 3 * 86400):
            return f"{int(s // n)}{unit}"
    return f"{s:g}s"


# ---- the record ----------------------------------------------------------------------------

class Record:
    """``<root>/record.jsonl``: the supervisor's facts, one JSON object per line.

    Appends are one write() each, fsynced before the caller acts on the fact (a decision
    the record does not hold would be taken again, differently, after a crash). A crash
    mid-write leaves a line without its newline: readers ignore such a tail, and the next
    writer cuts it off (it was never acknowledged) and records that it did. Any other line
    that does not parse is an error naming it, never skipped."""

    def __init__(self, root: str, clock: Callable[[], float] = time.time):
        self.root = root
        self.path = os.path.join(root, RECORD)
        self._clock = clock
        self._fd: Optional[int] = None
        self._seq = 0

    def _raw(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def read(self) -> list[dict]:
        """Every complete fact, in order (a torn last line is not a fact)."""
        return self._parse(self._raw())[0]

    def exists(self) -> bool:
        return bool(self.read())

    def _parse(self, data: bytes) -> tuple[list[dict], bytes]:
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        facts = []
        for no, line in enumerate(lines, 1):
            try:
                fact = json.loads(line)
                if not isinstance(fact, dict) or "type" not in fact:
                    raise ValueError("not an object with a type")
            except ValueError as e:
                raise DispatchError(f"{self.path}:{no}: not a record fact ({e}): {line[:120]!r}") from None
            facts.append(fact)
        return facts, tail

    def open_for_append(self) -> list[dict]:
        """Become the writer: cut a torn tail, return the facts so far."""
        data = self._raw()
        facts, tail = self._parse(data)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        created = not os.path.lexists(self.path)
        self._fd = os.open(self.path, flags, 0o644)
        if created:
            dfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self._seq = len(facts)
        if tail:
            os.ftruncate(self._fd, len(data) - len(tail))
            os.fsync(self._fd)
            self.append({"type": "torn_tail_dropped", "bytes": tail.decode("utf-8", "replace")})
            facts = self._parse(self._raw())[0]
        return facts

    def append(self, fact: dict) -> dict:
        if self._fd is None:
            raise DispatchError("record not opened for appending (a bug)")
        self._seq += 1
        fact = {"v": SCHEMA, "seq": self._seq, "t": round(self._clock(), 3), **fact}
        line = (json.dumps(fact, separators=(",", ":")) + "\n").encode()
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)
        return fact

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---- the claim: one writer at a time ----------------------------------------------------------

def _pid_is_supervisor(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"dispatch" in cmd


class Claim:
    """Who writes the record: ``<root>/supervisor/<NNNNNN>`` entries, O_EXCL-created in
    increasing order, each holding the claimant's host, pid and poll interval; the highest
    one is the writer. The writer touches its entry (mtime) every poll as a heartbeat and
    checks before every append that no higher entry exists; when one appears it stops
    writing, creates ``<NNNNNN>.exited`` and exits. A new supervisor takes over only from a
    claimant that exited, whose pid is gone (same host), or whose heartbeat stood still for
    three of its polls (another host; compared on the file server's clock only). No lock:
    locks are unreliable on the parallel filesystems a root lives on."""

    def __init__(self, root: str, poll: float, purpose: str, *, sleep=time.sleep, clock=time.monotonic):
        self.dir = os.path.join(root, CLAIMS)
        self.poll, self.purpose = poll, purpose
        self.seq: Optional[int] = None
        self._sleep, self._clock = sleep, clock

    def _entries(self) -> tuple[list[int], set[int]]:
        try:
            items = os.listdir(self.dir)
        except FileNotFoundError:
            return [], set()
        claims = sorted(int(e) for e in items if re.fullmatch(r"[0-9]{6}", e))
        exited = {int(e[:6]) for e in items if re.fullmatch(r"[0-9]{6}\.exited", e)}
        return claims, exited

    def _info(self, seq: int) -> dict:
        try:
            with open(os.path.join(self.dir, f"{seq:06d}")) as f:
                return json.loads(f.read() or "{}")
        except (OSError, ValueError):
            return {}

    def _mtime(self, seq: int) -> Optional[float]:
        try:
            return os.stat(os.path.join(self.dir, f"{seq:06d}")).st_mtime
        except FileNotFoundError:
            return None

    def holder_alive(self, seq: int, exited: set[int], wait: bool = True) -> bool:
        """Is claimant ``seq`` still (possibly) writing?"""
        if seq in exited:
            return False
        info = self._info(seq)
        if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
            return _pid_is_supervisor(info["pid"])
        if not wait:
            return True
        window = 3 * float(info.get("poll") or DEFAULT_POLL) + 5
        before, t0 = self._mtime(seq), self._clock()
        while self._clock() - t0 < window:
            self._sleep(min(1.0, window))
            if seq in self._entries()[1] or self._mtime(seq) != before:
                return seq not in self._entries()[1]
        return False

    def acquire(self, takeover: bool = False) -> int:
        """Become the writer. ``takeover`` (supersede): claim first, then wait until the
        previous writer has noticed and stopped; otherwise refuse while it is alive."""
        os.makedirs(self.dir, exist_ok=True)
        claims, exited = self._entries()
        prev = claims[-1] if claims else None
        if prev is not None and not takeover and self.holder_alive(prev, exited):
            info = self._info(prev)
            raise DispatchError(
                f"a supervisor is already running for {os.path.dirname(self.dir)} "
                f"(claim {prev:06d}: host {info.get('host', '?')}, pid {info.get('pid', '?')}, "
                f"{info.get('purpose', '?')}); stop it first, or use `dispatch-slurm supersede`")
        seq = (prev or 0) + 1
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "poll": self.poll,
                           "purpose": self.purpose, "t": time.time()}).encode()
        try:
            fd = os.open(os.path.join(self.dir, f"{seq:06d}"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            raise DispatchError(f"another supervisor is claiming {os.path.dirname(self.dir)} right now "
                                f"(claim {seq:06d} exists); try again") from None
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self.seq = seq
        if takeover and prev is not None:
            # the previous writer sees our higher claim at its next poll and exits; on
            # another host, a heartbeat that stands still for three polls also ends the wait
            while self.holder_alive(prev, self._entries()[1], wait=True):
                self._sleep(0.5)
        return seq

    def mine(self) -> bool:
        claims, _ = self._entries()
        return self.seq is not None and bool(claims) and claims[-1] == self.seq

    def heartbeat(self) -> None:
        if self.seq is not None:
            try:
                os.utime(os.path.join(self.dir, f"{self.seq:06d}"))
            except OSError:
                pass

    def exit(self) -> None:
        """Say this claimant stopped, so a successor need not wait for a stale heartbeat."""
        if self.seq is None:
            return
        try:
            fd = os.open(os.path.join(self.dir, f"{self.seq:06d}.exited"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            os.close(fd)
        except FileExistsError:
            pass
        except OSError:
            pass
        self.seq = None


# ---- requests from people: release, supersede -------------------------------------------------

def _request_path(root: str, name: str) -> str:
    return os.path.join(root, REQUESTS, name)


def make_request(root: str, name: str, body: dict) -> str:
    """O_EXCL-create ``<root>/requests/<name>`` (durable); FileExistsError if already made."""
    folder = os.path.join(root, REQUESTS)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, json.dumps(body).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def _who() -> dict:
    import pwd
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return {"user": user, "uid": os.geteuid(), "host": socket.gethostname(), "pid": os.getpid(),
            "t": round(time.time(), 3)}


# ---- state: a replay of the facts -------------------------------------------------------------

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
    used: int = 0
    finished: Optional[dict] = None
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
            self.submitted_in_g = self.used = self.submit_failures = 0
            self.pending_decision = self.hold_needed = self.hold = self.pending_apply = None
            self.finished = None
        elif t == "intent":
            self.n, self.tag, self.intent_t = f["n"], f["tag"], f["t"]
            self.intent_open, self.need_submit = True, False
        elif t == "submit_failed":
            self.submit_failures += 1
            self.last_submit_error = f.get("error", "")
        elif t == "intent_lost":
            self.intent_open, self.need_submit = False, True
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
            if f.get("held"):
                self.hold_needed = f
            elif f["rule"] == "resubmit":
                self.used += 1
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
        elif t == "finished":
            self.finished = f
        # superseded, hold_expired, note, torn_tail_dropped: facts for people, no state

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


# ---- submission arguments ---------------------------------------------------------------------

def check_sbatch_args(args: list[str], defn: dict) -> None:
    """Refuse what the supervisor sets itself or cannot supervise, naming the argument."""
    if not args:
        raise DispatchError("no sbatch arguments: put the batch script (and sbatch options) after `--`")
    for a in args:
        opt = a.split("=", 1)[0]
        if opt == "--comment":
            raise DispatchError(f"sbatch argument {a!r}: the supervisor sets --comment itself "
                                "(it tags each submission to find it again after a crash)")
        if opt.startswith("--dispatch-"):
            raise DispatchError(f"sbatch argument {a!r}: the supervisor sets the --dispatch-* options "
                                "itself (use run's own options: --shared-checkpoint, --grace)")
        if opt in ("--array", "-a") or (a.startswith("-a") and len(a) > 2 and not a.startswith("--")):
            raise DispatchError(f"sbatch argument {a!r}: array jobs are not supervised; every task is "
                                "its own job (run one supervisor per task root)")
        if defn["via"] == "env" and opt == "--export":
            raise DispatchError(f"sbatch argument {a!r}: --via env sets --export itself")
        if defn["shared"] and opt == "--requeue":
            raise DispatchError(f"sbatch argument {a!r}: a shared-checkpoint job is submitted with "
                                "--no-requeue, so that Slurm cannot restart it behind the hold")


def sbatch_argv(defn: dict, root: str, g: int, n: int, tag: str) -> tuple[list[str], dict[str, str]]:
    """The sbatch arguments and the environment additions of one submission."""
    argv = [f"--comment={tag}"]
    env: dict[str, str] = {}
    if defn["shared"]:
        # Slurm's own requeue (node failure with JobRequeue=1, PreemptMode=REQUEUE,
        # `scontrol requeue`) would start a new execution with no decision of ours: the
        # very recovery the hold must stand in for. --no-requeue makes those end the job,
        # so the supervisor sees the end and holds.
        argv.append("--no-requeue")
    if defn["via"] == "spank":
        argv += [f"--dispatch-checkpoint={root}", f"--dispatch-generation={g}", f"--dispatch-submission={n}"]
        if defn["shared"]:
            argv.append("--dispatch-shared-checkpoint")
        if defn.get("grace") is not None:
            argv.append(f"--dispatch-grace={defn['grace']}")
    else:
        env = {"DISPATCH_CHECKPOINT": root, "DISPATCH_GENERATION": str(g), "DISPATCH_SUBMISSION": str(n)}
        if defn["shared"]:
            env["DISPATCH_SHARED_CHECKPOINT"] = "1"
        if defn.get("grace") is not None:
            env["DISPATCH_GRACE"] = str(defn["grace"])
        argv.append("--export=ALL," + ",".join(env))
    return argv + list(defn["args"]), env


def submission_tag(root: str, g: int, n: int) -> str:
    return f"dispatch-slurm:{root}:g{g}:n{n}"


# ---- the plan ---------------------------------------------------------------------------------

def plan(defn: dict, root: str, state: Optional[State] = None) -> dict:
    """What each rule will do for this job, before it starts (or from where it stands)."""
    shared, left = defn["shared"], defn["resubmit"] - (state.used if state else 0)
    rows = [{"when": "COMPLETED", "rule": "done", "then": "exit 0"}]
    for cause, states in (("failure", "FAILED TIMEOUT OUT_OF_MEMORY BOOT_FAIL DEADLINE"),
                          ("cancel", "CANCELLED"), ("preemption", "PREEMPTED"), ("node_failure", "NODE_FAIL")):
        if left <= 0:
            rows.append({"when": states, "cause": cause, "rule": "fail", "then": "no resubmission left: exit 1"})
        elif shared:
            rows.append({"when": states, "cause": cause, "rule": "hold", "replaces": "resubmit",
                         "then": f"HOLD; when lifted, resubmit with a new N ({left} left)"})
        else:
            rows.append({"when": states, "cause": cause, "rule": "resubmit",
                         "then": f"resubmit with a new N ({left} left, then fail)"})
    if shared:
        rows.append({"when": "requeued by Slurm", "rule": "hold", "replaces": "requeue",
                     "then": "cannot happen: submitted with --no-requeue, so Slurm ends the job and the "
                             "rules above apply; should Slurm requeue it anyway, `scontrol hold` and HOLD"})
    else:
        rows.append({"when": "requeued by Slurm", "rule": "requeue",
                     "then": "Slurm restarts the job itself (same N, R+1): recorded, no budget used"})
    hold = None
    if shared:
        hold = {"hold_for": defn["hold_for"], "cessation_interval": defn["cessation_interval"],
                "cessation_cmd": defn["cessation_cmd"],
                "text": f"the checkpoint is shared, so a new execution must not start while the old one may "
                        f"still write: each recovery waits up to {_fmt_duration(defn['hold_for'])} for "
                        f"`dispatch-slurm release {root}` or a 'ceased' answer of the cessation signal, asked "
                        f"every {_fmt_duration(defn['cessation_interval'])}: {defn['cessation_cmd']}; "
                        f"unanswered, the job stays held and the supervisor exits 3"}
    argv, env = sbatch_argv(defn, root, defn["g"], 1, submission_tag(root, defn["g"], 1))
    shown = ["sbatch", "--parsable", *(a.replace("=1", "=<N>") if a.startswith("--dispatch-submission")
                                       else a.replace(":n1", ":n<N>") for a in argv)]
    env = {k: ("<N>" if k == "DISPATCH_SUBMISSION" else v) for k, v in env.items()}
    notes = []
    if defn["via"] == "env" and shared:
        notes.append("--via env: the Epilog sees only the plugin's options, so it records no cessation "
                     "evidence; holds lift by a person, or when every node rebooted")
    return {"root": root, "generation": defn["g"], "shared_checkpoint": shared,
            "resubmit_budget": defn["resubmit"], "budget_left": left, "via": defn["via"],
            "sbatch": shown, "env": env, "rules": rows, "hold": hold, "notes": notes,
            "state": state.summary() if state else "not started"}


def render_plan(p: dict) -> str:
    out = [f"root: {p['root']}  generation: {p['generation']}  ({p['state']})",
           f"shared checkpoint: {'yes' if p['shared_checkpoint'] else 'no'}  "
           f"resubmit budget: {p['resubmit_budget']} ({p['budget_left']} left)  via: {p['via']}",
           "submits: " + shlex.join(p["sbatch"])]
    if p["env"]:
        out.append("with: " + " ".join(f"{k}={v}" for k, v in p["env"].items()))
    out.append("when an execution ends:")
    width = max(len(r["when"]) for r in p["rules"])
    for r in p["rules"]:
        sub = f" instead of {r['replaces']}" if r.get("replaces") else ""
        out.append(f"  {r['when']:<{width}}  {r['rule']}{sub}: {r['then']}")
    if p["hold"]:
        out.append(f"HOLD: {p['hold']['text']}")
    out += [f"note: {n}" for n in p["notes"]]
    return "\n".join(out) + "\n"


# ---- the supervisor ---------------------------------------------------------------------------

def _fault(point: str) -> None:
    """Crash tests: DISPATCH_SUPERVISOR_FAULT=<point> kills the supervisor (SIGKILL, no
    cleanup) at that point, to show what a restart makes of the record."""
    if os.environ.get("DISPATCH_SUPERVISOR_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _say(msg: str) -> None:
    print(f"dispatch-slurm: {msg}", file=sys.stderr, flush=True)


class Supervisor:
    """One supervisor of one root. ``step()`` does at most one thing (records facts and
    acts on Slurm) and returns how long to wait before the next; ``run()`` loops.
    ``slurm``, ``clock``, ``sleep`` and ``ask`` are injectable for tests."""

    def __init__(self, root: str, slurm: Optional[Slurm] = None, *, poll: float = DEFAULT_POLL,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 ask: Optional[Callable[[dict], dict]] = None, say: Callable[[str], None] = _say):
        self.root = root
        self.slurm = slurm or Slurm()
        self.poll = poll
        self.clock, self.sleep, self.say = clock, sleep, say
        self.ask = ask or self.ask_command
        self.record = Record(root, clock)
        self.state = State()
        self.claim: Optional[Claim] = None
        self._asked_this_run = False
        self._slurm_warned = False

    # -- record ---------------------------------------------------------------------------

    def open(self, purpose: str, takeover: bool = False) -> State:
        """Claim the root and replay its record."""
        self.claim = Claim(self.root, self.poll, purpose)
        self.claim.acquire(takeover=takeover)
        facts = self.record.open_for_append()
        self.state = State.replay(facts)
        return self.state

    def fact(self, type_: str, **fields) -> dict:
        if self.claim is not None and not self.claim.mine():
            self._lost_claim()
        f = self.record.append({"type": type_, **fields})
        self.state.apply(f)
        self.say(describe(f))
        return f

    def _lost_claim(self):
        me = self.claim
        superseded = self.state.g is not None and os.path.exists(
            _request_path(self.root, f"supersede.{self.state.g + 1}"))
        if me is not None:
            me.exit()
        if superseded:
            raise Finished(EXIT_DONE, f"superseded by generation {self.state.g + 1}; that supervisor "
                                      "cancels this generation's job and carries on")
        raise Finished(EXIT_ERROR, "another supervisor took over this root; stopping without writing")

    def close(self) -> None:
        if self.claim is not None:
            self.claim.exit()
        self.record.close()

    # -- start ----------------------------------------------------------------------------

    def start(self, defn: Optional[dict]) -> None:
        """After open(): record who we are; for a new root, the job's definition."""
        try:
            cluster = self.slurm.cluster_name()
        except SlurmError as e:
            cluster = self.state.cluster
            if cluster is None:
                raise DispatchError(f"cannot ask Slurm for the cluster name: {e}") from None
        resumed = self.state.facts > 0
        self.fact("supervisor", incarnation=self.claim.seq if self.claim else None, host=socket.gethostname(),
                  pid=os.getpid(), cluster=cluster, resumed=resumed, poll=self.poll)
        if not resumed:
            if defn is None:
                raise DispatchError(f"{self.root} has no record yet: give the sbatch arguments after `--`")
            self.fact("job", **defn)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> Finished:
        while True:
            if self.claim is not None:
                if not self.claim.mine():
                    self._lost_claim()
                self.claim.heartbeat()
            wait = self.step()
            if wait:
                self.sleep(wait)

    def step(self) -> float:
        """Do the next thing the state calls for; the seconds to wait before the next step."""
        st = self.state
        if st.finished and st.finished["outcome"] != "held":
            raise self._outcome(st.finished)
        if st.hold_needed:
            self._open_hold(st.hold_needed)
            return 0
        if st.hold:
            return self._hold_step()
        if st.pending_decision:
            self._decide(st.pending_decision)
            return 0
        if st.pending_apply:
            self._apply_released(st.pending_apply)
            return 0
        if st.intent_open:
            return self._recover_intent()
        if st.need_submit:
            return self._submit()
        if st.job is not None:
            return self._follow()
        raise DispatchError(f"{self.record.path}: the record leaves nothing to do ({st.summary()}); a bug?")

    @staticmethod
    def _outcome(f: dict) -> Finished:
        code = {"done": EXIT_DONE, "superseded": EXIT_DONE, "failed": EXIT_FAILED, "held": EXIT_HELD}
        return Finished(code.get(f["outcome"], EXIT_ERROR), f.get("message") or f["outcome"])

    def finish(self, outcome: str, message: str) -> None:
        f = self.fact("finished", g=self.state.g, outcome=outcome, message=message)
        raise self._outcome(f)

    # -- submission -----------------------------------------------------------------------

    def _submit(self) -> float:
        st, defn = self.state, self.state.defn
        if st.submit_failures >= (1 if st.submitted_in_g == 0 else SUBMIT_TRIES):
            self.finish("failed", f"sbatch failed {st.submit_failures} time(s): {st.last_submit_error}")
        n = store.allocate_submission(names.submission_dir(self.root))
        tag = submission_tag(self.root, st.g, n)
        self.fact("intent", g=st.g, n=n, tag=tag, epoch=epochmod.compose(st.g, n, 0))
        argv, env = sbatch_argv(defn, self.root, st.g, n, tag)
        _fault("after-intent")
        try:
            job = self.slurm.submit(argv, env or None)
        except SlurmError as e:
            self.fact("submit_failed", g=st.g, n=n, error=str(e)[-1000:])
            return self._recover_intent()
        _fault("after-sbatch")
        self.fact("submitted", g=st.g, n=n, job=job, tag=tag)
        return 0

    def _recover_intent(self) -> float:
        """An intent without a job id: sbatch may or may not have queued the job. Slurm
        knows (the tag is the job's comment; sacct too, for a job that ended and left
        slurmctld's memory while no supervisor ran): record the job, or that the intent was
        lost (then a fresh N is allocated: reusing N for a job that may have run would give
        two executions one epoch). The minute of slack covers clocks that disagree."""
        st = self.state
        try:
            found = sorted(self.slurm.jobs_with_comment(st.tag, since=(st.intent_t or 0) - 60),
                           key=lambda j: j.job_id)
        except SlurmError as e:
            self._slurm_trouble(e)
            return self.poll
        if found:
            self.fact("submitted", g=st.g, n=st.n, job=found[0].job_id, tag=st.tag, recovered=True)
            for extra in found[1:]:  # cannot happen with one sbatch per intent; say so if it does
                self.fact("note", text=f"job {extra.job_id} also carries tag {st.tag}; following "
                                       f"{found[0].job_id} only")
            return 0
        self.fact("intent_lost", g=st.g, n=st.n, tag=st.tag)
        return self.poll if st.submit_failures else 0

    # -- following the job ----------------------------------------------------------------

    def _slurm_trouble(self, e: Exception) -> None:
        if not self._slurm_warned:
            self.say(f"warning: Slurm did not answer ({e}); retrying every {self.poll:g} s")
            self._slurm_warned = True

    def _exec_fields(self, r: int, nodes: list[str], start_time: Optional[int]) -> dict:
        st = self.state
        e = epochmod.compose(st.g, st.n, r)
        attempt = names.attempt_token(st.cluster, str(st.job), e) if st.cluster else None
        return {"g": st.g, "n": st.n, "job": st.job, "r": r, "epoch": e, "attempt": attempt,
                "nodes": nodes, "start_time": start_time}

    def _follow(self) -> float:
        st = self.state
        try:
            j = self.slurm.find_job(st.job)
        except SlurmError as e:
            self._slurm_trouble(e)
            return self.poll
        self._slurm_warned = False
        if j is None:
            r = st.started["r"] if st.started else 0
            if r not in st.ended:
                fields = self._exec_fields(r, (st.started or {}).get("nodes", []),
                                           (st.started or {}).get("start_time"))
                self.fact("ended", **fields, state="UNKNOWN",
                          reason="known neither to slurmctld (purged after MinJobAge) nor to sacct")
                return 0
            return self.poll
        r = j.restart_count
        if st.started and r > st.started["r"] and st.started["r"] not in st.ended:
            s = st.started
            self.fact("ended", **self._exec_fields(s["r"], s["nodes"], s.get("start_time")),
                      state="REQUEUED", requeued=True, reason=j.reason, flags=sorted(j.flags),
                      now=f"{j.state} restart_count={r}")
            return 0
        if r not in st.ended and (st.started is None or r > st.started["r"]):
            ran = j.state in TERMINAL and j.start_time and j.nodes  # ended between two polls
            if j.state in ("RUNNING", "SUSPENDED") or ran:
                self.fact("started", **self._exec_fields(r, j.nodes, j.start_time),
                          late=j.state not in ("RUNNING", "SUSPENDED"))
                return 0
        if j.state in TERMINAL and r not in st.ended:
            via = {"via": "sacct"} if j.source == "sacct" else {}
            self.fact("ended", **self._exec_fields(r, j.nodes, j.start_time), state=j.state,
                      reason=j.reason, exit_code=j.exit_code, signal=j.exit_signal, flags=sorted(j.flags), **via)
            return 0
        return self.poll

    # -- rules ----------------------------------------------------------------------------

    def _decide(self, ended: dict) -> None:
        st, defn = self.state, self.state.defn
        ref = {k: ended[k] for k in ("job", "r")}
        if ended.get("requeued"):
            if not defn["shared"]:
                self.fact("rule", rule="requeue", cause="requeue", **ref)
                return
            try:  # Slurm requeued a shared-checkpoint job anyway: keep it from starting
                self.slurm.hold(ended["job"])
                self.fact("rule", rule="requeue", cause="requeue", held=True, slurm_held=True, **ref)
            except SlurmError as e:
                self.fact("rule", rule="requeue", cause="requeue", held=False, **ref,
                          warning=f"Slurm requeued this shared-checkpoint job and it could not be held "
                                  f"({e}); its executions may overlap")
            return
        if ended["state"] == "COMPLETED":
            self.fact("rule", rule="done", cause="completed", **ref)
            self.finish("done", f"job {ended['job']} completed")
        if ended["state"] == "UNKNOWN":
            self.fact("rule", rule="fail", cause="unknown", **ref)
            self.finish("failed", f"job {ended['job']} is known neither to slurmctld nor to sacct, so how it "
                                  "ended cannot be told; not resubmitting blindly (supersede to go on)")
        cause = CAUSES.get(ended["state"], "failure")
        left = defn["resubmit"] - st.used
        if left > 0:
            self.fact("rule", rule="resubmit", cause=cause, budget_left=left - 1, held=defn["shared"], **ref)
        else:
            self.fact("rule", rule="fail", cause=cause, budget_left=0, **ref)
            self.finish("failed", f"job {ended['job']} ended {ended['state']} and no resubmission is left "
                                  f"(--resubmit {defn['resubmit']})")

    def _apply_released(self, hold: dict) -> None:
        rule, ref = hold["replaces"], {"job": hold["job"], "r": hold["r"]}
        if rule == "resubmit":
            self.fact("rule", rule="resubmit", after_hold=hold["hold"],
                      budget_left=self.state.defn["resubmit"] - self.state.used - 1, **ref)
        elif rule == "requeue":
            if hold.get("slurm_held"):
                try:
                    self.slurm.release(hold["job"])
                except SlurmError as e:
                    self.fact("note", text=f"scontrol release {hold['job']} failed: {e}")
            self.fact("rule", rule="requeue", after_hold=hold["hold"], **ref)
        else:
            self.fact("rule", rule=rule, after_hold=hold["hold"], **ref)

    # -- holds ----------------------------------------------------------------------------

    def _open_hold(self, rule: dict) -> None:
        st = self.state
        ex = st.ended.get(rule["r"]) if rule.get("job") == st.job else None
        ex = ex or rule.get("execution") or {}
        h = self.fact("hold", hold=st.holds + 1, replaces=rule["rule"], cause=rule.get("cause"),
                      job=rule["job"], r=rule["r"], g=ex.get("g"), n=ex.get("n"), epoch=ex.get("epoch"),
                      attempt=ex.get("attempt"), nodes=ex.get("nodes", []), start_time=ex.get("start_time"),
                      slurm_held=bool(rule.get("slurm_held")), until=round(self.clock() + st.defn["hold_for"], 3),
                      cessation_cmd=st.defn["cessation_cmd"], interval=st.defn["cessation_interval"])
        events.record("hold", root=self.root, attempt=h.get("attempt") or "supervisor",
                      hold=h["hold"], replaces=h["replaces"], job=h["job"], until=h["until"])
        self.say(f"HOLD #{h['hold']}: the checkpoint is shared, so {h['replaces']} waits until execution "
                 f"R={h['r']} of job {h['job']} has ceased (asked every "
                 f"{_fmt_duration(h['interval'])}) or a person runs `dispatch-slurm release {self.root}`")

    def _release_entry(self, hold: dict) -> Optional[dict]:
        path = _request_path(self.root, f"release.{hold['hold']}")
        try:
            with open(path) as f:
                body = f.read()
        except FileNotFoundError:
            return None
        try:
            return {"entry": path, **json.loads(body or "{}")}
        except ValueError:
            return {"entry": path}

    def _hold_step(self) -> float:
        st = self.state
        h = st.hold
        rel = self._release_entry(h)
        if rel is not None:
            who = {k: rel[k] for k in ("user", "uid", "host", "message", "entry") if k in rel}
            self.fact("release", hold=h["hold"], by="person", requested_t=rel.get("t"), **who)
            events.record("release", root=self.root, attempt=h.get("attempt") or "supervisor",
                          hold=h["hold"], by="person")
            return 0
        now = self.clock()
        due = st.last_answer_t is None or now - st.last_answer_t >= h["interval"]
        expired = now >= h["until"]
        if due or (expired and not self._asked_this_run):
            ans = self.ask(h)
            self._asked_this_run = True
            self.fact("cessation", hold=h["hold"], job=h["job"], r=h["r"], **ans)
            events.record("cessation", root=self.root, attempt=h.get("attempt") or "supervisor",
                          hold=h["hold"], answer=ans["answer"], source="supervisor")
            if ans["answer"] == "ceased":
                self.fact("release", hold=h["hold"], by="cessation signal")
                events.record("release", root=self.root, attempt=h.get("attempt") or "supervisor",
                              hold=h["hold"], by="cessation signal")
                return 0
            now = self.clock()
        if expired:
            self.fact("hold_expired", hold=h["hold"], until=h["until"])
            self.finish("held", f"hold #{h['hold']} expired after {_fmt_duration(st.defn['hold_for'])} with "
                                f"no answer: job {h['job']} stays held ({h['replaces']} not applied). When "
                                f"it is safe: `dispatch-slurm release {self.root}`, then "
                                f"`dispatch-slurm run {self.root}` to continue")
        next_ask = (st.last_answer_t or now) + h["interval"]
        return max(0.05, min(self.poll, next_ask - now, h["until"] - now))

    def ask_command(self, h: dict) -> dict:
        """Run the site's cessation command for the held execution: exit 0 ceased, 1 not
        ceased, anything else (or no answer in time) cannot tell."""
        values = {"job": h["job"], "restart": h["r"], "root": self.root, "generation": h.get("g"),
                  "submission": h.get("n"), "epoch": h.get("epoch"), "attempt": h.get("attempt"),
                  "cluster": self.state.cluster, "nodes": ",".join(h.get("nodes") or []),
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

    # -- supersession ---------------------------------------------------------------------

    def supersede(self, defn: dict) -> None:
        """After open(takeover=True) and start(None): end generation G, begin G+1."""
        st = self.state
        old_g, old_job, started = st.g, st.job, st.started
        old_shared = st.defn.get("shared", False)
        cancelled, state = False, None
        if old_job is not None:
            try:
                j = self.slurm.find_job(old_job)
            except SlurmError as e:
                raise DispatchError(f"cannot ask Slurm about job {old_job}: {e}") from None
            state = j.state if j else "UNKNOWN"
            if j is not None and j.state not in TERMINAL:
                self.slurm.cancel(old_job)
                cancelled = True
        self.fact("superseded", from_g=old_g, to_g=old_g + 1, job=old_job, state=state, cancelled=cancelled)
        self.fact("job", **{**defn, "g": old_g + 1})
        if (old_shared or defn["shared"]) and started is not None and state is not None:
            # the old execution may still write into the shared folder: the new
            # generation's first submission is a recovery like any other
            self.fact("rule", rule="supersede", cause="supersession", held=True, job=old_job,
                      r=started["r"], execution={k: started.get(k) for k in
                                                 ("g", "n", "epoch", "attempt", "nodes", "start_time")})


def describe(f: dict) -> str:
    """One line per fact, for the supervisor's stderr."""
    t = f["type"]
    if t == "job":
        return (f"generation {f['g']}: {'shared checkpoint, ' if f['shared'] else ''}resubmit budget "
                f"{f['resubmit']}, via {f['via']}: sbatch {shlex.join(f['args'])}")
    if t == "intent":
        return f"submitting G={f['g']} N={f['n']} (tag {f['tag']})"
    if t == "submitted":
        return f"submitted job {f['job']} (G={f['g']} N={f['n']}){' [found after a restart]' if f.get('recovered') else ''}"
    if t == "started":
        return f"job {f['job']} execution R={f['r']} started on {','.join(f['nodes'])} (epoch {f['epoch']})"
    if t == "ended":
        return f"job {f['job']} execution R={f['r']} ended: {f['state']} ({f.get('reason') or '-'})"
    if t == "rule":
        extra = " -> HOLD" if f.get("held") else ""
        left = f" ({f['budget_left']} left)" if "budget_left" in f else ""
        return f"rule: {f['rule']}{left}{extra}"
    if t == "hold":
        until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["until"]))
        return (f"hold #{f['hold']} on job {f['job']} R={f['r']} (instead of {f['replaces']}), "
                f"until {until}")
    if t == "cessation":
        return f"cessation signal for hold #{f['hold']}: {f['answer']}"
    if t == "release":
        return f"hold #{f['hold']} released by {f['by']}"
    if t == "finished":
        return f"finished: {f['outcome']}: {f.get('message', '')}"
    if t == "supervisor":
        return f"supervisor {'resumed' if f.get('resumed') else 'started'} (pid {f['pid']} on {f['host']})"
    rest = {k: v for k, v in f.items() if k not in ("v", "seq", "t", "type")}
    return f"{t}: {json.dumps(rest)}"


# ---- entry points used by the CLI -------------------------------------------------------------

def normalize(root: str) -> str:
    root = names.normalize_root(root)
    if "%a" in root:
        raise DispatchError(f"checkpoint root {root!r}: array roots (%a) are not supervised; "
                            "run one supervisor per task root")
    if not os.path.isdir(root):
        raise DispatchError(f"checkpoint root {root} does not exist (create it first)")
    return root


def make_defn(options: dict, args: list[str], base: Optional[dict] = None) -> dict:
    """A job definition from CLI options (None = not given: from ``base``, else the default)."""
    base = base or {}
    d = {k: (options[k] if options.get(k) is not None else base.get(k, DEFAULTS[k])) for k in DEFAULTS}
    if d["resubmit"] < 0:
        raise DispatchError(f"--resubmit must be 0 or more, got {d['resubmit']}")
    if d["via"] not in ("spank", "env"):
        raise DispatchError(f"--via must be spank or env, got {d['via']!r}")
    try:
        parts = shlex.split(d["cessation_cmd"])
        for p in parts:
            p.format(**{k: "" for k in PLACEHOLDERS})
    except (ValueError, KeyError, IndexError) as e:
        raise DispatchError(f"--cessation-cmd {d['cessation_cmd']!r}: {e!r} (placeholders: "
                            f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)})") from None
    if not parts:
        raise DispatchError("--cessation-cmd is empty")
    d["args"] = list(args) or list(base.get("args", []))
    check_sbatch_args(d["args"], d)
    d["cwd"] = os.getcwd()
    return d


def check_resume(options: dict, args: list[str], defn: dict) -> None:
    """On resume the record's definition stands: a different value given now is refused."""
    for k, v in options.items():
        if v is not None and k in DEFAULTS and v != defn.get(k):
            raise DispatchError(f"the record of this root has {k.replace('_', '-')}={defn.get(k)!r} for "
                                f"generation {defn['g']}, not {v!r}: omit it to resume (or supersede the job)")
    if args and list(args) != defn["args"]:
        raise DispatchError(f"the record of this root submits `{shlex.join(defn['args'])}`, not "
                            f"`{shlex.join(args)}`: omit the sbatch arguments to resume (or supersede the job)")


def run(root: str, options: dict, args: list[str], poll: float, slurm: Optional[Slurm] = None) -> Finished:
    root = normalize(root)
    sup = Supervisor(root, slurm, poll=poll)
    try:
        st = sup.open("run")
        if st.facts:
            check_resume(options, args, st.defn)
            defn = None
            if st.defn.get("cwd") and os.path.isdir(st.defn["cwd"]):
                os.chdir(st.defn["cwd"])
        else:
            defn = {"g": 0, **make_defn(options, args)}
        sup.start(defn)
        return sup.run()
    except Finished as f:
        return f
    finally:
        sup.close()


def supersede(root: str, options: dict, args: list[str], poll: float, slurm: Optional[Slurm] = None) -> Finished:
    root = normalize(root)
    facts = Record(root).read()
    st = State.replay(facts)
    if st.g is None:
        raise DispatchError(f"{root} has no record of a job to supersede: start one with `dispatch-slurm run`")
    new_g = st.g + 1
    if new_g > epochmod.G_MAX:
        raise DispatchError(f"generation {new_g} is over the maximum {epochmod.G_MAX:,}")
    defn = make_defn(options, args, base=st.defn)
    try:
        make_request(root, f"supersede.{new_g}", {**_who(), "args": args})
    except FileExistsError:
        raise DispatchError(f"generation {new_g} of {root} was already requested "
                            f"({_request_path(root, f'supersede.{new_g}')})") from None
    sup = Supervisor(root, slurm, poll=poll)
    try:
        st = sup.open("supersede", takeover=True)
        if st.g + 1 != new_g:
            raise DispatchError(f"the record moved to generation {st.g} meanwhile; not superseding")
        sup.start(None)
        sup.supersede(defn)
        return sup.run()
    except Finished as f:
        return f
    finally:
        sup.close()


def release(root: str, message: Optional[str] = None) -> dict:
    """A person's answer to the standing hold: an O_EXCL entry the supervisor picks up."""
    root = normalize(root)
    st = State.replay(Record(root).read())
    if st.hold is None:
        raise DispatchError(f"no hold stands on {root} ({st.summary()})")
    h = st.hold
    body = {**_who(), "message": message or ""}
    path_of = lambda h: _request_path(root, f"release.{h['hold']}")  # noqa: E731
    try:
        path = make_request(root, f"release.{h['hold']}", body)
    except FileExistsError:
        raise DispatchError(f"hold #{h['hold']} of {root} is already released ({path_of(h)}); "
                            "the supervisor applies it at its next poll") from None
    claim = Claim(root, DEFAULT_POLL, "release")
    claims, exited = claim._entries()
    running = bool(claims) and claim.holder_alive(claims[-1], exited, wait=False)
    return {"hold": h["hold"], "job": h["job"], "r": h["r"], "replaces": h["replaces"], "entry": path,
            "supervisor_running": running}


def load_state(root: str) -> State:
    return State.replay(Record(normalize(root)).read())


__all__ = ["Record", "Claim", "State", "Supervisor", "Finished", "plan", "render_plan", "run", "supersede",
           "release", "parse_duration", "DEFAULTS", "DEFAULT_CESSATION_CMD"]
