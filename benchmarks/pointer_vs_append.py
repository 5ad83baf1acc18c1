"""The design review's reproduction: a check-then-rename pointer against append-only
publication, with the old run really stalled (SIGSTOP) between its check and its
rename. Kept here, not in the package: the pointer is the design we rejected.

One trial, for each design, on a real filesystem:
  1. the old execution O (epoch E1) saves s0 and makes it visible;
  2. O saves s0+1 and *checks* (pointer: "is the current pointer older than me?");
     the harness SIGSTOPs it right there, before its rename (append-only: before its
     publish, which has no check at all);
  3. the replacement R (epoch E2 > E1) resumes from what is visible and makes k saves
     (k random in 0..3: how long the stall lasts);
  4. SIGCONT: O completes its rename (pointer) / its publication (append-only);
  5. a third execution T resumes. A *loss*: R made at least one save, yet T resumes
     from O's lineage (R's work is dropped; T continues a dead lineage).

    python benchmarks/pointer_vs_append.py [--trials 1000] [--seed 1]
    python benchmarks/pointer_vs_append.py --cluster --trials 40    (O and R are Slurm jobs)
"""

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # the test bed
from dispatch_slurm import store  # noqa: E402  (inside a job: the package installed on the node)

E1, E2 = 1_000_000, 2_000_000
ATTEMPT = {"old": f"bench.1.{E1}", "new": f"bench.2.{E2}"}  # each lineage's exec folder (token: its epoch)


# ---- the rejected design: a pointer file, updated by check-then-rename ---------------

