"""slurmd frozen on the batch node longer than SlurmdTimeout (SIGSTOP, then SIGCONT), as a
slurmd stuck on a hung mount does, under the README's job script (plugin-only, Slurm's
requeue) and a trainer that is not the project's and rotates its saves (keeps one, as
``save_total_limit=1``): slurmctld sets the node DOWN and requeues the job, the step's
``srun`` ends, and the trainer on the frozen node trains, saves and rotates on.

The old execution's watch publishes every save its trainer completes until the trainer is
gone (slurmd, thawed, kills it); the requeued execution, on another node, resumes from the
latest publication although the old trainer's rotation removed that save from its folder;
the run finishes and the root stays resumable. (Before: the watch ended with the srun, the
rotation removed the latest published save, and every later execution was refused at
``latest --resume``.)"""

from __future__ import annotations

import shutil

import pytest

from support import REPO
from testbed import campaign
from testbed.cluster import CONTROLLER, Cluster
from dispatch_slurm.contract import names

pytestmark = [pytest.mark.cluster, pytest.mark.only_on("trixie")]

STEPS, EVERY, STEP_S = 900, 10, 0.1  # a save a second; the old trainer outlasts the freeze
TRAINER = r"^\S*python[0-9.]* train.py"  # the trainer's processes, not srun's (whose command line holds the same)


def log(hdir) -> list[tuple[str, str, int, float]]:
    """The trainers' log: (exec folder, op, step, time), both executions in one file."""
    p = hdir / "train.log"
    lines = [line.split() for line in p.read_text().splitlines()] if p.exists() else []
    return [(a, op, int(step), float(t)) for a, op, step, t in (x for x in lines if len(x) == 4)]


def pubs(hroot) -> list[tuple[names.Publication, float]]:
    d = hroot / "pub"
    return [(names.parse(p.name), p.stat().st_mtime) for p in d.iterdir()] if d.is_dir() else []


def test_a_frozen_slurmd_leaves_the_latest_publication_resumable(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root, hroot = f"{cdir}/root", hdir / "root"
    c.exec(CONTROLLER, f"mkdir -m 700 {root}", user="alice")
    (hdir / "bin").mkdir()
    (hdir / "bin" / "python").symlink_to("/usr/bin/python3")
    shutil.copy(REPO / "tests" / "rotating_trainer.py", hdir / "rotating_trainer.py")
    (hdir / "train.py").write_text(campaign.wrapper(f"{cdir}/rotating_trainer.py", [
        "--steps", str(STEPS), "--save-every", str(EVERY), "--keep", "1", "--step-time", str(STEP_S),
        "--log", f"{cdir}/train.log"]))
    (hdir / "job.sh").write_text(campaign.readme_job_script(REPO / "README.md"))
    job = c.slurm_as("alice").submit(["-N1", "-n1", f"--chdir={cdir}", "-o", f"{cdir}/%j.out", "--open-mode=append",
                                      "--requeue", f"--dispatch-checkpoint={root}", f"{cdir}/job.sh"],
                                     {"PATH": f"{cdir}/bin:/usr/local/bin:/usr/bin:/bin"})
    first = c.wait_job(job, "RUNNING", timeout=60)
    node = first.batch_host
    c.wait_until(lambda: pubs(hroot), timeout=60, what="the first publication")
    c.exec(node, ["pkill", "-STOP", "-x", "slurmd"])
    try:
        again = c.wait_job(job, lambda j: j.restart_count == 1 and (j.state == "RUNNING" or j.ended), timeout=120)
        old = log(hdir)[0][0]
        # the requeued execution resolves its resume while the old trainer saves and rotates on
        started = c.wait_until(lambda: [t for a, op, _, t in log(hdir) if a != old] or c.job(job).ended, timeout=60,
                               what="the requeued execution's trainer to start, or the job to end")
        if started is not True:  # two saves more: the old trainer's rotation removed the save resumed from
            c.wait_until(lambda: sum(1 for a, op, _, t in log(hdir) if a == old and op == "saved"
                                     and t > started[0]) >= 2, timeout=60, what="two more saves of the old trainer")
        assert c.pids(node, TRAINER, user="alice"), "the old trainer trains on on the frozen node"
    finally:
        c.exec(node, ["pkill", "-CONT", "-x", "slurmd"], check=False)
    c.wait_until(lambda: not c.pids(node, f"{TRAINER}|dispatch-slurm watch", user="alice"), timeout=90,
                 what="slurmd, thawed, to end the old execution's trainer and watch")
    end = c.wait_job(job, lambda j: j.ended, timeout=180)
    out = "".join(p.read_text() for p in sorted(hdir.glob("*.out")))
    entries = log(hdir)
    print(f"\n{node} frozen; requeued on {again.batch_host}; the trainers' log:\n" + "\n".join(map(str, entries)))

    new = [e for e in entries if e[0] != old]
    resumed = [step for a, op, step, _ in new if op == "resumed"]
    errors = [line for line in out.splitlines() if "error" in line]
    assert resumed, f"the requeued execution never resumed: {errors}"
    assert end.state == "COMPLETED" and "done" in {op for _, op, *_ in new}, (end.state, errors)
    # every save the old trainer completed was published at its epoch, the last ones after its srun ended
    old_saved = {step for a, op, step, _ in entries if a == old and op == "saved"}
    old_pubs = {p.step for p, _ in pubs(hroot) if p.path.startswith(f"exec/{old}/")}
    assert old_saved <= old_pubs, f"saved but never published: {sorted(old_saved - old_pubs)}"
    assert not (hroot / "exec" / old / f"checkpoint-{resumed[0]}").exists(), "its rotation removed the save"
    # the resume was from the latest publication at the requeued execution's start (Slurm's whole second)
    before = [p.step for p, t in pubs(hroot) if t < (again.start_time or 0)]
    assert resumed[0] >= max(before) and resumed[0] in old_pubs, (resumed, sorted(before)[-3:])
    latest = c.exec(CONTROLLER, ["dispatch-slurm", "latest", root], user="alice").stdout.split("\t")[0]
    assert latest.endswith(f"/checkpoint-{STEPS}") and (hroot / latest[len(root) + 1:]).is_dir(), latest
