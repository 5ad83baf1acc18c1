"""`dispatch-slurm watch`: publication latency and idle CPU, inotify and polling side by side.

Latency: a save is written as the Hugging Face Trainer writes it (weights, then
trainer_state.json, closed); the clock starts when trainer_state.json is closed and
stops when the running watch prints the publication (it prints after the save is
fsynced and the publication is durable). A warm-up save (not counted) first lets the
watch start; each timed save then waits a random fraction of the poll interval, so
saves do not run in lockstep with the polls (they would all land just after one).
Goal: < 1 s. Idle CPU: utime+stime of a
running watch over an idle window, from /proc/<pid>/stat. Goal: < 1% of a core.

    python benchmarks/bench_watch.py [--saves 50] [--idle 10] [--dir DIR]
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

EPOCH = 1_000_000
GOAL_LATENCY_S, GOAL_IDLE_CPU = 1.0, 0.01


def start(root: str, exec_dir: str, mode_args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "DISPATCH_CHECKPOINT": root, "DISPATCH_EXEC_DIR": exec_dir,
           "DISPATCH_EPOCH": str(EPOCH), "DISPATCH_ATTEMPT": os.path.basename(exec_dir)}
    return subprocess.Popen([sys.executable, "-m", "dispatch_slurm", "watch", *mode_args],
                            env=env, stdout=subprocess.PIPE, text=True)


def save(exec_dir: str, step: int, size: int) -> float:
    d = os.path.join(exec_dir, f"checkpoint-{step}")
    os.mkdir(d)
    header = b'{"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (size, size)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:  # whole: publish refuses a torn one
        f.write(len(header).to_bytes(8, "little") + header + b"\0" * size)
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        f.write(f'{{"global_step": {step}}}')
    return time.monotonic()  # trainer_state.json is closed: the save is complete


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def latency(tmp: str, name: str, mode_args: list[str], n: int, size: int, jitter: float) -> list[float]:
    root = os.path.join(tmp, name)
    exec_dir = os.path.join(root, "exec", f"{name}.1.{EPOCH}")  # an attempt token of epoch EPOCH
    os.makedirs(exec_dir)
    proc = start(root, exec_dir, mode_args)
    out, rng = [], random.Random(0)
    try:
        for step in range(0, n + 1):
            if step:
                time.sleep(rng.uniform(0, jitter))  # de-phase from the polls (not a wait)
            t0 = save(exec_dir, step, size)
            line = proc.stdout.readline()
            if step:
                out.append(time.monotonic() - t0)
            if not line.startswith(f"published step {step} "):
                raise SystemExit(f"{name}: expected the publication of step {step}, got {line!r}")
    finally:
        proc.kill()
        proc.wait()
    return out


def idle_cpu(tmp: str, modes: dict, seconds: float) -> dict[str, float]:
    procs = {}
    for name, args in modes.items():
        root = os.path.join(tmp, f"idle-{name}")
        exec_dir = os.path.join(root, "exec", f"{name}.2.{EPOCH}")
        os.makedirs(exec_dir)
        procs[name] = start(root, exec_dir, args)
        save(exec_dir, 1, 16)
        procs[name].stdout.readline()  # started, scanned, published: now idle
    try:
        before = {k: cpu_seconds(p.pid) for k, p in procs.items()}
        t0 = time.monotonic()
        time.sleep(seconds)  # the measurement window itself
        wall = time.monotonic() - t0
        return {k: (cpu_seconds(p.pid) - before[k]) / wall for k, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--saves", type=int, default=50)
    ap.add_argument("--idle", type=float, default=10.0, help="idle window, seconds")
    ap.add_argument("--size", type=int, default=1 << 20, help="bytes of weights per save")
    ap.add_argument("--interval", type=float, default=0.5, help="poll interval (the CLI default)")
    ap.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    modes = {"inotify": [], "poll": ["--no-inotify", "--poll", str(a.interval)]}
    with tempfile.TemporaryDirectory(dir=a.dir, prefix=".bench-watch-") as tmp:
        lat = {k: latency(tmp, k, v, a.saves, a.size, a.interval) for k, v in modes.items()}
        cpu = idle_cpu(tmp, modes, a.idle)
    print(f"watch: {a.saves} saves of {a.size} bytes each, in {a.dir}; poll interval {a.interval}s")
    print(f"  {'':8} {'latency median':>15} {'max':>9} {'idle CPU':>10}")
    for k in modes:
        print(f"  {k:8} {statistics.median(lat[k]) * 1e3:12.1f} ms {max(lat[k]) * 1e3:6.1f} ms "
              f"{cpu[k] * 100:9.3f}%")
    tick = 1 / os.sysconf("SC_CLK_TCK")
    print(f"  (idle CPU resolution: one {tick * 1e3:g} ms clock tick in {a.idle:g} s = {tick / a.idle * 100:.2f}%)")
    mi, mp = statistics.median(lat["inotify"]), statistics.median(lat["poll"])
    print(f"  poll/inotify median latency ratio: {mp / mi:.1f}x")
    for k in modes:
        worst = max(lat[k])
        print(f"  {k}: max latency {worst:.3f} s = {worst / GOAL_LATENCY_S:.2f} of the {GOAL_LATENCY_S:g} s goal; "
              f"idle CPU {cpu[k] * 100:.3f}% = {cpu[k] / GOAL_IDLE_CPU:.2f} of the 1% goal "
              f"[{'ok' if worst < GOAL_LATENCY_S and cpu[k] < GOAL_IDLE_CPU else 'MISSED'}]")


if __name__ == "__main__":
    main()
