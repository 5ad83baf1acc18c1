"""A torchtitan job (docs/torchtitan.md's recipe, DispatchCheckpointManager) on the real
cluster, its node cut off the network: Slurm requeues the job while the old execution keeps
training and saving into the shared checkpoint volume. The replacement resumes from the
latest publication; the old execution's late saves stay in its own folder at its lower
epoch (torchtitan's keep_latest_k and its "greatest step-N" never see another execution's
saves); after the heal the latest is the replacement's, and every save it kept is complete.

Needs torch and torchtitan in the cluster: only bookworm (Python 3.11) can use this
machine's site-packages, mounted read-only at /opt/host-site. DeepSpeed is not run here:
on CPU it compiles a C++ op when it starts, and the cluster image has no C++ compiler."""

from __future__ import annotations

import os

import pytest

from dispatch_slurm import store
from dispatch_slurm.store import events
from testbed.cluster import Cluster
from support import HOST_SITE, doc_snippet

pytestmark = [pytest.mark.cluster, pytest.mark.only_on("bookworm")]  # the host's torch runs there

DEADLINE = {"fast": dict(node_down=120, requeue_start=150), "site": dict(node_down=900, requeue_start=600)}


def test_torchtitan_job_partitioned_keeps_both_lineages_apart(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    if HOST_SITE not in c.volumes.values():
        pytest.skip(f"no torch usable in the {c.suite} cluster (only bookworm's Python 3.11 can use the host's)")
    pytest.importorskip("torchtitan")
    d = DEADLINE[c.profile]
    cdir, hdir = workdir
    (hdir / "train.py").write_text(doc_snippet("torchtitan.md", "torchtitan-loop"))  # the page's, as it is
    c.exec("c1", f"mkdir -m 700 {cdir}/root", user="alice")
    root = str(hdir / "root")
    batch = (f"#!/bin/bash\n#SBATCH -o {cdir}/job.out --open-mode=append --requeue -p normal -N 1 -n 1\n"
             "export MASTER_ADDR=$(hostname)\n"
             f"srun env PYTHONPATH={HOST_SITE} python3 {cdir}/train.py 100000000\n")
    job = c.submit("alice", batch, args=[f"--dispatch-checkpoint={cdir}/root"])

    def publications_of(restart: int, running: bool = True):
        if running and c.job(job).ended:  # fail now, with the job's output, not at the deadline
            raise AssertionError(f"the job ended: {(hdir / 'job.out').read_text()[-3000:]}")
        return [p for p in store.publications(root) if p.parts.restart == restart]

    c.wait_until(lambda: len(publications_of(0)) >= 2, timeout=240, what="the first execution's saves")
    node = c.job(job).batch_host
    c.partition(node)
    try:
        c.wait_job(job, lambda j: j.restart_count == 1 and j.state == "RUNNING" and j.batch_host != node,
                   timeout=d["node_down"] + d["requeue_start"])
        # both executions run: the old one, cut off, still publishes; the replacement resumes and saves
        second = c.wait_until(lambda: publications_of(1)[1:], timeout=240, what="the replacement's saves")
        old_step = max(p.step for p in publications_of(0))
        c.wait_until(lambda: max(p.step for p in publications_of(0)) > old_step, timeout=60,
                     what="the old execution to publish again while the replacement runs")
    finally:
        c.heal(node)
    c.cancel(job)
    c.wait_job(job, lambda j: j.ended, timeout=120)

    evs = events.read(root)
    attempts = {e["attempt"]: e["epoch"] for e in evs if e["type"] == "execution_started"}
    old, new = (sorted(attempts, key=attempts.get) + [None, None])[:2]
    started_new = min(e["t"] for e in evs if e["type"] == "execution_started" and e["attempt"] == new)
    late = [e for e in evs if e["type"] == "published" and e["attempt"] == old and e["t"] > started_new]
    assert late, "the old execution published after its replacement started (the overlap)"
    assert all(e["path"].startswith(f"exec/{old}/") for e in late)

    text = (hdir / "job.out").read_text()
    resumed = int(text.split("started at step ")[-1].split()[0])
    assert resumed in {p.step for p in publications_of(0, running=False)} and second[0].step > resumed, \
        "the replacement resumed from a save of the old execution, and went on from there"
    latest = store.latest(root)
    assert latest.parts.restart == 1 and latest.path.startswith(f"exec/{new}/checkpoint/step-")
    folder = hdir / "root" / "exec" / new / "checkpoint"
    kept = sorted(os.listdir(folder), key=lambda name: int(name.split("-")[1]))
    # keep_latest_k=3 (the page's) of its own regular saves, and the save scancel's SIGTERM made (the
    # protocol's); torchtitan removes on a thread of its own, and the handler's exit after the grace
    # save drops a removal the last regular save had queued (seen in CI: 4 regular saves left)
    assert 3 <= len(kept) <= 5 and all(os.path.isfile(folder / s / ".metadata") for s in kept), kept
    steps = [int(name.split("-")[1]) for name in kept]
    assert steps[:-1] == list(range(steps[-2] - 500 * (len(steps) - 2), steps[-2] + 1, 500)), kept  # the newest
    assert latest.path == f"exec/{new}/checkpoint/{kept[-1]}", (latest, kept)
