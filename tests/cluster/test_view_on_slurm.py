"""The view on the real cluster (docker-slurm, Slurm 22.05 to 26.05, and the cgroup v2 VMs): a job
whose script names only `#SBATCH --dispatch-checkpoint=R --dispatch-view=R/out` runs its batch
script, every srun task and their children with R/out being the execution's own exec/<attempt>/
(a bind mount in each task's own mount namespace); a requeue's execution sees its own; R/out on
the nodes and on the host stays empty. site.conf names tests/stubs/view-commands as
`dispatch-slurm view prepare|publish` (what the package's commands do is theirs to test): it
runs as the job user, all ids dropped, in a session of its own, one per step per node, and is
stopped when the step's tasks end. Hostile views are refused by sbatch in one line or fail the
job at start; no node is ever drained and nothing outside the user's tree changes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from support import REPO, vectors
from testbed.cluster import CONTROLLER, Cluster

pytestmark = pytest.mark.cluster

SITE = "/etc/dispatch-slurm/site.conf"
STAND_IN = REPO / "tests" / "stubs" / "view-commands"
ALICE = "2001 2001 2001 2001"  # a /proc status Uid: or Gid: line: real, effective, saved, fs


def make_root(c: Cluster, path: str, user: str = "alice", mode: str = "700") -> str:
    c.exec("c1", f"mkdir -p {path} && chmod {mode} {path}", user=user)
    return path


def no_node_drained(c: Cluster) -> None:
    reasons = c.exec(CONTROLLER, ["sinfo", "-R", "-h"]).stdout.strip()
    assert reasons == "", f"a node was drained: {reasons}"


@pytest.fixture
def commands(slurm_cluster: Cluster, workdir, etc):
    """The stand-in commands in WD/cmd/, named by every host's site.conf; (their folder in the
    containers, on the host)."""
    cdir, hdir = workdir
    (hdir / "cmd").mkdir()
    (hdir / "cmd").chmod(0o777)
    shutil.copy(STAND_IN, hdir / "cmd" / "view-commands")
    etc(SITE, f"dispatch_slurm = {cdir}/cmd/view-commands\n")
    return f"{cdir}/cmd", hdir / "cmd"


def log(hcmd: Path) -> list[str]:
    p = hcmd / "log"
    return p.read_text().splitlines() if p.exists() else []


def mounted_anywhere(c: Cluster, path: str) -> list[str]:
    """The hosts where path is a mount point in slurmd's own namespace (what the node sees)."""
    return [h for h in c.node_names if f" {path} " in c.exec(h, ["cat", "/proc/1/mountinfo"]).stdout]


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
sleep 600
"""


@pytest.mark.vm
def test_every_task_of_every_step_sees_its_own_execution_folder(slurm_cluster: Cluster, workdir, commands):
    c = slurm_cluster
    cdir, hdir = workdir
    _, hcmd = commands
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
    assert (hdir / "seen.0" / "batch.ls").read_text().split() == ["prepared"]
    assert sorted(p.name for p in first_exec.iterdir()) == ["batch", "child.0", "child.1", "prepared", "task.0",
                                                          "task.1"]
    assert list((hroot / "out").iterdir()) == [], "a task wrote into the node's own R/out"
    assert not mounted_anywhere(c, f"{root}/out"), "the view leaked into a node's namespace"
    # the commands: as alice with every id alice's, each in its own session, one per step per node
    lines = log(hcmd)
    starts = [line for line in lines if line.startswith(("prepare ", "publish "))]
    assert {line.split()[0] for line in starts} == {"prepare", "publish"}
    for line in starts:
        assert f"Uid: {ALICE} Gid: {ALICE}" in line and re.search(r"pid=(\d+) sid=\1 ", line), line
        assert f" view={root}/out exec={root}/exec/{first_exec.name} " in line, line
    per_step = {(re.search(r"host=(\S+)", line)[1], re.search(r"parent=(\S*)", line)[1])
                for line in starts if line.startswith("publish ")}
    assert len(per_step) == 3, starts  # the batch step on its node, the srun step on both
    # the srun step ended: its publishers were told (SIGTERM) and are gone
    c.wait_until(lambda: sum(line.startswith("publish term") for line in log(hcmd)) >= 2, timeout=30,
                 what="the srun step's publishers stopped")

    # a requeue while the first execution runs: the next one sees its own folder only
    before = sorted(p.name for p in first_exec.iterdir())
    c.exec(CONTROLLER, ["scontrol", "requeue", str(job)])
    c.wait_until(lambda: (hdir / "seen.1" / "done").exists(), timeout=180, what="the requeued execution's steps")
    second_exec = next(p for p in (hroot / "exec").iterdir() if p != first_exec)
    seen = sees(1)
    assert all(seen[f"{k[:-5]}.view"] == seen[f"{k[:-5]}.exec"] for k in seen if k.endswith(".view")), seen
    assert seen["batch.view"] != sees(0)["batch.view"], "the requeued execution saw the first one's folder"
    assert (hdir / "seen.1" / "batch.ls").read_text().split() == ["prepared"]
    assert sorted(p.name for p in second_exec.iterdir()) == before
    assert sorted(p.name for p in first_exec.iterdir()) == before, "the replacement wrote into the first's folder"
    assert list((hroot / "out").iterdir()) == []
    c.cancel(job)
    c.wait_until(lambda: not any(c.pids(h, "view-commands") for h in c.node_names), timeout=60,
                 what="no stand-in command left on any node")
    no_node_drained(c)


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
LITERAL = {"tab": "a\tb", "command substitution": "$(touch WD/PWNED)", "quotes": "it's \"q\""}


def test_the_view_vectors_through_sbatch(slurm_cluster: Cluster):
    """tests/vectors/view.json's refusals, word for word, from sbatch (the vectors' roots need
    not exist: the view's words are checked before the root is looked at)."""
    c = slurm_cluster
    for case in vectors("view.json")["errors"]:
        array = ["--array=1"] if "%a" in case["root"] else []
        r = c.exec(CONTROLLER, ["sbatch", *array, f"--dispatch-checkpoint={case['root']}",
                                f"--dispatch-view={case['view']}", "--wrap", "true"], user="alice", check=False)
        assert r.returncode != 0 and case["error"] in r.stderr, (case["view"][:80], r.stderr[-500:])


