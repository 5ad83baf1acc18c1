"""Bytes on disk over many interruptions, with and without gc (`run --keep-last K`).

On docker-slurm (Slurm 24.11, fast profile), `dispatch-slurm run` supervises a job that
writes a save of --save-mb MB every --interval s (the trial trainer: Hugging Face
layout, rotation like save_total_limit=1) and publishes it. Each execution is
interrupted once it has saved for --run-for s, alternately by `scancel` (the
supervisor resubmits) and `scontrol requeue` (Slurm restarts it, R+1), --interruptions
times. Both modes run the same script: "gc" with `--keep-last K`, "none" without.
Every second the bytes on disk (st_blocks: what a quota counts) of the saves (exec/)
and of the whole root are sampled, with the executions gc may not collect yet
("live": started, and not yet both shown to have ceased, all their nodes' Epilog
records, and quiet for gc's --min-age of 60 s). Sampling stops before the supervisor
does.

Printed: per mode the maximum and final bytes; for gc the bound (K + live) x save
size at every sample and how far the measurement ever went past it. Plotted (PNG):
bytes over time for both modes and the bound.

    python benchmarks/retention_disk.py [--interruptions 20] [--keep-last 2] [--save-mb 50] \\
        [--interval 5] [--run-for 65] [--plot retention_disk.png] [--json retention_disk.json]
"""

import argparse
import json
import os
import shlex
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # the test bed
from dispatch_slurm.supervisor.record import Record  # noqa: E402
from testbed import trial, wait  # noqa: E402
from testbed.cluster import CONTROLLER, Cluster  # noqa: E402

MIN_AGE = 60.0  # the supervisor's gc: Policy's default --min-age