def pointer_read(root):
    try:
        with open(os.path.join(root, "latest")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def pointer_check(root, step, lineage):
    """'Only move the pointer forward': the check a careful pointer scheme makes."""
    cur = pointer_read(root)
    return cur is None or cur["lineage"] == lineage or cur["step"] < step


def pointer_rename(root, path, step, lineage):
    tmp = os.path.join(root, f".latest.{lineage}.tmp")
    with open(tmp, "w") as f:
        json.dump({"path": path, "step": step, "lineage": lineage}, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(root, "latest"))


# ---- both designs behind one interface -------------------------------------------------

def save(root, lineage, step):
    path = os.path.join(root, "exec", ATTEMPT[lineage], f"checkpoint-{step}")
    os.makedirs(path)
    with open(os.path.join(path, "state.json"), "w") as f:
        json.dump({"lineage": lineage, "step": step}, f)
    return path


def make_visible(design, root, path, step, lineage, epoch, stall=None):
    """Make a save visible; `stall()` runs between the check and the act."""
    if design == "pointer":
        ok = pointer_check(root, step, lineage)
        if stall:
            stall()
        if ok:
            pointer_rename(root, path, step, lineage)
    else:
        if stall:
            stall()
        store.publish(path, step, root=root, epoch=epoch, sync=False)


def resume(design, root):
    if design == "pointer":
        cur = pointer_read(root)
        return (cur["lineage"], cur["step"]) if cur else None
    pub = store.latest(root)
    if pub is None:
        return None
    with open(os.path.join(root, pub.path, "state.json")) as f:
        s = json.load(f)
    return s["lineage"], s["step"]


def trial(design, base, rng) -> dict:
    root = tempfile.mkdtemp(dir=base)
    r_fd, w_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the old execution O
        os.close(r_fd)
        try:
            make_visible(design, root, save(root, "old", 10), 10, "old", E1)
            # the stall point: tell the harness, which SIGSTOPs us before we go on
            make_visible(design, root, save(root, "old", 11), 11, "old", E1,
                         stall=lambda: (os.write(w_fd, b"checked"), os.kill(os.getpid(), signal.SIGSTOP)))
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(w_fd)
    assert os.read(r_fd, 16) == b"checked"
    os.close(r_fd)
    # wait until O is really stopped (it stops itself right after the write)
    while True:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                break
    # the replacement R: resumes from what is visible, saves k times
    start = resume(design, root)
    step = start[1] if start else 0
    k = rng.randrange(4)
    for _ in range(k):
        step += 1
        make_visible(design, root, save(root, "new", step), step, "new", E2)
    os.kill(pid, signal.SIGCONT)  # the stall ends: O completes its rename / publication
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    third = resume(design, root)
    return {"k": k, "resumed": third, "loss": k > 0 and third[0] != "new"}


# ---- overlapping trials on a real cluster: O and R are Slurm jobs ----------------------

def worker(role: str, design: str, root: str, k: int) -> None:
    """Inside a job. old: make s0 visible, save s0+1, check, announce, wait (the
    harness SIGSTOPs us here), then act. new: resume from what is visible, save k."""
    epoch = E1 if role == "old" else E2
    if role == "old":
        make_visible(design, root, save(root, "old", 10), 10, "old", epoch)
        go = os.path.join(root, "go")

        def stall():
            open(os.path.join(root, "checked"), "w").close()
            while not os.path.exists(go):  # the harness stops us in this loop
                time.sleep(0.01)
        make_visible(design, root, save(root, "old", 11), 11, "old", epoch, stall=stall)
        return
    start = resume(design, root)
    step = start[1] if start else 0
    for _ in range(k):
        step += 1
        make_visible(design, root, save(root, "new", step), step, "new", epoch)


def cluster_trial(c, design: str, base: str, rng) -> dict:
    root = f"{base}/{design}-{rng.getrandbits(32):08x}"
    c.exec("c1", f"mkdir -m 700 {root}", user="alice")
    host_root = c.path(root)
    me = f"{base}/pointer_vs_append.py"
    job = lambda role, k=0: c.submit("alice", args=["-o", "/dev/null", "-w", "c3" if role == "old" else "c2",
                                                    "--wrap", f"python3 {me} --worker {role} {design} {root} {k}"])
    old = job("old")
    c.wait_until(lambda: (host_root / "checked").exists(), timeout=60, what="the old job to check")
    pid = c.wait_until(lambda: c.pids("c3", f"pointer_vs_append.py --worker old {design} {root}"), timeout=30, what="its pid")[0]
    c.exec("c3", ["kill", "-STOP", str(pid)])  # really stalled, between its check and its act
    (host_root / "go").touch()
    k = rng.randrange(4)
    new = job("new", k)
    c.wait_job(new, {"COMPLETED", "FAILED"}, timeout=60)
    c.exec("c3", ["kill", "-CONT", str(pid)])
    c.wait_job(old, {"COMPLETED", "FAILED"}, timeout=60)
    third = resume(design, str(host_root))
    return {"k": k, "resumed": third, "loss": k > 0 and third[0] != "new"}


def run_cluster(trials: int, seed: int = 1, suite: str = "trixie") -> dict:
    import shutil
    from testbed.cluster import Cluster
    rng = random.Random(seed)
    out = {}
    with Cluster(suite, "fast", log=lambda m: print(m, file=sys.stderr)) as c:
        base = "/checkpoints/pointer-vs-append"
        c.exec("c1", f"install -d -m 1777 {base}")
        shutil.copy(os.path.abspath(__file__), c.path(base) / "pointer_vs_append.py")
        for design in ("pointer", "append-only"):
            results = [cluster_trial(c, design, base, random.Random(rng.random())) for _ in range(trials)]
            out[design] = {"trials": trials, "losses": sum(r["loss"] for r in results),
                           "stalls_with_replacement_saves": sum(r["k"] > 0 for r in results)}
    return out


def run(trials: int, seed: int = 1, base: str | None = None) -> dict:
    rng = random.Random(seed)
    out = {}
    with tempfile.TemporaryDirectory(prefix="pointer-vs-append-", dir=base) as tmp:
        for design in ("pointer", "append-only"):
            results = [trial(design, tmp, random.Random(rng.random())) for _ in range(trials)]
            out[design] = {"trials": trials, "losses": sum(r["loss"] for r in results),
                           "stalls_with_replacement_saves": sum(r["k"] > 0 for r in results)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cluster", action="store_true",
                    help="overlapping trials on docker-slurm: the old and new executions are Slurm jobs")
    ap.add_argument("--worker", nargs=4, metavar=("ROLE", "DESIGN", "ROOT", "K"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        role, design, root, k = a.worker
        return worker(role, design, root, int(k))
    res = run_cluster(a.trials, a.seed) if a.cluster else run(a.trials, a.seed)
    where = "overlapping Slurm jobs" if a.cluster else "local"
    print(f"stalled old run (SIGSTOP between check and act), {a.trials} {where} trials per design")
    for design, r in res.items():
        print(f"  {design:<12} losses {r['losses']:>4} / {r['trials']}"
              f"   (trials where the replacement saved during the stall: {r['stalls_with_replacement_saves']})")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
