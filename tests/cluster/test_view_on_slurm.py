"""The view on the real cluster (docker-slurm, Slurm 22.05 to 26.05, and the cgroup v2 VMs): a job
whose script names only `#SBATCH --dispatch-checkpoint=R --dispatch-view=R/out` runs its batch
script, every srun task and their children with R/out being the execution's own exec/<attempt>/
(a bind mount in each task's own mount namespace); a requeue's execution sees its own; R/out on
the nodes and on the host stays empty. The nodes' own `dispatch-slurm view prepare` and `view
publish` run as the job user, all ids dropped, in a session of their own, and the publisher of a
step ends with the step's tasks. The job scripts of the README and of docs/view.md, as written
(their root and paths this test's), run an unmodified trainer (tests/testbed/dettrain.py
--naive: no dispatch import, no flag of it; it saves Hugging Face's checkpoint-<N>/ layout into
the folder it is given and resumes from the highest one there, as get_last_checkpoint does)
through a requeue. Hostile views are refused by sbatch in one line or fail the job at start; no
node is ever drained and nothing outside the user's tree changes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dispatch_slurm import store
from dispatch_slurm.contract import layout, names
from support import vectors
from test_readme_snippets import block
from testbed import dettrain
from testbed.cluster import CONTROLLER, Cluster

pytestmark = pytest.mark.cluster

ALICE = "2001 2001 2001 2001"  # a /proc status Uid: or Gid: line: real, effective, saved, fs
PUBLISHER = "dispatch-slurm view publish"


def make_root(c: Cluster, path: str, user: str = "alice", mode: str = "700") -> str:
    c.exec("c1", f"mkdir -p {path} && chmod {mode} {path}", user=user)
    return path


def no_node_drained(c: Cluster) -> None:
    reasons = c.exec(CONTROLLER, ["sinfo", "-R", "-h"]).stdout.strip()
    assert reasons == "", f"a node was drained: {reasons}"


def mounted_anywhere(c: Cluster, path: str) -> list[str]:
    """The hosts where path is a mount point in slurmd's own namespace (what the node sees)."""
    return [h for h in c.node_names if f" {path} " in c.exec(h, ["cat", "/proc/1/mountinfo"]).stdout]


def publishers(c: Cluster) -> dict[str, list[str]]:
    """Each node's running view publishers: their /proc status ids and their pid, session."""
    got = {}
    for h in c.node_names:
        got[h] = []
        for pid in c.pids(h, PUBLISHER, user="alice"):
            r = c.exec(h, f"grep -E '^(Uid|Gid):' /proc/{pid}/status | tr -s '\t ' ' ' | tr '\n' ' ';"
                          f" cut -d' ' -f1,6 /proc/{pid}/stat", check=False)
            if r.returncode == 0:
                got[h].append(r.stdout.strip())
    return got


def on_batch_node_alone(c: Cluster, seen: Path, batch_publisher: list[str]) -> None:
    """An srun step on the batch step's node alone starts no publisher (nor prepare) of its
    own: the batch step's, which outlives it, publishes for it. Its task sees the view."""
    c.wait_until(lambda: (seen / "alone.running").exists(), timeout=120, what="the srun step on the batch node")
    now = [line for lines in publishers(c).values() for line in lines]
    assert now == batch_publisher, f"the srun step on the batch node started a publisher of its own: {now}"
    (seen / "alone.go").touch()
    c.wait_until(lambda: (seen / "alone.done").exists(), timeout=120, what="the srun step on the batch node to end")
    view, exec_dir = ((seen / f"alone.{k}").read_text().strip() for k in ("view", "exec"))
    assert view == exec_dir, "the srun step's task did not see the execution's folder"


