"""A local rehearsal of the end of a job: run a command, signal it the way Slurm will.

Why locally. The doctor's question -- does the signal reach every rank, and does the save
fit? -- depends on the launch stack (a shell, torchrun, accelerate launch, the trainer's
own loop), which runs the same on a laptop as in a step. What Slurm does is few rules (measured on docker-slurm, 22.05 and 26.05):
  * a step's signal (``--signal=SIG@T``, preemption's SIGTERM, the limit's SIGTERM) goes
    to each task's own process -- the launcher -- and not to its children under cgroup
    process tracking (26.05), but to every process of the step under linuxproc (22.05,
    26.05). The rehearsal does the first by default (a launcher must pass the signal on)
    and the second with ``every_process`` (every descendant of the command, found through
    /proc: torchrun starts its workers in sessions of their own, a process group would
    miss them);
  * ``B:`` goes to the batch shell's own process only: here, the command's;
  * T seconds later (the time limit) or GraceTime later (preemption): SIGTERM again,
    KillWait later SIGKILL to everything;
  * a step ends when its first process ends: the others are killed with it.
The doctor is made a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so processes
orphaned by a dying launcher stay its descendants and are killed as Slurm would.
"""

import ctypes
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

from ..errors import DispatchError
from ..runtime import probe
from ..runtime.launch import descendants
from .rules import Row, Signal, SlurmConf, rows

POLL_S = 0.05


@dataclass
class Run:
    sent_at: float | None = None        # Unix time the signal was sent
    end_at: float | None = None         # Unix time of the window's end (the kill)
    exit_code: int | None = None        # the command's status (-N: signal N)
    ready: int = 0                      # handlers installed when the signal was sent
    log: list = field(default_factory=list)  # (seconds after the signal, what happened)


def _subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


class Rehearsal:
    """One rehearsal (see the module doc). ``probe_dir``: where the ranks' handlers
    record (set as $DISPATCH_PROBE_DIR for the command)."""

    def __init__(self, argv, probe_dir: str, env=None, every_process: bool = False):
        self.argv, self.probe_dir, self.every_process = list(argv), probe_dir, every_process
        self.env = {**(os.environ if env is None else env), "DISPATCH_PROBE_DIR": probe_dir}
        self.run = Run()
        self.proc: Optional[subprocess.Popen] = None

    def _note(self, what: str) -> None:
        at = 0.0 if self.run.sent_at is None else time.time() - self.run.sent_at
        self.run.log.append((round(at, 2), what))

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.proc and pid == self.proc.pid and self.run.exit_code is None:
                self.run.exit_code = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.run.exit_code
                self._note(f"the command exited {self.run.exit_code}")

    def _alive(self) -> list[int]:
        return descendants(os.getpid())

    def _send(self, sig: int, to_all: bool) -> None:
        first = [self.proc.pid] if self.proc is not None and self.run.exit_code is None else []
        pids = self._alive() if to_all else first
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        self._note(f"SIG{signal.Signals(sig).name[3:]} to {'every process' if to_all else 'its first process'} "
                   f"({len(pids)})")

    def start(self) -> None:
        _subreaper()
        self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True,
                                     stdout=2)  # the command's output on stderr: the report owns stdout

    def wait_ready(self, ranks: int, timeout: float) -> int:
        """Poll the probe records until ``ranks`` handlers are installed, the command
        exits, or ``timeout``; the number installed."""
        deadline = time.monotonic() + timeout
        while True:
            n = sum(1 for p in probe.read(self.probe_dir).values() if "installed" in p)
            self._reap()
            if n >= ranks or self.run.exit_code is not None or time.monotonic() > deadline:
                return n
            time.sleep(POLL_S)

    def _until(self, t: float) -> bool:
        """Wait until Unix time ``t``, the step ending (its first process gone: the rest
        killed) as Slurm does; False once nothing is left."""
        while time.time() < t:
            self._reap()
            if self.run.exit_code is not None:
                rest = self._alive()
                if rest:
                    self._send(signal.SIGKILL, True)
                    self._note("the step's first process ended: the rest killed")
                self._reap()
                if not self._alive():
                    return False
            time.sleep(POLL_S)
        return True

    def rehearse(self, sig: Signal, conf: SlurmConf, ranks: int, ready_timeout: float,
                 preempt: bool = False) -> Run:
        """Start, wait for the handlers, send the end of the job, collect (see module doc)."""
        self.start()
        try:
            self.run.ready = self.wait_ready(ranks, ready_timeout)
            if self.run.exit_code is None:
                self._finale(sig, conf, preempt)
        finally:
            for pid in self._alive():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while self._alive() and time.monotonic() < deadline:
                self._reap()
                time.sleep(POLL_S)
            self._reap()
        return self.run

    def _finale(self, sig: Signal, conf: SlurmConf, preempt: bool) -> None:
        self.run.sent_at = time.time()
        if preempt:
            name = sig.name if conf.send_user_signal else "TERM"
            self._send(getattr(signal, "SIG" + name), self.every_process and not (sig.batch and conf.send_user_signal))
            first = conf.grace_time
        else:
            self._send(getattr(signal, "SIG" + sig.name), self.every_process and not sig.batch)
            first = sig.seconds
        self.run.end_at = self.run.sent_at + first + conf.kill_wait
        if self._until(self.run.sent_at + first):
            self._note(f"{'GraceTime over' if preempt else 'the limit'}: SIGTERM (KillWait follows)")
            self._send(signal.SIGCONT, self.every_process)
            self._send(signal.SIGTERM, self.every_process)
            if self._until(self.run.end_at):
                self._send(signal.SIGKILL, True)
        self._until(time.time() + 5)


def local(argv: list[str], sig: Signal, conf: SlurmConf, ranks: int, ready_timeout: float, preempt: bool,
          probe_dir: Optional[str], every_process: bool) -> tuple[Run, list[Row]]:
    """The local rehearsal of ``argv`` and what its ranks' handlers recorded (in ``probe_dir``,
    else a new temporary folder)."""
    where = probe_dir or tempfile.mkdtemp(prefix="dispatch-doctor-")
    os.makedirs(where, exist_ok=True)
    r = Rehearsal(argv, where, every_process=every_process)
    try:
        run = r.rehearse(sig, conf, ranks, ready_timeout, preempt)
    except FileNotFoundError as e:
        raise DispatchError(f"cannot run {argv[0]!r}: {e.strerror}") from None
    return run, rows(probe.read(where), run.sent_at or time.time(), run.end_at or time.time())
