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
from dataclasses import dataclass, field

from dispatch_slurm.errors import DispatchError

from . import wait

#: the trial trainer, run by path (jobs on the nodes see only dispatch_slurm installed)
WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workload.py")
#: where docker-slurm's image has it (docker-slurm/Dockerfile copies the checkout to /src)
IMAGE_WORKLOAD = "/src/dispatch-slurm/tests/testbed/workload.py"


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
    # the moment the replacement chose its resume point (it logs "start" just before)
    chose = next((r["t"] for r in recs if r["lineage"] == new and r["op"] == "start"), None)
    # how soon after Slurm said "ended" the replacement ran (resubmission or Slurm's requeue)
    started = round(chose - ended_at, 3) if chose is not None else None
    resumed = next((r for r in recs if r["lineage"] == third and r["op"] in ("resume", "resume_failed")), None)
    from_lineage = resumed.get("from_lineage") if resumed else None
    new_saved = any(r["lineage"] == new and r["op"] == "write" and r["path"].endswith("trainer_state.json")
                    for r in recs)
    # once the replacement has a complete save, any later resume must continue its lineage
    wrong = third is not None and new_saved and from_lineage != new
    timeline = {who: [round(r["t"] - ended_at, 3) for r in recs if r["lineage"] == lin and r["op"] in
                        ("write", "delete")] for who, lin in (("old", old), ("new", new), ("third", third)) if lin}
    return Result(scenario, mode, round(overlap, 3), len(mixed), len(lost), wrong, from_lineage,
                  {"mixed_folders": mixed[:5], "lost_saves": lost[:5], "replacement_started_s": started,
                   "old_writes_after_end": sum(t > ended_at for t in old_writes),
                   # > 0: a real race, the old execution wrote after the replacement chose where to resume
                   "old_writes_after_new_chose": sum(chose is not None and t > chose for t in old_writes),
                   "lineages": {"old": old, "new": new, "third": third}, "timeline": timeline})


def table(results: list[Result]) -> str:
    head = f"{'scenario':<10} {'mode':<9} {'overlap':>8} {'mixed':>6} {'lost':>5} {'wrong resume':>13}"
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(f"{r.scenario:<10} {r.mode:<9} {r.overlap_s:7.1f}s {r.mixed:>6} {r.lost:>5} "
                    f"{'YES' if r.wrong_resume else 'no':>13}")
    return "\n".join(rows)


# ---- local trials: processes on this machine stand in for Slurm executions ----------

def _wait_saves(log: str, n: int, timeout: float = 60) -> None:
    def saved() -> bool:
        if not os.path.exists(log):
            return False
        with open(log) as f:
            return sum('"op": "write"' in line and "trainer_state" in line for line in f) >= n
    wait.until(saved, timeout=timeout, what=f"{n} saves in {log}", every=0.02)


def run_local(mode: str, base: str, interval: float = 0.2, warmup: float = 0.6,
              overlap: float | None = None) -> Result:
    """Old execution saves; 'the scheduler' reports it ended and starts a replacement
    (which loads for `warmup` s after choosing its resume point) while the old one
    keeps saving for `overlap` seconds (its grace window); both stop; then a third
    execution resumes. The overlap defaults to 7.5 save intervals."""
    overlap = 7.5 * interval if overlap is None else overlap
    root, logs = os.path.join(base, "root"), os.path.join(base, "logs")
    os.makedirs(root)
    common = ["--mode", mode, "--log-dir", logs, "--interval", str(interval), "--keep", "2"]
    if mode == "naive":
        common += ["--dir", os.path.join(root, "shared")]

    def start(job: str, n: int, max_saves: int = 0, wait: float = 0.0):
        env = {**os.environ, "SLURM_JOB_ID": job, "SLURM_CLUSTER_NAME": "local",
               "DISPATCH_CHECKPOINT": root, "DISPATCH_SUBMISSION": str(n)}
        from dispatch_slurm import store
        from dispatch_slurm.contract import env as envmod
        env.update(envmod.compute(env))
        store.make_exec_dir(root, env["DISPATCH_ATTEMPT"])
        lineage = env["DISPATCH_ATTEMPT"] if mode == "dispatch" else f"{job}.0"
        extra = ["--max-saves", str(max_saves)] * bool(max_saves) + ["--warmup", str(wait)]
        proc = subprocess.Popen([sys.executable, WORKLOAD, *common, *extra], env=env)
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


