"""Overlap trials: run an old execution and its replacement at the same time, then
measure from the trainers' own logs what the overlap did.

Metrics (per trial):
  overlap_s     how long the old execution kept writing after it was reported ended
  mixed         save folders written by both executions
  lost          the replacement's saves deleted by the old execution's rotation
  wrong_resume  a later (third) execution resumed from another lineage than the
                replacement's (e.g. the old execution's late, higher-step save)
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field


@dataclass
class Result:
    scenario: str
    mode: str
    overlap_s: float
    mixed: int
    lost: int
    wrong_resume: bool
    resumed_from: str | None = None
    details: dict = field(default_factory=dict)


def read_logs(log_dir: str) -> list[dict]:
    recs = []
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".jsonl"):
            with open(os.path.join(log_dir, name)) as f:
                recs += [json.loads(line) for line in f if line.strip()]
    return sorted(recs, key=lambda r: r["t"])


def analyze(recs: list[dict], old: str, new: str, third: str | None, ended_at: float,
            scenario: str = "", mode: str = "") -> Result:
    """`old`, `new`, `third`: lineage ids; `ended_at`: when the scheduler said old ended."""
    writes_by_folder = defaultdict(set)
    for r in recs:
        if r["op"] == "write":
            writes_by_folder[os.path.dirname(r["path"])].add(r["lineage"])
    mixed = sorted(f for f, who in writes_by_folder.items() if len(who) > 1)
    lost = sorted({r["path"] for r in recs if r["op"] == "delete" and r["lineage"] == old
                   and new in writes_by_folder.get(r["path"], ())})
    old_writes = [r["t"] for r in recs if r["lineage"] == old and r["op"] in ("write", "delete", "publish")]
    overlap = max(0.0, max(old_writes, default=ended_at) - ended_at)
    resumed = next((r for r in recs if r["lineage"] == third and r["op"] in ("resume", "resume_failed")), None)
    from_lineage = resumed.get("from_lineage") if resumed else None
    new_saved = any(r["lineage"] == new and r["op"] == "write" and r["path"].endswith("trainer_state.json")
                    for r in recs)
    # once the replacement has a complete save, any later resume must continue its lineage
    wrong = third is not None and new_saved and from_lineage != new
    return Result(scenario, mode, round(overlap, 3), len(mixed), len(lost), wrong, from_lineage,
                  {"mixed_folders": mixed[:5], "lost_saves": lost[:5],
                   "old_writes_after_end": sum(t > ended_at for t in old_writes)})


def table(results: list[Result]) -> str:
    head = f"{'scenario':<10} {'mode':<9} {'overlap':>8} {'mixed':>6} {'lost':>5} {'wrong resume':>13}"
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(f"{r.scenario:<10} {r.mode:<9} {r.overlap_s:7.1f}s {r.mixed:>6} {r.lost:>5} "
                    f"{'YES' if r.wrong_resume else 'no':>13}")
    return "\n".join(rows)


# ---- local trials: processes on this machine stand in for Slurm executions ----------

def _wait_saves(log: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(log):
            with open(log) as f:
                if sum('"op": "write"' in line and "trainer_state" in line for line in f) >= n:
                    return
        time.sleep(0.02)
    raise TimeoutError(f"{log}: fewer than {n} saves within {timeout}s")


def run_local(mode: str, base: str, interval: float = 0.2, overlap: float = 1.5,
              warmup: float = 0.6) -> Result:
    """Old execution saves; 'the scheduler' reports it ended and starts a replacement
    (which loads for `warmup` s after choosing its resume point) while the old one
    keeps saving for `overlap` seconds (its grace window); both stop; then a third
    execution resumes."""
    root, logs = os.path.join(base, "root"), os.path.join(base, "logs")
    os.makedirs(root)
    common = ["--mode", mode, "--log-dir", logs, "--interval", str(interval), "--keep", "2"]
    if mode == "naive":
        common += ["--dir", os.path.join(root, "shared")]

    def start(job: str, n: int, max_saves: int = 0, wait: float = 0.0):
        env = {**os.environ, "SLURM_JOB_ID": job, "SLURM_CLUSTER_NAME": "local",
               "DISPATCH_CHECKPOINT": root, "DISPATCH_SUBMISSION": str(n)}
        from . import env as envmod, store
        env.update(envmod.compute(env))
        store.make_exec_dir(root, env["DISPATCH_ATTEMPT"])
        lineage = env["DISPATCH_ATTEMPT"] if mode == "dispatch" else f"{job}.0"
        extra = ["--max-saves", str(max_saves)] * bool(max_saves) + ["--warmup", str(wait)]
        proc = subprocess.Popen([sys.executable, "-m", "dispatch_slurm.workload", *common, *extra], env=env)
        return proc, lineage

    old, old_id = start("101", 1)
    _wait_saves(os.path.join(logs, f"{old_id}.jsonl"), 3)
    ended_at = time.time()  # the scheduler says: ended. The process disagrees.
    new, new_id = start("102", 2, wait=warmup)
    deadline = time.monotonic() + overlap
    while time.monotonic() < deadline and old.poll() is None:
        time.sleep(0.02)
    old.send_signal(signal.SIGKILL)
    old.wait()
    _wait_saves(os.path.join(logs, f"{new_id}.jsonl"), 1)
    new.send_signal(signal.SIGKILL)
    new.wait()
    third, third_id = start("103", 3, max_saves=1)
    third.wait(60)
    return analyze(read_logs(logs), old_id, new_id, third_id, ended_at, "local", mode)


def demo_local() -> list[Result]:
    import tempfile
    results = []
    for mode in ("naive", "dispatch"):
        with tempfile.TemporaryDirectory(prefix=f"dispatch-demo-{mode}-") as base:
            results.append(run_local(mode, base))
    return results


if __name__ == "__main__":
    res = demo_local()
    print(table(res))
    print(json.dumps([asdict(r) for r in res], indent=1))
