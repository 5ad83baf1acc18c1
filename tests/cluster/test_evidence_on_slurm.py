"""On the real cluster: a plugin job nobody supervises (sbatch
--dispatch-checkpoint, no `run`), read from its root alone. The Prolog records each
execution's nodes and start, the Epilog every node's cessation naming the execution's
nodes, so `report` shows every execution's end and `gc` collects what the policy allows;
and a node cut off for longer than MinJobAge records its cessation when it rejoins
(slurmd runs that Epilog without the job's options), so a shared-checkpoint hold lifts
by itself."""

from __future__ import annotations

import json
import time

import pytest

from dispatch_slurm.store import events
from testbed.cluster import CONTROLLER, Cluster, slurm_at_least

pytestmark = pytest.mark.cluster
WORKLOAD = "/src/dispatch-slurm/tests/testbed/workload.py"
TWO_NODES = """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1 -o {cdir}/job-%j.out --requeue
srun -N1 -n1 python3 {workload} --mode dispatch --log-dir {cdir}/logs --interval 1 --keep 0 --max-saves 300
"""


def published(hdir, epoch: int) -> list[str]:
    pub = hdir / "root" / "pub"
    return [n for n in pub.iterdir() if n.name.startswith(f"{epoch:020d}")] if pub.exists() else []


def entries(hdir, attempt: str) -> dict[str, dict]:
    d = hdir / "root" / "ceased"
    return {p.name[len(attempt) + 1:]: json.loads(p.read_text() or "{}")
            for p in (d.iterdir() if d.exists() else []) if p.name.startswith(attempt + ".")}


def resumes(hdir) -> list[dict]:
    return [json.loads(line) for p in sorted((hdir / "logs").glob("*.jsonl")) for line in p.read_text().splitlines()
            if '"resume"' in line]


def test_report_and_gc_of_a_plugin_job_nobody_supervised(slurm_cluster: Cluster, workdir):
    """Two executions of a two-node plugin job (a requeue, then scancel): every node's
    Epilog entry names both nodes, `report` shows both executions ceased and dates them
    by the Prolog (Slurm's start time from 24.11), resumed from what the trainer logged;
    `gc --keep-last 2 --dry-run` would remove the rest, with no record, no --nodes, and
    `gc` removes it."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = f"{cdir}/root"
    c.exec(CONTROLLER, f"mkdir -m 700 {root} {cdir}/logs", user="alice")
    job = c.submit("alice", TWO_NODES.format(cdir=cdir, workload=WORKLOAD), args=[f"--dispatch-checkpoint={root}"])
    nodes0 = c.wait_job(job, "RUNNING", timeout=90).nodes
    c.wait_until(lambda: len(published(hdir, 1_000_000)) >= 3, timeout=90, what="R=0's publications")
    c.requeue(job)
    nodes1 = c.wait_job(job, lambda j: j.restart_count == 1 and "RUNNING" in j.states, timeout=180).nodes
    c.wait_until(lambda: len(published(hdir, 1_000_001)) >= 3, timeout=90, what="R=1's publications")
    c.cancel(job, user="alice")
    a0, a1 = (f"{slurm_cluster_name(c)}.{job}.{1_000_000 + r}" for r in (0, 1))
    for attempt, nodes in ((a0, nodes0), (a1, nodes1)):
        c.wait_until(lambda: set(entries(hdir, attempt)) == set(nodes), timeout=90,
                     what=f"every node's Epilog entry for {attempt}")
        assert all(e["nodes"] == sorted(nodes) for e in entries(hdir, attempt).values()), entries(hdir, attempt)
    text = c.exec(CONTROLLER, ["dispatch-slurm", "report", root], user="alice").stdout
    print("\n" + text)
    r = json.loads(c.exec(CONTROLLER, ["dispatch-slurm", "report", root, "--json"], user="alice").stdout)
    ex = r["executions"]
    assert [e["attempt"] for e in ex] == [a0, a1]
    # no supervisor record: how each ended is Slurm's word, asked by the report, and
    # the root shows both ceased
    assert [(e["ended"]["state"].split("+")[0], e["ended"]["source"]) for e in ex] == \
        [("REQUEUED", "slurm"), ("CANCELLED", "slurm")], [e["ended"] for e in ex]
    assert [e["cessation"]["ceased"] for e in ex] == [True, True], [e["cessation"] for e in ex]
    assert [e["cessation"]["nodes"] for e in ex] == [sorted(nodes0), sorted(nodes1)]
    assert [e["started_by"] for e in ex] == ["prolog", "prolog"]
    prolog = [ev for ev in events.read(str(hdir / "root")) if ev["type"] == "execution_started"
              and ev.get("source") == "prolog"]
    assert {(ev["attempt"], ev["node"]) for ev in prolog} == {(a, n) for a, ns in ((a0, nodes0), (a1, nodes1))
                                                                    for n in ns}
    if slurm_at_least(c, "24.11"):  # Slurm gives the Prolog the start time (SLURM_JOB_START_TIME) from 24.11
        assert all(isinstance(ev.get("start_time"), int) for ev in prolog), prolog
    (i,) = r["interruptions"]
    (res,) = [x for x in resumes(hdir) if x["lineage"] == a1]  # the trainer's word on R=1's resume
    assert i["resumed_from"]["step"] == res["step"], (i, res)
    assert "ceased on" in text and "running, or unknown" not in text and "CANCELLED (Slurm)" in text, text

    c.wait_until(lambda: time.time() - max(p.stat().st_mtime for p in (hdir / "root" / "exec").rglob("*")) > 6,
                 timeout=30, what="the exec folders to be quiet for --min-age")
    dry = c.exec(CONTROLLER, ["dispatch-slurm", "gc", root, "--keep-last", "2", "--min-age", "5", "--dry-run"],
                 user="alice")
    print(dry.stdout + dry.stderr)
    assert "would remove" in dry.stdout and "every node that ran it recorded its Epilog" in dry.stdout
    assert "unknown" not in dry.stdout and "not shown to have ceased" not in dry.stdout, dry.stdout
    real = json.loads(c.exec(CONTROLLER, ["dispatch-slurm", "gc", root, "--keep-last", "2", "--min-age", "5",
                                          "--json"], user="alice").stdout)
    kept = [v["path"] for v in real if v["action"] == "keep"]
    assert len(kept) == 2 and all(a1 in p for p in kept), kept
    assert not any((hdir / p).exists() for p in (v["path"] for v in real if v["action"] == "remove"))


def slurm_cluster_name(c: Cluster) -> str:
    return c.slurm.cluster_name()


SHARED_JOB = """#!/bin/bash
#SBATCH -N 1 -o {cdir}/slurm-%j.out
while [ ! -e {cdir}/stop ]; do
  echo "$DISPATCH_ATTEMPT $(date +%s.%N)" >> {cdir}/writes
  sleep 0.5
