"""The view on the real cluster: the job scripts of the README and of docs/view.md, as written (their
root and paths this test's), with an unmodified trainer (tests/testbed/dettrain.py --naive: no
dispatch import, no flag of it; it saves Hugging Face's checkpoint-<N>/ layout into the folder it
is given and resumes from the highest one there, as get_last_checkpoint does).

The plugin's side (--dispatch-view, the mount namespace of every task, `view prepare` and `view
publish` run as the job user on each node before each step's tasks) comes from another branch:
until a cluster's sbatch knows --dispatch-view these tests skip, naming it."""

from __future__ import annotations

import json

import pytest

from dispatch_slurm import store
from test_readme_snippets import block
from test_spank_site import make_root, no_node_drained
from testbed import dettrain
from testbed.cluster import CONTROLLER, Cluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def view_site(slurm_cluster: Cluster):
    """A cluster whose plugin has the view (--dispatch-view); skip on one that has not."""
    c = slurm_cluster
    probe = c.exec(CONTROLLER, ["sbatch", "--test-only", "--dispatch-view=/tmp", "--wrap", "true"], user="alice",
                   check=False)
    if "dispatch-view" in probe.stderr and ("unrecognized" in probe.stderr or "invalid" in probe.stderr):
        pytest.skip("this cluster's SPANK plugin has no --dispatch-view yet (the plugin's side of the view)")
    return c


def _script(text: str, root: str, trainer: str, cdir: str) -> str:
    """A page's job script with this test's root and trainer (its own command line, unchanged)."""
    out = text.replace("/scratch/me/run1", root)
    out = out.replace("python train.py --output-dir", f"python3 {trainer} --naive --max-steps 400 --save-every 20 "
                      f"--step-time 0.1 --log {cdir}/train.log --output-dir")
    return out.replace("#!/bin/bash\n", f"#!/bin/bash\n#SBATCH -o {cdir}/job.out --open-mode=append --requeue\n", 1)


def _through_a_requeue(c: Cluster, workdir, snippet: str) -> None:
    """The job saves and publishes; `scontrol requeue` starts its next execution, which resumes
    from the latest publication (placed in its own folder) and publishes at its greater epoch."""
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    c.exec("c1", f"mkdir -p {root}/out", user="alice")
    (hdir / "dettrain.py").write_text(open(dettrain.__file__).read())
    (hdir / "train.sbatch").write_text(_script(snippet, root, f"{cdir}/dettrain.py", cdir))
    job = c.submit("alice", (hdir / "train.sbatch").read_text())
    hroot = str(hdir / "root")

    def published(restart: int) -> list:
        if c.job(job).ended:
            raise AssertionError(f"the job ended: {(hdir / 'job.out').read_text()[-3000:]}")
        return [p for p in store.publications(hroot) if p.parts.restart == restart]

    first = c.wait_until(lambda: published(0)[1:], timeout=240, what="the first execution's saves published")
    c.exec(CONTROLLER, ["scontrol", "requeue", str(job)])
    c.wait_until(lambda: published(1), timeout=400, what="the requeued execution's first publication")
    c.cancel(job)
    c.wait_job(job, lambda j: j.ended, timeout=120)
    recs = [json.loads(line) for line in (hdir / "train.log").read_text().splitlines()]
    resumes = [r for r in recs if r["op"] == "resume"]
    old = {p.step for p in store.publications(hroot) if p.parts.restart == 0}
    assert resumes and resumes[-1]["step"] in old and resumes[-1]["step"] >= first[-1].step, \
        "the requeued execution resumed from a publication of the first, under the trainer's own rule"
    latest = store.latest(hroot)
    assert latest.parts.restart == 1 and latest.path.startswith("exec/"), latest
    no_node_drained(c)


@pytest.mark.one_release
def test_the_readmes_view_job_script_resumes_an_unmodified_trainer(view_site: Cluster, workdir):
    _through_a_requeue(view_site, workdir, block("readme-view-job-script"))


@pytest.mark.one_release
def test_the_view_job_script_runs_an_unmodified_trainer_through_a_requeue(view_site: Cluster, workdir):
    _through_a_requeue(view_site, workdir, block("view-job-script"))
