"""The nemesis: applies a run's schedule to whatever runs at each fault's time, and undoes
each fault after its duration."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from dispatch_slurm.slurm.client import SlurmError

from ..bed import ClusterError
from .schedule import STRAYS, Fault

if TYPE_CHECKING:
    from .runs import Campaign, RunState


FS = "fs"  # the tmpfs under /checkpoints that holds every root and shared folder (the ENOSPC fault fills it)


FS_MIB = 64


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