# ---- cluster trials: real Slurm executions overlap ---------------------------------------

SCENARIOS = ("cancel", "preempt", "partition")
#: requeue scenarios: Slurm itself restarts the job (restart count +1), no resubmission.
#: expedite: like partition, but the job asks for ``--requeue=expedite`` (Slurm 25.11+, with
#: SlurmctldParameters=enable_expedited_requeue): restarted at once (BeginTime 0, top of
#: the queue) instead of after the requeue delay (cred_expire + 1 s: 11 s fast, 121 s by default).
REQUEUES = ("partition", "expedite")
DEADLINE = {"fast": 180.0, "site": 3600.0, "vm": 300.0}  # site: SlurmdTimeout=300, requeue delay 121 s, slow re-registration


class DockerTarget:
    """A test bed (testbed.bed.Bed: docker-slurm's containers or the QEMU VMs): every
    fault is available, and the test user's jobs and files are reachable from this machine."""

    workload = IMAGE_WORKLOAD

    def __init__(self, cluster, user: str = "alice"):
        self.c, self.user = cluster, user
        self.slurm = cluster.slurm_as(user)
        self.profile = cluster.profile
        self.nodes = list(cluster.node_names)

    def host_path(self, path: str) -> str:
        return str(self.c.path(path))

    def mkdir(self, path: str) -> None:
        self.c.exec(self.nodes[0], f"mkdir -p {path} && chmod 700 {path}", user=self.user)

    def submit(self, script: str, args: list[str]) -> int:
        return self.slurm.submit(args, script=script)

    def unpin(self, job_id: int) -> None:
        """Let a requeued job pinned to a node (-w) restart anywhere (Slurm accepts the
        change only while the job is pending)."""
        self.c.exec("ctl", ["scontrol", "update", f"jobid={job_id}", "ReqNodeList="])

    def release(self) -> str:
        return self.c.slurm_release

    def preempt(self, node: str) -> int:
        return self.c.submit("bob", args=["-p", "high", "-w", node, "--exclusive", "-o", "/dev/null",
                                          "--wrap", "sleep 3600"])

    def cancel(self, job_id: int, user: str | None = None) -> None:
        self.c.cancel(job_id, user=user)

    def partition(self, node: str) -> None:
        self.c.partition(node)

    def heal(self, node: str) -> None:
        self.c.heal(node)

    def alive(self, node: str, marker: str) -> bool:
        return bool(self.c.pids(node, marker))


class SlurmTarget:
    """Any cluster the user can sbatch to, through the local Slurm CLI: cancel and
    preempt (a high-priority partition must exist); a partition needs node access."""

    workload = WORKLOAD  # this checkout's: it must be on a filesystem the nodes share

    def __init__(self, slurm, nodes: list[str], profile: str = "site", preempt_partition: str = "high"):
        self.slurm, self.nodes, self.profile = slurm, nodes, profile
        self.preempt_partition = preempt_partition

    def host_path(self, path: str) -> str:
        return path

    def mkdir(self, path: str) -> None:
        os.makedirs(path, mode=0o700, exist_ok=True)

    def submit(self, script: str, args: list[str]) -> int:
        return self.slurm.submit(args, script=script)

    def unpin(self, job_id: int) -> None:
        self.slurm.run(["scontrol", "update", f"jobid={job_id}", "ReqNodeList="])

    def release(self) -> str:
        return ""  # unknown: sbatch says whether it knows --requeue=expedite

    def preempt(self, node: str) -> int:
        return self.slurm.submit(["-p", self.preempt_partition, "-w", node, "--exclusive", "-o", "/dev/null",
                                  "--wrap", "sleep 3600"])

    def cancel(self, job_id: int, user: str | None = None) -> None:
        self.slurm.cancel(job_id)

    def partition(self, node: str) -> None:
        raise DispatchError("the partition scenario needs the docker-slurm target (it cuts a node's network)")

    heal = partition

    def alive(self, node: str, marker: str) -> bool | None:
        return None  # unknown from a login node: the trainers' logs decide


