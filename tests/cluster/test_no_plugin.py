"""On the cluster: a site without the SPANK plugin (the plugstack drop-in removed
on every host: sbatch no longer knows --dispatch-checkpoint), the TaskProlog configured, and
a client that calls sbatch itself, as submitit does: it exports only DISPATCH_CHECKPOINT.

- The job's first execution allocates its submission number (jobs/<cluster>.<job id>); two
  requeues (`scontrol requeue`) keep that N, each execution gets a new epoch (R+1) and its
  own exec folder, and resumes from the latest publication.
- A refused job's reason is in its stderr file (sbatch -e), on every release: Slurm writes a
  TaskProlog's `print` lines to the task's stdout only; the TaskProlog appends the reason to
  the stderr file itself."""

from __future__ import annotations

import re

import pytest

from dispatch_slurm import store
from testbed.cluster import CONTROLLER, Cluster
from test_epoch_claims import cluster_name
from test_package_on_slurm import DROPIN, enable, hosts
from test_readme_snippets import block
from test_spank_site import make_root, no_node_drained

pytestmark = pytest.mark.cluster

# resume, say which execution this is and where it resumed from, publish step 10*(R+1), wait
REQUEUED = """#!/bin/bash
#SBATCH -w c1 -o {cdir}/%j.out -e {cdir}/%j.err --open-mode=append
set -euo pipefail
eval "$(dispatch-slurm env)"   # the TaskProlog exported the same values: this checks them
resume=$(dispatch-slurm latest --resume)
echo "$DISPATCH_SUBMISSION $DISPATCH_RESTART $DISPATCH_EPOCH $DISPATCH_ATTEMPT resume=$resume" >> {cdir}/runs
step=$(( (DISPATCH_RESTART + 1) * 10 ))
mkdir -p "$DISPATCH_EXEC_DIR/checkpoint-$step" && echo w >"$DISPATCH_EXEC_DIR/checkpoint-$step/model.bin" && dispatch-slurm publish "$DISPATCH_EXEC_DIR/checkpoint-$step"
touch {cdir}/published.$DISPATCH_RESTART
sleep 600
"""


@pytest.fixture
def no_plugin(slurm_cluster: Cluster):
    """The site without the plugin: its plugstack drop-in removed on every host (sbatch and
    each slurmstepd read plugstack.conf when they start, so no daemon restarts), put back after."""
    c = slurm_cluster
    try:
        for h in hosts(c):
            c.exec(h, ["rm", "-f", DROPIN])
        unknown = c.exec(CONTROLLER, ["sbatch", "--dispatch-checkpoint=/tmp", "--wrap", "true"], user="alice",
                         check=False)
        assert unknown.returncode != 0 and "dispatch-checkpoint" in unknown.stderr, unknown
        yield c
    finally:
        enable(c)


def runs(hdir) -> list[list[str]]:
    f = hdir / "runs"
    return [line.split() for line in f.read_text().splitlines()] if f.exists() else []


@pytest.mark.one_release  # Python (the TaskProlog, env): the same on every release; ~2 min (two requeues)
def test_a_plain_sbatch_job_keeps_one_n_across_requeues(no_plugin: Cluster, workdir):
    c = no_plugin
    cdir, hdir = workdir
    name = cluster_name(c)
    root = f"{cdir}/root"
    (hdir / "train.sbatch").write_text(REQUEUED.format(cdir=cdir))
    # the user guide's snippet as written, with this test's root (the snippet's mkdir makes it)
    snippet = block("plain-sbatch").replace("/scratch/$USER/run1", root)
    out = c.exec(CONTROLLER, ["bash", "-euo", "pipefail", "-c", snippet], user="alice", workdir=cdir).stdout
    job = int(re.fullmatch(r"Submitted batch job (\d+)\n", out)[1])
    for r in (0, 1, 2):
        c.wait_until(lambda: (hdir / f"published.{r}").exists(), timeout=180, what=f"execution R={r} published")
        if r < 2:
            c.exec(CONTROLLER, ["scontrol", "requeue", str(job)])
    got = runs(hdir)
    assert [row[:3] for row in got] == [["1", "0", "1000000"], ["1", "1", "1000001"], ["1", "2", "1000002"]], got
    attempts = [row[3] for row in got]
    assert attempts == [f"{name}.{job}.{1_000_000 + r}" for r in range(3)], attempts
    host_root = hdir / "root"
    assert (host_root / "jobs" / f"{name}.{job}").read_bytes() == b"000001\n"
    assert sorted(p.name for p in (host_root / "sub").iterdir()) == ["000001"], "a requeue allocated again"
    assert got[0][4] == "resume=", "the first execution resumed from something"
    pubs = store.publications(str(host_root))
    for r in (1, 2):  # each resumed from the previous execution's save, the latest: its own copy of it
        pub = next(p for p in pubs if p.path == f"exec/{attempts[r - 1]}/checkpoint-{10 * r}")
        assert got[r][4] == f"resume={root}/exec/{attempts[r]}/dispatch-resume/{pub.name}/checkpoint-{10 * r}", got[r]
    assert [(p.epoch, p.step) for p in pubs] == [(1_000_000 + r, 10 * (r + 1)) for r in range(3)], pubs
    assert store.latest(str(host_root)).path == f"exec/{attempts[2]}/checkpoint-30"
    c.cancel(job)
    no_node_drained(c)


# every release: what Slurm does with a TaskProlog's output is slurmstepd's, per release; ~15 s
def test_a_refused_plain_job_says_why_in_its_stderr(no_plugin: Cluster, workdir):
    """A hand-set N no submission allocated: the job fails, its stderr file (-e, apart from
    -o as submitit keeps them) holds the TaskProlog's reason, then Slurm's own line."""
    c = no_plugin
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    job = c.submit("alice", args=["--export=ALL,DISPATCH_CHECKPOINT,DISPATCH_SUBMISSION", "-o", f"{cdir}/%j.out",
                                  "-e", f"{cdir}/%j.err", "--wrap", f"touch {cdir}/ran"],
                   env={"DISPATCH_CHECKPOINT": root, "DISPATCH_SUBMISSION": "7"})
    c.wait_job(job, {"FAILED"}, timeout=90)
    err = (hdir / f"{job}.err").read_text()
    reason = f"dispatch-slurm: error: DISPATCH_SUBMISSION=7 was never allocated under {root}"
    print(f"Slurm {c.slurm_release}: {job}.err =", err, f"{job}.out =", (hdir / f"{job}.out").read_text(), sep="\n")
    assert reason in err, err
    assert "TaskProlog failed" in err and err.index(reason) < err.index("TaskProlog failed"), err
    assert reason in (hdir / f"{job}.out").read_text(), "the print line left the job's stdout"
    assert not (hdir / "ran").exists(), "the refused job ran"
    assert sorted(p.name for p in (hdir / "root").iterdir()) == [], "the refused job wrote under the root"
    no_node_drained(c)
