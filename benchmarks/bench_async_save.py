"""The save path against the hardware floor, side by side in one run.

A state of ``--size`` bytes (float32 tensors of ``--tensor-size`` each; on the GPU when
there is one, else in host memory) is saved each way below, ``--repeats`` rounds after one
warm-up round (not counted: first allocations, first page faults), the ways interleaved in
every round so the machine's other load hits all of them alike:

  floor            the raw copy of every tensor into buffers allocated once: on a GPU
                   device-to-host into pinned memory, non_blocking, known done by a CUDA
                   event; on CPU a memcpy into warm pages. What any save must block for.
  torch.save       torch.save into one file, fsync, publish: the disk's floor.
  dcp.save         DCP's synchronous save, then publish.
  dcp.async_save   DCP's default async save (a fresh staging copy each save), published
                   from its upload's completion.
  AsyncSaver       dispatch_slurm.integrations.dcp.AsyncSaver (buffers kept across saves).

Each as *blocking* (what the training loop waits: the whole save for the synchronous ways,
until the call returns for the async ones) and *published* (from the call until the
publication exists), medians over the rounds with their range, and ratios, each the median
of the rounds' own (a round's way against the same round's reference: drift and the
machine's other load hit both alike): blocking to the floor, published to ``dcp.save``'s.
Between two saves the last one is removed and ``os.sync()`` called, outside the timings.
Goals: AsyncSaver blocking <= 2x the floor on a GPU,
<= 1.5x on CPU; its time to published <= 1.1x ``dcp.save``'s. The last line gives the bound
of the second for any async save that copies the state before writing it, (floor +
dcp.save) / dcp.save: about 1.01 where the copy is a GPU's (0.06 s for 3.2 GB) and the write
a disk's (6 s), more on CPU, where a memcpy is a sizeable part of a write.

    python benchmarks/bench_async_save.py --size 1GB [--repeats 5] [--json out.json] [--dir DIR]

On a GPU the same command measures the CUDA path (the state on the device, pinned buffers).

``--dir``: where the checkpoint root goes (default: a temporary folder under $TMPDIR; put
it on the filesystem the checkpoints live on). Nothing is kept: each save is removed once
measured. One process, no torch.distributed.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
WAYS = ("floor", "torch.save", "dcp.save", "dcp.async_save", "AsyncSaver")
GOAL_BLOCKING = {"cuda": 2.0, "cpu": 1.5}
GOAL_PUBLISHED = 1.1


def size(text: str) -> int:
    """``1GB``, ``512MB``, ``4MB``, ``123`` (bytes); binary units."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B") + "B"
    for unit in ("GB", "MB", "KB", "B"):
        if t.endswith(unit) and t[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(t[: -len(unit)]) * UNITS[unit])
    raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1GB, 512MB, 4MB)")


