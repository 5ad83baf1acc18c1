"""What the view costs: the task start-up it adds, the bytes `view prepare` writes, and the
training time its publisher adds. Each part can be run alone (``--parts``).

mount    the view's mount alone in a task (task_init_privileged: unshare, / slave, the opens as
         the user, the bind), timed by spank_env/test_contexts.c on this machine's kernel
cluster  `srun -n1 true` steps inside one job whose root holds ``--pubs`` publications, on one
         docker-slurm cluster, without the view (``--dispatch-checkpoint=R``, the baseline) and
         with it (``--dispatch-view=R/out``: every step the view folder checked and made, the
         nodes' `dispatch-slurm view prepare` run and waited for, `view publish` started and
         stopped at the step's end, and each task's mount namespace and bind); goal <= 50 ms
         more per task. ``--commands none`` names a do-nothing command as site.conf's
         dispatch_slurm instead: the plugin's own cost. ``--steps-on other``: a 2-node job,
         its steps on the node without the batch step (whose publisher covers steps on its own
         node only)
prepare  a Hugging Face-shaped save of ``--mb`` MiB (6 files) published by execution A; with
         ``--pubs`` more publications in pub/, execution B's prepare, as the job user (nobody:
         root would get a copy of the data, whom a file's mode does not stop): the disk it
         takes (free blocks before and after, everything synced; goal: at most 1% of the save),
         the entries it made, and its time (in a child of this process, and the command's wall
         time, Python's start-up included)
start    a short step's publisher alone (`view publish` with its stdin at its end, as the plugin
         starts it where the step's task is gone before it looks), ``--starts`` times, beside
         this Python's bare start: what a short step on a node without the batch step waits for
publisher a CPU training loop (``--steps`` steps of a matmul, a ``--save-mb`` MiB torch.save
         every ``--save-every`` steps into its exec folder), ``--n`` pairs of runs, the order
         alternated: alone, and with `dispatch-slurm view publish` beside it (which fsyncs and
         publishes each save); the median wall time of each way, their ratio and the median of
         the pairs' (goal: <= 1%), the publisher's own CPU time, and the same until the saves
         are on disk (alone, the run then ``os.sync()``: the writes the publisher's fsync brings
         forward, which the training loop alone leaves in the page cache)

    python benchmarks/bench_view.py [--parts mount,cluster,prepare,publisher,start] [--suite trixie]
        [--steps-per-job 50] [--rounds 2] [--pubs 10000] [--commands installed|none]
        [--steps-on batch|other] [--mounts 200] [--starts 30]
        [--mb 1024] [--steps 300] [--save-every 30] [--save-mb 64] [--n 3] [--dir DIR]

Run as root from the checkout (the prepare part drops to the job user, nobody, as
tests/testbed/viewbed.py does), on the filesystem to measure (``--dir``, default this folder's)."""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = str(HERE.parent)
sys.path.insert(0, str(HERE.parent / "tests"))  # the test bed
sys.path.insert(0, REPO)
sys.path.insert(0, str(HERE))  # bench_hooks, beside it
from bench_hooks import JOB as HOOKS_JOB  # noqa: E402
from support import build_spank  # noqa: E402
from testbed.cluster import CONTROLLER, Cluster  # noqa: E402

from dispatch_slurm import store, view  # noqa: E402
from dispatch_slurm.store import epochs  # noqa: E402
from dispatch_slurm.contract import epoch as epochmod  # noqa: E402
from dispatch_slurm.contract import names  # noqa: E402
from dispatch_slurm.contract.env import Execution  # noqa: E402

SITE = "/etc/dispatch-slurm/site.conf"
DO_NOTHING = """#!/bin/sh
# the view's commands doing nothing: the plugin's own cost
[ "$2" = publish ] && exec sleep 100000
exit 0
"""

# bench_hooks.py's job (its srun steps timed), the last step showing the view instead
JOB = HOOKS_JOB.replace("attempt=${{DISPATCH_ATTEMPT", "view=${{DISPATCH_VIEW")
assert JOB != HOOKS_JOB
# --steps-on other: a two-node job whose steps run on the node without the batch step (srun's
# relative node 1), where no batch step's publisher covers them
JOB_OTHER = JOB.replace("#SBATCH -N1 -n1", "#SBATCH -N2 --ntasks-per-node=1").replace(
    "srun -n1 --quiet true", "srun -N1 -n1 -r1 --quiet true")
