"""The view on this machine: what the SPANK plugin does for each task, done by hand (root, a
real mount namespace, a real filesystem, a real job user), around the unmodified trainers of
``unmodified/``, beside the same trainers in one shared folder.

Per execution, as the plugin does on a node: ``dispatch-slurm env --local`` (a new execution
of the root: its epoch claimed, its folder made), then, as the job user, ``dispatch-slurm view
prepare`` and, detached, ``dispatch-slurm view publish``; then the trainer in a private mount
namespace (``unshare --mount --propagation slave``) in which ``mount --bind exec/<attempt>
VIEW`` made the view folder the execution's own, dropped to the job user (``setpriv``). The
naive side runs the same trainer, as the same user, on one shared folder.

The schedule (``overlap``), the same on both sides, deterministic (each step's end is in the
trainer's own record, and a process is stopped between two steps): A saves 2 and 4, then
"Slurm says it ended" and it is stopped (SIGSTOP: alive, as a stalled or cut-off node's
trainer is); B, its replacement, resumes and saves 6 and 8, then is killed; A runs on and saves
6, 8 and 10 late, then is killed; C resumes and trains to the end. With the view C resumes from
B's 8 (B's epoch is greater), A's late saves stay published at A's own epoch, B's saves are
intact in B's folder, and C's final weights are the uninterrupted run's, bit for bit; in the
shared folder C resumes from A's late 10, and A's rotation has taken B's saves."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Optional

from . import wait
from .unmodified.common import read

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
USER = (65534, 65534)  # nobody: the job user


@dataclass(frozen=True)
class Trainer:
    script: str
    nproc: int = 1
    step_time: float = 0.3
    max_steps: int = 12
    save_every: int = 2
    torchrun: bool = False  # launched by torchrun --standalone (a free port: executions side by side never collide)

    def argv(self, out: str, record: str) -> list[str]:
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.nproc)] \
            if self.torchrun else []
        return [sys.executable, *launcher, str(HERE / "unmodified" / self.script), "--out", out, "--record", record,
                "--max-steps", str(self.max_steps), "--save-every", str(self.save_every),
                "--step-time", str(self.step_time)]


TRAINERS = {
    "plain": Trainer("plain.py"),
    "huggingface": Trainer("hf.py"),
    "lightning": Trainer("lightning_train.py"),
    "torchtitan": Trainer("titan.py"),
    "deepspeed": Trainer("ds.py", torchrun=True),
    "deepspeed-2": Trainer("ds.py", nproc=2, step_time=0.5, torchrun=True),
}


def _python_visible() -> str:
    """Shell lines (as root, inside the namespace) that let the job user run this Python: an
    interpreter under a folder only root may enter (pyenv in /root) is bound back under a
    tmpfs that hides the rest of that folder. Nothing outside the namespace changes."""
    base = os.path.realpath(sys.base_prefix)
    top = "/" + base.split("/")[1] if base.count("/") > 1 else ""
    if not top or os.stat(top).st_mode & 0o001:
        return ""
    return (f"hold=$(mktemp -d) && mount --bind {shlex.quote(base)} $hold && "
            f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(top)} && mkdir -p {shlex.quote(base)} && "
            f"mount --bind $hold {shlex.quote(base)} && ")


@dataclass
class Execution:
    name: str
    values: dict
    trainer: Optional[subprocess.Popen] = None
    publisher: Optional[subprocess.Popen] = None
    record: str = ""
    said: list[str] = field(default_factory=list)
    ranks: int = 1
    tag: str = ""  # TAG's value in its trainer's environment: the bed's folder and the name

    def tagged(self) -> dict[str, str]:
        """TAG for this execution's trainer: unique across beds (test workers side by side)."""
        return {TAG: self.tag}

    @property
    def attempt(self) -> str:
        return self.values["DISPATCH_ATTEMPT"]

    @property
    def exec_dir(self) -> str:
        return self.values["DISPATCH_EXEC_DIR"]

    @property
    def epoch(self) -> int:
        return int(self.values["DISPATCH_EPOCH"])



