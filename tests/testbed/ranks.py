"""Multi-rank preemption trials: examples/dist_train.py under real torchrun (gloo, CPU),
signalled at a random moment, then checked and resumed.

One trial: an execution trains (DDP or FSDP, sync or async DCP saves, 2-4 ranks); at a
random moment it gets SIGTERM on every rank (as Slurm sends it), on one rank only
(mid-collective: the others wait in the all-reduce for a skewed rank 0), on torchrun
(which forwards it), or SIGKILL on every rank (no save: what was in flight must stay
unpublished). Every run has a hard deadline: a deadlock fails the trial, never hangs.
Then: every publication is complete (DCP ``.metadata``, every shard readable, its
stored step equal to the published step), the preemption's save is the latest, and a
replacement execution resumes from exactly that step.

    PYTHONPATH=tests python -m testbed.ranks --trials 50     # the full randomized run
"""

import argparse
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from dispatch_slurm import store
from dispatch_slurm.store import events

from . import wait

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "dist_train.py")
SENTINEL = "dispatch-checkpoint-complete"
TARGETS = ("all", "one", "agent", "kill")
DEADLINE = 120.0  # seconds for one execution to exit after its signal: beyond, a deadlock


@dataclasses.dataclass
class Trial:
    nproc: int
    fsdp: bool
    async_save: bool
    target: str
    delay: float  # seconds of training before the signal (the random moment)
    skew: float = 0.0
    # results
    step: int | None = None  # the step the preemption saved (None: killed)
    published_s: float | None = None  # signal -> the preemption's publication
    resumed: int | None = None
    unpublished: int = 0  # save folders left without .metadata (killed mid-write)
    torn: int = 0
    deadlock: bool = False
    error: str = ""


def random_trial(rng: random.Random, target: str | None = None) -> Trial:
    target = target or rng.choice(TARGETS)
    return Trial(nproc=rng.choice((2, 3, 4)), fsdp=rng.random() < 0.5, async_save=rng.random() < 0.5,
                 target=target, delay=rng.uniform(0.2, 2.0), skew=0.03 if target == "one" else 0.0)


def dispatch_env(root: str, attempt: str, epoch: int, **extra) -> dict:
    """The environment of one execution (its exec folder made), without the caller's
    DISPATCH_*, rank, torchrun or Slurm variables."""
    exec_dir = store.make_exec_dir(root, attempt)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("DISPATCH_", "RANK", "SLURM_", "WORLD_", "MASTER_", "LOCAL_RANK"))}
    return {**base, "DISPATCH_CHECKPOINT": root, "DISPATCH_EXEC_DIR": exec_dir, "DISPATCH_EPOCH": str(epoch),
            "DISPATCH_ATTEMPT": attempt, "DISPATCH_GRACE_S": "60", "PYTHONPATH": REPO, **extra}


def launch(argv, *, nproc: int = 1, env=None, **popen) -> subprocess.Popen:
    """``python ARGV`` (one process) or ``torchrun --standalone`` (nproc ranks; torchrun picks
    a free port, so parallel runs never collide), in a session of its own (killpg)."""
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return subprocess.Popen([sys.executable, *launcher, *map(str, argv)], env=env, text=True,
                            start_new_session=True, **popen)


def start(t: Trial, root: str, attempt: str, epoch: int, *args: str, log: str) -> subprocess.Popen:
    flags = [*(["--fsdp"] if t.fsdp else []), *(["--async-save"] if t.async_save else [])]
    with open(log, "w") as out:
        return launch([EXAMPLE, *args, *flags], nproc=t.nproc, env=dispatch_env(root, attempt, epoch),
                      stdout=out, stderr=subprocess.STDOUT)


def workers(root: str, attempt: str, nproc: int) -> dict[int, int] | None:
    """rank -> pid of every worker that started training, once all have."""
    pids = [e["pid"] for e in events.read(root) if e["type"] == "execution_started" and e["attempt"] == attempt]
    if len(pids) < nproc:
        return None
    ranks = {}
    for pid in pids:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        ranks[int(env.get(b"RANK", b"0"))] = pid  # plain python: the one rank
    return ranks


