"""publish() against the bare syscalls it needs, side by side in one run.

Bare: open(root), open(pub), open(O_CREAT|O_EXCL|O_NOFOLLOW), close, fsync(pub),
fsync(root). publish() adds the validation (walk to the save, whose save it is, name
encoding, NAME_MAX, the epoch's claim, the write-once record, each file whole) and its event
line; the save's own fsync is left out of both (sync=False) as it costs the same either way.
Goal: ratio <= 1.1. The kinds run in turn, one operation each, so drift hits each, and each
starts from a clean filesystem (an untimed ``os.sync()``): an fsync commits the filesystem's
whole journal, so an operation would otherwise pay for what the one before it left unflushed
(publish's event line, which in a job the trainer's next save flushes). On a shared machine
the fsyncs' time swings by 10x from minute to minute, and the ratio of medians with it; what
publish adds is also shown as the difference of the medians, wall and CPU (user+system, which an
fsync's wait does not count): that stays put. The same script measures e1361b3, the reference
figure, whose publish took (root, save, step, epoch).

publish runs as in a job ($DISPATCH_CHECKPOINT is its root): the events file of the
execution's own root is kept open between lines.

The floor: the system calls today's contract makes on top of the bare ones, written out with
no code around them (the save opened from the root and its real path read back, the epoch's
claim looked at, the save listed, the ``published`` event line appended on a kept fd, once
the fd and the file's path are checked to be one file). ``publish / floor`` is
what the package's own code costs; ``floor / bare`` is what the contract costs since e1361b3
(the claim, the whole-file check, the event), whatever code makes those calls.

Then the check that every file of a save is whole (store/whole.py: a torn torch.save zip or
safetensors file is never published), on a save shaped like a Hugging Face checkpoint (a
safetensors model, torch.save'd optimizer, scheduler and RNG state, JSON files): the save's
fsync walk (what publish ran before the check) and the check alone, alternating. The files
are already on disk, so the fsyncs are cheap and the check's share is the largest it gets.
Goal: ratio <= 1.1.

``--without PART`` (repeatable) replaces one part of publish with nothing, to show what it
costs: ``event`` (the published event line), ``claim`` (reading the epoch's claim), ``walk``
(the save's walk and whole-file check), ``once`` (recording the save as published, with its
real path). For measuring only: a publish without them breaks the contract.

    python benchmarks/bench_publish.py [--n 2000] [--dir DIR] [--without PART ...]   (DIR on the disk you care about)
"""

import argparse
import importlib
import io
import json
import os
import statistics
import tempfile
import time
from typing import Any

from dispatch_slurm import store

try:
    from dispatch_slurm.contract import names
except ImportError:  # e1361b3, before the package had layers
    from dispatch_slurm import names  # type: ignore[no-redef]

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


_kept: dict[str, int] = {}  # the floor's events fd, kept as publish keeps its own execution's


def floor(root: str, rel: str, name: str, claim: str, line: bytes) -> None:
    """The contract's system calls alone (see the module doc); ``line``: the event, made before."""
    rfd = os.open(root, DIR)
    try:
        os.stat(rel, dir_fd=rfd, follow_symlinks=False)
        sfd = os.open(rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=rfd)
        os.readlink(f"/proc/self/fd/{rfd}")
        os.readlink(f"/proc/self/fd/{sfd}")
        efd = os.open("epochs", DIR | os.O_NOFOLLOW, dir_fd=rfd)
        os.stat(claim, dir_fd=efd, follow_symlinks=False)
        os.close(efd)
        os.listdir(f"/proc/self/fd/{sfd}")
        os.close(sfd)
        pfd = os.open("pub", DIR | os.O_NOFOLLOW, dir_fd=rfd)
        os.close(os.open(name, FLAGS, 0o444, dir_fd=pfd))
        os.fsync(pfd)
        os.fsync(rfd)
        os.close(pfd)
        events = os.path.join(root, "events", "floor.jsonl")
        if events not in _kept:
            efd = os.open("events", DIR | os.O_NOFOLLOW, dir_fd=rfd)
            _kept[events] = os.open("floor.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW |
                                    os.O_CLOEXEC, 0o644, dir_fd=efd)
            os.close(efd)
        os.fstat(_kept[events])
        os.stat(events, follow_symlinks=False)
        os.write(_kept[events], line)
    finally:
        os.close(rfd)