def _build_deepspeed_op() -> None:
    """DeepSpeed's shared-memory op, JIT-built as root into its cache (torch's own lock on the
    build folder lets workers build at once), where DeepSpeed is installed; else nothing."""
    import importlib.util
    if importlib.util.find_spec("deepspeed") is None:
        return
    code = ("from deepspeed.accelerator import get_accelerator\n"
            "b = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
            "b is None or b.load(verbose=False)\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=600)

class Bed:
    """A root, its view folder and the shared folder, in a folder the job user can reach."""

    def __init__(self, base: Optional[str] = None):
        self.base = pathlib.Path(base or tempfile.mkdtemp(prefix="dispatch-view-"))
        self.base.mkdir(exist_ok=True)
        os.chmod(self.base, 0o755)
        self.root, self.shared, self.logs = self.base / "root", self.base / "shared", self.base / "logs"
        self.home = self.base / "home"
        for d in (self.root, self.shared, self.logs, self.home):
            d.mkdir(exist_ok=True)
            os.chown(d, *USER)
        self.view = self.root / "out"  # the folder the trainer uses; in each task, the execution's own
        self.view.mkdir(exist_ok=True)
        os.chown(self.view, *USER)
        self.prelude = _python_visible()
        self.env = self._env()
        self.started: list[subprocess.Popen] = []
        self.names: list[str] = []  # the executions' tags (Execution.tag)

    def _env(self) -> dict:
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("DISPATCH_", "SLURM_", "RANK", "WORLD_", "MASTER_", "LOCAL_RANK", "PYTHON"))}
        ext = self.base / "torch_extensions"  # DeepSpeed's CPU op, built once by root: a copy the user may lock
        cache = pathlib.Path(os.environ.get("TORCH_EXTENSIONS_DIR", pathlib.Path.home() / ".cache/torch_extensions"))
        if not cache.is_dir():
            _build_deepspeed_op()  # a fresh machine: no test built it yet (the order is xdist's)
        if cache.is_dir() and not ext.exists():
            shutil.copytree(cache, ext, symlinks=True)
            for d, _, files in os.walk(ext):
                os.chown(d, *USER)
                for f in files:
                    os.chown(os.path.join(d, f), *USER, follow_symlinks=False)
        return {**keep, "HOME": str(self.home), "HF_HOME": str(self.home / "hf"), "TMPDIR": str(self.home),
                "TORCH_EXTENSIONS_DIR": str(ext), "PYTHONPATH": str(REPO), "DISPATCH_CHECKPOINT": str(self.root),
                "PYTHONDONTWRITEBYTECODE": "1"}

    def as_user(self, argv: list[str], env: dict, bind: Optional[str] = None, **popen) -> subprocess.Popen:
        """``argv`` as the job user, in a mount namespace of its own; ``bind``: the execution
        folder bound over the view folder there first (what the plugin does for a task)."""
        mount = f"mount --bind {shlex.quote(bind)} {shlex.quote(str(self.view))} && " if bind else ""
        drop = ["setpriv", f"--reuid={USER[0]}", f"--regid={USER[1]}", "--clear-groups", "--"]
        script = f"set -e; {self.prelude}{mount}exec {shlex.join(drop + argv)}"
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "slave", "sh", "-c", script], env=env,
                                start_new_session=True, **popen)
        self.started.append(proc)
        return proc

    def as_root(self, argv: list[str], env: dict, **popen) -> subprocess.Popen:
        """``argv`` as root in a mount namespace where the job user may run this Python too (a
        hook that drops to the job user and starts the CLI)."""
        script = f"set -e; {self.prelude}exec {shlex.join(argv)}"
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "slave", "sh", "-c", script], env=env,
                                start_new_session=True, **popen)
        self.started.append(proc)
        return proc

    def close(self) -> None:
        """End whatever of the bed's processes still runs (a schedule that failed midway)."""
        for tag in self.names:
            for pid in _tagged(tag):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.started:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(30)

    def cli(self, *args: str, env: dict) -> subprocess.CompletedProcess:
        proc = self.as_user([sys.executable, "-m", "dispatch_slurm", *args], env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # -- one execution, as the plugin starts it on a node ------------------------------------

    def execution(self, name: str) -> Execution:
        got = self.cli("env", "--local", "--format", "json", env=self.env)
        assert got.returncode == 0, got.stderr
        tag = f"{self.base.name}/{name}"
        self.names.append(tag)
        return Execution(name, json.loads(got.stdout), tag=tag)

    def start_view(self, ex: Execution, kind: str) -> None:
        """prepare, the publisher, then the trainer in its namespace (the plugin's order)."""
        env = {**self.env, **ex.values, "DISPATCH_VIEW": str(self.view)}
        got = self.cli("view", "prepare", env=env)
        ex.said += got.stderr.splitlines()
        assert got.returncode == 0, got.stderr
        ex.publisher = self.as_user([sys.executable, "-m", "dispatch_slurm", "view", "publish"], env,
                                    stderr=open(self.logs / f"{ex.name}.publisher", "w"))
        ex.record = str(self.logs / f"{ex.name}.jsonl")
        ex.trainer = self.as_user(TRAINERS[kind].argv(str(self.view), ex.record), {**env, **ex.tagged()},
                                  bind=ex.exec_dir,
                                  stdout=open(self.logs / f"{ex.name}.out", "w"), stderr=subprocess.STDOUT)

    def start_naive(self, ex: Execution, kind: str) -> None:
        ex.record = str(self.logs / f"{ex.name}.jsonl")
        env = {**{k: v for k, v in self.env.items() if k != "DISPATCH_CHECKPOINT"}, **ex.tagged()}
        ex.trainer = self.as_user(TRAINERS[kind].argv(str(self.shared), ex.record), env,
                                  stdout=open(self.logs / f"{ex.name}.out", "w"), stderr=subprocess.STDOUT)

    # -- what the schedule waits for ---------------------------------------------------------

    def saved(self, ex: Execution, step: int, view: bool, timeout: float = 300) -> None:
        """Until ``ex``'s trainer recorded its save of ``step`` (every rank's), and with the view
        until that save is published; a trainer that exits first fails the wait."""
        def done() -> bool:
            recs = read(ex.record)
            return len({r["rank"] for r in recs if r["op"] == "save" and r["step"] == step}) >= ex.ranks and \
                (not view or self.published(ex, step))
        wait.until(lambda: done() or _exited(ex.trainer), timeout=timeout, what=f"{ex.name} to save step {step}",
                   every=0.02)
        assert done(), f"{ex.name}'s trainer exited before it saved step {step}: {self.tail(ex)}"

    def published(self, ex: Execution, step: int) -> bool:
        from dispatch_slurm import store
        return any(p.epoch == ex.epoch and p.step == step for p in store.publications(str(self.root)))

    def tail(self, ex: Execution) -> str:
        return self.tail_of(ex.name)

    def tail_of(self, name: str) -> str:
        """The end of an execution's trainer output and publisher's stderr."""
        out = []
        for suffix in ("out", "publisher"):
            try:
                out.append((self.logs / f"{name}.{suffix}").read_text()[-3000:])
            except FileNotFoundError:
                pass
        return "\n".join(out)

    def signal(self, ex: Execution, sig: int) -> None:
        """``sig`` to every process of ``ex``'s trainer: each one whose environment carries its
        tag (torchrun starts its workers in sessions of their own, out of the group's reach)."""
        for pid in _tagged(ex.tag):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, ex: Execution) -> None:
        self.signal(ex, signal.SIGSTOP)

    def cont(self, ex: Execution) -> None:
        self.signal(ex, signal.SIGCONT)

    def kill(self, ex: Execution) -> None:
        """The trainer's processes killed (the node finally ends them); its publisher, which
        lasts as long as they do, then makes its last scan and exits."""
        self.signal(ex, signal.SIGKILL)
        ex.trainer.wait(60)
        wait.until(lambda: not _tagged(ex.tag), timeout=60, what=f"{ex.name}'s processes to end")
        if ex.publisher is not None:
            ex.publisher.wait(120)

    def finish(self, ex: Execution, timeout: float = 600) -> int:
        rc = ex.trainer.wait(timeout)
        if ex.publisher is not None:
            ex.publisher.wait(120)
        return rc