done
"""


@pytest.mark.one_release  # 6-7 min: the partition must outlast MinJobAge (180 s) and slurmctld's purge
def test_a_hold_lifts_by_itself_after_a_partition_longer_than_min_job_age(slurm_cluster: Cluster, workdir):
    """A shared-checkpoint job's node is cut off until slurmctld has forgotten the job.
    When it rejoins, slurmd kills the orphan and runs the Epilog with the job id alone (no
    options, uid 0): the Epilog records the cessation from the Prolog's record on the
    node, as alice, and the supervisor's hold lifts by the cessation signal, no person."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = f"{cdir}/root"
    c.exec(CONTROLLER, f"mkdir -m 700 {root}", user="alice")
    (hdir / "job.sh").write_text(SHARED_JOB.format(cdir=cdir))
    c.exec(CONTROLLER, f"cd {cdir} && setsid nohup dispatch-slurm run {root} --shared-checkpoint --resubmit 1 "
                       f"--cessation-interval 3s --poll 1 -- {cdir}/job.sh > {cdir}/sup.log 2>&1 < /dev/null &",
           user="alice")
    from dispatch_slurm.supervisor.record import Record

    def facts(kind):
        return [f for f in Record(str(hdir / "root")).read() if f["type"] == kind]

    first = c.wait_until(lambda: facts("started"), timeout=90, what="the first execution")[0]
    job, node, a0 = first["job"], first["nodes"][0], first["attempt"]
    c.wait_until(lambda: (hdir / "writes").exists(), timeout=30, what="the job's first writes")
    c.partition(node)
    try:
        c.wait_until(lambda: facts("hold"), timeout=120, what="the hold after the node failure")
        t_cut = time.time()
        c.wait_until(lambda: "Invalid job id" in c.exec(CONTROLLER, ["scontrol", "show", "job", str(job)],
                                                        check=False).stderr,
                     timeout=360, what="slurmctld to forget the job (MinJobAge + its purge)")
        print(f"job {job} forgotten {time.time() - t_cut:.0f} s after the hold")
        assert not facts("release") and not entries(hdir, a0), "nothing lifted the hold while the node was cut off"
    finally:
        c.heal(node)
    t_heal = time.time()
    released = c.wait_until(lambda: facts("release"), timeout=300, what="the hold to lift after the heal")[0]
    print(f"hold lifted {released['t'] - t_heal:.0f} s after the heal")
    assert released["by"] == "cessation signal", released
    (entry,) = entries(hdir, a0).items()
    assert entry[0] == node and entry[1]["nodes"] == [node]
    assert (hdir / "root" / "ceased" / f"{a0}.{node}").stat().st_uid == 2001, "written as alice, not root"
    (ev,) = [e for e in events.read(str(hdir / "root")) if e["type"] == "cessation" and e.get("source", "")
             .startswith("epilog")]
    assert ev["source"] == "epilog (rejoined)" and ev["node"] == node, ev
    log = c.exec(node, "cat /var/log/dispatch-slurm.log").stdout
    assert "Slurm gave no job options" in log and "BUG" not in log, log[-2000:]
    c.wait_until(lambda: [f for f in facts("started") if f["n"] == 2], timeout=120, what="the resubmission")
    (hdir / "stop").touch()
    c.wait_until(lambda: facts("finished"), timeout=120, what="the supervisor to finish")
    text = c.exec(CONTROLLER, ["dispatch-slurm", "report", root], user="alice").stdout
    print("\n" + text)
    assert f"ceased on {node} (Epilog)" in text
    c.wait_node(node, lambda n: n.state == {"IDLE"}, timeout=240)
    reasons = c.exec(CONTROLLER, ["sinfo", "-R", "-h"]).stdout.strip()
    assert reasons == "", f"a node was drained: {reasons}"