def make_state(total: int, per_tensor: int, device: str) -> dict:
    import torch
    g = torch.Generator().manual_seed(0)
    state, left, i = {}, total, 0
    while left > 0:
        n = max(1, min(per_tensor, left) // 4)
        state[f"t{i}"] = torch.rand(n, generator=g).to(device)
        left, i = left - 4 * n, i + 1
    return state


class Floor:
    """The copy every save must make, into buffers allocated (and touched) once."""

    def __init__(self, state: dict, device: str):
        import torch
        self.torch, self.cuda = torch, device == "cuda"
        self.buffers = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=self.cuda) for k, v in state.items()}
        self.stream = torch.cuda.Stream() if self.cuda else None

    def copy(self, state: dict) -> None:
        torch = self.torch
        if self.stream is None:
            for k, v in state.items():
                self.buffers[k].copy_(v)
            return
        self.stream.wait_stream(torch.cuda.current_stream())  # after the work that made the state
        with torch.cuda.stream(self.stream):
            for k, v in state.items():
                self.buffers[k].copy_(v, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        done.synchronize()


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_once(way: str, ctx: dict, step: int) -> tuple[float, float | None]:
    """One save of ``way``: (blocking s, published s or None)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from dispatch_slurm import store
    from dispatch_slurm.integrations import dcp as ddcp
    state, path = ctx["state"], ddcp.checkpoint_dir(step)
    t0 = time.perf_counter()
    if way == "floor":
        ctx["floor"].copy(state)
        return time.perf_counter() - t0, None
    if way == "torch.save":
        os.makedirs(path)
        torch.save(state, os.path.join(path, "state.pt"))
        fsync_file(os.path.join(path, "state.pt"))
        store.publish(path, step)
        t = time.perf_counter() - t0
        return t, t
    if way == "dcp.save":
        ddcp.save(state, step)
        t = time.perf_counter() - t0
        return t, t
    if way == "dcp.async_save":
        response = dcp.async_save(state, checkpoint_id=path)
        blocking = time.perf_counter() - t0
        upload: Any = getattr(response, "upload_completion", response)
        upload.result()
        ddcp.publish(path, step)
        return blocking, time.perf_counter() - t0
    saver = ctx["saver"]
    saver.save(state, step)
    blocking = time.perf_counter() - t0
    saver.wait()
    return blocking, time.perf_counter() - t0


def measure(ctx: dict, repeats: int) -> dict[str, dict[str, list[float]]]:
    """{way: {"blocking": [...], "published": [...]}}, the warm-up round left out."""
    from dispatch_slurm.integrations import dcp as ddcp
    got: dict[str, dict[str, list[float]]] = {w: {"blocking": [], "published": []} for w in WAYS}
    step = 0
    for r in range(repeats + 1):
        order = WAYS if r % 2 == 0 else tuple(reversed(WAYS))
        for way in order:
            step += 1
            blocking, published = run_once(way, ctx, step)
            shutil.rmtree(ddcp.checkpoint_dir(step), ignore_errors=True)
            os.sync()  # the next save starts with nothing of this one left to write back
            if r > 0:
                got[way]["blocking"].append(blocking)
                if published is not None:
                    got[way]["published"].append(published)
    return got


def paired(ours: list[float], base: list[float]) -> float | None:
    """The median over the rounds of ours / base in the same round: the machine's drift and
    other load hit both sides of each ratio alike."""
    return statistics.median(a / b for a, b in zip(ours, base)) if ours and base else None


def summary(got: dict) -> list[dict]:
    rows = []
    for w in WAYS:
        b, p = got[w]["blocking"], got[w]["published"]
        rows.append({"way": w, "blocking_s": statistics.median(b), "blocking_range_s": [min(b), max(b)],
                     "published_s": statistics.median(p) if p else None,
                     "published_range_s": [min(p), max(p)] if p else None,
                     "blocking_x_floor": paired(b, got["floor"]["blocking"]),
                     "published_x_sync": paired(p, got["dcp.save"]["published"])})
    return rows


def table(rows: list[dict], meta: dict) -> str:
    lines = [f"state {meta['size_bytes'] / (1 << 20):.0f} MiB in {meta['tensors']} tensors on {meta['device']}, "
             f"{meta['repeats']} rounds (medians [min-max]; ratios: median of the rounds' own), torch {meta['torch']}, "
             f"{meta['machine']}, load {meta['load_1m'][0]:.1f} then {meta['load_1m'][1]:.1f}",
             f"{'way':<16}{'blocking s':>24}{'x floor':>9}{'published s':>24}{'x dcp.save':>11}"]
    for r in rows:
        b = f"{r['blocking_s']:.4f} [{r['blocking_range_s'][0]:.4f}-{r['blocking_range_s'][1]:.4f}]"
        p = "-" if r["published_s"] is None else \
            f"{r['published_s']:.3f} [{r['published_range_s'][0]:.3f}-{r['published_range_s'][1]:.3f}]"
        xp = "-" if r["published_x_sync"] is None else f"{r['published_x_sync']:.2f}"
        lines.append(f"{r['way']:<16}{b:>24}{r['blocking_x_floor']:>9.2f}{p:>24}{xp:>11}")
    g = meta["goals"]
    lines.append(f"any async save through a staging copy publishes at best at the copy + dcp.save: "
                 f"{g['published_bound_x_sync']:.2f}x dcp.save in this run")
    lines.append(f"goals: AsyncSaver blocking <= {g['blocking_x_floor']}x floor: {g['blocking_met']}; "
                 f"published <= {g['published_x_sync']}x dcp.save: {g['published_met']}")
    return "\n".join(lines)


def environment(root: str) -> None:
    """This process as one execution of a dispatch-slurm job whose root is ``root``."""
    from dispatch_slurm import store
    attempt, epoch = "bench.1.1000000", 1_000_000
    exec_dir = store.make_exec_dir(root, attempt)
    os.environ.update(DISPATCH_CHECKPOINT=root, DISPATCH_EXEC_DIR=exec_dir, DISPATCH_EPOCH=str(epoch),
                      DISPATCH_ATTEMPT=attempt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=size, default=size("256MB"), help="the state's size (e.g. 1GB, 4MB)")
    ap.add_argument("--tensor-size", type=size, default=size("64MB"), help="each tensor's size")
    ap.add_argument("--repeats", type=int, default=5, help="measured rounds (after one warm-up round)")
    ap.add_argument("--dir", help="where the checkpoint root goes (default: a temporary folder)")
    ap.add_argument("--json", help="write the figures there too")
    a = ap.parse_args(argv)
    load_start = os.getloadavg()[0]
    import torch

    from dispatch_slurm.integrations import dcp as ddcp
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="bench-async-save-", dir=a.dir) as tmp:
        root = os.path.join(tmp, "root")
        os.mkdir(root)
        environment(root)
        state = make_state(a.size, a.tensor_size, device)
        saver = ddcp.AsyncSaver()
        ctx = {"state": state, "floor": Floor(state, device), "saver": saver}
        try:
            got = measure(ctx, a.repeats)
        finally:
            saver.close()
    rows = summary(got)
    ours = next(r for r in rows if r["way"] == "AsyncSaver")
    floor, sync = got["floor"]["blocking"], got["dcp.save"]["published"]
    goals = {"blocking_x_floor": GOAL_BLOCKING[device], "published_x_sync": GOAL_PUBLISHED,
             "published_bound_x_sync": paired([f + s for f, s in zip(floor, sync)], sync),
             "blocking_met": ours["blocking_x_floor"] <= GOAL_BLOCKING[device],
             "published_met": ours["published_x_sync"] <= GOAL_PUBLISHED}
    meta = {"size_bytes": sum(t.numel() * t.element_size() for t in state.values()), "tensors": len(state),
            "device": torch.cuda.get_device_name() if device == "cuda" else f"cpu ({os.cpu_count()} cores)",
            "repeats": a.repeats, "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.node(), "load_1m": [load_start, os.getloadavg()[0]], "date": time.strftime("%Y-%m-%d"),
            "command": " ".join([os.path.basename(sys.argv[0]), *(argv if argv is not None else sys.argv[1:])]),
            "goals": goals}
    print(table(rows, meta), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**meta, "rows": rows, "samples": got}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
