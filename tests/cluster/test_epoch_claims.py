"""On the real cluster: two jobs of one root never run or publish at one epoch.

The collision: two plain sbatch jobs with DISPATCH_SUBMISSION=1 set by hand both got
epoch 1000000, the second resumed from the first's step 500, the first published 600 later
and `latest` named it: the other lineage. Here the second job is refused before it writes
anything, its stderr naming the first job and the fix, and `latest` stays the first job's,
whatever the way in: `eval "$(dispatch-slurm env)"` and the TaskProlog (Python, the same on
every release: one release), the SPANK plugin with `--dispatch-submission=1` twice and the
Prolog it triggers (C built per release: every release)."""

from __future__ import annotations

import re

import pytest

from dispatch_slurm import store
from testbed.cluster import CONTROLLER, Cluster

pytestmark = pytest.mark.cluster

# the job: resume, publish step 500, say so, wait for the test's word, publish step 600
TRAINER = """
resume=$(dispatch-slurm latest --resume)
echo "resume=$resume"
mkdir -p "$DISPATCH_EXEC_DIR/checkpoint-500" && echo w >"$DISPATCH_EXEC_DIR/checkpoint-500/model.bin" && dispatch-slurm publish "$DISPATCH_EXEC_DIR/checkpoint-500"
touch {cdir}/$SLURM_JOB_ID.ready
while [ ! -e {cdir}/go ]; do sleep 0.2; done
mkdir -p "$DISPATCH_EXEC_DIR/checkpoint-600" && echo w >"$DISPATCH_EXEC_DIR/checkpoint-600/model.bin" && dispatch-slurm publish "$DISPATCH_EXEC_DIR/checkpoint-600"
"""
BY_HAND = """#!/bin/bash
#SBATCH -w c1 -o {cdir}/%j.out -e {cdir}/%j.err
set -euo pipefail
export DISPATCH_CHECKPOINT={root} DISPATCH_SUBMISSION=1   # by hand, as the old error message invited
eval "$(dispatch-slurm env)"
""" + TRAINER
# the plugin's job: its claim is made before the script starts; publish 500 and 600 at the word
# (one Python start: this test runs on every release)
PLUGIN = """#!/bin/bash
#SBATCH -o {cdir}/%j.out -e {cdir}/%j.err
set -euo pipefail
touch {cdir}/$SLURM_JOB_ID.ready
while [ ! -e {cdir}/go ]; do sleep 0.2; done
mkdir -p "$DISPATCH_EXEC_DIR/checkpoint-500" "$DISPATCH_EXEC_DIR/checkpoint-600"
echo w >"$DISPATCH_EXEC_DIR/checkpoint-500/model.bin"; echo w >"$DISPATCH_EXEC_DIR/checkpoint-600/model.bin"
python3 -c 'import sys; from dispatch_slurm import store; [store.publish(p) for p in sys.argv[1:]]' \
  "$DISPATCH_EXEC_DIR/checkpoint-500" "$DISPATCH_EXEC_DIR/checkpoint-600"
"""


def cluster_name(c: Cluster) -> str:
    return re.search(r"^ClusterName\s*=\s*(\S+)", c.exec(CONTROLLER, ["scontrol", "show", "config"]).stdout, re.M)[1]


def allocate_one(c: Cluster, root: str) -> None:
    """N=1 allocated under ROOT/sub/ as a real submission would (alice, O_EXCL)."""
    c.exec("c1", ["python3", "-c", f"from dispatch_slurm import store; assert store.allocate_submission({root!r}) == 1"],
           user="alice")


def written(host_root, job: int) -> list[str]:
    """Everything under the root that names the job: its exec folder, events, claims."""
    mark = f".{job}."
    return sorted(str(p.relative_to(host_root)) for p in host_root.rglob("*")
                  if mark in p.name or (p.is_file() and mark.encode() in p.read_bytes()))


def check_refused(c: Cluster, hdir, host_root, first: int, second: int, name: str, where: str = "err") -> str:
    """The second job ended FAILED, never trained, wrote nothing; its stderr (a TaskProlog's
    `print` line: its output) names the first."""
    c.wait_job(second, {"FAILED"}, timeout=90)
    err = (hdir / f"{second}.{where}").read_text()
    root = f"/checkpoints/{host_root.relative_to(c.checkpoints)}"
    assert (f"epoch 1000000 of {root} is already claimed by job {name}.{first} "
            f"({root}/epochs/00000000000001000000); this job ({name}.{second}) would share its epoch") in err, err
    assert f"fix: submit with `dispatch-slurm submit {root} -- ...` or `sbatch --dispatch-checkpoint={root}`" in err
    out = hdir / f"{second}.out"
    assert "resume=" not in (out.read_text() if out.exists() else ""), "the refused job trained"
    assert not (hdir / f"{second}.ready").exists(), "the refused job's script ran"
    assert written(host_root, second) == [], "the refused job wrote under the root"
    return err