def disk_bytes(path: str) -> int:
    """Bytes on disk under ``path`` (st_blocks), never following a symlink."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return 0
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        total += st.st_blocks * 512
        if e.is_dir(follow_symlinks=False):
            total += disk_bytes(e.path)
    return total


class Run:
    """One mode: a root, the supervisor, the sampler, the interruptions."""

    def __init__(self, c: Cluster, mode: str, a):
        self.c, self.mode, self.a = c, mode, a
        self.base = f"/checkpoints/retention-{mode}-{int(time.time())}"
        self.root = f"{self.base}/root"
        self.host = str(c.path(self.base))
        self.samples: list[tuple[float, int, int, int]] = []  # (t, bytes of saves, live, bytes of the root)
        self.interruptions: list[tuple[float, str]] = []
        self._stop = threading.Event()

    def facts(self, type_: str) -> list[dict]:
        return [f for f in Record(f"{self.host}/root").read() if f["type"] == type_]

    def last_write(self, attempt: str) -> float:
        path = f"{self.host}/logs/{attempt}.jsonl"
        if not os.path.exists(path):
            return 0.0
        with open(path) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        return max((r["t"] for r in lines if r["op"] in ("write", "delete", "publish")), default=0.0)

    def live(self, now: float) -> int:
        """Started executions gc may not collect yet: not shown to have ceased, or not quiet."""
        ceased_dir = f"{self.host}/root/ceased"
        done = set(os.listdir(ceased_dir)) if os.path.isdir(ceased_dir) else set()
        n = 0
        for s in {f["attempt"]: f for f in self.facts("started")}.values():
            ceased = all(f"{s['attempt']}.{node}" in done for node in s["nodes"])
            if not ceased or now - self.last_write(s["attempt"]) < MIN_AGE:
                n += 1
        return n

    def sample(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            saves, total = disk_bytes(f"{self.host}/root/exec"), disk_bytes(f"{self.host}/root")
            self.samples.append((now, saves, self.live(now), total))
            self._stop.wait(1.0)

    def start(self) -> None:
        c, a = self.c, self.a
        c.exec(CONTROLLER, f"mkdir -m 700 -p {self.root} {self.base}/logs", user="alice")
        half = a.save_mb * 1_000_000 // 2
        script = (f"#!/bin/bash\n#SBATCH -o {self.base}/slurm-%j.out -e {self.base}/slurm-%j.err\n"
                  f"srun python3 {trial.IMAGE_WORKLOAD} --mode dispatch --log-dir {self.base}/logs "
                  f"--interval {a.interval} --keep 1 --payload {half}\n")
        c.exec(CONTROLLER, f"cat > {self.base}/job.sh", user="alice", input=script)
        gc = ["--keep-last", str(a.keep_last)] if self.mode == "gc" else []
        argv = ["dispatch-slurm", "run", self.root, "--resubmit", str(a.interruptions + 1), *gc, "--poll", "1",
                "--cessation-interval", "10", "--", "-n1", "-c1", "-p", "normal", f"{self.base}/job.sh"]
        c.exec(CONTROLLER, f"cd {self.base} && setsid nohup {shlex.join(argv)} > {self.base}/sup.log 2>&1 "
                           "< /dev/null &", user="alice")
        threading.Thread(target=self.sample, daemon=True).start()

    def execution(self, seen: set) -> dict:
        """Wait for the next execution to start and save for --run-for seconds."""
        def started():
            new = [f for f in self.facts("started") if (f["job"], f["r"]) not in seen]
            return new[-1] if new else None
        s = wait.until(started, timeout=600, what=f"{self.mode}: the next execution to start", every=1)
        seen.add((s["job"], s["r"]))

        def saved_long_enough():
            path = f"{self.host}/logs/{s['attempt']}.jsonl"
            if not os.path.exists(path):
                return False
            with open(path) as f:
                saves = [json.loads(x)["t"] for x in f if '"op": "publish"' in x]
            return saves and saves[-1] - saves[0] >= self.a.run_for
        wait.until(saved_long_enough, timeout=self.a.run_for + 600, what=f"{self.mode}: {s['attempt']} saving",
                   every=1)
        return s

    def interrupt(self, s: dict, i: int) -> None:
        how = "scancel" if i % 2 == 0 else "requeue"
        if how == "scancel":  # by root, as an admin or a preemption would: the job's own user's means stop
            self.c.exec(CONTROLLER, ["scancel", str(s["job"])])
        else:
            self.c.exec(CONTROLLER, ["scontrol", "requeue", str(s["job"])])
        self.interruptions.append((time.time(), how))
        print(f"{self.mode}: interruption {i + 1}/{self.a.interruptions} ({how}) of {s['attempt']}",
              file=sys.stderr, flush=True)

    def stop(self) -> None:
        self._stop.set()  # what happens once the supervisor is stopped is not gc's to answer for
        folder = f"{self.host}/root/supervisor"
        claims = sorted(x for x in os.listdir(folder) if x.isdigit())
        pid = json.loads(open(f"{folder}/{claims[-1]}").read() or "{}").get("pid")
        if pid:
            self.c.exec(CONTROLLER, ["kill", "-TERM", str(pid)], user="alice", check=False)
        self.c.exec(CONTROLLER, ["scancel", "-u", "alice"], check=False)
        self.c.wait_nodes(lambda ns: all(n.state == {"IDLE"} for n in ns), timeout=240, what="nodes idle")

    def go(self) -> None:
        self.start()
        seen: set = set()
        for i in range(self.a.interruptions):
            self.interrupt(self.execution(seen), i)
        self.execution(seen)  # the last one saves for --run-for too
        self.stop()


def save_size(host_root: str) -> int:
    """Bytes on disk of one complete save (the largest one left)."""
    sizes = []
    for d, dirs, files in os.walk(f"{host_root}/exec"):
        if "trainer_state.json" in files:
            sizes.append(disk_bytes(d))
    return max(sizes)


def summarize(runs: dict, k: int, size: int) -> dict:
    out = {"keep_last": k, "save_bytes": size}
    for mode, r in runs.items():
        t0 = r.samples[0][0]
        row = {"max_bytes": max(b for _, b, _, _ in r.samples), "final_bytes": r.samples[-1][1],
               "max_root_bytes": max(x for _, _, _, x in r.samples),
               "samples": [(round(t - t0, 1), b, live) for t, b, live, _ in r.samples],
               "interruptions": [(round(t - t0, 1), how) for t, how in r.interruptions]}
        if mode == "gc":
            bound = [(k + live) * size for _, _, live, _ in r.samples]
            over = [b - lim for (_, b, _, _), lim in zip(r.samples, bound) if b > lim]
            row.update(max_live=max(live for _, _, live, _ in r.samples), max_bound=max(bound),
                       samples_over_bound=len(over), total_samples=len(bound), max_excess=max(over, default=0))
        out[mode] = row
    return out


def plot(res: dict, path: str) -> None:
    plt = trial.pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    mb = 1e6
    for mode, label in (("none", "no gc"), ("gc", f"run --keep-last {res['keep_last']}")):
        if mode in res:
            xs = [t / 60 for t, _, _ in res[mode]["samples"]]
            ax.plot(xs, [b / mb for _, b, _ in res[mode]["samples"]], label=label)
    if "gc" in res:
        s = res["gc"]["samples"]
        ax.step([t / 60 for t, _, _ in s], [(res["keep_last"] + live) * res["save_bytes"] / mb for _, _, live in s],
                where="post", linestyle="--",
                label=f"bound (K + live executions) x save ({res['save_bytes'] / mb:.0f} MB)")
        for t, _ in res["gc"]["interruptions"]:
            ax.axvline(t / 60, color="grey", linewidth=0.5, alpha=0.5)
    ax.set_xlabel("minutes (grey: interruptions of the gc run: scancel / scontrol requeue, alternately)")
    ax.set_ylabel("MB of saves on disk (exec/)")
    ax.legend(loc="upper left")
    ax.set_title(f"Bytes on disk over {len(res[next(iter(m for m in ('gc', 'none') if m in res))]['interruptions'])} "
                 f"interruptions of a job writing {res['save_bytes'] / mb:.0f} MB saves, with and without gc")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interruptions", type=int, default=20)
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--save-mb", type=int, default=50)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between two saves")
    ap.add_argument("--run-for", type=float, default=65.0, help="seconds each execution saves before it is cut")
    ap.add_argument("--modes", default="gc,none")
    ap.add_argument("--plot", default="retention_disk.png")
    ap.add_argument("--json", default="retention_disk.json")
    a = ap.parse_args()
    if a.plot:
        trial.pyplot()  # refuse before anything runs when matplotlib is missing
    with Cluster("trixie", "fast", log=lambda m: print(m, file=sys.stderr)) as c:
        runs = {}
        for mode in a.modes.split(","):
            runs[mode] = Run(c, mode, a)
            runs[mode].go()
        size = save_size(runs[next(iter(runs))].host + "/root")
        res = summarize(runs, a.keep_last, size)
    mb = 1e6
    print(f"save size on disk: {size / mb:.1f} MB; K = {a.keep_last}; {a.interruptions} interruptions")
    for mode in runs:
        r = res[mode]
        line = (f"{mode:>5}: saves max {r['max_bytes'] / mb:7.1f} MB, final {r['final_bytes'] / mb:7.1f} MB "
                f"(the whole root: max {r['max_root_bytes'] / mb:.1f} MB)")
        if mode == "gc":
            line += (f"; bound (K + live) x save: max {r['max_bound'] / mb:.1f} MB (live at most {r['max_live']}); "
                     f"over the bound in {r['samples_over_bound']}/{r['total_samples']} samples, by at most "
                     f"{r['max_excess'] / mb:.1f} MB")
        print(line)
    if "gc" in res and "none" in res:
        print(f"final bytes, none / gc: {res['none']['final_bytes'] / res['gc']['final_bytes']:.1f}x; "
              f"max: {res['none']['max_bytes'] / res['gc']['max_bytes']:.1f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    if a.plot:
        plot(res, a.plot)
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
