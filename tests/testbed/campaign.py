"""The fault campaign: long runs under a seeded nemesis, judged by an independent checker.

Each run is drawn from its seed (``setup_for``, ``schedule_for``): a setup as users have
them (the deterministic trainer with dispatch-slurm's handler, with its own handler
printing the sentinel, or untrapped; a Hugging Face Trainer; one or two ranks; Slurm's
default output path, ``%x-%j``, a literal file, an appended one; under ``dispatch-slurm run``
or plugin-only with Slurm's requeue; with or without ``--signal``; with or without gc) and
a schedule of overlapping faults (``KINDS``). The same schedule hits both modes side by
side: *dispatch* (the setup as the user guide writes it) and *naive* (one shared folder,
the framework's own resume and rotation, Slurm's requeue, a user who resubmits by hand).

A nemesis thread applies each fault at its time to whatever runs then (a node fault to the
nodes the executions run on), and undoes it after its duration; the trainers log every
step; when both modes have ended, Slurm's accounting is read and ``checker.check`` judges
each mode from the root, sacct and the trainer's log alone. Every anomaly is printed with
its seed, class and the command that replays the run (the same setup and schedule; the
cluster's own timing is not replayed: this is a real Slurm, not a simulation).
Goodput: the trainer's log split into ``dispatch_slurm.report.goodput``'s buckets, beside
Young/Daly's prediction and, for dispatch mode, the estimate ``dispatch-slurm report``
makes from the root alone.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
import shutil
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from dispatch_slurm.report import goodput
from dispatch_slurm.slurm.client import SlurmError

from . import checker
from .bed import ClusterError

IMAGE_TESTBED = "/src/dispatch-slurm/tests/testbed"  # the test bed's copy in docker-slurm's image
HOST_SITE = "/opt/host-site"  # where bookworm's containers see this machine's torch
USER = "alice"
FS = "fs"  # the tmpfs under /checkpoints that holds every root and shared folder (the ENOSPC fault fills it)
FS_MIB = 64

#: setup axis -> its values, drawn in this order from the run's seed
AXES: dict[str, tuple] = {
    "trainer": ("handler", "own", "none", "hf"),
    "ranks": (1, 2),
    "output": ("default", "name", "literal", "append"),
    "launcher": ("run", "plugin"),
    "signal": (False, True),
    "gc": (0, 2),
}

#: fault kind -> (weight, duration range in seconds; (0, 0): instant)
KINDS: dict[str, tuple[float, tuple[float, float]]] = {
    "timelimit": (2.0, (0, 0)),        # scontrol update TimeLimit: the job's time limit, now
    "cancel": (2.0, (0, 0)),           # an admin's scancel
    "preempt": (2.0, (10, 30)),        # a higher-tier job wants the node for that long
    "requeue": (2.0, (0, 0)),          # scontrol requeue while the execution runs
    "partition": (2.0, (25, 70)),      # the node's traffic dropped, its processes running
    "partition-long": (0.5, (0, 0)),   # the same, longer than MinJobAge
    "crash": (1.5, (20, 60)),          # slurmd and the job's processes killed, the node back later
    "stall": (1.5, (5, 40)),           # SIGSTOP of a rank, SIGCONT later
    "enospc": (1.5, (10, 40)),         # the checkpoint filesystem full
    "ctld-restart": (1.0, (0, 0)),     # slurmctld stopped and started
    "stray": (1.0, (10, 40)),          # a stray file in pub/, removed by a person later
    "slurmd-stop": (1.5, (45, 90)),    # slurmd SIGSTOPped (a hung mount, memory pressure), the job's processes running
}
NODE_FAULTS = ("partition", "partition-long", "crash", "slurmd-stop")
#: kinds added since the long campaign, drawn on a generator of their own: a seed draws the
#: faults it drew before, but for those an added kind takes the place of (at its weight's share)
ADDED = ("slurmd-stop",)
GIVE_UP = 8  # a user who resubmits by hand gives up after this many jobs in a row without a new step
STRAYS = ("notes.txt", ".nfs000000000123abcd00000001", "00000000000001000000-00000000000000000100-MZXW6===")


@dataclass
class Setup:
    trainer: str
    ranks: int
    output: str
    launcher: str
    signal: bool
    gc: int

    def label(self) -> str:
        return (f"{self.trainer}/{self.ranks}r/{self.output}/{self.launcher}"
                f"{'/signal' if self.signal else ''}{f'/gc{self.gc}' if self.gc else ''}")


@dataclass
class Fault:
    at: float  # seconds after both modes took their first step
    kind: str
    duration: float
    pick: int  # which node, rank or stray name, among the candidates at that time


@dataclass
class Params:
    """Timings of a campaign (``--steps``, the profile's MinJobAge)."""

    steps: int = 480
    hf_steps: int = 240
    step_time: float = 0.25
    save_every: int = 20
    lead_s: int = 20  # --signal=TERM@lead
    min_job_age: float = 180.0
    slurmd_timeout: float = 15.0  # the profile's SlurmdTimeout: a slurmd-stop outlasts it
    deadline_s: float = 1500.0
    mean_gap_s: float = 25.0
    resubmit: int = 100
    kinds: Optional[tuple[str, ...]] = None  # draw faults among these kinds only (None: every kind)


def parse_setup(text: Optional[str]) -> dict[str, Any]:
    """``--setup trainer=own,ranks=2``: the axes to fix (the others are drawn)."""
    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        axis, _, value = part.partition("=")
        axis = axis.strip()
        if axis not in AXES:
            raise ClusterError(f"--setup: unknown axis {axis!r}: one of {', '.join(AXES)}")
        for v in AXES[axis]:
            if str(v).lower() == value.strip().lower() or (isinstance(v, bool) and value.strip() in ("0", "1")
                                                          and v == (value.strip() == "1")):
                out[axis] = v
                break
        else:
            raise ClusterError(f"--setup: {axis}={value!r} is not one of {', '.join(map(str, AXES[axis]))}")
    return out


def setup_for(seed: int, fixed: Optional[dict] = None, hf: bool = True) -> Setup:
    """The run's setup: every axis drawn from the seed (always all, in order, so fixing one
    axis leaves the others as they were), then ``fixed``, then what cannot go together:
    the Hugging Face trainer runs one rank and only where torch runs (``hf``); gc is
    ``run``'s (``--keep-last``)."""
    rng = random.Random(f"setup:{seed}")
    v = {axis: rng.choice(values) for axis, values in AXES.items()}
    spare = rng.choice(("handler", "own", "none"))
    v.update(fixed or {})
    if v["trainer"] == "hf" and not hf:
        if (fixed or {}).get("trainer") == "hf":
            raise ClusterError("--setup trainer=hf needs torch in the cluster: --suite bookworm (its Python 3.11 "
                               "runs this machine's torch)")
        v["trainer"] = spare
    if v["trainer"] == "hf":
        v["ranks"] = 1
    if v["launcher"] == "plugin":
        if (fixed or {}).get("gc"):
            raise ClusterError("--setup gc=2 needs launcher=run (gc is `run --keep-last`)")
        v["gc"] = 0
    return Setup(**v)


def schedule_for(seed: int, p: Params, n: Optional[int] = None) -> list[Fault]:
    """The run's faults: ``n`` (else 2..5, from the seed) of weighted kinds, the first 10-25 s
    after training began, then exponential gaps (mean ``p.mean_gap_s``, at least 3 s), so
    faults with durations overlap the next ones. A kind of ``ADDED`` replaces the one drawn
    at its weight's share, so every other fault of a seed stays what it was."""
    rng, later = random.Random(f"faults:{seed}"), random.Random(f"faults:{seed}:added")
    count = rng.randint(2, 5) if n is None else n
    kinds = [k for k in KINDS if (p.kinds is None or k in p.kinds) and k not in ADDED]
    added = [k for k in ADDED if p.kinds is None or k in p.kinds]
    weights, more = [KINDS[k][0] for k in kinds], [KINDS[k][0] for k in added]
    out, t = [], rng.uniform(10, 25)
    for _ in range(count):
        kind = rng.choices(kinds, weights)[0] if kinds else str(rng.random())
        if added and (not kinds or later.random() < sum(more) / (sum(weights) + sum(more))):
            kind = later.choices(added, more)[0]
        lo, hi = KINDS[kind][1]
        duration = p.min_job_age + rng.uniform(15, 45) if kind == "partition-long" else rng.uniform(lo, hi)
        if kind == "slurmd-stop":  # long enough for slurmctld to set the node DOWN, whatever the profile
            duration = max(duration, p.slurmd_timeout + 30)
        out.append(Fault(round(t, 1), kind, round(duration, 1), rng.randrange(1 << 16)))
        t += max(3.0, rng.expovariate(1 / p.mean_gap_s))
    return out


def replay_command(suite: str, seed: int, mode: str, setup: str = "", steps: Optional[int] = None,
                   kinds: Optional[tuple[str, ...]] = None) -> str:
    more = (f" --setup {setup}" if setup else "") + (f" --steps {steps}" if steps else "") + \
        "".join(f" --kind {k}" for k in kinds or ())
    return f"PYTHONPATH=tests python -m testbed campaign --suite {suite} --seed {seed} --runs 1 --mode {mode}{more}"


def plan(suite: str, seed: int, runs: Optional[int], faults: Optional[int], fixed: dict, p: Params) -> str:
    """What a campaign would run, one line per run, as if every fault hit (``--dry-run``;
    ``--duration`` alone: the first 100 runs)."""
    hf = suite == "bookworm"
    lines: list[str] = []
    total, kinds, setups = 0, dict[str, int](), set()
    for i in range(runs or 10_000):
        if runs is None and (total >= faults if faults else i >= 100):
            break
        s = setup_for(seed + i, fixed, hf=hf)
        sched = schedule_for(seed + i, p)
        total += len(sched)
        setups.add(s.label())
        for f in sched:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        lines.append(f"seed {seed + i}: {s.label()}: " + ", ".join(f"{f.kind}@{f.at:.0f}s" for f in sched))
    lines.append(f"{len(lines)} runs, {len(setups)} setups, {total} faults: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    return "\n".join(lines)


# -- the job scripts ---------------------------------------------------------------------------


def readme_job_script(readme: Path) -> str:
    """The README's job script without the plugin's view (its ``job-script`` snippet): the one
    the tests of the protocol run; the view's one-line form has a test of its own."""
    found = re.search(r"<!-- snippet: job-script -->\n```sh\n(.*?)```", readme.read_text(), re.S)
    if found is None:
        raise ClusterError(f"{readme} has no `<!-- snippet: job-script -->` sh block")
    return found[1]


def wrapper(trainer: str, args: list[str], site: Optional[str] = None) -> str:
    """A ``train.py`` that runs ``trainer`` with ``args`` first, as a user's entry point would
    (``site``: a folder of packages to add, e.g. this machine's torch)."""
    path = f"sys.path.insert(0, {site!r})\n" if site else ""
    return (f"import sys\n{path}sys.argv[1:1] = {args!r}\nsys.argv[0] = {trainer!r}\n"
            f"exec(compile(open({trainer!r}).read(), {trainer!r}, 'exec'), "
            f"{{'__name__': '__main__', '__file__': {trainer!r}}})\n")


NAIVE_SCRIPT = "#!/bin/bash\n#SBATCH --time=24:00:00\nsrun python train.py --output-dir {shared}\n"


class Side:
    """One mode of a run: its folder, job script, jobs, and how it ended."""

    def __init__(self, camp: "Campaign", run: "RunState", mode: str):
        self.camp, self.run, self.mode = camp, run, mode
        self.bed = camp.bed
        self.dir = f"/checkpoints/campaign/{run.id}/{mode}"
        self.hdir = self.bed.path(self.dir)
        self.root = f"/checkpoints/{FS}/{run.id}/{mode}/root" if mode == "dispatch" else None
        self.shared = f"/checkpoints/{FS}/{run.id}/{mode}/shared" if mode == "naive" else None
        self.log = f"{self.dir}/train.jsonl"
        self.jobs: list[int] = []
        self.retry_at = 0.0
        self.superseded: dict[int, float] = {}  # finished fact (its seq) -> when its user superseded after it
        self.outcome: Optional[dict] = None
        self.events: list[dict] = []
        s = run.setup
        self.trap = "hf" if s.trainer == "hf" else ("own" if mode == "naive" and s.trainer == "handler" else s.trainer)
        self.launcher = "user" if mode == "naive" else s.launcher
        # the trainer's processes (not srun's, whose command line holds the same words after "srun")
        self.marker = f"^\\S*python[0-9.]* train.py .*/checkpoints/{FS}/{run.id}/{mode}/"
        self.started_at = time.time()

    @property
    def hroot(self) -> Optional[Path]:
        return self.bed.path(self.root) if self.root else None

    def note(self, what: str, **more) -> None:
        self.events.append({"t": time.time(), "what": what, **more})
        self.camp.say(f"run {self.run.seed} {self.mode}: {what} {more if more else ''}".rstrip())

    # preparing and submitting

    def prepare(self) -> None:
        s, p = self.run.setup, self.camp.params
        self.hdir.mkdir(parents=True)
        self.hdir.chmod(0o1777)
        (self.hdir / "bin").mkdir()
        (self.hdir / "bin" / "python").symlink_to("/usr/bin/python3")
        folder = self.shared if self.mode == "naive" else None
        if s.trainer == "hf":
            trainer = f"{IMAGE_TESTBED}/hftrain.py"
            args = ["--max-steps", str(p.hf_steps), "--save-every", str(p.save_every), "--step-time",
                    str(p.step_time), "--seed", str(self.run.seed % 1000), "--log", self.log]
            args += ["--naive"] if self.mode == "naive" else []
        else:
            trainer = f"{IMAGE_TESTBED}/dettrain.py"
            args = ["--max-steps", str(p.steps), "--save-every", str(p.save_every), "--step-time", str(p.step_time),
                    "--trap", self.trap, "--seed", str(self.run.seed % 1000), "--log", self.log,
                    "--barrier-dir", f"{self.dir}/barrier", "--warmup", "1"]
            args += ["--naive"] if self.mode == "naive" else []
        (self.hdir / "train.py").write_text(wrapper(trainer, args, HOST_SITE if s.trainer == "hf" else None))
        if self.mode == "naive":
            script = NAIVE_SCRIPT.format(shared=folder)
        else:
            script = self.camp.job_script
            script = re.sub(r" --signal=\S+", "", script)  # the setup's own --signal is on the command line
            if s.launcher == "plugin":  # the plugin sets DISPATCH_* and the Prolog makes the folder
                script = "\n".join(line for line in script.splitlines() if "dispatch-slurm env" not in line) + "\n"
        (self.hdir / "train.sbatch").write_text(script)
        parent = self.root or self.shared
        assert parent is not None
        self.bed.exec("ctl", f"mkdir -p {os.path.dirname(parent)} && mkdir -m 700 {parent}", user=USER)

    def sbatch_args(self) -> list[str]:
        s, p = self.run.setup, self.camp.params
        a = ["-N1", f"-n{s.ranks}", "-c1", "-p", "normal", f"--chdir={self.dir}",
             "-J", f"c{self.run.seed}-{self.mode}"]
        a += {"default": [], "name": [f"-o{self.dir}/%x-%j.out"], "literal": [f"-o{self.dir}/train.out"],
              "append": [f"-o{self.dir}/train.out", "--open-mode=append"]}[s.output]
        if s.signal:
            a.append(f"--signal=TERM@{p.lead_s}")
        return a

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.dir}/bin:/usr/local/bin:/usr/bin:/bin"}

    def start(self) -> None:
        self.started_at = time.time()
        if self.launcher == "run":
            self.start_supervisor(first=True)
        else:
            self.submit()

    def start_supervisor(self, first: bool) -> None:
        s, p = self.run.setup, self.camp.params
        args = ["--resubmit", str(p.resubmit), "--continuations", str(p.resubmit), "--poll", "1"]
        args += ["--keep-last", str(s.gc)] if s.gc else []
        tail = f" {' '.join(args)} -- {' '.join(self.sbatch_args())} {self.dir}/train.sbatch" if first else " --poll 1"
        env = " ".join(f"{k}={v}" for k, v in self.env().items())
        self.bed.exec(self.camp.login, f"cd {self.dir} && env {env} setsid nohup dispatch-slurm run {self.root}{tail} "
                                       f">> {self.dir}/sup.log 2>&1 < /dev/null &", user=USER)

    def submit(self) -> None:
        a = self.sbatch_args() + ["--requeue"]
        if self.mode == "dispatch":
            a.append(f"--dispatch-checkpoint={self.root}")
        job = self.bed.slurm_as(USER, self.camp.login).submit(a + [f"{self.dir}/train.sbatch"], self.env())
        self.jobs.append(job)
        self.note("submitted", job=job)

    # following

    def record(self) -> list[dict]:
        hroot = self.hroot
        p = hroot / "record.jsonl" if hroot else None
        out = []
        if p and p.exists():
            for line in p.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def current_job(self) -> Optional[int]:
        if self.launcher == "run":
            jobs = [f["job"] for f in self.record() if f.get("type") == "submitted"]
            for j in jobs:
                if j not in self.jobs:
                    self.jobs.append(j)
        return self.jobs[-1] if self.jobs else None

    def log_records(self) -> list[dict]:
        return checker.read_log(str(self.bed.path(self.log)))

    def trained(self) -> bool:
        return any(r["op"] == "done" for r in self.log_records())

    def stepping(self) -> bool:
        p = self.bed.path(self.log)
        return p.exists() and '"op": "step"' in p.read_text()

    def poll(self) -> None:
        if self.outcome is not None:
            return
        if self.launcher == "run":
            self.current_job()
            facts = self.record()
            last = next((f for f in reversed(facts) if f.get("type") in ("finished", "job")), {})
            if last.get("type") == "finished":  # of the generation that runs now
                if self.supersede_after(last):
                    return
                self.outcome = {"state": last["outcome"], "message": last.get("message", ""), "t": last["t"],
                                "by": "supervisor"}
                self.note("ended", state=self.outcome["state"], message=self.outcome["message"][:200])
            elif not self.bed.pids(self.camp.login, f"dispatch-slurm (run|supersede) {self.root}", user=USER):
                tail = (self.hdir / "sup.log").read_text()[-600:] if (self.hdir / "sup.log").exists() else ""
                self.note("supervisor exited without finishing; started again (as after a logout)", log=tail)
                self.start_supervisor(first=False)
            return
        job = self.current_job()
        if job is None:
            return
        j = self.camp.job(job)
        if j is None or not j.ended:
            if j is not None and j.state == "PENDING" and "held" in (j.reason or "").lower():
                self.note("Slurm holds the job; released, as its user would", job=job, reason=j.reason)
                self.bed.exec("ctl", ["scontrol", "release", str(job)], check=False)
            return
        if self.trained():
            self.outcome = {"state": "done", "message": f"job {job} ended {j.state}; the log says training finished",
                            "t": time.time(), "by": "user"}
            self.note("ended", state="done", job=job)
        elif len(self.jobs) > self.camp.params.resubmit or self.stuck():
            self.outcome = {"state": "failed", "message": f"no resubmission is left: the user gave up after "
                                                          f"{len(self.jobs)} jobs (the last {GIVE_UP} made no new step)",
                            "t": time.time(), "by": "user"}
            self.note("ended", state="failed", job=job)
        elif time.time() >= self.retry_at:
            # a user looks before resubmitting again: the longer, the more jobs in a row made no step
            idle = self.idle_jobs()
            if idle and self.retry_at == 0.0:
                self.retry_at = time.time() + 5.0 * idle
                return
            self.retry_at = 0.0
            self.note("job ended before training finished; resubmitted by its user", job=job, state=j.state)
            self.submit()

    def supersede_after(self, fin: dict) -> bool:
        """A run that failed on a refusal repeated before training (`run` names it and says
        to supersede once it is fixed): its user looks for up to a minute whether `latest`
        answers again (a person moved the stray entry out of pub/), and then supersedes, as
        the message says. True while the user is at it."""
        if fin["outcome"] != "failed" or "failed the same way before it" not in fin.get("message", ""):
            return False
        if fin["seq"] in self.superseded:  # until the supersession is in the record
            return time.time() < self.superseded[fin["seq"]] + 60
        if time.time() > fin["t"] + 60:
            return False
        if time.time() < self.retry_at:
            return True
        self.retry_at = time.time() + 2
        if self.bed.exec(self.camp.login, ["dispatch-slurm", "latest", self.root], user=USER, check=False).returncode == 2:
            return True
        self.superseded[fin["seq"]] = time.time()
        self.note("run failed on a refusal that went away; superseded, as its user would", message=fin["message"][:200])
        env = " ".join(f"{k}={v}" for k, v in self.env().items())
        self.bed.exec(self.camp.login, f"cd {self.dir} && env {env} setsid nohup dispatch-slurm supersede {self.root} "
                                       f"--poll 1 >> {self.dir}/sup.log 2>&1 < /dev/null &", user=USER)
        return True

    def idle_jobs(self) -> int:
        """How many of the last jobs, in a row, applied no step beyond what earlier ones had."""
        recs = self.log_records()
        best, idle = 0, 0
        for j in self.jobs:
            mine = [r["step"] for r in recs if r["op"] == "step" and r.get("job") == str(j)]
            if mine and max(mine) > best:
                best, idle = max(mine), 0
            else:
                idle += 1
        return idle

    def stuck(self) -> bool:
        """A user who resubmits by hand gives up after ``GIVE_UP`` jobs in a row without a new step."""
        return self.idle_jobs() >= GIVE_UP

    def running(self) -> tuple[Optional[int], list[str]]:
        """The current job and its nodes when it runs."""
        job = self.current_job()
        if job is None or self.outcome is not None:
            return None, []
        j = self.camp.job(job)
        if j is None or j.state != "RUNNING":
            return job, []
        return job, list(j.nodes)

    def stop(self, why: str) -> None:
        """The deadline: stop supervising and cancel."""
        if self.launcher == "run":
            self.bed.exec(self.camp.login, ["dispatch-slurm", "stop", self.root, "-m", why], user=USER, check=False)
        for job in self.jobs:
            self.bed.exec("ctl", ["scancel", str(job)], check=False)
        if self.outcome is None:
            self.outcome = {"state": "unfinished", "message": why, "t": time.time(), "by": "campaign"}


# -- the nemesis -----------------------------------------------------------------------------------


class Undo:
    """A fault's undoing, run once: by its timer, or at once when the run ends."""

    def __init__(self, nemesis: "Nemesis", fn: Callable[[], None], a: "Applied"):
        self.nemesis, self.fn, self.a = nemesis, fn, a
        self.lock = threading.Lock()
        self.ran = False
        self.timer: Optional[threading.Timer] = None

    def now(self) -> None:
        with self.lock:
            if self.ran:
                return
            self.ran = True
        if self.timer is not None:
            self.timer.cancel()
        try:
            self.fn()
        except Exception as e:  # keep undoing the rest: a cluster left broken spoils the next run
            self.nemesis.errors.append(f"undoing {self.a.kind}: {e}")
            self.nemesis.camp.say(f"run {self.nemesis.rs.seed}: undoing {self.a.kind} failed: {e}")
        self.a.t1 = time.time()


@dataclass
class Applied:
    kind: str
    at: float
    t0: float
    t1: Optional[float] = None
    nodes: list[str] = field(default_factory=list)
    jobs: dict[str, int] = field(default_factory=dict)
    detail: str = ""
    missed: bool = False


class Nemesis(threading.Thread):
    """Applies a run's schedule to whatever runs at each fault's time, and undoes each fault
    after its duration; ``finish`` undoes everything still in force."""

    def __init__(self, camp: "Campaign", run: "RunState"):
        super().__init__(daemon=True, name=f"nemesis-{run.seed}")
        self.camp, self.rs, self.bed = camp, run, camp.bed
        self.applied: list[Applied] = []
        self.undos: list[Undo] = []
        self.busy: set[str] = set()
        self.limits: dict[int, int] = {}  # job -> the time limit a fault set (minutes)
        self.done = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:  # noqa: D401 - Thread.run
        """Apply each fault at its time. Undoing runs on timers of its own, so a fault whose
        Slurm queries hang (a controller that cannot resolve a dead node) never delays the
        undoing that would unblock it."""
        t0 = self.rs.t0
        for f in sorted(self.rs.schedule, key=lambda f: f.at):
            if self.done.wait(max(0.0, t0 + f.at - time.time())):
                return
            if any(side.outcome is None for side in self.rs.sides):
                self._apply(f)

    def finish(self) -> None:
        """Stop applying, and undo at once every fault still in force."""
        self.done.set()
        if self.is_alive():
            self.join(300)
        for u in list(self.undos):
            u.now()

    def later(self, seconds: float, undo: Callable[[], None], a: Applied) -> None:
        u = Undo(self, undo, a)
        self.undos.append(u)
        u.timer = threading.Timer(seconds, u.now)
        u.timer.daemon = True
        u.timer.start()

    def _apply(self, f: Fault) -> None:
        a = Applied(f.kind, f.at, time.time())
        live = [s for s in self.rs.sides if s.outcome is None]
        running = {s.mode: s.running() for s in live}
        jobs = {m: j for m, (j, nodes) in running.items() if j is not None and nodes}
        a.jobs = dict(jobs)
        try:
            getattr(self, "_" + f.kind.replace("-", "_"))(f, a, live, running)
        except (ClusterError, SlurmError, OSError) as e:
            a.detail += f" (failed: {str(e)[-300:]})"
            self.errors.append(f"{f.kind}: {e}")
        if a.t1 is None and not any(u.a is a for u in self.undos):
            a.t1 = time.time()
        self.applied.append(a)
        self.camp.say(f"run {self.rs.seed}: fault {f.kind}{' (missed: nothing ran)' if a.missed else ''} "
                      f"{a.detail}".rstrip())

    def _nodes(self, running: dict, f: Fault) -> list[str]:
        nodes = sorted({n for _, ns in running.values() for n in ns} - self.busy)
        return [nodes[f.pick % len(nodes)]] if nodes else []

    def _timelimit(self, f: Fault, a: Applied, live, running) -> None:
        a.missed = not a.jobs
        for mode, job in a.jobs.items():
            j = self.camp.job(job)
            if j is None or not j.start_time:
                continue
            # the limit as near as Slurm takes it (whole minutes): passed already without --signal
            # (TIMEOUT at slurmctld's next check, within 30 s); with one, a few seconds beyond the lead
            elapsed = time.time() - j.start_time
            ahead = self.camp.params.lead_s + 5 if self.rs.setup.signal else 0
            minutes = max(1, math.ceil((elapsed + ahead) / 60) if ahead else math.floor(elapsed / 60))
            minutes = self.limits[job] = min(minutes, self.limits.get(job, minutes))  # never lengthened
            self.bed.exec("ctl", ["scontrol", "update", f"jobid={job}", f"TimeLimit={minutes}"], check=False)
            a.detail += f"{mode}: job {job} TimeLimit={minutes} (ran {elapsed:.0f}s); "

    def _cancel(self, f: Fault, a: Applied, live, running) -> None:
        a.missed = not a.jobs
        for job in a.jobs.values():
            self.bed.exec("ctl", ["scancel", str(job)], check=False)
        a.detail = f"scancel {sorted(a.jobs.values())} as root"

    def _requeue(self, f: Fault, a: Applied, live, running) -> None:
        a.missed = not a.jobs
        for job in a.jobs.values():
            self.bed.exec("ctl", ["scontrol", "requeue", str(job)], check=False)
        a.detail = f"scontrol requeue {sorted(a.jobs.values())}"

    def _preempt(self, f: Fault, a: Applied, live, running) -> None:
        nodes = sorted({n for _, ns in running.values() for n in ns})
        a.missed, a.nodes = not nodes, nodes
        preemptors = []
        for n in nodes:
            preemptors.append(self.bed.submit("bob", args=["-p", "high", "-w", n, "--exclusive", "-o", "/dev/null",
                                                           "-J", "preemptor", "--wrap", f"sleep {f.duration:.0f}"]))
        a.detail = f"high-tier jobs {preemptors} on {nodes} for {f.duration:.0f}s"
        def cancel() -> None:
            for p in preemptors:
                self.bed.exec("ctl", ["scancel", str(p)], check=False)
        self.later(f.duration + 5, cancel, a)  # its sleep ends by itself; one still pending is cancelled

    def _on_node(self, f: Fault, a: Applied, running: dict, act: Callable[[str], None],
                 undo: Callable[[str], None], what: str) -> None:
        """A fault on one node running the job (``f.pick`` among them), busy until ``undo``
        ran after the fault's duration; ``what``: its detail, ``{n}`` the node."""
        nodes = self._nodes(running, f)
        a.missed, a.nodes = not nodes, nodes
        if not nodes:
            return
        n = nodes[0]
        self.busy.add(n)
        act(n)
        a.detail = what.format(n=n, s=f"{f.duration:.0f}")

        def back() -> None:
            undo(n)
            self.busy.discard(n)
        self.later(f.duration, back, a)

    def _partition(self, f: Fault, a: Applied, live, running) -> None:
        self._on_node(f, a, running, self.bed.partition, self.bed.heal, "{n} cut off for {s}s")

    _partition_long = _partition  # the same cut; the schedule draws it longer than MinJobAge

    def _crash(self, f: Fault, a: Applied, live, running) -> None:
        def boot(n: str) -> None:
            self.bed.boot(n)
            self.camp.pin_addresses()  # its address may have changed
        self._on_node(f, a, running, self.bed.kill, boot, "{n} killed (slurmd and every process), back after {s}s")

    def _slurmd_stop(self, f: Fault, a: Applied, live, running) -> None:
        """slurmd frozen on a node running the job, longer than SlurmdTimeout: slurmctld sets
        the node DOWN and requeues or fails the job while its processes run on."""
        self._on_node(f, a, running, lambda n: self.bed.exec(n, ["pkill", "-STOP", "-x", "slurmd"]),
                      lambda n: self.bed.exec(n, ["pkill", "-CONT", "-x", "slurmd"], check=False),
                      "slurmd on {n} SIGSTOPped for {s}s")

    def _stall(self, f: Fault, a: Applied, live, running) -> None:
        stopped: list[tuple[str, int]] = []
        for s in live:
            _, nodes = running.get(s.mode, (None, []))
            pids = sorted((n, p) for n in nodes if n not in self.busy for p in self.bed.pids(n, s.marker))
            if pids:
                n, pid = pids[f.pick % len(pids)]
                self.bed.exec(n, ["kill", "-STOP", str(pid)], check=False)
                stopped.append((n, pid))
        a.missed, a.nodes = not stopped, sorted({n for n, _ in stopped})
        a.detail = f"SIGSTOP {stopped} for {f.duration:.0f}s"

        def cont() -> None:
            for n, pid in stopped:
                try:
                    self.bed.exec(n, ["kill", "-CONT", str(pid)], check=False)
                except ClusterError:
                    pass  # the node was killed meanwhile
        self.later(f.duration, cont, a)

    def _enospc(self, f: Fault, a: Applied, live, running) -> None:
        fs = self.bed.checkpoints / FS
        if not os.path.ismount(fs):
            a.missed, a.detail = True, f"/checkpoints/{FS} is no filesystem of its own (Cluster(tmpfs=...)): not filled"
            return
        filler = fs / ".campaign-filler"
        free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
        with open(filler, "wb") as out:
            try:
                os.posix_fallocate(out.fileno(), 0, max(1, free))
            except OSError:
                pass  # full is what was wanted
        a.detail = f"{FS} full ({free >> 10} KiB filled) for {f.duration:.0f}s"
        self.later(f.duration, lambda: filler.unlink(missing_ok=True), a)

    def _ctld_restart(self, f: Fault, a: Applied, live, running) -> None:
        self.bed.restart("ctl")
        self.camp.pin_addresses()
        self.camp.wait_controller()
        a.detail = "slurmctld restarted"

    def _stray(self, f: Fault, a: Applied, live, running) -> None:
        made = []
        for s in live:
            if s.hroot is not None:
                p = s.hroot / "pub" / STRAYS[f.pick % len(STRAYS)]
                p.parent.mkdir(exist_ok=True)
                p.write_text("")
                made.append(p)
        a.missed = not made
        a.detail = f"{[str(p.name) for p in made]} in pub/ for {f.duration:.0f}s"
        def remove() -> None:
            for p in made:
                p.unlink(missing_ok=True)
        self.later(f.duration, remove, a)


# -- a run -----------------------------------------------------------------------------------------


@dataclass
class RunState:
    seed: int
    setup: Setup
    schedule: list[Fault]
    id: str
    sides: list[Side] = field(default_factory=list)
    t0: float = 0.0


class Campaign:
    def __init__(self, bed, params: Params, say: Callable[[str], None], keep: Optional[Path] = None,
                 suite: str = "trixie", readme: Optional[Path] = None):
        self.bed, self.params, self.say, self.keep, self.suite = bed, params, say, keep, suite
        self.hf = HOST_SITE in getattr(bed, "volumes", {}).values()
        self.job_script = readme_job_script(readme or Path(__file__).resolve().parents[2] / "README.md")
        ok = bed.exec("db", ["sinfo", "-h"], user=USER, check=False).returncode == 0
        self.login = "db" if ok else "ctl"  # a login node of its own, when Slurm's clients work there
        conf = bed.slurm.config()
        for key, attr in (("MinJobAge", "min_job_age"), ("SlurmdTimeout", "slurmd_timeout")):
            value = str(conf.get(key) or "").split()  # "180 sec"
            if value and value[0].isdigit():
                setattr(self.params, attr, float(value[0]))
        bed.path("campaign").mkdir(exist_ok=True)
        bed.path("campaign").chmod(0o1777)
        if hasattr(bed, "kill"):
            self.pin_addresses()

    def job(self, job: int):
        """The job as Slurm says (None when neither slurmctld nor sacct knows it, or slurmctld
        did not answer for a minute: restarting, or busy)."""
        deadline = time.time() + 60
        while True:
            try:
                return self.bed.slurm.job(job)
            except SlurmError:
                if time.time() > deadline:
                    return None
                time.sleep(1)

    def pin_addresses(self) -> None:
        """Every host's address in every container's /etc/hosts. Docker's DNS forgets a stopped
        container's name, which a real crashed node keeps; slurmctld (22.05) then blocks on a
        name it cannot resolve, and nothing answers until the node is back."""
        hosts = ["db", "ctl", *self.bed.node_names]
        addr = {}
        for h in hosts:
            c = self.bed._container(h)
            c.reload()
            ips = [n.get("IPAddress") for n in c.attrs["NetworkSettings"]["Networks"].values() if n.get("IPAddress")]
            if ips:
                addr[h] = ips[0]
        lines = "".join(f"{ip}\t{h}\t# pinned by the campaign\n" for h, ip in addr.items())
        for h in hosts:
            if h in addr:
                self.bed.exec(h, f"grep -v 'pinned by the campaign' /etc/hosts > /tmp/hosts.campaign; "
                                 f"printf '%s' {shlex.quote(lines)} >> /tmp/hosts.campaign; "
                                 "cat /tmp/hosts.campaign > /etc/hosts", check=False)

    def wait_controller(self) -> None:
        self.bed.wait_until(lambda: self.bed.exec("ctl", ["scontrol", "ping"], check=False).returncode == 0,
                            timeout=120, what="slurmctld to answer after its restart", poll=1)

    def run_one(self, seed: int, modes: tuple[str, ...], fixed: Optional[dict] = None) -> dict:
        setup = setup_for(seed, fixed, hf=self.hf)
        schedule = schedule_for(seed, self.params)
        run = RunState(seed, setup, schedule, f"run-{seed}-{int(time.time())}")
        run.sides = [Side(self, run, m) for m in modes]
        self.say(f"run {seed}: {setup.label()}, {len(schedule)} faults: "
                 + ", ".join(f"{f.kind}@{f.at:.0f}s" for f in schedule))
        for s in run.sides:
            s.prepare()
        for s in run.sides:
            s.start()
        nemesis = Nemesis(self, run)
        t_start = time.time()
        def stepping() -> bool:
            for s in run.sides:
                s.poll()
            return all(s.stepping() or s.outcome for s in run.sides)
        try:
            self.bed.wait_until(stepping, timeout=300, what=f"run {seed}: every mode's first step", poll=1)
        except ClusterError as e:
            self.say(str(e))
        run.t0 = time.time()
        nemesis.start()
        deadline = t_start + self.params.deadline_s
        while any(s.outcome is None for s in run.sides) and time.time() < deadline:
            for s in run.sides:
                try:
                    s.poll()
                except (ClusterError, SlurmError) as e:
                    self.say(f"run {seed} {s.mode}: polling: {e}")
            time.sleep(1)
        for s in run.sides:
            if s.outcome is None:
                s.stop(f"the campaign's deadline ({self.params.deadline_s:.0f}s) passed")
        nemesis.finish()
        self.settle(run)
        return self.judge(run, nemesis)

    def settle(self, run: RunState) -> None:
        """Every job of the run ended, its processes gone, every node back and idle or in use."""
        jobs = [j for s in run.sides for j in s.jobs]
        for j in jobs:
            info = self.job(j)
            if info is not None and not info.ended:
                self.bed.exec("ctl", ["scancel", str(j)], check=False)
        self.bed.exec("ctl", ["scancel", "-u", "bob"], check=False)
        try:
            self.bed.wait_until(lambda: all((self.job(j) is None or self.job(j).ended) for j in jobs), timeout=240,
                                what=f"run {run.seed}: its jobs to end", poll=2)
        except ClusterError as e:
            self.say(str(e))
        for s in run.sides:
            for n in self.bed.node_names:
                try:
                    left = self.bed.pids(n, s.marker)
                except ClusterError:
                    continue
                if left:
                    s.note("trainer processes outlived their jobs; killed", node=n, pids=left)
                    self.bed.exec(n, ["kill", "-9", *map(str, left)], check=False)
        for n in self.bed.node_names:  # a drained node is a finding and would starve the next run
            try:
                info = self.bed.node(n)
            except (SlurmError, ClusterError):
                continue
            if "DRAIN" in info.state:
                run.sides[0].note("node drained; resumed", node=n, reason=getattr(info, "reason", ""))
                self.bed.exec("ctl", ["scontrol", "update", f"nodename={n}", "state=resume"], check=False)
        try:
            self.bed.wait_nodes(lambda ns: all("IDLE" in n.state or "ALLOCATED" in n.state or "MIXED" in n.state
                                               for n in ns), timeout=300, what="every node back")
        except ClusterError as e:
            self.say(str(e))

    # judging

    def sacct(self, side: Side) -> str:
        path = side.hdir / "sacct.json"
        if side.jobs:
            res = self.bed.exec("ctl", ["sacct", "-D", "-X", "--json", "-j", ",".join(map(str, side.jobs))],
                                check=False)
            path.write_text(res.stdout if res.returncode == 0 else '{"jobs": []}')
        else:
            path.write_text('{"jobs": []}')
        return str(path)

    def checker_run(self, side: Side, applied: list[Applied]) -> checker.Run:
        s, p = side.run.setup, self.params
        faults = [{"kind": a.kind, "t0": a.t0, "t1": a.t1 or a.t0, "jobs": list(a.jobs.values()), "nodes": a.nodes}
                  for a in applied if not a.missed]
        return checker.Run(
            mode=side.mode, trainer="hf" if s.trainer == "hf" else "det",
            max_steps=p.hf_steps if s.trainer == "hf" else p.steps, save_every=p.save_every, step_time=p.step_time,
            ranks=s.ranks, seed=side.run.seed % 1000, trap=side.trap, trainer_log=str(side.bed.path(side.log)),
            sacct=self.sacct(side), root=str(side.hroot) if side.hroot else None, root_in_cluster=side.root,
            folder=str(side.bed.path(side.shared)) if side.shared else None, folder_in_cluster=side.shared,
            lead_s=p.lead_s if s.signal else 0.0, outcome=side.outcome or {}, faults=faults,
            reference=self.hf_reference(side.run.seed % 1000) if s.trainer == "hf" else None)

    def judge(self, run: RunState, nemesis: Nemesis) -> dict:
        result: dict[str, Any] = {"seed": run.seed, "id": run.id, "setup": asdict(run.setup), "label": run.setup.label(),
                                  "schedule": [asdict(f) for f in run.schedule],
                                  "faults": [asdict(a) for a in nemesis.applied], "nemesis_errors": nemesis.errors,
                                  "modes": {}}
        for side in run.sides:
            crun = self.checker_run(side, nemesis.applied)
            found = checker.check(crun)
            g = measured_goodput(crun, sum(1 for a in nemesis.applied if not a.missed), self.params)
            est = None
            if side.hroot is not None and (side.hroot / "pub").exists():
                est = report_estimate(str(side.hroot))
            replay = replay_command(self.suite, run.seed, side.mode, setup=self.fixed_text,
                                    steps=self.params.steps if self.params.steps != Params.steps else None,
                                    kinds=self.params.kinds)
            result["modes"][side.mode] = {
                "outcome": side.outcome, "jobs": side.jobs, "events": side.events,
                "anomalies": checker.as_dicts(found), "goodput": g, "report_estimate": est, "replay": replay,
                "check": asdict(crun),
                "faults_hit": sum(1 for a in nemesis.applied if not a.missed)}
            for cls in sorted({a.cls for a in found}):
                same = [a for a in found if a.cls == cls]
                more = f" (and {len(same) - 1} more)" if len(same) > 1 else ""
                self.say(f"ANOMALY seed={run.seed} mode={side.mode} class={cls}: {same[0].detail}{more}\n"
                         f"  replay: {replay}")
            if self.keep and (found or side.events):
                dst = self.keep / run.id / side.mode
                shutil.copytree(side.hdir, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("barrier"))
                if side.hroot and side.hroot.exists():
                    shutil.copytree(side.hroot, dst / "root", dirs_exist_ok=True)
                if side.shared:
                    hs = side.bed.path(side.shared)
                    if hs.exists():
                        shutil.copytree(hs, dst / "shared", dirs_exist_ok=True)
        if self.plot_dir is not None:
            try:
                plot_run(result, run, self.plot_dir / f"{run.id}.png")
                result["plot"] = str(self.plot_dir / f"{run.id}.png")
            except Exception as e:  # a picture must not lose the run's verdict
                self.say(f"run {run.seed}: plot failed: {e}")
        shutil.rmtree(self.bed.path(f"{FS}/{run.id}"), ignore_errors=True)
        return result

    plot_dir: Optional[Path] = None
    fixed_text = ""  # the --setup given, for the replay command
    _hf_refs: dict = {}

    def hf_reference(self, seed: int) -> Optional[str]:
        """The uninterrupted Hugging Face run's final digest for this seed: one job, once."""
        if seed in self._hf_refs:
            return self._hf_refs[seed]
        d = "/checkpoints/campaign/hf-reference"
        hd = self.bed.path(d)
        hd.mkdir(exist_ok=True)
        hd.chmod(0o1777)
        p = self.params
        trainer = f"{IMAGE_TESTBED}/hftrain.py"
        args = ["--naive", "--output-dir", f"{d}/out-{seed}", "--max-steps", str(p.hf_steps), "--save-every",
                str(p.save_every), "--step-time", "0", "--seed", str(seed), "--log", f"{d}/{seed}.jsonl"]
        (hd / f"train-{seed}.py").write_text(wrapper(trainer, args, HOST_SITE))
        job = self.bed.submit(USER, args=["-N1", "-n1", "-o", f"{d}/{seed}.out", "--wrap",
                                          f"python3 {d}/train-{seed}.py"])
        self.bed.wait_job(job, lambda j: j.ended, timeout=900, poll=2)
        done = [r for r in checker.read_log(str(hd / f"{seed}.jsonl")) if r["op"] == "done"]
        self._hf_refs[seed] = done[-1]["h"] if done else None
        if not done:
            self.say(f"the Hugging Face reference run for seed {seed} did not finish: "
                     f"{(hd / f'{seed}.out').read_text()[-1500:] if (hd / f'{seed}.out').exists() else ''}")
        return self._hf_refs[seed]


def rejudge(results: list[dict], keep: Path) -> list[dict]:
    """Check a finished campaign again from the files ``--keep`` copied (a checker changed
    since): each mode's anomalies replaced by what the checker says of its kept files now."""
    for r in results:
        for mode, m in r["modes"].items():
            d = keep / r.get("id", "") / mode
            if "check" not in m or not d.is_dir():
                continue
            c = checker.Run.from_json(m["check"])
            c.trainer_log, c.sacct = str(d / "train.jsonl"), str(d / "sacct.json")
            c.root = str(d / "root") if c.root else None
            c.folder = str(d / "shared") if c.folder else None
            m["anomalies"] = checker.as_dicts(checker.check(c))
    return results


# -- goodput, measured ---------------------------------------------------------------------------


def lineage(execs: list[checker.Execution], rel: Callable[[Optional[str]], Optional[str]]) -> set[tuple[str, int]]:
    """(attempt, step) of every step the final state contains: from the last ``done`` back
    through each resume to the execution whose save it loaded."""
    out: set[tuple[str, int]] = set()
    done = [(r, e) for e in execs for r in e.ops("done")]
    if not done:
        return out
    r, ex = max(done, key=lambda re: re[0]["t"])
    upto, until = r["step"], r["t"]
    seen = set()
    while ex is not None and ex.attempt not in seen:
        seen.add(ex.attempt)
        res = next(iter(ex.ops("resume")), None)
        low = res["step"] if res else 0
        out |= {(ex.attempt, s["step"]) for s in ex.ops("step") if low < s["step"] <= upto and s["t"] <= until}
        if res is None:
            break
        path = rel(res["path"])
        writes = [(w["t"], w, e) for e in execs for w in e.ops("save") if rel(w["path"]) == path and w["t"] <= res["t"]]
        if not writes:
            break
        _, w, ex = max(writes, key=lambda x: x[0])
        upto, until = w["step"], w["t"]
    return out


def measured_goodput(run: checker.Run, faults: int, p: Params) -> dict:
    """The run's wall time in goodput's buckets, from the trainer's log and Slurm's
    accounting, and Young/Daly's prediction for its fault rate, save and restart times."""
    c = checker.Checker(run)
    execs = c.execs
    if not execs:
        return {"goodput": None}
    keep = lineage(execs, c.rel)
    intervals: list[tuple[float, float, str]] = []
    saves, restarts = [], []
    prev_last: Optional[float] = None
    for ex in execs:
        recs = [r for r in ex.records if r.get("rank", 0) == 0]
        start = min(ex.start["t"], ex.first_t)  # a Hugging Face trainer's launch, before its imports
        steps = [r for r in recs if r["op"] == "step"]
        first = steps[0]["t"] - run.step_time if steps else ex.last_t
        intervals.append((start, first, "restore"))
        if prev_last is not None and steps:
            restarts.append(max(0.0, first - prev_last))
        t = first
        begin = None
        for r in recs:
            if r["op"] == "step":
                intervals.append((max(t, r["t"] - 1.5 * run.step_time), r["t"],
                                  "productive" if (ex.attempt, r["step"]) in keep else "recomputed"))
            elif r["op"] == "save_begin":
                begin = r["t"]
            elif r["op"] in ("save", "save_failed") and begin is not None:
                intervals.append((begin, r["t"], "save"))
                saves.append(r["t"] - begin)
                begin = None
            if r["op"] in ("step", "save", "save_failed"):
                t = r["t"]
        if steps:
            prev_last = steps[-1]["t"]
    sacct_raw = json.loads(Path(run.sacct).read_text()) if run.sacct else {"jobs": []}
    wall0 = min(e.first_t for e in execs)
    for j in sacct_raw.get("jobs", []):
        tm = j.get("time") or {}
        sub, elig, st = (checker._num(tm.get(k)) for k in ("submission", "eligible", "start"))
        a = elig or sub
        if a and st and st > a:
            intervals.append((a, st, "queue"))
        if sub:
            wall0 = min(wall0, sub)
    done = [r["t"] for r in c.log if r["op"] == "done"]
    wall1 = max(done) if done else max(e.last_t for e in execs)
    out = goodput.summary(goodput.split(wall0, wall1, intervals))
    tau = p.save_every * p.step_time
    delta = statistics.mean(saves) if saves else 0.0
    r_mean = statistics.mean(restarts) if restarts else 0.0
    out["prediction"] = goodput.young_daly(tau, delta, r_mean, out["wall_s"] / faults if faults else math.inf) \
        if faults else None
    out["faults"] = faults
    out["finished"] = bool(done)
    return out


def report_estimate(root: str) -> Optional[dict]:
    """What `dispatch-slurm report` says of the run's goodput, from the root alone."""
    from dispatch_slurm import report
    try:
        return report.build(root).get("goodput")
    except Exception as e:  # the report's failure is a finding, not the campaign's end
        return {"error": str(e)[-500:]}


# -- the table and the picture --------------------------------------------------------------------


def summarize(results: list[dict]) -> str:
    lines = []
    kinds: dict[str, int] = {}
    classes: dict[str, dict[str, int]] = {}
    gp: dict[str, list[dict]] = {}
    for r in results:
        for a in r["faults"]:
            if not a["missed"]:
                kinds[a["kind"]] = kinds.get(a["kind"], 0) + 1
        for mode, m in r["modes"].items():
            for a in m["anomalies"]:
                classes.setdefault(mode, {}).setdefault(a["cls"], 0)
                classes[mode][a["cls"]] += 1
            if m["goodput"].get("goodput") is not None:
                gp.setdefault(mode, []).append(m["goodput"])
    head = f"{'seed':>6} {'setup':<36} {'faults':>6}  " + "  ".join(f"{m:<34}" for m in ("dispatch", "naive"))
    lines += [head, "-" * len(head)]
    for r in results:
        cells = []
        for mode in ("dispatch", "naive"):
            m = r["modes"].get(mode)
            if m is None:
                cells.append(f"{'-':<34}")
                continue
            g = m["goodput"].get("goodput")
            an = ",".join(sorted({a["cls"] for a in m["anomalies"]})) or "ok"
            cells.append(f"{(m['outcome'] or {}).get('state', '?'):<8} {'' if g is None else f'{100 * g:4.0f}%':>5} "
                         f"{an[:19]:<19}")
        n = sum(1 for a in r["faults"] if not a["missed"])
        lines.append(f"{r['seed']:>6} {r['label'][:36]:<36} {n:>6}  " + "  ".join(cells))
    lines += ["", "faults applied: " + (", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none")
              + f" ({sum(kinds.values())} in all)"]
    for mode in ("dispatch", "naive"):
        if mode in {m for r in results for m in r["modes"]}:
            cl = classes.get(mode, {})
            lines.append(f"anomalies, {mode}: " + (", ".join(f"{k} {v}" for k, v in sorted(cl.items())) or "none"))
    for mode, gs in sorted(gp.items()):
        wall = sum(g["wall_s"] for g in gs)
        b = {k: sum(g["buckets"][k] for g in gs) for k in goodput.BUCKETS}
        preds = [g["prediction"] for g in gs if g.get("prediction")]
        dalys = [x["daly"] for x in preds if x["daly"] is not None]
        youngs = [x["young"] for x in preds if x["young"] is not None]
        daly = statistics.mean(dalys) if dalys else None
        young = statistics.mean(youngs) if youngs else None
        lines.append(f"goodput, {mode}: {100 * b['productive'] / wall:.1f}% of {wall:.0f}s; "
                     + ", ".join(f"{k} {100 * v / wall:.1f}%" for k, v in b.items() if k != "productive")
                     + (f"; Young {100 * young:.1f}%, Daly {100 * daly:.1f}% predicted"
                        if daly is not None and young is not None else ""))
    return "\n".join(lines)


def _totals(results: list[dict], mode: str) -> dict:
    """One mode's sums over a campaign: runs, ends, anomalies by class, goodput's buckets."""
    ms = [r["modes"][mode] for r in results if mode in r["modes"]]
    gs = [m["goodput"] for m in ms if m["goodput"].get("goodput") is not None]
    wall = sum(g["wall_s"] for g in gs) or 1.0
    preds = [g["prediction"] for g in gs if g.get("prediction")]
    classes: dict[str, list[int]] = {}
    for r in results:
        for a in r["modes"].get(mode, {}).get("anomalies", []):
            seeds = classes.setdefault(a["cls"], [])
            if r["seed"] not in seeds:
                seeds.append(r["seed"])
    ends: dict[str, int] = {}
    for m in ms:
        state = (m["outcome"] or {}).get("state", "?")
        ends[state] = ends.get(state, 0) + 1
    events: dict[str, int] = {}
    for m in ms:
        for e in m["events"]:
            if e["what"] not in ("ended", "submitted") and not e["what"].startswith("job ended before"):
                events[e["what"]] = events.get(e["what"], 0) + 1
    return {"runs": len(ms), "ends": ends, "classes": classes, "wall": wall,
            "buckets": {k: sum(g["buckets"][k] for g in gs) / wall for k in goodput.BUCKETS},
            "young": statistics.mean(x["young"] for x in preds) if preds else None,
            "daly": statistics.mean(x["daly"] for x in preds) if preds else None, "events": events}


def seed_ranges(seeds: list[int]) -> str:
    """``1000-1030, 1100-1131``: sorted seeds as runs of consecutive numbers (campaigns
    merged by ``--from-json`` each start at their own seed)."""
    out: list[list[int]] = []
    for s in sorted(seeds):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in out)