TAG = "VIEWBED_RUN"  # in each trainer's environment: which execution's it is


def _tagged(tag: str) -> list[int]:
    needle = f"{TAG}={tag}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(pid))
            except OSError:
                pass
    return found


def _exited(proc: Optional[subprocess.Popen]) -> bool:
    return proc is not None and proc.poll() is not None


@dataclass
class Outcome:
    """What one side of the schedule did, read from the trainers' own records and the root."""
    kind: str
    mode: str
    b_resumed: Optional[int]
    c_resumed: Optional[int]
    c_done: Optional[str]  # C's final digest
    late_resume: bool  # C resumed from a step only A saved, after B started
    b_lost: list[int]  # B's saves (of the two its rotation keeps) gone from where B wrote them, or rewritten by A
    rc: int


def resumed(record: str) -> Optional[int]:
    steps = [r["step"] for r in read(record) if r["op"] == "resume" and r["rank"] == 0]
    return steps[0] if steps else None


def done_digest(record: str) -> Optional[str]:
    hs = [r["h"] for r in read(record) if r["op"] == "done" and r["rank"] == 0]
    return hs[0] if hs else None


def overlap(bed: Bed, kind: str, mode: str) -> Outcome:
    """The schedule of the module doc on one side (``mode``: "view" or "naive")."""
    try:
        return _overlap(bed, kind, mode)
    finally:
        bed.close()


