"""publish() against the bare syscalls it needs, side by side in one run.

Bare: open(root), open(pub), open(O_CREAT|O_EXCL|O_NOFOLLOW), close, fsync(pub),
fsync(root). publish() adds the validation (walk to the save, whose save it is, name
encoding, NAME_MAX) and its event line; the save's own fsync is left out of both
(sync=False) as it costs the same either way. Goal: ratio <= 1.3. Runs alternate so drift hits both.

    python benchmarks/bench_publish.py [--n 2000] [--dir DIR]   (DIR on the disk you care about)
"""

import argparse
import os
import statistics
import tempfile
import time

from dispatch_slurm import store
from dispatch_slurm.contract import names

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def bare(root: str, name: str) -> None:
    rfd = os.open(root, DIR)
    pfd = os.open("pub", DIR | os.O_NOFOLLOW, dir_fd=rfd)
    os.close(os.open(name, FLAGS, 0o444, dir_fd=pfd))
    os.fsync(pfd)
    os.fsync(rfd)
    os.close(pfd)
    os.close(rfd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir, prefix=".bench-publish-") as tmp:
        r1, r2 = os.path.join(tmp, "bare"), os.path.join(tmp, "dispatch")
        for r in (r1, r2):
            os.makedirs(os.path.join(r, "pub"))
            os.makedirs(os.path.join(r, "exec", "linux.1.1000000"))
        saves = []
        for i in range(a.n):
            p = os.path.join(r2, "exec", "linux.1.1000000", f"checkpoint-{i}")
            os.mkdir(p)
            saves.append(p)
        t_bare, t_pub = [], []
        for i, save in enumerate(saves):
            name = names.encode(1_000_000, i, f"exec/linux.1.1000000/checkpoint-{i}")
            t0 = time.perf_counter()
            bare(r1, name)
            t1 = time.perf_counter()
            store.publish(save, i, root=r2, epoch=1_000_000, sync=False)
            t2 = time.perf_counter()
            t_bare.append(t1 - t0)
            t_pub.append(t2 - t1)
        mb, mp = statistics.median(t_bare), statistics.median(t_pub)
        fs = os.statvfs(tmp)
        print(f"publish vs bare syscalls, {a.n} publications each, in {a.dir} (f_bsize {fs.f_bsize})")
        print(f"  bare     median {mb * 1e6:9.1f} us   mean {statistics.fmean(t_bare) * 1e6:9.1f} us")
        print(f"  publish  median {mp * 1e6:9.1f} us   mean {statistics.fmean(t_pub) * 1e6:9.1f} us")
        print(f"  ratio    median {mp / mb:.2f}x   mean {statistics.fmean(t_pub) / statistics.fmean(t_bare):.2f}x"
              f"   (goal <= 1.3x)")


if __name__ == "__main__":
    main()