def finish_first(c: Cluster, hdir, host_root, first: int, name: str) -> None:
    """The first job publishes step 600 and ends; every publication, the latest too, is its own."""
    (hdir / "go").touch()
    c.wait_job(first, {"COMPLETED"}, timeout=90)
    pubs = store.publications(str(host_root))
    assert [p.step for p in pubs] == [500, 600], pubs
    assert all(p.path.startswith(f"exec/{name}.{first}.1000000/") for p in pubs), pubs
    assert store.latest(str(host_root)) == pubs[-1]


@pytest.mark.one_release  # Python (env, the TaskProlog): the same on every release; ~25 s
def test_hand_set_submission_numbers_never_share_an_epoch(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    name = cluster_name(c)
    root = f"{cdir}/root"
    c.exec("c1", f"mkdir -m 700 {root}", user="alice")
    host_root = hdir / "root"
    script = BY_HAND.format(cdir=cdir, root=root)

    never = c.submit("alice", script)  # N=1 that no submission allocated
    c.wait_job(never, {"FAILED"}, timeout=90)
    assert f"DISPATCH_SUBMISSION=1 was never allocated under {root}" in (hdir / f"{never}.err").read_text()
    assert sorted(p.name for p in host_root.iterdir()) == [], "the refused job wrote under the root"

    allocate_one(c, root)  # one real submission; then two jobs reuse its N by hand
    first = c.submit("alice", script)
    c.wait_until(lambda: (hdir / f"{first}.ready").exists(), timeout=90, what="the first job at step 500")
    second = c.submit("alice", script)
    check_refused(c, hdir, host_root, first, second, name)

    # the TaskProlog's way in: the variables exported by sbatch, no eval in the script
    env = {"DISPATCH_CHECKPOINT": root, "DISPATCH_SUBMISSION": "1"}
    third = c.submit("alice", args=["--export=ALL,DISPATCH_CHECKPOINT,DISPATCH_SUBMISSION", "-w", "c2",
                                    "-o", f"{cdir}/%j.out", "-e", f"{cdir}/%j.err", "--wrap", f"touch {cdir}/ran"],
                     env=env)
    # Slurm drops a TaskProlog's stderr and prints its `print` line to the job's stdout; the
    # TaskProlog appends the reason to the stderr file itself (tests/cluster/test_no_plugin.py)
    err = check_refused(c, hdir, host_root, first, third, name)
    assert "TaskProlog failed" in err and not (hdir / "ran").exists()
    assert "is already claimed by job" in (hdir / f"{third}.out").read_text()
    finish_first(c, hdir, host_root, first, name)
    assert c.exec(CONTROLLER, ["sinfo", "-R", "-h"]).stdout.strip() == "", "a node was drained"


# every release: the plugin is built per release; ~20 s
def test_the_plugin_never_runs_two_jobs_at_one_epoch(slurm_cluster: Cluster, workdir):
    """`sbatch --dispatch-checkpoint=ROOT --dispatch-submission=1` twice. sbatch refuses an N
    that sub/ never allocated, and one whose epoch a running job claimed; two such jobs
    queued before either ran: the second to start (its Prolog logs the refusal, user_init
    fails its tasks) is refused, naming the first, and writes nothing."""
    c = slurm_cluster
    cdir, hdir = workdir
    name = cluster_name(c)
    root = f"{cdir}/root"
    c.exec("c1", f"mkdir -m 700 {root}", user="alice")
    host_root = hdir / "root"
    opts = [f"--dispatch-checkpoint={root}", "--dispatch-submission=1"]
    never = c.exec(CONTROLLER, ["sbatch", *opts, "--wrap", "true"], user="alice", check=False)
    assert never.returncode != 0 and f"--dispatch-submission=1 was never allocated under {root}" in never.stderr
    allocate_one(c, root)

    script = PLUGIN.format(cdir=cdir)
    first, second = (c.submit("alice", script, args=[*opts, "-H", "-w", node]) for node in ("c1", "c2"))
    c.exec(CONTROLLER, ["scontrol", "release", str(first)], user="alice")
    c.wait_until(lambda: (hdir / f"{first}.ready").exists(), timeout=90, what="the first job running")
    c.exec(CONTROLLER, ["scontrol", "release", str(second)], user="alice")
    check_refused(c, hdir, host_root, first, second, name)
    log = c.exec("c2", "cat /var/log/dispatch-slurm.log").stdout
    assert f"job {second}: user error, job will fail in its tasks: epoch 1000000" in log, log[-2000:]

    late = c.exec(CONTROLLER, ["sbatch", *opts, "--wrap", "true"], user="alice", check=False)
    assert late.returncode != 0 and f"is already claimed by job {name}.{first}" in late.stderr, late.stderr
    finish_first(c, hdir, host_root, first, name)
    assert c.exec(CONTROLLER, ["sinfo", "-R", "-h"]).stdout.strip() == "", "a node was drained"