def finish(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit code, or None after killing the whole session at the deadline."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        return None


def signal_it(t: Trial, proc: subprocess.Popen, ranks: dict[int, int], rng: random.Random) -> None:
    if t.target == "agent":
        proc.send_signal(signal.SIGTERM)
    elif t.target == "one":
        os.kill(ranks[rng.randrange(1, t.nproc)], signal.SIGTERM)  # a rank waiting in the all-reduce
    else:
        sig = signal.SIGKILL if t.target == "kill" else signal.SIGTERM
        for rank in rng.sample(sorted(ranks), len(ranks)):
            os.kill(ranks[rank], sig)


def check_complete(root: str, t: Trial) -> None:
    """Every publication is a whole DCP save of its step; count unpublished leftovers."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    published = set()
    for pub in store.publications(root):
        path = os.path.join(root, pub.path)
        published.add(path)
        with tempfile.NamedTemporaryFile(suffix=".pt") as f:
            try:
                dcp_to_torch_save(path, f.name)
                step = torch.load(f.name, weights_only=False)["app"]["step"]
            except Exception as e:  # noqa: BLE001 -- any failure to read it back is a torn save
                t.torn += 1
                t.error += f"publication {pub.name} unreadable: {e}; "
                continue
        if step != pub.step:
            t.torn += 1
            t.error += f"publication of step {pub.step} holds step {step}; "
    for dirpath, dirs, _ in os.walk(os.path.join(root, "exec")):
        for d in dirs:
            full = os.path.join(dirpath, d)
            if d.startswith("checkpoint-") and full not in published:
                t.unpublished += 1


def run(t: Trial, root: str, rng: random.Random, logdir: str) -> Trial:
    """Preempt one execution at t's random moment, check, resume with a replacement."""
    attempt, epoch = "local.1.1000000", 1_000_000
    log = os.path.join(logdir, "preempted.log")
    proc = start(t, root, attempt, epoch, "--max-steps", "1000000", "--save-every", "7",
                 "--step-time", "0.005", *(("--skew", str(t.skew)) if t.skew else ()), log=log)
    try:
        def started():
            if proc.poll() is not None:
                raise AssertionError(f"torchrun exited {proc.returncode} before training: {open(log).read()[-3000:]}")
            return workers(root, attempt, t.nproc)
        ranks = wait.until(started, timeout=120, what="every rank to start training", every=0.1)
        time.sleep(t.delay)  # the random moment of the fault (not a synchronisation)
        sent = time.time()
        signal_it(t, proc, ranks, rng)
        rc = finish(proc, DEADLINE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = open(log).read()
    if rc is None:
        t.deadlock, t.error = True, f"no exit within {DEADLINE:g} s of the signal: {text[-2000:]}"
        return t
    check_complete(root, t)
    preempt = [e for e in events.read(root) if e["type"] == "published" and e.get("by") == "preempt"]
    if t.target == "kill":
        if rc == 0 or preempt or SENTINEL in text:
            t.error += f"killed run: rc {rc}, {len(preempt)} preemption publications; "
    else:
        # torchrun itself exits non-zero when it was the one signalled (SignalException)
        if (rc != 0 and t.target != "agent") or text.count(SENTINEL) != t.nproc or len(preempt) != 1:
            t.error += f"rc {rc}, {text.count(SENTINEL)} sentinels, {len(preempt)} preemption publications: {text[-3000:]}; "
            return t
        t.step, t.published_s = preempt[0]["step"], preempt[0]["t"] - sent
        latest = store.latest(root)
        if (latest.epoch, latest.step) != (epoch, t.step):
            t.error += f"latest is {latest.name}, not the preemption's save of step {t.step}; "
    return resume(t, root, logdir)


def resume(t: Trial, root: str, logdir: str) -> Trial:
    latest = store.latest(root)
    if latest is None:
        return t  # killed before its first save completed: nothing to resume from
    log = os.path.join(logdir, "resumed.log")
    proc = start(t, root, "local.1.2000000", 2_000_000, "--max-steps", str(latest.step + 2),
                 "--save-every", "1000000", log=log)
    rc = finish(proc, DEADLINE)
    text = open(log).read()
    got = [int(line.split()[3]) for line in text.splitlines() if line.startswith("resumed at step")]
    t.resumed = got[0] if got else None
    if rc != 0 or t.resumed != latest.step:
        t.deadlock = rc is None
        t.error += f"resume: rc {rc}, resumed at {t.resumed}, latest {latest.step}: {text[-8000:]}; "
    return t


def trials(n: int, seed: int, targets=None) -> list[Trial]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = random_trial(rng, targets[i % len(targets)] if targets else None)
        with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
            os.mkdir(os.path.join(tmp, "root"))
            try:
                out.append(run(t, os.path.join(tmp, "root"), rng, tmp))
            except Exception as e:  # noqa: BLE001 -- a trial that could not run is a failed trial, not the end
                t.error = f"{type(e).__name__}: {e}"
                out.append(t)
        line = json.dumps(dataclasses.asdict(out[-1]))
        print(line if out[-1].error else line[:400], flush=True)  # a failure whole: its traceback
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write every trial's result here")
    a = ap.parse_args(argv)
    results = trials(a.trials, a.seed, TARGETS)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    bad = [r for r in results if r.error or r.deadlock or r.torn]
    print(f"{len(results)} trials: {sum(r.deadlock for r in results)} deadlocks, "
          f"{sum(r.torn for r in results)} torn publications, {len(bad)} failed, "
          f"{sum(r.unpublished for r in results)} unpublished leftovers (killed mid-save)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
