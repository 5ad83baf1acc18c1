"""`dispatch-slurm report` of a real docker-slurm run: a supervised job that is
preempted (REQUEUE partition), requeued by `scontrol requeue`, then cancelled by its
user. The report names the three executions and how each ended, the publications (the
grace saves of the preemption handler among them), what each replacement resumed from,
the steps lost, and draws the timeline (set DISPATCH_REPORT_PNG to keep the picture)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from testbed.cluster import CONTROLLER, Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]  # the report reads the root, not Slurm
WORKLOAD = "/src/dispatch-slurm/tests/testbed/workload.py"
JOB = """#!/bin/bash
#SBATCH -N 1 -p normal -o {cdir}/job-%j.out
srun python3 {workload} --mode dispatch --handler --log-dir {cdir}/logs --interval 1 --keep 2
"""


def test_report_of_a_preempted_requeued_and_cancelled_job(slurm_cluster: Cluster, workdir, tmp_path):
    c = slurm_cluster
    cdir, hdir = workdir
    root = f"{cdir}/root"
    c.exec(CONTROLLER, f"mkdir -m 700 {root}", user="alice")
    (hdir / "job.sh").write_text(JOB.format(cdir=cdir, workload=WORKLOAD))
    c.exec(CONTROLLER, f"cd {cdir} && setsid nohup dispatch-slurm run {root} --resubmit 2 --poll 1 -- "
                       f"{cdir}/job.sh > {cdir}/sup.log 2>&1 < /dev/null &", user="alice")
    from dispatch_slurm.supervisor.record import Record

    def facts(kind):
        return [f for f in Record(str(hdir / "root")).read() if f["type"] == kind]

    def published(epoch):
        return [n for n in os.listdir(hdir / "root" / "pub") if n.startswith(f"{epoch:020d}")] \
            if (hdir / "root" / "pub").exists() else []

    job = c.wait_until(lambda: facts("submitted"), timeout=60, what="the submission")[0]["job"]
    for r, fault in ((0, "preempt"), (1, "requeue"), (2, "cancel")):
        c.wait_until(lambda: len(published(1_000_000 + r)) >= 2, timeout=120, what=f"R={r}'s publications")
        if fault == "preempt":
            preemptor = c.preempt(job)
        elif fault == "requeue":
            c.cancel(preemptor, user="bob")
            c.exec(CONTROLLER, ["scontrol", "requeue", str(job)])
        else:
            c.cancel(job, user="alice")
        if r < 2:
            c.wait_until(lambda: any(f["r"] == r + 1 for f in facts("started")), timeout=120,
                         what=f"the execution R={r + 1}")
    c.wait_until(lambda: facts("finished"), timeout=120, what="the supervisor to finish")
    png = tmp_path / "timeline.png"
    res = c.exec(CONTROLLER, ["dispatch-slurm", "report", root, "--json"], user="alice")
    r = json.loads(res.stdout)
    text = c.exec(CONTROLLER, ["dispatch-slurm", "report", root], user="alice").stdout
    print("\n" + text)
    from dispatch_slurm import report
    report.timeline.plot(report.build(str(hdir / "root")), str(png))
    if os.environ.get("DISPATCH_REPORT_PNG"):
        shutil.copy(png, os.environ["DISPATCH_REPORT_PNG"])
    ex = r["executions"]
    assert [e["restart"] for e in ex] == [0, 1, 2] and {e["job"] for e in ex} == {job}
    assert [e["ended"]["state"] for e in ex] == ["REQUEUED", "REQUEUED", "CANCELLED"]
    assert ex[0]["signals"] and ex[2]["signals"], "the preemption's and the cancel's SIGTERM reached the handler"
    for old, new, i in zip(ex, ex[1:], r["interruptions"]):
        assert i["resumed_from"] is not None and i["resumed_from"]["epoch"] == old["epoch"]
        assert i["resumed_from"]["step"] == max(p["step"] for p in old["publications"]), \
            "the replacement resumed from the old execution's grace save"
        assert i["steps_lost"] == 0
    assert r["finished"]["outcome"] == "stopped"
    assert png.read_bytes()[:4] == b"\x89PNG"