SCRIPT = """#!/bin/bash
#SBATCH --dispatch-checkpoint={root} --dispatch-view={root}/out
#SBATCH -N2 --ntasks-per-node=1 --requeue -o {cdir}/job.out --open-mode=append -e {cdir}/job.err
o={cdir}/seen.${{SLURM_RESTART_COUNT:-0}}
mkdir -p $o
stat -c %d.%i {root}/out > $o/batch.view
stat -c %d.%i "$DISPATCH_EXEC_DIR" > $o/batch.exec
ls -A {root}/out > $o/batch.ls
touch {root}/out/batch
srun bash -c 'h=$(hostname); stat -c %d.%i {root}/out > '$o'/task.$SLURM_PROCID.$h.view
  stat -c %d.%i "$DISPATCH_EXEC_DIR" > '$o'/task.$SLURM_PROCID.$h.exec
  touch {root}/out/task.$SLURM_PROCID; bash -c "touch {root}/out/child.$SLURM_PROCID"'
touch $o/done
srun -N1 -n1 -w $SLURMD_NODENAME bash -c 'touch '$o'/alone.running; while [ ! -e '$o'/alone.go ]; do sleep 0.2; done
  stat -c %d.%i {root}/out > '$o'/alone.view; stat -c %d.%i "$DISPATCH_EXEC_DIR" > '$o'/alone.exec'
touch $o/alone.done
sleep 600
"""
@pytest.mark.vm
def test_every_task_of_every_step_sees_its_own_execution_folder(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    hroot = hdir / "root"
    job = c.submit("alice", SCRIPT.format(root=root, cdir=cdir))
    c.wait_until(lambda: (hdir / "seen.0" / "done").exists(), timeout=120, what="the first execution's steps")
    first = {p.name for p in (hroot / "exec").iterdir()}
    assert len(first) == 1
    first_exec = hroot / "exec" / first.pop()

    def sees(n: int) -> dict[str, str]:
        return {p.name: p.read_text().strip() for p in (hdir / f"seen.{n}").iterdir() if p.suffix in (".view", ".exec")}

    seen = sees(0)
    tasks = sorted(k[:-5] for k in seen if k.startswith("task.") and k.endswith(".view"))
    assert len(tasks) == 2 and len({t.split(".")[2] for t in tasks}) == 2, seen  # two nodes
    for who in ["batch", *tasks]:  # R/out is the execution's folder, in the batch script and every task
        assert seen[f"{who}.view"] == seen[f"{who}.exec"], seen
    # prepare ran before the batch script, as alice: nothing published, so only its record
    assert (hdir / "seen.0" / "batch.ls").read_text().split() == [layout.VIEW]
    assert (first_exec / layout.VIEW).stat().st_uid == 2001
    assert sorted(p.name for p in first_exec.iterdir()) == sorted(
        ["batch", "child.0", "child.1", layout.VIEW, "task.0", "task.1"])
    assert list((hroot / "out").iterdir()) == [], "a task wrote into the node's own R/out"
    assert not mounted_anywhere(c, f"{root}/out"), "the view leaked into a node's namespace"
    # the srun step ended: its publishers went with its tasks; the batch step's one is left,
    # as alice with every id alice's, in its own session
    c.wait_until(lambda: sum(map(len, publishers(c).values())) <= 1, timeout=60,
                 what="the srun step's publishers gone with its tasks")
    left = [line for lines in publishers(c).values() for line in lines]
    assert len(left) == 1, f"the batch step's publisher is gone: {left}, {(hdir / 'job.err').read_text()[-2000:]}"
    (line,) = left
    assert f"Uid: {ALICE} Gid: {ALICE}" in line and re.search(r" (\d+) \1$", line), line
    on_batch_node_alone(c, hdir / "seen.0", left)

    # a requeue while the first execution runs: the next one sees its own folder only
    before = sorted(p.name for p in first_exec.iterdir())
    c.exec(CONTROLLER, ["scontrol", "requeue", str(job)])
    c.wait_until(lambda: (hdir / "seen.1" / "done").exists(), timeout=180, what="the requeued execution's steps")
    second_exec = next(p for p in (hroot / "exec").iterdir() if p != first_exec)
    seen = sees(1)
    where = {"node's R/out": (hroot / "out").stat().st_ino, "first exec": first_exec.stat().st_ino,
             "batch.ls": (hdir / "seen.1" / "batch.ls").read_text(), "err": (hdir / "job.err").read_text()[-1500:]}
    assert all(seen[f"{k[:-5]}.view"] == seen[f"{k[:-5]}.exec"] for k in seen if k.endswith(".view")), (seen, where)
    assert seen["batch.view"] != sees(0)["batch.view"], "the requeued execution saw the first one's folder"
    assert (hdir / "seen.1" / "batch.ls").read_text().split() == [layout.VIEW]
    assert sorted(p.name for p in second_exec.iterdir()) == before
    assert sorted(p.name for p in first_exec.iterdir()) == before, "the replacement wrote into the first's folder"
    assert list((hroot / "out").iterdir()) == []
    c.cancel(job)
    c.wait_until(lambda: not any(publishers(c).values()), timeout=60, what="no view publisher left on any node")
    no_node_drained(c)


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
def test_the_readmes_view_job_script_resumes_an_unmodified_trainer(slurm_cluster: Cluster, workdir):
    _through_a_requeue(slurm_cluster, workdir, block("readme-view-job-script"))


@pytest.mark.one_release
def test_the_view_job_script_runs_an_unmodified_trainer_through_a_requeue(slurm_cluster: Cluster, workdir):
    _through_a_requeue(slurm_cluster, workdir, block("view-job-script"))


# ---- hostile views: refused by sbatch, or the job fails at start; never a drained node ----

def _etc_snapshot(c: Cluster) -> dict[str, str]:
    return {h: c.exec(h, "find /etc -xdev -printf '%p %u %m %s %T@\\n' | sort").stdout
            for h in [CONTROLLER, *c.node_names]}


REFUSED = [  # (--dispatch-view, sbatch's exit status, what its one line says)
    ("out", 255, "view folder 'out' must be an absolute path"),
    ("ROOT/../etc", 255, "must not contain '..'"),
    ("ROOT/" + "x" * 4200, 255, "is too long"),
    ("ROOT", 1, "is the checkpoint root itself: name a folder inside it (e.g. ROOT/out)"),
    ("WD/elsewhere", 1, "is not inside the checkpoint root ROOT"),
    ("ROOT/exec/mine", 1, "is in ROOT/exec, dispatch-slurm's own folder"),
    ("ROOT/etc-link", 1, "ROOT/etc-link is a symlink; the view and its root must be real folders"),
    ("ROOT/bobs", 1, "ROOT/bobs belongs to uid 2002, not to you (uid 2001)"),
]
SLURMS_OWN = ("Invalid --dispatch-view argument",  # sbatch's own lines around the plugin's one
              "spank: required plugin", "Plugin stack post-option processing failed")
LITERAL = {"tab": "a\tb", "command substitution": "$(touch WD/PWNED)", "quotes": "it's \"q\""}


def test_the_view_vectors_through_sbatch(slurm_cluster: Cluster):
    """tests/vectors/view.json's refusals, word for word, from sbatch (the vectors' roots need
    not exist: the view's words are checked before the root is looked at). sbatch names the
    view by its option where the vectors say "view folder"."""
    c = slurm_cluster
    for case in vectors("view.json")["errors"]:
        array = ["--array=1"] if "%a" in case["root"] else []
        r = c.exec(CONTROLLER, ["sbatch", *array, f"--dispatch-checkpoint={case['root']}",
                                f"--dispatch-view={case['view']}", "--wrap", "true"], user="alice", check=False)
        said = case["error"].removeprefix("view folder ")
        assert r.returncode != 0 and said in r.stderr, (case["view"][:80], r.stderr[-500:])


def test_hostile_views(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root", mode="777")  # bob may make his folder in it
    c.exec("c1", f"ln -s /etc {root}/etc-link", user="alice")
    c.exec("c1", f"mkdir -m 777 {root}/bobs", user="bob")
    before = _etc_snapshot(c)
    for view, code, said in REFUSED:
        view, said = (s.replace("ROOT", root).replace("WD", cdir) for s in (view, said))
        r = c.exec(CONTROLLER, ["sbatch", "--parsable", f"--dispatch-checkpoint={root}", f"--dispatch-view={view}",
                                "--wrap", "true"], user="alice", check=False)
        errors = [line for line in r.stderr.splitlines() if "error" in line and not any(o in line for o in SLURMS_OWN)]
        assert (r.returncode, r.stdout) == (code, ""), (view[:80], r)
        assert len(errors) == 1 and said in errors[0], (view[:80], r.stderr)
    # odd bytes are only bytes, a 4,000-byte view works; a symlink planted after sbatch checked
    # fails the job at start; a prepare that refuses (the latest publication's save vanished)
    # fails it with its line
    views = {name: f"{root}/{rel.replace('WD', cdir)}" for name, rel in LITERAL.items()}
    views["4,000 bytes"] = f"{root}/" + "/".join(["d" * 200] * 19) + "/"
    views["4,000 bytes"] += "e" * (4000 - len(views["4,000 bytes"]))
    views["planted"] = f"{root}/planted"
    views["prepare refuses"] = f"{root}/refused"
    jobs = {}
    for name, view in views.items():
        jobs[name] = c.submit("alice", args=["-H", f"--dispatch-checkpoint={root}", f"--dispatch-view={view}",
                                             "-o", f"{cdir}/{len(jobs)}.out", "-e", f"{cdir}/{len(jobs)}.err",
                                             "--wrap", f'touch "$DISPATCH_VIEW/written" && touch {cdir}/{len(jobs)}.ran'])
    c.exec("c1", f"ln -s /etc {root}/planted", user="alice")
    for i, name in enumerate(views):
        if name == "prepare refuses":  # the last: the other jobs' prepare found nothing published
            vanished = names.encode(1_000_000, 5, "exec/gone.1.1/checkpoint-5")
            c.exec("c1", f"mkdir -p {root}/{layout.PUB} && touch {root}/{layout.PUB}/{vanished}", user="alice")
        c.exec(CONTROLLER, ["scontrol", "release", str(jobs[name])], user="alice")
        ended = c.wait_job(jobs[name], {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}, timeout=120)
        err = (hdir / f"{i}.err").read_text() if (hdir / f"{i}.err").exists() else ""
        if name in ("planted", "prepare refuses"):
            assert "FAILED" in ended.states and not (hdir / f"{i}.ran").exists(), (name, ended, err)
            want = (f"{root}/planted is a symlink" if name == "planted" else
                    f"names the save {root}/exec/gone.1.1/checkpoint-5, which no longer exists")
            assert want in err, (name, err)
        else:
            assert "COMPLETED" in ended.states, (name, ended, err)
    execs = list((hdir / "root" / "exec").iterdir())
    written = [p for p in execs if (p / "written").exists()]
    assert len(written) == len(LITERAL) + 1, "a job with an odd view did not write into its exec folder"
    assert not (hdir / "PWNED").exists() and not (hdir / "root" / "planted" / "written").exists()
    assert _etc_snapshot(c) == before, "something under /etc changed"
    no_node_drained(c)