def _poll(probe, timeout: float, what: str):
    return wait.until(probe, timeout=timeout, what=f"trial: {what}")


def _lineage(recs: list[dict], job: int, restart: int | None = None) -> str | None:
    for r in recs:
        if r["op"] == "start" and str(r.get("job")) == str(job) and (restart is None or r.get("restart") == restart):
            return r["lineage"]
    return None


def _saves(recs: list[dict], lineage: str | None) -> int:
    return sum(r["op"] == "write" and r["lineage"] == lineage and r["path"].endswith(STATE) for r in recs)


STATE = "trainer_state.json"


def cluster_trial(t, scenario: str, modes: tuple[str, ...], base: str, interval: float = 1.0,
                  warmup: float = 3.0, log=print, ahead: bool = False) -> list[Result]:
    """One trial of `scenario` for every mode, side by side on the same node.

    ``ahead`` (cancel, preempt): each replacement is submitted and running before the trigger,
    held before it chooses its resume point until Slurm reports the old execution ended, so that
    it chooses while the old one still writes (within KillWait) however long scheduling and
    start-up take on a loaded machine: a race arranged, not hoped for. Without it, a replacement
    is submitted when Slurm reports the end, as a user or a supervisor does (the figures of
    ``python -m testbed trial``)."""
    node = t.nodes[-1]
    limit = DEADLINE.get(t.profile, 1200.0)
    part = "scavenger" if scenario == "preempt" else "normal"  # scavenger: PreemptMode=CANCEL
    requeue = scenario in REQUEUES
    expedite = scenario == "expedite"
    if expedite and t.release() and tuple(map(int, t.release().split("."))) < (25, 11):
        raise DispatchError(f"the expedite scenario needs Slurm 25.11 or later (--requeue=expedite), not "
                            f"{t.release()}: --suite sid")
    dirs, old, new, third = {}, {}, {}, {}
    for mode in modes:
        d = f"{base}/{mode}"
        t.mkdir(d)
        t.mkdir(f"{d}/root")
        dirs[mode] = d

    ahead = ahead and not requeue

    def script(mode: str, extra: str = "") -> str:
        d = dirs[mode]
        naive = f"--dir {d}/root/shared" if mode == "naive" else ""
        return (f"#!/bin/bash\n#SBATCH -o {d}/slurm-%j.out -e {d}/slurm-%j.err\n"
                f"srun python3 {t.workload} --mode {mode} --log-dir {d}/logs "
                f"--interval {interval} --keep 2 --warmup {warmup} {naive} {extra}\n")

    def args(mode: str, *more: str) -> list[str]:
        a = ["-n1", "-c1", "-p", part, *more]
        return a + [f"--dispatch-checkpoint={dirs[mode]}/root"] if mode == "dispatch" else a

    def recs(mode: str) -> list[dict]:
        p = t.host_path(f"{dirs[mode]}/logs")
        return read_logs(p) if os.path.isdir(p) else []

    # expedite: not pinned (-w), so nothing but Slurm decides when and where it restarts;
    # the scheduler packs both on the first node (best fit), and whichever node each got is cut
    for mode in modes:
        old[mode] = t.submit(script(mode), args(mode, "--requeue=expedite") if expedite
                             else args(mode, "-w", node))
    for mode in modes:
        _poll(lambda: _saves(recs(mode), _lineage(recs(mode), old[mode], 0)) >= 2, limit,
              f"{mode}: the old execution's first saves")
    ran_on = {mode: (t.slurm.job(old[mode]).batch_host or node) if expedite else node for mode in modes}
    if ahead:
        for mode in modes:
            new[mode] = t.submit(script(mode, f"--start-after {dirs[mode]}/go"), args(mode, "-x", node))
        for mode in modes:
            _poll(lambda: any(r["op"] == "ready" and str(r.get("job")) == str(new[mode]) for r in recs(mode)),
                  limit, f"{mode}: the replacement to run, held before it chooses")
    log(f"{scenario}: old executions {old} saving on {ran_on}; triggering")
    preemptor = None
    if scenario == "cancel":
        for mode in modes:
            t.cancel(old[mode])
    elif scenario == "preempt":
        preemptor = t.preempt(node)
    else:
        for n in sorted(set(ran_on.values())):
            t.partition(n)
    ended_at = {}

    def reported_ended(mode):
        j = t.slurm.job(old[mode])
        done = j.restart_count >= 1 if requeue else j.ended
        if done and mode not in ended_at:
            ended_at[mode] = time.time()
        return done

    def let_go(mode: str) -> bool:  # the held replacement chooses as soon as Slurm says the old one ended
        done = reported_ended(mode)
        if done and ahead:
            with open(t.host_path(f"{dirs[mode]}/go"), "w"):
                pass
        return done

    _poll(lambda: all([let_go(m) for m in modes]), limit, "Slurm to report the old executions ended")
    if scenario == "partition":
        for mode in modes:  # requeued and waiting (BeginTime): it may restart on any node
            t.unpin(old[mode])
    log(f"{scenario}: Slurm reports ended; " + ("the held replacements choose" if ahead else "starting replacements"))
    for mode in modes:  # as soon as Slurm says so: resubmit (cancel, preempt) or Slurm requeues
        if not ahead:
            new[mode] = old[mode] if requeue else t.submit(script(mode), args(mode, "-x", node))
    new_restart = 1 if requeue else 0
    for mode in modes:
        _poll(lambda: _saves(recs(mode), _lineage(recs(mode), new[mode], new_restart)) >= 2, limit,
              f"{mode}: the replacement's first saves")
    if requeue:
        for n in sorted(set(ran_on.values())):
            t.heal(n)
    for mode in modes:  # the old execution must really be gone before the third resumes
        marker = f"{dirs[mode]}/logs"
        _poll(lambda: t.alive(ran_on[mode], marker) is False or _quiet(recs(mode), _lineage(recs(mode), old[mode], 0),
                                                                      4 * interval), limit,
              f"{mode}: the old execution's processes to stop")
    for mode in modes:
        t.cancel(new[mode])
    for mode in modes:
        _poll(lambda: t.slurm.job(new[mode]).ended and "COMPLETING" not in t.slurm.job(new[mode]).flags,
              limit, f"{mode}: the replacement to end")
    if preemptor:
        t.cancel(preemptor, user="bob")
    for mode in modes:
        third[mode] = t.submit(script(mode, "--max-saves 1"), args(mode))
    for mode in modes:
        _poll(lambda: t.slurm.job(third[mode]).ended, limit, f"{mode}: the third execution")
    results = []
    for mode in modes:
        r = recs(mode)
        res = analyze(r, _lineage(r, old[mode], 0), _lineage(r, new[mode], new_restart),
                      _lineage(r, third[mode]), ended_at[mode], scenario, mode)
        res.details["jobs"] = {"old": old[mode], "new": new[mode], "third": third[mode]}
        res.details["old_node"] = ran_on[mode]
        results.append(res)
    if requeue:
        cut = set(ran_on.values())
        _poll(lambda: all(n.state == {"IDLE"} for n in t.slurm.nodes() if n.name in cut), limit,
              f"{', '.join(sorted(cut))} back in service")
    return results


