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


DETTRAIN = "/src/dispatch-slurm/tests/testbed/dettrain.py"  # the test bed's copy in the image
PEER = """#!/bin/bash
#SBATCH -N 1 -n 2 --time=4 --signal=TERM@80 -o {d}/job.out
set -euo pipefail
{env}srun {srun} python3 {dettrain} --output-dir "$DISPATCH_EXEC_DIR" --max-steps 100000 --step-time 0.2 \\
    --save-every 100000 --trap handler --barrier-dir {d}/barrier --crash-at-step 60 --crash-rank 1 {abort} \\
    --log {d}/train.log &
T=$!
wait $T
"""
# how Slurm stops the survivors of a crashed task: srun --kill-on-bad-exit (every release since
# 17.11), a PMI abort (26.05: SIGCONT, SIGTERM, KillWait, SIGKILL; before, SIGKILL alone)
PEER_KILLS = {"kill-on-bad-exit": ("--kill-on-bad-exit=1", ""), "pmi-abort": ("--mpi=pmi2", "--crash-abort")}


@pytest.mark.only_on("sid")  # the PMI abort's SIGTERM is 26.05's; the rest is the same on every release
def test_a_peers_crash_is_a_failure_not_a_preemption(slurm_cluster: Cluster, workdir):
    """Two ranks (the test bed's trainer, no torch: its per-step file barrier stands in for the
    all-reduce) under srun; rank 1 raises in the middle of step 60 and Slurm SIGTERMs rank 0,
    which looks like a preemption to its handler. Nothing is published (rank 0's save of a
    step rank 1 never finished waits for rank 1's part until KillWait's SIGKILL), no sentinel,
    no checkpoint_complete; the job ends FAILED, and `run` decides it a failure (exit 143
    after the PMI abort: the aborting rank dies of the step's SIGTERM). The --signal comes
    long after the crash: Slurm may send it up to 60 s early, and with a 2-minute limit it
    could come before the crash under load (a plugin-only job then saves for it and
    COMPLETES, as it should: seen twice in CI, cause not confirmed). The rule for a crash
    after the signal time: tests/test_end_rule.py."""
    from test_supervisor import Sup
    c = slurm_cluster
    cdir, hdir = workdir
    runs, jobs = {}, {}
    for how in ("run", "plugin"):
        for kill, (srun, abort) in PEER_KILLS.items():
            name = f"{how}-{kill}"
            d, root = f"{cdir}/{name}", f"{cdir}/{name}/root"
            (hdir / name).mkdir()
            (hdir / name).chmod(0o1777)
            c.exec("c1", f"mkdir -m 700 {root}", user="alice")
            script = PEER.format(d=d, dettrain=DETTRAIN, srun=srun, abort=abort,
                                 env='eval "$(dispatch-slurm env)"\n' if how == "run" else "")
            if how == "plugin":
                jobs[name] = c.submit("alice", script, args=[f"--dispatch-checkpoint={root}"])
                continue
            (hdir / name / "job.sbatch").write_text(script)
            s = Sup(c, d, hdir / name, root)
            runs[name] = (s, s.start("run", "--poll", "1", "--", f"{d}/job.sbatch"))
    for name, (s, k) in runs.items():
        assert s.wait_rc(k, timeout=240) == 1, s.log(k)[-2000:]
        assert [(f["rule"], f["cause"]) for f in s.facts("rule")] == [("fail", "failure")], s.facts("rule")
        jobs[name] = next(f["job"] for f in s.facts() if f.get("job"))
    for name, job in jobs.items():
        info = c.wait_job(job, lambda j: j.ended, timeout=240)
        assert info.state == "FAILED" and info.restart_count == 0, (name, info)
        root = str(hdir / name / "root")
        evs = events.read(root)
        log = [json.loads(line) for line in (hdir / name / "train.log").read_text().splitlines()]
        assert [(e["rank"], e["step"]) for e in log if e["op"] == "crash"] == [(1, 60)], name
        assert not [e for e in log if e["op"] in ("save", "stop")], (name, log[-5:])
        assert "preempt_signal" in {e["type"] for e in evs}, (name, evs)  # Slurm's SIGTERM reached rank 0
        assert "checkpoint_complete" not in {e["type"] for e in evs}, (name, evs)
        assert store.publications(root) == [], name
        assert SENTINEL not in (hdir / name / "job.out").read_text(), name
