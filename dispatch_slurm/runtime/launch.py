"""`dispatch-slurm launch -- torchrun ...`: a launcher that neither kills nor hides the save.

What goes wrong without it (torch 2.13's elastic agent, accelerate 1.x, read in their
source): torchrun handles SIGTERM/INT/HUP/QUIT by signalling its workers, SIGKILLing them
30 s later whatever the grace (``--shutdown-timeout``), and exiting 1 with a
SignalException traceback even when every rank saved; any other signal (SIGUSR1/2) ends
torchrun at once by its default action, and the step with it. ``accelerate launch`` with
one process handles none: SIGTERM ends it at once, the step and its rank with it.

What this does, for the save signals (default SIGTERM plus the job's, $DISPATCH_SIGNAL):
  * the launcher starts with them ignored (an ignored disposition survives exec, a
    handler does not) and with torchrun's ``--signals-to-handle`` (PET_/TORCHELASTIC_SIGNALS_TO_HANDLE) left without them, so
    torchrun neither forwards-then-kills nor dies; its workers inherit "ignored" and
    the preemption handler they install replaces it;
  * this process catches them and passes each on to every process below it: under
    cgroup process tracking Slurm signals only the task's own process, this one
    (measured on 26.05), and a batch shell's trap or a local ``kill`` does the same;
    under linuxproc every process gets it from Slurm as well, and a rank's second
    signal is ignored by its handler: no double save;
  * it exits with the launcher's status, except that a non-zero status after a signal is
    turned into 0 when every rank under it recorded a successful save and exit 0 (probe
    records), so the job script's ``exit $?`` reads a saved preemption as success.
Other signals reach the launcher unchanged. Linux only (/proc).
"""

import os
from collections.abc import Mapping
import signal
import subprocess
import sys

from ..contract.env import Execution
from . import probe

TORCH_DEFAULT = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def descendants(root_pid: int) -> list[int]:
    """Every live descendant of ``root_pid`` (through /proc's parent links), root_pid excluded."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root_pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def save_signals(environ: Mapping[str, str]) -> list[signal.Signals]:
    """SIGTERM and $DISPATCH_SIGNAL of ``environ`` (USR2, SIGUSR1, 12; comma-separated)."""
    out = [signal.SIGTERM]
    for part in filter(None, (p.strip() for p in (Execution.current(environ).save_signals or "").split(","))):
        s = signal.Signals(int(part)) if part.isdigit() else getattr(signal, part if part.startswith("SIG")
                                                                       else "SIG" + part)
        if s not in out:
            out.append(s)
    return out


def child_env(environ, sigs) -> dict:
    """The launcher's environment: torchrun told not to handle the save signals."""
    names = {s.name for s in sigs}
    given = environ.get("PET_SIGNALS_TO_HANDLE") or environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE") or ",".join(TORCH_DEFAULT)
    keep = [n for n in (p.strip() for p in given.split(",")) if n and n not in names]
    value = ",".join(keep) or "SIGINT"
    # torchrun reads its --signals-to-handle from PET_SIGNALS_TO_HANDLE and then overwrites
    # TORCHELASTIC_SIGNALS_TO_HANDLE (the multiprocessing layer's) with it: set both
    return {**environ, "TORCHELASTIC_SIGNALS_TO_HANDLE": value, "PET_SIGNALS_TO_HANDLE": value}


def launch(argv, environ=None) -> int:
    """Run ``argv`` as described in the module doc; its exit status (see there)."""
    environ = dict(os.environ if environ is None else environ)
    sigs = save_signals(environ)
    seen: set[int] = set()
    signalled = []

    def ignore():
        for s in sigs:
            signal.signal(s, signal.SIG_IGN)

    def forward(signum, frame):
        signalled.append(signum)
        for pid in descendants(os.getpid()):
            seen.add(pid)
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for s in sigs:
        signal.signal(s, forward)
    env = child_env(environ, sigs)
    env["DISPATCH_LAUNCHER"] = os.path.basename(argv[0])
    proc = subprocess.Popen(argv, env=env, preexec_fn=ignore)
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            continue
    if code != 0 and signalled and _every_rank_saved(environ, seen):
        sys.stderr.write(f"dispatch-slurm launch: {argv[0]} exited {code} after the signal, every rank saved "
                         "and exited 0: exiting 0\n")
        return 0
    return code if code >= 0 else 128 - code


def _every_rank_saved(environ, pids: set[int]) -> bool:
    where = probe.directory(environ)
    if not where or not pids:
        return False
    import socket
    host = socket.gethostname()
    mine = [p for (h, pid), p in probe.read(where).items() if h == host and pid in pids and "installed" in p]
    return bool(mine) and all(p.get("exit", {}).get("code") == 0 and p.get("saved", {}).get("ok") for p in mine)