def _quiet(recs: list[dict], lineage: str | None, seconds: float) -> bool:
    """No write by `lineage` for `seconds` (when processes cannot be listed)."""
    last = max((r["t"] for r in recs if r["lineage"] == lineage), default=0)
    return time.time() - last > seconds


def summarize(results: list[Result]) -> str:
    """Per scenario and mode: trials, overlap median/max, and the failure counts."""
    import statistics
    groups = defaultdict(list)
    for r in results:
        groups[(r.scenario, r.mode)].append(r)
    head = (f"{'scenario':<10} {'mode':<9} {'trials':>6} {'overlap median':>15} {'max':>7} "
            f"{'mixed':>6} {'lost':>5} {'wrong resume':>13} {'replacement ran':>16}")
    rows = [head, "-" * len(head)]
    for (sc, mode), rs in sorted(groups.items()):
        ov = [r.overlap_s for r in rs]
        st = [r.details["replacement_started_s"] for r in rs if r.details.get("replacement_started_s") is not None]
        ran = f"{statistics.median(st):+.1f}s" if st else "-"
        rows.append(f"{sc:<10} {mode:<9} {len(rs):>6} {statistics.median(ov):14.1f}s {max(ov):6.1f}s "
                    f"{sum(r.mixed for r in rs):>6} {sum(r.lost for r in rs):>5} "
                    f"{sum(r.wrong_resume for r in rs):>13} {ran:>16}")
    return "\n".join(rows)


