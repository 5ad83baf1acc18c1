"""What the view costs, side by side in one run: the bytes `view prepare` writes to put the latest
publication into a new execution's folder (goal: at most 1% of the save: links, not copies), its
time with many publications in the root, and the training time the view's publisher adds to a
trainer that saves (goal: at most 1%).

1. prepare: a Hugging Face-shaped save of ``--mb`` MiB (6 files) published by execution A; with
   ``--pubs`` more publications in pub/, execution B's prepare, as the job user (nobody: root
   would get a copy of the data, whom a file's mode does not stop): the disk it takes (free
   blocks before and after, everything synced), the entries it made, and its time (in a child
   of this process, and the command's wall time, Python's start-up included).
2. the publisher: a CPU training loop (``--steps`` steps of a matmul, a ``--save-mb`` MiB
   torch.save every ``--save-every`` steps into its exec folder), ``--n`` times each way in
   alternation: alone, and with `dispatch-slurm view publish` beside it (which fsyncs and
   publishes each save); the median wall time of each way and their ratio.

    python benchmarks/bench_view.py [--mb 1024] [--pubs 10000] [--steps 300] [--save-mb 64] [--n 3]

Run as root (the prepare part drops to the job user, nobody, as tests/testbed/viewbed.py does)
from the checkout, on the filesystem to measure (``--dir``, default this folder's)."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from dispatch_slurm import store, view  # noqa: E402
from dispatch_slurm.contract import names  # noqa: E402
from dispatch_slurm.contract.env import Execution  # noqa: E402

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
    sys.path.insert(0, os.path.join(REPO, "tests"))
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
    alone, beside = [], []
    for i in range(n):
        for way in ("alone", "publisher"):
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
            t = train(ex["DISPATCH_EXEC_DIR"], steps, every, mb, env)
            if pub is not None:
                pub.wait(300)
                published = sum(1 for p in store.publications(root) if p.epoch == int(ex["DISPATCH_EPOCH"]))
                assert published == steps // every, published
            (beside if pub else alone).append(t)
            shutil.rmtree(root)
    a, b = statistics.median(alone), statistics.median(beside)
    print(f"the publisher: {steps} steps, a {mb} MiB torch.save every {every} ({steps // every} saves), "
          f"{n} runs each way:")
    print(f"  alone {a:.2f} s (runs {', '.join(f'{x:.2f}' for x in alone)}), with the publisher {b:.2f} s "
          f"(runs {', '.join(f'{x:.2f}' for x in beside)}): {100 * (b - a) / a:+.2f}%")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--pubs", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-every", type=int, default=30)
    ap.add_argument("--save-mb", type=int, default=64)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--dir", default=HERE)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the prepare part drops to the job user itself (nobody)")
    with tempfile.TemporaryDirectory(dir=a.dir, prefix=".bench-view-") as base:
        os.chmod(base, 0o755)  # the job user's bed is inside
        bench_prepare(os.path.join(base, "prepare"), a.mb, a.pubs)
        bench_publisher(base, a.steps, a.save_every, a.save_mb, a.n)


if __name__ == "__main__":
    main()