def test_hostile_views(slurm_cluster: Cluster, workdir, commands):
    c = slurm_cluster
    cdir, hdir = workdir
    hcmd = commands[1]
    root = make_root(c, f"{cdir}/root", mode="777")  # bob may make his folder in it
    c.exec("c1", f"ln -s /etc {root}/etc-link", user="alice")
    c.exec("c1", f"mkdir -m 777 {root}/bobs", user="bob")
    before = _etc_snapshot(c)
    for view, code, said in REFUSED:
        view, said = (s.replace("ROOT", root).replace("WD", cdir) for s in (view, said))
        r = c.exec(CONTROLLER, ["sbatch", "--parsable", f"--dispatch-checkpoint={root}", f"--dispatch-view={view}",
                                "--wrap", "true"], user="alice", check=False)
        errors = [line for line in r.stderr.splitlines() if "error" in line]
        assert (r.returncode, r.stdout) == (code, ""), (view[:80], r)
        assert len(errors) == 1 and said in errors[0], (view[:80], r.stderr)
    # odd bytes are only bytes, a 4,000-byte view works; a symlink planted after sbatch checked
    # fails the job at start; a prepare that refuses fails it with its line
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
        if name == "prepare refuses":
            (hcmd / "prepare.mode").write_text("fail")
        c.exec(CONTROLLER, ["scontrol", "release", str(jobs[name])], user="alice")
        ended = c.wait_job(jobs[name], {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}, timeout=120)
        (hcmd / "prepare.mode").unlink(missing_ok=True)
        err = (hdir / f"{i}.err").read_text() if (hdir / f"{i}.err").exists() else ""
        if name in ("planted", "prepare refuses"):
            assert "FAILED" in ended.states and not (hdir / f"{i}.ran").exists(), (name, ended, err)
            want = (f"{root}/planted is a symlink" if name == "planted" else
                    "the view cannot be prepared: this is the line that names the fix")
            assert want in err, (name, err)
        else:
            assert "COMPLETED" in ended.states, (name, ended, err)
    execs = list((hdir / "root" / "exec").iterdir())
    written = [p for p in execs if (p / "written").exists()]
    assert len(written) == len(LITERAL) + 1, "a job with an odd view did not write into its exec folder"
    assert not (hdir / "PWNED").exists() and not (hdir / "root" / "planted" / "written").exists()
    assert _etc_snapshot(c) == before, "something under /etc changed"
    no_node_drained(c)