def pyplot():
    """matplotlib's pyplot, or an error saying how to get it: asked before any trial runs."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DispatchError("--plot needs matplotlib: pip install 'dispatch-slurm[plot]'") from None
    return plt


def plot(results: list[Result], path: str) -> None:
    """A timeline per trial: every write of the old, new and third execution, relative
    to the moment Slurm reported the old execution ended (needs matplotlib)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(results), 1, figsize=(10, 1.5 * len(results) + 0.8), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        timeline = r.details["timeline"]
        for row, (who, ts) in enumerate(timeline.items()):
            ax.plot(ts, [row] * len(ts), "|", markersize=12)
        ax.axvline(0, color="red", linewidth=1)
        ax.set_yticks(range(len(timeline)), list(timeline))
        ax.set_ylim(-0.7, len(timeline) - 0.3)
        ax.set_title(f"{r.scenario} / {r.mode}: overlap {r.overlap_s:.1f} s, mixed {r.mixed}, lost {r.lost}, "
                     f"wrong resume {'YES' if r.wrong_resume else 'no'}", fontsize=9)
    axes[-1, 0].set_xlabel("seconds after Slurm reported the old execution ended (red line)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(scenarios, modes, trials: int = 1, target: str = "docker-slurm", suite: str = "trixie",
        profile: str = "fast", base: str | None = None, nodes: list[str] | None = None,
        interval: float = 1.0, warmup: float = 3.0, log=print, tracking: str | None = None) -> list[Result]:
    """Every trial of every scenario; starts (and stops) a docker-slurm cluster for the
    default target, the two VMs (cgroup v2) for ``vm``."""
    results = []
    if "local" in scenarios:
        import tempfile
        for _ in range(trials):
            for mode in modes:
                with tempfile.TemporaryDirectory(prefix=f"dispatch-trial-{mode}-") as d:
                    results.append(run_local(mode, d, interval=interval, warmup=warmup))
        scenarios = [s for s in scenarios if s != "local"]
    if not scenarios:
        return results
    cluster = None
    if target in ("docker-slurm", "vm"):
        if target == "vm":  # cgroup v2 on the VMs' own kernel (the image must be built)
            from .vm import VMCluster
            if tracking not in (None, "cgroup"):
                raise DispatchError("--target vm runs cgroup v2 tracking only (--tracking cgroup or none)")
            cluster = VMCluster(suite, log=log).start()
        else:
            from .cluster import Cluster
            cluster = Cluster(suite, profile, log=log, tracking=tracking).start()
        t, base = DockerTarget(cluster), "/checkpoints/trials"
        t.mkdir(base)
    else:
        from dispatch_slurm.slurm.client import Slurm
        if not base or not nodes:
            raise DispatchError("--target slurm needs --dir (a folder every node shares) and --nodes")
        t = SlurmTarget(Slurm(), nodes, profile)
    try:
        for scenario in scenarios:
            for i in range(trials):
                results += cluster_trial(t, scenario, tuple(modes), f"{base}/{scenario}-{i}-{int(time.time())}",
                                         interval, warmup, log)
    finally:
        if cluster is not None:
            cluster.stop()
    return results