assert JOB_OTHER.count("-r1") == 1 and "-N2" in JOB_OTHER


def publications(root: Path, n: int) -> None:
    """n publications in root/pub/, alice's (names of saves of earlier executions, one
    earlier submission per 1,000, each with its epoch claimed, as publish claims it first):
    made as root on a root that is root's for the while, then all given to alice."""
    os.chown(root, 0, 0)
    pub = root / "pub"
    pub.mkdir(exist_ok=True)
    st = store.at(str(root))
    olds = [epochmod.compose(0, st.allocate_submission(), 0) for _ in range((n + 999) // 1000)]
    for k, e in enumerate(olds):
        epochs.claim(st, f"old.{k}.{e}")
    for i in range(n):
        (pub / names.encode(olds[i // 1000], i, f"exec/old.{i // 1000}.{olds[i // 1000]}/checkpoint-{i}")).touch()
    latest = root / "exec" / f"old.{(n - 1) // 1000}.{olds[-1]}" / f"checkpoint-{n - 1}"  # the save prepare places
    latest.mkdir(parents=True)
    (latest / "model.safetensors").write_bytes(b"w" * 4096)
    (latest / "trainer_state.json").write_text(json.dumps({"global_step": n - 1}))
    for d, dirs, files in os.walk(root):
        for p in [d, *(os.path.join(d, x) for x in dirs + files)]:
            os.chown(p, 2001, 2001)


def run_variant(c: Cluster, name: str, steps: int, i: int, root: str, on: str = "batch") -> float:
    out = f"/checkpoints/bench/{name}-{i}.out"
    opts = [f"--dispatch-checkpoint={root}"] + ([f"--dispatch-view={root}/out"] if name == "view" else [])
    job = c.submit("alice", (JOB if on == "batch" else JOB_OTHER).format(out=out, steps=steps), args=opts)
    c.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=900)
    text = c.read(out)
    if "failed" in text or "elapsed" not in text:
        raise SystemExit(f"{name}: the job did not run cleanly:\n{text}")
    if (re.search(r"view=(\S+)", text)[1] != "none") != (name == "view"):
        raise SystemExit(f"{name}: DISPATCH_VIEW is not what this variant gives:\n{text}")
    return float(re.search(r"elapsed (\S+)", text)[1]) / steps


def mount_alone(n: int, pubs: int) -> list[float]:
    """The task's part (task_init_privileged: namespace, opens, bind), in microseconds, n times."""
    from test_spank_view import Bed  # the local tests' job tree, their stand-in commands
    top = Path(tempfile.mkdtemp(prefix="bench-view-", dir="/tmp"))
    top.chmod(0o755)
    try:
        driver = build_spank("test_contexts", top)
        (top / "bed").mkdir(mode=0o755)
        bed = Bed(top / "bed")
        publications(bed.root, pubs)
        got = []
        for _ in range(n):
            shutil.rmtree(bed.root / "exec", ignore_errors=True)
            shutil.rmtree(bed.root / "epochs", ignore_errors=True)
            r = subprocess.run([str(driver), "view", str(bed.top), str(bed.root / "out"), "plain"],
                               capture_output=True, text=True, check=True)
            m = re.search(r"^task_init_privileged_us: (\d+)$", r.stdout, re.M)
            if "task_init_privileged: 0" not in r.stdout or m is None:
                raise SystemExit(f"the driver did not bind the view:\n{r.stdout}{r.stderr}")
            got.append(int(m[1]))
        return got
    finally:
        shutil.rmtree(top)


TRAIN = """
import os, sys, time, torch
out, steps, every, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
torch.set_num_threads(1)
w = torch.randn(384, 384)
state = {"w": torch.randn(mb * 2**18)}  # mb MiB of float32
t0 = time.perf_counter()
for step in range(1, steps + 1):
    for _ in range(8):
        w = torch.tanh(w @ w) * 0.5
    if step % every == 0:
        torch.save(state, os.path.join(out, f"checkpoint-{step}.pt"))
print(time.perf_counter() - t0)
"""


def execution(root: str) -> dict:
    got = subprocess.run([sys.executable, "-m", "dispatch_slurm", "env", "--local", "--format", "json"],
                         env={**os.environ, "DISPATCH_CHECKPOINT": root, "PYTHONPATH": REPO}, capture_output=True,
                         text=True, check=True)
    return json.loads(got.stdout)


def make_save(path: str, mb: int) -> None:
    os.makedirs(path)
    for name, size in (("model.safetensors.bin", mb // 3), ("optimizer.pt.bin", mb - mb // 3)):
        with open(os.path.join(path, name), "wb") as f:
            for _ in range(size):
                f.write(os.urandom(1 << 20))
    for name in ("config.json", "scheduler.bin", "rng_state.bin"):
        with open(os.path.join(path, name), "wb") as f:
            f.write(b"{}" * 500)
    with open(os.path.join(path, "trainer_state.json"), "w") as f:
        f.write('{"global_step": 100}')


def as_user(uid: int, fn) -> dict:
    """``fn()`` in a child of this process that dropped to ``uid`` (no new program: this
    Python, whatever folder it lives in); its JSON-able answer."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = {"ok": fn()}
        except BaseException as e:  # noqa: BLE001 -- reported to the parent
            out = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    got = json.loads(data)
    if "error" in got:
        raise SystemExit(got["error"])
    return got["ok"]


def bench_prepare(base: str, mb: int, pubs: int) -> None:
    """As the job user (tests/testbed/viewbed.py's bed: nobody, the commands in a namespace
    where nobody may run this Python)."""
    from testbed import viewbed
    bed = viewbed.Bed(base)
    uid = viewbed.USER[0]
    a = bed.execution("A")
    save = os.path.join(a.exec_dir, "checkpoint-100")
    make_save(save, mb)
    for d, dirs, files in os.walk(a.exec_dir):
        for n in [d, *(os.path.join(d, x) for x in dirs + files)]:
            os.chown(n, *viewbed.USER)
    got = bed.cli("publish", save, env={**bed.env, **a.values})
    assert got.returncode == 0, got.stderr
    pub_dir = os.path.join(bed.root, "pub")
    for i in range(pubs):  # older publications (step 100's stays the latest)
        open(os.path.join(pub_dir, names.encode(a.epoch, i % 100, f"exec/x.1.1/c-{i}")), "x").close()
    size = sum(os.path.getsize(os.path.join(save, f)) for f in os.listdir(save))
    b = bed.execution("B")
    root = str(bed.root)

    def prepare_here() -> dict:
        os.sync()
        free = shutil.disk_usage(root).free
        files = sum(len(fs) + len(ds) for _, ds, fs in os.walk(root))
        t0 = time.perf_counter()
        view.prepare(Execution.current({**b.values, "DISPATCH_VIEW": str(bed.view)}), say=lambda t: None)
        took = time.perf_counter() - t0
        os.sync()
        return {"s": took, "bytes": free - shutil.disk_usage(root).free,
                "entries": sum(len(fs) + len(ds) for _, ds, fs in os.walk(root)) - files}
    got_here = as_user(uid, prepare_here)
    c = bed.execution("C")
    t0 = time.perf_counter()
    done = bed.cli("view", "prepare", env={**bed.env, **c.values, "DISPATCH_VIEW": str(bed.view)})
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    print(f"prepare, a {size / 2**20:.0f} MiB save (6 files), {pubs + 1} publications in pub/, as uid {uid}:")
    print(f"  disk taken {got_here['bytes'] / 2**10:.1f} KiB = {100 * got_here['bytes'] / size:.4f}% of the save; "
          f"{got_here['entries']} new entries (the save's names, the record); in-process "
          f"{got_here['s'] * 1e3:.1f} ms; the command {wall * 1e3:.0f} ms (Python's start-up, unshare and setpriv "
          "included)")


def train(exec_dir: str, steps: int, every: int, mb: int, env: dict) -> float:
    got = subprocess.run([sys.executable, "-c", TRAIN, exec_dir, str(steps), str(every), str(mb)], env=env,
                         capture_output=True, text=True, check=True)
    return float(got.stdout.strip().splitlines()[-1])


def bench_publisher(base: str, steps: int, every: int, mb: int, n: int) -> None:
    alone, beside, cpu = [], [], []
    durable_alone, durable_beside = [], []  # from the trainer's start until its saves are on disk
    for i in range(n):
        for way in (("alone", "publisher") if i % 2 == 0 else ("publisher", "alone")):
            root = os.path.join(base, f"proot-{i}-{way}")  # a root each: nothing to resume, nothing to copy
            os.mkdir(root)
            ex = execution(root)
            env = {**os.environ, **ex, "PYTHONPATH": REPO, "DISPATCH_VIEW": os.path.join(root, "out")}
            pub = None
            if way == "publisher":
                subprocess.run([sys.executable, "-m", "dispatch_slurm", "view", "prepare"], env=env, check=True,
                               capture_output=True)
                pub = subprocess.Popen([sys.executable, "-m", "dispatch_slurm", "view", "publish"], env=env,
                                       stderr=subprocess.DEVNULL)
            t0 = time.perf_counter()
            t = train(ex["DISPATCH_EXEC_DIR"], steps, every, mb, env)
            if pub is None:
                os.sync()  # the saves on disk: what a checkpoint is for (the publisher fsyncs each)
            else:
                _, status, use = os.wait4(pub.pid, 0)  # its CPU time: the share of a core it took
                pub.returncode = os.waitstatus_to_exitcode(status)
                cpu.append((use.ru_utime + use.ru_stime) / t)
                published = sum(1 for p in store.publications(root) if p.epoch == int(ex["DISPATCH_EPOCH"]))
                assert published == steps // every, published
            (beside if pub else alone).append(t)
            (durable_beside if pub else durable_alone).append(time.perf_counter() - t0)
            shutil.rmtree(root)
    a, b = statistics.median(alone), statistics.median(beside)
    paired = [100 * (y - x) / x for x, y in zip(alone, beside)]
    print(f"the publisher: {steps} steps, a {mb} MiB torch.save every {every} ({steps // every} saves), "
          f"{n} runs each way, in pairs (the order alternated):")
    print(f"  alone {a:.2f} s (runs {', '.join(f'{x:.2f}' for x in alone)}), with the publisher {b:.2f} s "
          f"(runs {', '.join(f'{x:.2f}' for x in beside)}): {100 * (b - a) / a:+.2f}%")
    print(f"  per pair: median {statistics.median(paired):+.2f}% (pairs {', '.join(f'{x:+.1f}' for x in paired)}); "
          f"the publisher's own CPU {100 * statistics.median(cpu):.2f}% of a core over the run")
    da, db = statistics.median(durable_alone), statistics.median(durable_beside)
    paired = [100 * (y - x) / x for x, y in zip(durable_alone, durable_beside)]
    print(f"  until the saves are on disk (alone: then os.sync(); with it: its exit, the last save fsynced and "
          f"published): {da:.2f} s / {db:.2f} s, {100 * (db - da) / da:+.2f}%; per pair median "
          f"{statistics.median(paired):+.2f}%")


def bench_start(base: str, n: int) -> None:
    """A short step's publisher: started with its stdin at its end already (the plugin's pipe
    closed before it looked), one scan of an exec folder with nothing new, exit."""
    root = os.path.join(base, "sroot")
    os.mkdir(root)
    ex = execution(root)
    env = {**os.environ, **ex, "PYTHONPATH": REPO, "DISPATCH_VIEW": os.path.join(root, "out"),
           "DISPATCH_VIEW_STEP_END": "stdin"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the package's modules compiled once, as dpkg's are
    subprocess.run([sys.executable, "-m", "dispatch_slurm", "view", "prepare"], env=env, check=True,
                   capture_output=True)
    took = []
    for _ in range(n + 1):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dispatch_slurm", "view", "publish"], env=env, check=True,
                       stdin=subprocess.DEVNULL, capture_output=True)
        took.append(time.perf_counter() - t)
    took = took[1:]  # the first compiled what was not yet
    bare = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        bare.append(time.perf_counter() - t)
    print(f"a short step's publisher, told before it began, {n} runs: median {statistics.median(took) * 1e3:.1f} ms, "
          f"min {min(took) * 1e3:.1f} ms (this Python's bare start: median {statistics.median(bare) * 1e3:.1f} ms)")


def cluster(a) -> None:
    with Cluster(a.suite, "fast", log=lambda s: print(s, file=sys.stderr)) as c:
        c.exec("c1", "install -d -m 1777 /checkpoints/bench")
        root = "/checkpoints/bench/root"
        c.exec("c1", f"install -d -m 0700 -o alice -g alice {root} /checkpoints/bench/cmd")
        publications(c.path(root), a.pubs)
        if a.commands == "none":
            (c.path("/checkpoints/bench/cmd") / "view-commands").write_text(DO_NOTHING)
            (c.path("/checkpoints/bench/cmd") / "view-commands").chmod(0o755)
            for host in [CONTROLLER, *c.node_names]:
                c.exec(host, f"echo 'dispatch_slurm = /checkpoints/bench/cmd/view-commands' >> {SITE}")
        per: dict[str, list[float]] = {"spank": [], "view": []}
        for i in range(a.rounds):
            for name in (per if i % 2 == 0 else reversed(list(per))):
                per[name].append(run_variant(c, name, a.steps_per_job, i, root, a.steps_on))
        base, viewed = statistics.median(per["spank"]), statistics.median(per["view"])
        print(f"per-task start-up of `srun -n1 true` on the {a.steps_on} node, {a.steps_per_job} steps x "
              f"{a.rounds} rounds, {a.pubs} "
              f"publications in the root, view commands: {a.commands}, Slurm {c.slurm_release} (docker-slurm, "
              f"{os.cpu_count()}-core host)")
        print(f"  spank  {base * 1000:7.1f} ms/step")
        print(f"  view   {viewed * 1000:7.1f} ms/step   {1000 * (viewed - base):+6.1f} ms per task (goal <= +50 ms)")


PARTS = ("mount", "cluster", "prepare", "publisher", "start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help="which of " + ", ".join(PARTS))
    ap.add_argument("--suite", default="trixie", choices=["bookworm", "trixie", "sid"])
    ap.add_argument("--steps-per-job", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pubs", type=int, default=10_000)
    ap.add_argument("--commands", default="installed", choices=["installed", "none"])
    ap.add_argument("--steps-on", default="batch", choices=["batch", "other"],
                    help="the cluster part's steps: on the batch step's node, or on another node of a 2-node job")
    ap.add_argument("--mounts", type=int, default=200, help="times the mount alone is timed")
    ap.add_argument("--starts", type=int, default=30, help="times a short step's publisher is timed")
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-every", type=int, default=30)
    ap.add_argument("--save-mb", type=int, default=64)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--dir", default=str(HERE))
    a = ap.parse_args()
    parts = a.parts.split(",")
    if set(parts) - set(PARTS):
        raise SystemExit(f"--parts: {a.parts!r} names no part; choose from {', '.join(PARTS)}")
    if os.geteuid() != 0:
        raise SystemExit("run as root: the mount part mounts, the prepare part drops to the job user itself (nobody)")
    if "mount" in parts:
        us = mount_alone(a.mounts, a.pubs)
        print(f"the view's mount alone (task_init_privileged: unshare, / slave, opens as the user, bind), "
              f"{a.mounts} tasks, this kernel ({os.uname().release}): median {statistics.median(us) / 1000:.2f} ms, "
              f"p90 {sorted(us)[int(len(us) * 0.9)] / 1000:.2f} ms")
    if "cluster" in parts:
        cluster(a)
    if {"prepare", "publisher", "start"} & set(parts):
        with tempfile.TemporaryDirectory(dir=a.dir, prefix=".bench-view-") as base:
            os.chmod(base, 0o755)  # the job user's bed is inside
            if "prepare" in parts:
                bench_prepare(os.path.join(base, "prepare"), a.mb, a.pubs)
            if "publisher" in parts:
                bench_publisher(base, a.steps, a.save_every, a.save_mb, a.n)
            if "start" in parts:
                bench_start(base, a.starts)


if __name__ == "__main__":
    main()
