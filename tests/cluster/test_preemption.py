"""On the real cluster: a job preempted in REQUEUE mode saves within its
GraceTime, prints the sentinel, its save is published, the events show preempt_signal
then checkpoint_complete (the process's own, never the Epilog's), and the requeued execution
resumes from that save."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from dispatch_slurm import store
from dispatch_slurm.store import events
from testbed.cluster import Cluster
from support import HOST_SITE, REPO

pytestmark = pytest.mark.cluster

SENTINEL = "dispatch-checkpoint-complete"
GRACE = {"fast": 5, "site": 60}  # GraceTime of the "normal" partition per profile

PROTOCOL = """
import json, os, time
from dispatch_slurm import install_preemption_handler, store
root, exec_dir = os.environ["DISPATCH_CHECKPOINT"], os.environ["DISPATCH_EXEC_DIR"]
pub, step = store.latest(root), 0
if pub:
    with open(os.path.join(root, pub.path, "state.json")) as f:
        step = json.load(f)["step"]
    print(f"resumed from {pub.path} at step {step}", flush=True)

def save(left):
    path = os.path.join(exec_dir, f"checkpoint-{step}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    print(f"saved step {step} with {left:.1f}s left", flush=True)
    return path

install_preemption_handler(save)
print("running", flush=True)
while True:
    time.sleep(0.1)
    step += 1
"""


def batch(wd: str, suite: str, command: str) -> str:
    # Slurm 22.05 requeues a preempted job only if it still runs when the grace ends
    linger = "export DISPATCH_PREEMPT_LINGER=1\n" if suite == "bookworm" else ""
    return (f"#!/bin/bash\n#SBATCH -o {wd}/job.out --open-mode=append --requeue -p normal\n{linger}"
            f'echo "execution restart=${{SLURM_RESTART_COUNT:-0}} attempt=$DISPATCH_ATTEMPT"\n'
            f"srun {command}\n")


def preempt_and_requeue(c: Cluster, job: int, out, started: str):
    c.wait_until(lambda: out.exists() and started in out.read_text(), timeout=90, what="the job to run")
    preemptor = c.preempt(job)
    c.wait_job(job, lambda j: j.restart_count == 1, timeout=120)
    c.cancel(preemptor, user="bob")
    text = c.wait_until(lambda: t if "resumed from" in (t := out.read_text()) else None,
                        timeout=120, what="the requeued execution")
    c.cancel(job)  # its SIGTERM makes the handler save and print again: read before it
    return text


def test_preempted_job_checkpoints_in_grace_and_resumes(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    (hdir / "prot.py").write_text(PROTOCOL)
    c.exec("c1", f"mkdir -m 700 {cdir}/root", user="alice")
    job = c.submit("alice", batch(cdir, c.suite, f"python3 {cdir}/prot.py"),
                   args=[f"--dispatch-checkpoint={cdir}/root"])
    text = preempt_and_requeue(c, job, hdir / "job.out", "running")
    saved = int(re.search(r"saved step (\d+)", text)[1])
    attempts = re.findall(r"execution restart=(\d) attempt=(\S+)", text)
    assert [r for r, _ in attempts] == ["0", "1"] and attempts[0][1] != attempts[1][1]
    assert text.count(SENTINEL) == 1 and text.index(SENTINEL) > text.index("saved step")
    pub = next(p for p in store.publications(str(hdir / "root")) if p.step == saved)
    assert pub.path == f"exec/{attempts[0][1]}/checkpoint-{saved}" and pub.parts.restart == 0
    assert f"resumed from {pub.path} at step {saved}" in text
    evs = [e for e in events.read(str(hdir / "root")) if e["attempt"] == attempts[0][1]]
    types = [e["type"] for e in evs]
    assert types.index("preempt_signal") < types.index("checkpoint_complete"), types
    signal_t = next(e["t"] for e in evs if e["type"] == "preempt_signal")
    done = [e for e in evs if e["type"] == "checkpoint_complete"]
    assert done[0]["t"] - signal_t < GRACE[c.profile], "the save must fit the grace window"
    # the execution's own events tell its end; the Epilog reads none of the job's output
    # (Slurm hands the path over unexpanded, an appended log holds older lines)
    assert {e.get("source") for e in done} == {None}, done
    # the old execution's Epilog records *its* attempt as ceased (Slurm gives it the new
    # restart count already; a cessation for the running replacement would be a lie)
    ceased = sorted(p.name for p in (hdir / "root" / "ceased").iterdir())
    assert any(n.startswith(attempts[0][1] + ".") for n in ceased), ceased


@pytest.mark.only_on("bookworm")  # the host's torch runs there only
def test_pytorch_example_preempted_and_resumed(slurm_cluster: Cluster, workdir):
    """examples/pytorch_train.py under Slurm: model + optimizer state saved in the grace
    window, published, and the requeued execution resumes from it. Needs torch in the
    cluster: only the bookworm cluster can use this machine's (Python 3.11) torch."""
    c = slurm_cluster
    if HOST_SITE not in c.volumes.values():
        pytest.skip(f"no torch usable in the {c.suite} cluster (only bookworm's Python 3.11 can use the host's)")
    torch = pytest.importorskip("torch")
    cdir, hdir = workdir
    shutil.copy(REPO / "examples" / "pytorch_train.py", hdir / "train.py")
    c.exec("c1", f"mkdir -m 700 {cdir}/root", user="alice")
    cmd = (f"env PYTHONPATH={HOST_SITE} python3 {cdir}/train.py --max-steps 1000000 --save-every 200 "
           f"--step-time 0.01")
    job = c.submit("alice", batch(cdir, c.suite, cmd), args=[f"--dispatch-checkpoint={cdir}/root"])
    text = preempt_and_requeue(c, job, hdir / "job.out", "saved")
    step = int(re.search(r"preempted at step (\d+)", text)[1])
    assert SENTINEL in text
    pub = max((p for p in store.publications(str(hdir / "root")) if p.parts.restart == 0),
              key=lambda p: p.step)
    assert pub.step == step, "the grace save is the first execution's latest publication"
    state = torch.load(hdir / "root" / pub.path / "state.pt", weights_only=True)
    assert state["step"] == step and "momentum_buffer" in json.dumps(list(state["optimizer"]["state"][0]))
    assert f"resumed from {pub.path} at step {step}" in text
