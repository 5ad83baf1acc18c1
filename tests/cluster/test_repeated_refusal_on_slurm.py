"""`run` on the real cluster, a root whose latest publication's save is gone (removed by hand,
with the publication's held links): every execution of the README's job script is refused at
`latest --resume`, seconds after it started, the same way. `run --resubmit 3` tries one
resubmission, then ends failed with the refusal and its fix named and budget left, instead of
spending the whole budget in seconds; the fix it names (`retire --latest`), then `supersede`,
finish the run."""

from __future__ import annotations

import json
import shutil

import pytest

from support import REPO
from testbed import campaign
from testbed.cluster import CONTROLLER, Cluster
from dispatch_slurm.contract import names
from dispatch_slurm.supervisor.record import Record

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]
DETTRAIN = f"{campaign.IMAGE_TESTBED}/dettrain.py"


def test_a_refusal_that_repeats_is_not_resubmitted_until_the_budget_is_spent(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root, hroot = f"{cdir}/root", hdir / "root"
    c.exec(CONTROLLER, f"mkdir -m 700 {root}", user="alice")
    (hdir / "bin").mkdir()
    (hdir / "bin" / "python").symlink_to("/usr/bin/python3")
    (hdir / "train.py").write_text(campaign.wrapper(DETTRAIN, [
        "--max-steps", "40", "--save-every", "10", "--step-time", "0.05", "--trap", "own",
        "--log", f"{cdir}/train.jsonl"]))
    (hdir / "job.sh").write_text(campaign.readme_job_script(REPO / "README.md"))
    env = f"PATH={cdir}/bin:/usr/local/bin:/usr/bin:/bin"

    def facts(kind=None):
        return [f for f in Record(str(hroot)).read() if kind is None or f["type"] == kind] \
            if (hroot / "record.jsonl").exists() else []

    def supervise(k: int, verb: str, *args: str) -> None:
        c.exec(CONTROLLER, f"cd {cdir} && env {env} setsid nohup bash -c 'dispatch-slurm {verb} {root} "
                           f"{' '.join(args)}; echo $? > {cdir}/sup.{k}.rc' > {cdir}/sup.{k}.log 2>&1 < /dev/null &",
               user="alice")

    def rc(k: int):
        p = hdir / f"sup.{k}.rc"
        return int(p.read_text()) if p.exists() and p.read_text().strip() else None

    # a job that publishes its saves (10, 20, 30, 40) and ends done; then a person removes the latest save
    job = c.slurm_as("alice").submit(["-N1", "-o", f"{cdir}/first-%j.out", f"--chdir={cdir}",
                                      f"--dispatch-checkpoint={root}", f"{cdir}/job.sh"], {"PATH": env[5:]})
    first = c.wait_job(job, lambda j: j.ended, timeout=180)
    assert first.state == "COMPLETED", (first.state, list(hdir.glob("first-*.out"))[0].read_text())
    latest = max(names.parse(p.name) for p in (hroot / "pub").iterdir())  # (epoch, step) order
    assert latest.step == 40
    shutil.rmtree(hroot / latest.path)
    shutil.rmtree(hroot / "held" / latest.name)  # by hand: the save and its publication's held links

    supervise(1, "run", "--resubmit", "3", "--poll", "1", "--", "-N1", f"--output={cdir}/run-%j.out", f"{cdir}/job.sh")
    c.wait_until(lambda: rc(1) is not None, timeout=300, what="run to end")
    log = (hdir / "sup.1.log").read_text()
    fin = facts("finished")[-1]
    rules = [(f["rule"], f.get("budget_left"), f.get("repeated", False)) for f in facts("rule")]
    first_end = facts("ended")[0]["t"]
    print(f"\n{log}\nrules {rules}; {fin['t'] - first_end:.1f}s from the first end to the finish")
    assert rc(1) == 1 and fin["outcome"] == "failed", log
    assert len(facts("submitted")) == 2 and rules == [("resubmit", 2, False), ("fail", 2, True)], rules
    assert "was refused its resume" in fin["message"] and "which no longer exists" in fin["message"]
    assert "dispatch-slurm retire" in fin["message"] and "(2 of --resubmit 3 left)" in fin["message"]
    assert f"dispatch-slurm supersede {root}" in fin["message"], fin["message"]
    refusals = [json.loads(line) for p in (hroot / "events").iterdir() for line in p.read_text().splitlines()
                if '"refused"' in line]
    assert len({e["attempt"] for e in refusals}) == 2, "each execution recorded its own refusal"

    # the fix the message names, then supersede: the run resumes from the previous publication and finishes
    c.exec(CONTROLLER, ["dispatch-slurm", "retire", root, "--latest", "-m", "save vanished"], user="alice")
    supervise(2, "supersede", "--poll", "1")
    c.wait_until(lambda: rc(2) is not None, timeout=300, what="supersede to end")
    assert rc(2) == 0 and facts("finished")[-1]["outcome"] == "done", (hdir / "sup.2.log").read_text()
