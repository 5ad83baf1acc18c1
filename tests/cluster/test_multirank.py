"""Multi-rank training on the real cluster: a 2-node x 2-task job (examples/dist_train.py,
FSDP, async DCP saves, gloo over the cluster network) preempted in the REQUEUE partition:
every rank stops at one step within GraceTime, the save is published once with every
rank's shard, and the requeued execution resumes from exactly that step on every rank.

Needs torch in the cluster: only bookworm (Python 3.11) can use this machine's, mounted
read-only at /opt/host-site."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from dispatch_slurm import store
from dispatch_slurm.store import events
from testbed.cluster import Cluster
from support import HOST_SITE, REPO

pytestmark = [pytest.mark.cluster, pytest.mark.only_on("bookworm")]  # the host's torch runs there

SENTINEL = "dispatch-checkpoint-complete"
GRACE = {"fast": 5, "site": 60}


def script(wd: str, cmd: str) -> str:
    # Slurm 22.05 requeues a preempted job only if it still runs when the grace ends (linger)
    return (f"#!/bin/bash\n#SBATCH -o {wd}/job.out --open-mode=append --requeue -p normal -N 2 --ntasks-per-node=2\n"
            "export DISPATCH_PREEMPT_LINGER=1 MASTER_ADDR=$(hostname)\n"
            'echo "execution restart=${SLURM_RESTART_COUNT:-0} attempt=$DISPATCH_ATTEMPT"\n'
            f"srun env PYTHONPATH={HOST_SITE} {cmd}\n")


def test_fsdp_job_preempted_saves_every_shard_and_resumes(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    if HOST_SITE not in c.volumes.values():
        pytest.skip(f"no torch usable in the {c.suite} cluster (only bookworm's Python 3.11 can use the host's)")
    cdir, hdir = workdir
    shutil.copy(REPO / "examples" / "dist_train.py", hdir / "train.py")
    c.exec("c1", f"mkdir -m 700 {cdir}/root", user="alice")
    cmd = f"python3 {cdir}/train.py --max-steps 1000000 --save-every 40 --step-time 0.02 --fsdp --async-save"
    job = c.submit("alice", script(cdir, cmd), args=[f"--dispatch-checkpoint={cdir}/root"])
    out = hdir / "job.out"
    c.wait_until(lambda: out.exists() and "step 40 saved" in out.read_text(), timeout=240, what="the job to save")
    preemptor = c.preempt(job)
    c.wait_job(job, lambda j: j.restart_count == 1, timeout=180)
    c.cancel(preemptor, user="bob")
    text = c.wait_until(lambda: t if "resumed at step" in (t := out.read_text()) else None,
                        timeout=240, what="the requeued execution to resume")
    c.cancel(job)
    root = str(hdir / "root")

    step = int(re.search(r"preempted at step (\d+)", text)[1])
    attempts = re.findall(r"execution restart=(\d) attempt=(\S+)", text)
    assert [r for r, _ in attempts] == ["0", "1"], attempts
    first = attempts[0][1]
    assert text.count(SENTINEL) == 4, "every rank of the first execution completed the save"
    pub = next(p for p in store.publications(root) if p.path.startswith(f"exec/{first}/") and p.step == step)
    assert max(p.step for p in store.publications(root) if p.path.startswith(f"exec/{first}/")) == step
    saved = sorted(p.name for p in (hdir / "root" / pub.path).iterdir())
    assert saved == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"], saved
    assert re.search(rf"resumed at step {step} digest [0-9a-f]+", text)

    evs = [e for e in events.read(root) if e["attempt"] == first]
    started = {(e["host"], e["pid"]) for e in evs  # the ranks' own; the Prolog records one per node too
               if e["type"] == "execution_started" and e.get("source") != "prolog"}
    assert len(started) == 4 and len({h for h, _ in started}) == 2, started
    by = [e for e in evs if e["type"] == "published" and e["by"] == "preempt"]
    assert len(by) == 1 and by[0]["step"] == step
    first_signal = min(e["t"] for e in evs if e["type"] == "preempt_signal")
    assert by[0]["t"] - first_signal < GRACE[c.profile], "the save must be published within the grace"


def frameworks(cdir: str):
    """framework -> (script, srun tasks on one node, what a resumed execution prints for a publication:
    Lightning names the path it loads, the execution's own copy of the save)."""
    import test_accelerate
    import test_lightning
    return {"lightning": (test_lightning.TRAINER, 2,
                          lambda pub: f"/dispatch-resume/{pub.name}/{os.path.basename(pub.path)}"),
            "accelerate": (test_accelerate.TRAINER, 1, lambda pub: f"resumed at step {pub.step}")}


@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
def test_framework_job_survives_a_requeue_and_a_resubmission(slurm_cluster: Cluster, workdir, framework):
    """Lightning (2 tasks, DDP over srun) and accelerate jobs: preempted in the REQUEUE
    partition, the requeued execution resumes from the grace save; cancelled (scancel's
    SIGTERM, KillWait), a new submission resumes from that save."""
    c = slurm_cluster
    if HOST_SITE not in c.volumes.values():
        pytest.skip(f"no torch usable in the {c.suite} cluster (only bookworm's Python 3.11 can use the host's)")
    pytest.importorskip(framework)
    cdir, hdir = workdir
    text, ntasks, resumed = frameworks(cdir)[framework]
    (hdir / "train.py").write_text(text)
    (hdir / "out").mkdir()
    (hdir / "out").chmod(0o1777)  # the job user drops its ready files there
    c.exec("c1", f"mkdir -m 700 {cdir}/root", user="alice")
    root = str(hdir / "root")
    batch = script(cdir, f"env OUT={cdir}/out python3 {cdir}/train.py 10000000 50").replace(
        "-N 2 --ntasks-per-node=2", f"-N 1 --ntasks-per-node={ntasks}")
    job = c.submit("alice", batch, args=[f"--dispatch-checkpoint={cdir}/root"])
    def first_publication():
        if c.job(job).ended:  # fail now, with the job's output, not at the deadline
            raise AssertionError(f"the job ended before publishing: {(hdir / 'job.out').read_text()[-3000:]}")
        return store.latest(root)
    c.wait_until(first_publication, timeout=240, what="a first publication")
    preemptor = c.preempt(job)
    c.wait_job(job, lambda j: j.restart_count == 1, timeout=180)
    c.cancel(preemptor, user="bob")
    out = hdir / "job.out"
    grace_save = c.wait_until(lambda: _preempt_pub(root, restart=0), timeout=60, what="the grace save")
    c.wait_until(lambda: resumed(grace_save) in out.read_text() and _own_pub(root, restart=1), timeout=240,
                 what="the requeued execution to resume from the grace save and publish")
    c.cancel(job)  # scancel: SIGTERM, KillWait, SIGKILL: the requeued execution saves again
    c.wait_job(job, lambda j: j.ended, timeout=120)
    cancel_save = c.wait_until(lambda: _preempt_pub(root, restart=1), timeout=60, what="the scancel save")
    assert store.latest(root) == cancel_save

    job2 = c.submit("alice", batch.replace("job.out", "job2.out"), args=[f"--dispatch-checkpoint={cdir}/root"])
    out2 = hdir / "job2.out"
    c.wait_until(lambda: out2.exists() and resumed(cancel_save) in out2.read_text(), timeout=240,
                 what="the resubmission to resume from the scancel save")
    c.cancel(job2)


def _own_pub(root: str, restart: int):
    return next((p for p in store.publications(root) if p.parts.restart == restart), None)


def _preempt_pub(root: str, restart: int):
    """The publication the preemption protocol made in execution ``restart`` (by=preempt)."""
    names = {e["name"] for e in events.read(root) if e["type"] == "published" and e.get("by") == "preempt"}
    return next((p for p in store.publications(root) if p.parts.restart == restart and p.name in names), None)