def _overlap(bed: Bed, kind: str, mode: str) -> Outcome:
    view = mode == "view"
    start = bed.start_view if view else bed.start_naive
    t = TRAINERS[kind]
    a, b, c = (bed.execution(f"{kind}-{mode}-{n}") for n in "ABC")
    for ex in (a, b, c):
        ex.ranks = t.nproc
    start(a, kind)
    bed.saved(a, 4, view=False)
    bed.stop(a)  # "Slurm says it ended": alive, stalled between two steps
    assert not [r for r in read(a.record) if r["op"] == "save" and r["step"] > 4], "A saved past 4 before its stop"
    if view:
        wait.until(lambda: bed.published(a, 4), timeout=120, what="A's step 4 to be published")
    start(b, kind)
    bed.saved(b, 8, view)
    bed.kill(b)
    b_saves = {6: _files(bed, b, 6, view), 8: _files(bed, b, 8, view)}
    bed.cont(a)  # the old execution runs on after its replacement started and ended
    bed.saved(a, 10, view)
    bed.kill(a)
    start(c, kind)
    rc = bed.finish(c)
    lost = [s for s, before in b_saves.items() if _files(bed, b, s, view) != before]
    c_step = resumed(c.record)
    a_late = {r["step"] for r in read(a.record) if r["op"] == "save" and r["step"] > 4}
    b_steps = {r["step"] for r in read(b.record) if r["op"] == "save"}
    return Outcome(kind, mode, resumed(b.record), c_step, done_digest(c.record),
                   c_step in a_late - b_steps, lost, rc)


def _files(bed: Bed, ex: Execution, step: int, view: bool) -> Optional[dict]:
    """(name -> (inode, mtime_ns, size)) of every file of ``ex``'s save of ``step`` where its
    trainer wrote it (with the view its own folder, else the shared one); None when none is there."""
    folder = pathlib.Path(ex.exec_dir if view else bed.shared)
    found = {}
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if not path.is_file() or not _of_step(str(rel), step):
            continue
        st = path.stat()
        found[str(rel)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return found or None


def _of_step(rel: str, step: int) -> bool:
    import re
    return any(re.fullmatch(p, part) for part in rel.split("/") for p in (
        rf"checkpoint-{step}", rf"checkpoint-{step}\.pt", rf"global_step{step}", rf"step-{step}",
        rf"epoch=\d+-step={step}\.ckpt"))


def uninterrupted(base: pathlib.Path, kind: str) -> str:
    """The final digest of the trainer run once, start to end, in a folder of its own."""
    out, record = base / f"{kind}-uninterrupted", base / f"{kind}-uninterrupted.jsonl"
    t = TRAINERS[kind]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "RANK", "WORLD_", "MASTER_"))}
    argv = t.argv(str(out), str(record))
    i = argv.index("--step-time")
    argv[i + 1] = "0"
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    h = done_digest(str(record))
    assert proc.returncode == 0 and h, proc.stdout[-2000:] + proc.stderr[-2000:]
    return h


def table(rows: list[tuple[Outcome, str]]) -> str:
    """The outcomes side by side (each with the uninterrupted run's digest), as a Markdown table."""
    out = ["| trainer | side | B resumed from | C resumed from | C from A's late save | B's saves A took | "
           "C's weights = uninterrupted |", "|---|---|---|---|---|---|---|"]
    for o, h in rows:
        out.append(f"| {o.kind} | {'view' if o.mode == 'view' else 'one shared folder'} | {o.b_resumed} | "
                   f"{o.c_resumed} | {'yes' if o.late_resume else 'no'} | "
                   f"{', '.join(map(str, o.b_lost)) or 'none'} | {'yes' if o.c_done == h else 'NO'} |")
    return "\n".join(out)


def run_all(kinds: list[str], log=print) -> str:
    """Both sides for each trainer, and the table (``python -m testbed view``)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="dispatch-view-") as base:
        os.chmod(base, 0o755)  # the job user's beds are inside
        for kind in kinds:
            h = uninterrupted(pathlib.Path(base), kind)
            for mode in ("view", "naive"):
                bed = Bed(os.path.join(base, f"{kind}-{mode}"))
                rows.append((overlap(bed, kind, mode), h))
                log(f"{kind} {mode}: {rows[-1][0]}")
    return table(rows)