def evidence(results: list[dict]) -> str:
    """The campaign as docs/evidence.md's table (markdown): faults by kind, ends and anomalies
    by class per mode (with the seeds that showed each), goodput and its buckets beside
    Young/Daly's prediction."""
    kinds: dict[str, int] = {}
    for r in results:
        for a in r["faults"]:
            if not a["missed"]:
                kinds[a["kind"]] = kinds.get(a["kind"], 0) + 1
    seeds = sorted(r["seed"] for r in results)
    modes = [m for m in ("dispatch", "naive") if any(m in r["modes"] for r in results)]
    t = {m: _totals(results, m) for m in modes}
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    rows = [("runs (seeds)", {m: f"{t[m]['runs']} ({seed_ranges(seeds)})" if seeds else "0" for m in modes}),
            ("setups", {m: str(len({r["label"] for r in results})) for m in modes}),
            ("faults applied", {m: f"{sum(kinds.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
                                for m in modes}),
            ("how runs ended", {m: ", ".join(f"{k} {v}" for k, v in sorted(t[m]["ends"].items())) for m in modes}),
            ("anomalies by class (seeds)", {m: "; ".join(f"{k}: {len(v)} runs ({', '.join(map(str, v[:8]))}"
                                                         f"{', ...' if len(v) > 8 else ''})"
                                                         for k, v in sorted(t[m]["classes"].items())) or "none"
                                            for m in modes}),
            ("goodput (productive steps / wall)", {m: f"**{pct(t[m]['buckets']['productive'])}** of "
                                                      f"{t[m]['wall'] / 60:.0f} min" for m in modes}),
            ("badput: save / recomputed / restore / queue / restart",
             {m: " / ".join(pct(t[m]["buckets"][k]) for k in goodput.BUCKETS[1:]) for m in modes}),
            ("Young / Daly predicted (per run, mean)", {m: f"{pct(t[m]['young'])} / {pct(t[m]['daly'])}" for m in modes}),
            ("other events", {m: "; ".join(f"{k} {v}" for k, v in sorted(t[m]["events"].items())) or "none"
                              for m in modes})]
    out = ["| | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    out += [f"| {name} | " + " | ".join(v[m].replace("|", "/") for m in modes) + " |" for name, v in rows]
    return "\n".join(out)


def plot_run(result: dict, run: RunState, path: Path) -> None:
    """Per mode (naive above dispatch): each execution a bar on its node's row, its steps
    in the final state solid and its recomputed steps hatched, saves as ticks (dispatch: the
    publications), each resume an arrow from the save it loaded, faults as shaded spans."""
    from dispatch_slurm.report.timeline import _pyplot
    plt = _pyplot()
    sides = sorted(run.sides, key=lambda s: s.mode != "naive")
    fig, axes = plt.subplots(len(sides), 1, figsize=(13, 2.2 + 1.6 * len(sides)), sharex=True, squeeze=False)
    t0 = run.t0 or min(s.started_at for s in sides)
    nodes = list(run.sides[0].bed.node_names)
    colors = plt.get_cmap("tab10")
    for ax, side in zip(axes[:, 0], sides):
        c = checker.Checker(_quick_run(side))
        keep = lineage(c.execs, c.rel)
        saves_at: dict[str, tuple[float, int]] = {}
        for i, ex in enumerate(c.execs):
            host = next((r.get("host") for r in ex.records if r.get("host")), None)
            row = nodes.index(host) if host in nodes else len(nodes)
            steps = ex.ops("step")
            col = colors(i % 10)
            ax.barh(row, ex.last_t - ex.first_t, left=ex.first_t - t0, height=0.5, color=col, alpha=0.25)
            for s in steps:
                if (ex.attempt, s["step"]) not in keep:
                    ax.barh(row, c.run.step_time, left=s["t"] - t0 - c.run.step_time, height=0.5, color="none",
                            hatch="////", edgecolor="red", linewidth=0)
            for w in ex.ops("save"):
                saves_at[c.rel(w["path"]) or ""] = (w["t"], row)
                if side.mode == "naive":
                    ax.plot(w["t"] - t0, row + 0.3, "|", color="black", markersize=7)
            for res in ex.ops("resume"):
                src = saves_at.get(c.rel(res["path"]) or "")
                if src:
                    ax.annotate("", xy=(res["t"] - t0, row), xytext=(src[0] - t0, src[1]),
                                arrowprops={"arrowstyle": "->", "color": col, "lw": 1})
        for p in c.pubs:
            owner = next((e for e in c.execs if p.path.startswith(f"exec/{e.attempt}/")), None)
            host = next((r.get("host") for r in owner.records if r.get("host")), None) if owner else None
            row = nodes.index(host) if host in nodes else len(nodes)
            ax.plot(p.made - t0, row + 0.3, "|", color="black", markersize=7)
        for a in result["faults"]:
            if a["missed"]:
                continue
            x0, x1 = a["t0"] - t0, (a["t1"] or a["t0"]) - t0
            ax.axvspan(x0, max(x1, x0 + 0.5), color="orange", alpha=0.15)
            ax.annotate(a["kind"], (x0, len(nodes) + 0.1), fontsize=7, rotation=30, color="darkorange")
        m = result["modes"].get(side.mode, {})
        g = (m.get("goodput") or {}).get("goodput")
        an = ", ".join(sorted({x["cls"] for x in m.get("anomalies", [])})) or "no anomaly"
        ax.set_title(f"{side.mode}: goodput {'-' if g is None else f'{100 * g:.0f}%'}; "
                     f"{(m.get('outcome') or {}).get('state', '?')}; {an}", fontsize=9)
        ax.set_yticks(range(len(nodes) + 1), nodes + ["?"], fontsize=8)
        ax.set_ylim(-0.7, len(nodes) + 0.7)
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("seconds after training began (bars: executions on their node; hatched: recomputed "
                           "steps; |: saves/publications; arrows: resumes from the save loaded; shaded: faults)")
    fig.suptitle(f"seed {run.seed}: {run.setup.label()}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


def _quick_run(side: Side) -> checker.Run:
    """The checker's view of a side without asking Slurm again (for the picture)."""
    s, p = side.run.setup, side.camp.params
    return checker.Run(mode=side.mode, trainer="hf" if s.trainer == "hf" else "det",
                       max_steps=p.hf_steps if s.trainer == "hf" else p.steps, save_every=p.save_every,
                       step_time=p.step_time, ranks=s.ranks, seed=side.run.seed % 1000, trap=side.trap,
                       trainer_log=str(side.bed.path(side.log)), root=str(side.hroot) if side.hroot else None,
                       root_in_cluster=side.root, folder_in_cluster=side.shared,
                       folder=str(side.bed.path(side.shared)) if side.shared else None)


def run(*, suite: str, profile: str, setup_text: str = "", seed: int, runs: Optional[int], faults: Optional[int], duration: Optional[float],
        modes: tuple[str, ...], fixed: dict, params: Params, say: Callable[[str], None],
        plot_dir: Optional[Path] = None, keep: Optional[Path] = None, tracking: Optional[str] = None,
        results: Optional[list] = None, each: Callable[[], None] = lambda: None) -> list[dict]:
    """Start a docker-slurm cluster and run seeds ``seed, seed+1, ...`` until ``runs`` runs,
    ``faults`` faults applied, or ``duration`` seconds, whichever comes first; each run's
    result is appended to ``results`` and ``each`` called (results survive an interrupt)."""
    from support import host_torch

    from .cluster import Cluster
    cluster = Cluster(suite, profile, log=say, tracking=tracking, volumes=host_torch(suite), tmpfs={FS: FS_MIB})
    cluster.start()
    results = [] if results is None else results
    try:
        camp = Campaign(cluster, params, say, keep=keep, suite=suite)
        camp.plot_dir = plot_dir
        camp.fixed_text = setup_text
        t_end = time.time() + duration if duration else None
        applied, i = 0, 0
        while True:
            if runs is not None and i >= runs:
                break
            if runs is None and faults is not None and applied >= faults:
                break
            if t_end is not None and time.time() >= t_end:
                break
            r = camp.run_one(seed + i, modes, fixed)
            results.append(r)
            each()
            applied += sum(1 for a in r["faults"] if not a["missed"])
            i += 1
    finally:
        cluster.stop()
    return results