def leave_out(part: str) -> None:
    """Replace one part of publish with nothing (``--without``)."""
    pub = importlib.import_module("dispatch_slurm.store.publish")
    from dispatch_slurm.store import posix
    nothing = staticmethod(lambda *a, **k: None)
    keep = staticmethod(lambda *a, **k: (None, []))
    if part == "held":
        posix.PosixStore.keep = keep  # type: ignore[method-assign,assignment]
        posix.PosixStore.release = nothing  # type: ignore[method-assign,assignment]
        return
    where = {"event": [(pub.events, "record")], "claim": [(pub.epochs, "for_publication")],
             "walk": [(posix.PosixStore, "sync_save")],
             "once": [(pub.once, "published"), (posix.PosixStore, "realpath")]}[part]
    for owner, name in where:
        setattr(owner, name, nothing)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--model-mb", type=int, default=64, help="the weights of the save the whole check walks")
    ap.add_argument("--without", action="append", default=[], choices=["event", "claim", "walk", "once", "held"],
                    help="leave this part of publish out, to show its cost (repeatable; skips the whole-file part)")
    a = ap.parse_args()
    for part in a.without:
        leave_out(part)
    with tempfile.TemporaryDirectory(dir=a.dir, prefix=".bench-publish-") as tmp:
        r1, r2, r3 = os.path.join(tmp, "bare"), os.path.join(tmp, "dispatch"), os.path.join(tmp, "floor")
        for r in (r1, r2, r3):
            os.makedirs(os.path.join(r, "pub"))
            os.makedirs(os.path.join(r, "exec", "linux.1.1000000"))
        os.makedirs(os.path.join(r3, "events"))
        os.makedirs(os.path.join(r3, "epochs"))
        claim = f"{1_000_000:020d}"
        with open(os.path.join(r3, "epochs", claim), "w") as f:
            f.write("linux.1.1000000\n")
        saves = []
        for i in range(a.n):
            p = os.path.join(r2, "exec", "linux.1.1000000", f"checkpoint-{i}")
            for folder in (p, os.path.join(r3, "exec", "linux.1.1000000", f"checkpoint-{i}")):
                os.mkdir(folder)
                os.close(os.open(os.path.join(folder, "w"), os.O_CREAT | os.O_WRONLY, 0o644))  # a save holds a file
            saves.append(p)
        layered = hasattr(store, "at")
        os.environ["DISPATCH_CHECKPOINT"] = r2  # publish as in a job: its own root's events file kept open
        e1361b3_publish: Any = store.publish  # publish(root, save, step, epoch) there

        def ours(i: int) -> None:
            if layered:
                store.publish(saves[i], i, root=r2, epoch=1_000_000, sync=False)
            else:
                e1361b3_publish(r2, saves[i], i, 1_000_000)

        def floor_of(i: int) -> None:
            rel = f"exec/linux.1.1000000/checkpoint-{i}"
            name = names.encode(1_000_000, i, rel)
            line = (json.dumps({"v": 1, "t": time.time(), "type": "published", "job": None,
                                "attempt": "linux.1.1000000", "epoch": None, "host": "h", "pid": os.getpid(),
                                "step": i, "path": rel, "name": name, "by": "publish", "existed": False},
                               separators=(",", ":")) + "\n").encode()
            floor(r3, rel, name, claim, line)

        def bare_of(i: int) -> None:
            bare(r1, names.encode(1_000_000, i, f"exec/linux.1.1000000/checkpoint-{i}"))

        # One of each in turn, each from a clean filesystem: an fsync commits the filesystem's
        # whole journal, so an operation would otherwise pay for what the one before it left
        # unflushed (publish's event line); os.sync() before each, not timed, flushes it
        runs: dict[str, tuple[list[float], list[float]]] = {"bare": ([], []), "publish": ([], []), "floor": ([], [])}
        kinds = {"bare": bare_of, "publish": ours, "floor": floor_of}
        for i in range(a.n):
            for kind, fn in kinds.items():
                wall, cpu = runs[kind]
                os.sync()
                c0, t0 = time.process_time(), time.perf_counter()
                fn(i)
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - t0)
        med = {k: (statistics.median(w), statistics.median(c)) for k, (w, c) in runs.items()}
        (mb, cb), (mp, cp), (mf, _) = med["bare"], med["publish"], med["floor"]
        fs = os.statvfs(tmp)
        print(f"publish vs bare syscalls, {a.n} publications each, in {a.dir} (f_bsize {fs.f_bsize})" + (f", without {', '.join(a.without)}" if a.without else ""))
        for kind in ("bare", "publish"):
            wall, cpu = runs[kind]
            print(f"  {kind:8s} median {med[kind][0] * 1e6:9.1f} us   mean {statistics.fmean(wall) * 1e6:9.1f} us"
                  f"   CPU median {med[kind][1] * 1e6:7.1f} us")
        print(f"  ratio    median {mp / mb:.2f}x   mean {statistics.fmean(runs['publish'][0]) / statistics.fmean(runs['bare'][0]):.2f}x"
              f"   (goal <= 1.1x)")
        print(f"  floor    median {mf * 1e6:9.1f} us   (the contract's system calls alone)")
        print(f"  ratio    publish / floor {mp / mf:.2f}x   floor / bare {mf / mb:.2f}x")
        print(f"  publish adds (difference of the medians): {(mp - mb) * 1e6:.1f} us wall, {(cp - cb) * 1e6:.1f} us CPU")
        if layered and not a.without:
            whole_check(tmp, max(50, a.n // 10), a.model_mb)
            if hasattr(store.Store, "keep"):
                held_links(tmp, max(50, a.n // 10), a.model_mb)


def hf_like_save(path: str, model_mb: int) -> None:
    """A checkpoint folder as the Trainer writes it, with real formats (torch.save's zip when
    torch is installed, else a zip of the same shape)."""
    os.makedirs(path)
    data = os.urandom(model_mb * 2**20)
    header = json.dumps({"w": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + data)
    for name, size in (("optimizer.pt", 2 * len(data)), ("scheduler.pt", 1000), ("rng_state.pth", 15000),
                       ("training_args.bin", 5000)):
        with open(os.path.join(path, name), "wb") as f:
            f.write(_zip_bytes(size))
    for name in ("trainer_state.json", "config.json", "generation_config.json"):
        with open(os.path.join(path, name), "w") as f:
            json.dump({"global_step": 1}, f)


def _zip_bytes(size: int) -> bytes:
    try:
        import torch
        buf = io.BytesIO()
        torch.save({"w": torch.zeros(size // 4, dtype=torch.float32)}, buf)
        return buf.getvalue()
    except ImportError:
        import zipfile
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("archive/data/0", b"\0" * size)
        return buf.getvalue()


def whole_check(tmp: str, n: int, model_mb: int) -> None:
    """The check's added time, measured apart from the fsyncs it rides along with (their time
    varies far more than the check's): publish's walk is the fsync walk plus, per file, the
    check; the walk with the check alone (fsync=False) is that added time, and a little more
    (its own walk down the save)."""
    from dispatch_slurm.store.durable import open_dir, sync_tree
    root = os.path.join(tmp, "check")
    rel = "exec/linux.1.1000000/checkpoint-1"
    hf_like_save(os.path.join(root, rel), model_mb)
    st = store.at(root)
    parent = open_dir(os.path.join(root, "exec", "linux.1.1000000"))
    t_fsync, t_check = [], []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            sync_tree("checkpoint-1", parent)  # publish's walk before the check: every file and folder fsynced
            t1 = time.perf_counter()
            st.sync_save(rel, os.path.join(root, rel), fsync=False)  # the check alone: each file whole?
            t2 = time.perf_counter()
            t_fsync.append(t1 - t0)
            t_check.append(t2 - t1)
    finally:
        os.close(parent)
    mf, mc = statistics.median(t_fsync), statistics.median(t_check)
    print(f"the whole-file check of a Hugging Face-shaped save ({len(os.listdir(os.path.join(root, rel)))} files, "
          f"{model_mb} MiB of weights), {n} times each")
    print(f"  fsync walk (before)  median {mf * 1e6:9.1f} us")
    print(f"  check alone          median {mc * 1e6:9.1f} us")
    print(f"  ratio    (fsync walk + check) / fsync walk {(mf + mc) / mf:.3f}x   (goal <= 1.1x)")


def held_links(tmp: str, n: int, model_mb: int) -> None:
    """The publication's own links to a Hugging Face-shaped save (``held/<name>``: a folder, a
    hard link and a chmod per file, two fsyncs), against the fsync walk publish makes anyway;
    and what they add to the filesystem: inodes (the folder only: a link is no inode) and bytes."""
    from dispatch_slurm.store.durable import open_dir, remove_tree, sync_tree
    root = os.path.join(tmp, "held")
    rel = "exec/linux.1.1000000/checkpoint-1"
    hf_like_save(os.path.join(root, rel), model_mb)
    st, name = store.at(root), names.encode(1_000_000, 1, rel)
    parent = open_dir(os.path.join(root, "exec", "linux.1.1000000"))
    t_fsync, t_keep = [], []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            sync_tree("checkpoint-1", parent)
            t1 = time.perf_counter()
            st.keep(rel, name)
            t2 = time.perf_counter()
            t_fsync.append(t1 - t0)
            t_keep.append(t2 - t1)
            if i == 0:
                sv = os.statvfs(root)
                inodes, free = sv.f_files - sv.f_ffree, sv.f_bfree * sv.f_frsize
            if i < n - 1:
                remove_tree(name, open_dir(os.path.join(root, "held")))
        sv = os.statvfs(root)
        remove_tree(name, open_dir(os.path.join(root, "held")))
        after = os.statvfs(root)
    finally:
        os.close(parent)
    mf, mk = statistics.median(t_fsync), statistics.median(t_keep)
    files = len(os.listdir(os.path.join(root, rel)))
    print(f"the held links of a Hugging Face-shaped save ({files} files, {model_mb} MiB of weights), {n} times each")
    print(f"  fsync walk           median {mf * 1e6:9.1f} us")
    print(f"  held links           median {mk * 1e6:9.1f} us")
    print(f"  ratio    (fsync walk + held) / fsync walk {(mf + mk) / mf:.3f}x")
    print(f"  per publication: {(sv.f_files - sv.f_ffree) - (after.f_files - after.f_ffree)} inode(s) "
          f"(the folder; {files} links), {max(0, after.f_bfree - sv.f_bfree) * sv.f_frsize} bytes on disk")


if __name__ == "__main__":
    main()
