"""What a resume copy costs, each way of making it, side by side in one run.

An execution resumes from its own copy of the published save (store/copies.py), made so that
no write through it reaches the published save: clones (FICLONE) where the filesystem makes
them, else hard links to the published, read-only files, or (for root, whom a file's mode does
not stop) a copy of the data. For a save shaped like a Hugging Face checkpoint (``--mb`` MiB in
a safetensors-sized model and a twice-as-large optimizer, plus small files), each way: the
median time of one copy and the bytes it takes on disk (free blocks before and after), on the
folder given (``--dir``, default this one: ext4 here, where no clone is made) and, with ``--xfs``
(root: a loop-mounted XFS image with reflinks, made and removed here), on XFS.

    python benchmarks/bench_resume_copy.py [--mb 1024] [--n 5] [--dir DIR] [--xfs]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from dispatch_slurm.store.durable import Linker, link_tree, open_dir, remove_tree


def make_save(path: str, mb: int) -> None:
    os.makedirs(path)
    for name, size in (("model.safetensors", mb // 3), ("optimizer.pt", mb - mb // 3)):
        with open(os.path.join(path, name), "wb") as f:
            for _ in range(size):
                f.write(os.urandom(1 << 20))
            os.fsync(f.fileno())
    for name in ("trainer_state.json", "config.json", "scheduler.pt", "rng_state.pth"):
        with open(os.path.join(path, name), "wb") as f:
            f.write(b"{}" * 500)


def way(kind: str) -> Linker:
    how = Linker(clone=kind == "clone")
    how.copy = kind == "copy"
    return how


def measure(folder: str, kinds: list[str], mb: int, n: int) -> None:
    with tempfile.TemporaryDirectory(dir=folder, prefix=".bench-copy-") as tmp:
        make_save(os.path.join(tmp, "save"), mb)
        src = open_dir(tmp)
        try:
            for kind in kinds:
                times, used, made = [], [], None
                for i in range(n):
                    os.sync()
                    free = shutil.disk_usage(tmp).free
                    how = way(kind)
                    t0 = time.perf_counter()
                    link_tree("save", src, "copy", src, how)
                    if kind == "copy":
                        os.sync()  # the data written, as a resume that reads it back would need
                    times.append(time.perf_counter() - t0)
                    os.sync()
                    used.append(free - shutil.disk_usage(tmp).free)
                    made = (how.cloned, how.linked, how.copied)
                    remove_tree("copy", src)
                if kind == "clone" and made and not made[0]:
                    print(f"  clone    none made on {folder}: the filesystem makes no clone (links instead)")
                    continue
                print(f"  {kind:8s} median {statistics.median(times) * 1e3:9.2f} ms   "
                      f"disk {statistics.median(used) / 2**20:9.2f} MiB   (cloned, linked, copied bytes) {made}")
        finally:
            os.close(src)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--xfs", action="store_true", help="also on a loop-mounted XFS image with reflinks (root)")
    a = ap.parse_args()
    print(f"a resume copy of a {a.mb} MiB save (6 files), {a.n} times each way, in {a.dir}")
    measure(a.dir, ["link", "copy", "clone"], a.mb, a.n)
    if a.xfs:
        with tempfile.TemporaryDirectory(dir=a.dir, prefix=".bench-xfs-") as tmp:
            img, mnt = os.path.join(tmp, "xfs.img"), os.path.join(tmp, "mnt")
            os.mkdir(mnt)
            with open(img, "wb") as f:
                f.truncate((3 * a.mb + 512) << 20)
            subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", img], check=True)
            subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
            try:
                print(f"the same on XFS with reflinks ({mnt})")
                measure(mnt, ["link", "copy", "clone"], a.mb, a.n)
            finally:
                subprocess.run(["umount", mnt], check=True)


if __name__ == "__main__":
    main()
