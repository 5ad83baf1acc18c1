"""latest() over 10^5 and 10^6 publications against a bare os.scandir listing.

latest() must parse every entry (a skipped bad entry could be the latest); the bulk
validator in names.all_valid() does that in C-level passes. The per-entry parse()
loop is shown too, for scale. Goal: latest <= 2x the bare listing.
The 10^6 folder takes ~30 s to create once; --keep DIR reuses it across runs.

    python benchmarks/bench_latest.py [--sizes 100000 1000000] [--keep DIR] [--rounds 3]
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

from dispatch_slurm import store
from dispatch_slurm.contract import names


def populate(root: str, n: int) -> None:
    pub = os.path.join(root, "pub")
    os.makedirs(pub, exist_ok=True)
    if len(os.listdir(pub)) == n:
        return
    shutil.rmtree(pub)
    os.mkdir(pub)
    fd = os.open(pub, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):  # 7 executions (one per epoch), realistic save paths
            e = 1_000_000 + i % 7
            os.close(os.open(names.encode(e, i, f"exec/linux.{1000 + i % 7}.{e}/checkpoint-{i}"),
                             os.O_CREAT | os.O_WRONLY, 0o444, dir_fd=fd))
    finally:
        os.close(fd)
    os.makedirs(os.path.join(root, "epochs"), exist_ok=True)
    for k in range(7):  # each epoch's claim, as env made it: latest() reads the latest's
        with open(os.path.join(root, "epochs", names.claim_name(1_000_000 + k)), "w") as f:
            f.write(f"linux.{1000 + k}.{1_000_000 + k}\n")


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--keep", help="folder to keep the populated roots in (reused next time)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base = a.keep or tempfile.mkdtemp(prefix=".bench-latest-", dir=os.path.dirname(os.path.abspath(__file__)))
    try:
        print(f"latest() vs bare os.scandir, median of {a.rounds} alternating rounds, in {base}")
        print(f"  {'entries':>9}  {'scandir':>9}  {'latest':>9}  {'ratio':>6}  {'per-entry parse':>16}  {'ratio':>6}")
        for n in a.sizes:
            root = os.path.join(base, f"r{n}")
            populate(root, n)
            pub = os.path.join(root, "pub")
            listing, fast, slow = [], [], []
            for _ in range(a.rounds):
                listing.append(timed(lambda: [e.name for e in os.scandir(pub)]))
                fast.append(timed(lambda: store.latest(root)))
                slow.append(timed(lambda: max(names.parse(e) for e in os.listdir(pub))))
            b, f, s = (statistics.median(x) for x in (listing, fast, slow))
            print(f"  {n:>9,}  {b:8.3f}s  {f:8.3f}s  {f / b:5.2f}x  {s:15.3f}s  {s / b:5.2f}x")
        print("  goal: latest <= 2x scandir")
    finally:
        if not a.keep:
            shutil.rmtree(base)


if __name__ == "__main__":
    main()
