"""On the real cluster (Slurm 22.05, 24.11 and 26.05): the SPANK plugin, the Prolog,
TaskProlog and Epilog give every task the same DISPATCH_* values as
`dispatch-slurm env` and the shared contract; bad input is refused without draining
a node or touching anything outside the user's own tree."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import time

import pytest

from dispatch_slurm.contract import env as envmod
from dispatch_slurm.slurm.hooks.job import SPANK_OPT
from dispatch_slurm.slurm.cessation.node import WAIT_S as CESSATION_WAIT
from dispatch_slurm.store import events
from testbed.cluster import CONTROLLER, Cluster, slurm_at_least
from testbed.vm import VMCluster

pytestmark = pytest.mark.cluster

ENV_DUMP = "{ env | grep ^DISPATCH_ | sort; echo END=1; }"  # END: the file is whole (the shell creates it first)


def make_root(c: Cluster, path: str, user: str = "alice", mode: str = "700") -> str:
    c.exec("c1", f"mkdir -p {path} && chmod {mode} {path}", user=user)
    return path


def dumps(host_dir, prefix: str) -> dict[str, dict[str, str]]:
    """name -> {K: V} of every `env | grep ^DISPATCH_` file the job wrote."""
    out = {}
    for p in sorted(host_dir.glob(f"{prefix}*")):
        lines = p.read_text().splitlines()
        if lines[-1:] == ["END=1"]:  # a file still being written is not seen yet
            out[p.name] = dict(line.split("=", 1) for line in lines[:-1] if "=" in line)
    return out


def cluster_name(c: Cluster) -> str:
    cfg = c.exec(CONTROLLER, ["scontrol", "show", "config"]).stdout
    return re.search(r"^ClusterName\s*=\s*(\S+)", cfg, re.M)[1]


def expected(c: Cluster, root: str, job_id: int, n: int, r: int = 0, g: int = 0) -> dict[str, str]:
    """The contract's answer, computed here from the same facts."""
    e = {"DISPATCH_CHECKPOINT": root, "DISPATCH_SUBMISSION": str(n), "DISPATCH_GENERATION": str(g),
         "SLURM_JOB_ID": str(job_id), "SLURM_CLUSTER_NAME": cluster_name(c)}
    if r:
        e["SLURM_RESTART_COUNT"] = str(r)
    return envmod.compute(e)


MULTI_NODE = """#!/bin/bash
#SBATCH -N {nodes} --ntasks-per-node=2 -o {out}/slurm-%j.out -e {out}/slurm-%j.err
{ENV_DUMP} > {out}/batch
dispatch-slurm env --format json --no-mkdir > {out}/cli.json
srun bash -c '{ENV_DUMP} > {out}/task.$SLURM_PROCID.$(hostname)'
"""


@pytest.mark.vm
@pytest.mark.parametrize("path", ["spank", pytest.param("taskprolog", marks=pytest.mark.vm("full"))])
def test_every_task_sees_the_contract(slurm_cluster: Cluster, workdir, path):
    """Both ways in give every task of a job on every node the same values: equal to
    `dispatch-slurm env`, to the contract computed here, and one DISPATCH_ATTEMPT."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    script = MULTI_NODE.format(out=cdir, ENV_DUMP=ENV_DUMP, nodes=len(c.node_names))
    if path == "spank":
        job = c.submit("alice", script, args=[f"--dispatch-checkpoint={root}"])
    else:  # user-level submission: no plugin option; the TaskProlog computes the values
        out = c.exec(CONTROLLER, ["dispatch-slurm", "submit", root, "--json", "--", "-D", cdir],
                     user="alice", input=script).stdout
        job = json.loads(out)["job_id"]
    c.wait_job(job, "COMPLETED", timeout=90)
    want = expected(c, root, job, n=1)
    tasks = dumps(hdir, "task.")
    assert len(tasks) == 2 * len(c.node_names) and {k.split(".")[2] for k in tasks} == set(c.node_names)
    assert all(t == want for t in tasks.values()), tasks
    assert dumps(hdir, "batch")["batch"] == want
    assert json.loads((hdir / "cli.json").read_text()) == want
    exec_dir = c.path(want["DISPATCH_EXEC_DIR"])
    assert exec_dir.is_dir() and exec_dir.stat().st_uid == 2001 and exec_dir.stat().st_mode & 0o777 == 0o700


@pytest.mark.vm("full")
def test_requeue_raises_r_and_resubmission_raises_n(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    script = f"""#!/bin/bash
#SBATCH -o /dev/null --requeue
echo "$DISPATCH_ATTEMPT $DISPATCH_RESTART $DISPATCH_SUBMISSION $DISPATCH_EPOCH" >> {cdir}/executions
sleep 300
"""
    job = c.submit("alice", script, args=[f"--dispatch-checkpoint={root}"])
    runs = lambda: (hdir / "executions").read_text().splitlines() if (hdir / "executions").exists() else []
    c.wait_until(lambda: len(runs()) == 1, timeout=60, what="first execution")
    c.exec(CONTROLLER, ["scontrol", "requeue", str(job)])
    c.wait_until(lambda: len(runs()) == 2, timeout=120, what="requeued execution")
    preemptor = c.preempt(job)  # partition "normal": PreemptMode=REQUEUE
    c.wait_job(job, lambda j: j.restart_count == 2, timeout=90)
    c.cancel(preemptor)
    c.wait_until(lambda: len(runs()) == 3, timeout=180, what="execution after preemption")
    rows = [r.split() for r in runs()]
    assert [r[1] for r in rows] == ["0", "1", "2"]
    assert len({r[0] for r in rows}) == 3, "every execution has its own attempt"
    assert [int(r[3]) for r in rows] == sorted(int(r[3]) for r in rows) and len({r[3] for r in rows}) == 3
    assert {r[2] for r in rows} == {"1"}, "a requeue keeps the submission number"
    c.cancel(job)
    second = c.submit("alice", script, args=[f"--dispatch-checkpoint={root}"])
    c.wait_until(lambda: len(runs()) == 4, timeout=60, what="resubmission")
    assert runs()[3].split()[1:3] == ["0", "2"], "a resubmission raises N and starts at R=0"
    c.cancel(second)
    assert sorted(p.name for p in (hdir / "root" / "sub").iterdir()) == ["000001", "000002"]



def snapshot(root) -> dict[str, tuple[int, int, int]]:
    """path -> (inode, size, mtime) of everything under ROOT/ceased and ROOT/events."""
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
            for d in ("ceased", "events") for p in sorted((root / d).rglob("*"))}


@pytest.mark.vm
def test_epilog_twice_changes_nothing_and_names_the_run(slurm_cluster: Cluster, workdir):
    """Slurm may run the Epilog again for one execution (TERMINATE_JOB retries; fixed in
    26.05). A second run, even one that finds the Prolog's record still there (as if the
    first died before removing it), adds no entry and no event. From 25.11 on the Epilog
    knows Slurm's own id of the run (SLURM_JOB_SLUID; 26.05 gives the job it too): the
    cessation event carries it as evidence, DISPATCH_ATTEMPT stays the contract's token."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    job = c.submit("alice", f"#!/bin/bash\n#SBATCH -w c1 -o {cdir}/out\necho $DISPATCH_ATTEMPT $SLURM_JOB_SLUID\n",
                   args=[f"--dispatch-checkpoint={root}"])
    c.wait_job(job, "COMPLETED", timeout=90)
    attempt, *sluid = (hdir / "out").read_text().split()
    assert attempt == expected(c, root, job, n=1)["DISPATCH_ATTEMPT"]
    entry = hdir / "root" / "ceased" / f"{attempt}.c1"
    c.wait_until(lambda: entry.exists(), timeout=60, what="the Epilog's cessation entry")
    c.wait_until(lambda: c.exec("c1", f"test -e /run/dispatch-slurm/{job}.json", check=False).returncode,
                 timeout=30, what="the Epilog to remove the Prolog's record")
    (ceased,) = [e for e in events.read(str(hdir / "root")) if e["type"] == "cessation"]
    assert ceased["attempt"] == attempt and ceased["node"] == "c1"
    assert ceased.get("sluid") == (sluid[0] if sluid else None), "SLURM_JOB_SLUID: the Epilog's equals the job's"
    # how the Epilog knows, in the entry and the event: on cgroup v2 (the VM bed) the job's
    # cgroup, gone or empty; elsewhere (cgroup v1, linuxproc) the process scan; and which
    # nodes ran the execution (the Prolog's SLURM_JOB_NODELIST, or SLURM_NODELIST on 22.05)
    evidence = json.loads(entry.read_text())
    assert evidence.pop("nodes") == ["c1"] and ceased["nodes"] == ["c1"]
    assert ceased["evidence"] == evidence
    if getattr(c, "cgroup", None) == "v2":
        assert evidence["by"] == "cgroup v2" and evidence["state"] in ("gone", "empty"), evidence
        assert (sluid[0] if sluid and slurm_at_least(c, "26.05") else f"job_{job}") in evidence["cgroup"], evidence
    else:
        assert evidence == {"by": "process scan"}
    before = snapshot(hdir / "root")

    # the Prolog's record back (root's, 0644, as the Prolog writes it), then the Epilog again
    record = json.dumps({"DISPATCH_CHECKPOINT": root, "DISPATCH_ATTEMPT": attempt})
    c.exec("c1", f"printf '%s' '{record}' > /run/dispatch-slurm/{job}.json && chmod 0644 /run/dispatch-slurm/{job}.json")
    c.exec("c1", ["/usr/libexec/dispatch-slurm/epilog"],
           env={"SLURM_JOB_ID": str(job), "SLURM_JOB_UID": "2001", "SLURM_JOB_GID": "2001", "SLURM_JOB_USER": "alice",
                "SLURMD_NODENAME": "c1", f"{SPANK_OPT}checkpoint": root, **({"SLURM_JOB_SLUID": sluid[0]} if sluid else {})})
    assert snapshot(hdir / "root") == before
    assert c.exec("c1", f"test -e /run/dispatch-slurm/{job}.json", check=False).returncode, "record removed again"


@pytest.mark.vm_only  # cgroup v2: the VM bed
def test_on_cgroup_v2_the_epilog_waits_for_the_job_cgroup_not_a_process_scan(slurm_cluster: Cluster, workdir):
    """A process of the job that dropped its environment (``env -i``) is invisible to the
    Epilog's process scan, not to the job's cgroup, which it cannot leave: run by hand
    while the job still runs, the Epilog records no cessation (after CESSATION_WAIT) and
    names the cgroup; once the job is cancelled, Slurm's own Epilog records it with the
    cgroup as its evidence, and `dispatch-slurm ceased` says so."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    job = c.submit("alice", f"#!/bin/bash\n#SBATCH -w c2 -o /dev/null\necho \"$SLURM_JOB_SLUID\" > {cdir}/sluid\n"
                            "exec env -i /bin/sleep 600\n", args=[f"--dispatch-checkpoint={root}"])
    c.wait_job(job, "RUNNING", timeout=90)
    c.wait_until(lambda: c.pids("c2", "^/bin/sleep 600", user="alice"), timeout=60, what="the job's sleep")
    sluid = (hdir / "sluid").read_text().strip()  # 26.05 names the job's cgroup by it; Slurm gives the Epilog it
    attempt = expected(c, root, job, n=1)["DISPATCH_ATTEMPT"]
    scan = c.exec("c2", f"grep -lsa 'DISPATCH_ATTEMPT={attempt}' /proc/[0-9]*/environ", check=False).stdout
    assert not scan.strip(), f"a process still carries the token, the scan alone would wait too: {scan}"
    by_hand = c.exec("c2", ["/usr/libexec/dispatch-slurm/epilog"],
                     env={"SLURM_JOB_ID": str(job), "SLURM_JOB_UID": "2001", "SLURM_JOB_GID": "2001",
                          "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "c2", f"{SPANK_OPT}checkpoint": root,
                          **({"SLURM_JOB_SLUID": sluid} if sluid else {})})
    assert by_hand.returncode == 0
    assert not (hdir / "root" / "ceased").exists() or not list((hdir / "root" / "ceased").iterdir())
    said = c.exec("c2", "tail -3 /var/log/dispatch-slurm.log").stdout
    assert f"job cgroup /sys/fs/cgroup/system.slice/c2_slurmstepd.scope/{sluid or f'job_{job}'}" in said, said
    c.cancel(job)
    entry = hdir / "root" / "ceased" / f"{attempt}.c2"
    c.wait_until(lambda: entry.exists(), timeout=90, what="Slurm's Epilog to record cessation")
    evidence = json.loads(entry.read_text())
    assert evidence["by"] == "cgroup v2" and evidence["state"] in ("gone", "empty"), evidence
    c.wait_job(job, lambda j: j.ended and "COMPLETING" not in j.flags, timeout=60)
    ans = json.loads(c.exec(CONTROLLER, ["dispatch-slurm", "ceased", str(job), "--root", root, "--generation", "0",
                                                 "--submission", "1", "--nodes", "c2", "--json"],
                            user="alice", check=False).stdout)
    assert ans["answer"] == "ceased" and ans["nodes"]["c2"]["how"] == "cgroup v2", ans


@pytest.mark.vm
@pytest.mark.only_on("trixie", "sid")  # RunInJob is 24.11's
@pytest.mark.parametrize("flags", ["Contain", "RunInJob"])
def test_the_epilog_records_cessation_when_the_hooks_run_inside_the_job(slurm_cluster: Cluster, workdir, flags):
    """PrologFlags=Contain (an extern step holds the job on every node from its allocation) and
    RunInJob (the Prolog and Epilog run in that extern step, inside the job's cgroup): the
    Prolog makes the exec folder and claims the epoch, and the Epilog records the cessation
    well within its wait, with its evidence: on cgroup v2 under RunInJob a job cgroup that
    holds nothing but the Epilog and its slurmstepd (before, it waited the whole
    CESSATION_WAIT for that cgroup to empty and recorded nothing). `dispatch-slurm ceased`
    says so."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    script = f"#!/bin/bash\n#SBATCH -w c2 -o {cdir}/job.out\necho \"$DISPATCH_EXEC_DIR\"\nsrun true\n"
    (hdir / "job.sbatch").write_text(script)
    c.set_prolog_flags(f"Alloc,{flags}")
    try:
        doctor = c.exec(CONTROLLER, ["dispatch-slurm", "doctor", "--script", f"{cdir}/job.sbatch"], user="alice",
                        check=False).stdout
        job = c.submit("alice", script, args=[f"--dispatch-checkpoint={root}"])
        c.wait_job(job, lambda j: j.ended, timeout=120)
        seen_ended = time.time()
        attempt = expected(c, root, job, n=1)["DISPATCH_ATTEMPT"]
        entry = hdir / "root" / "ceased" / f"{attempt}.c2"
        c.wait_until(entry.exists, timeout=120, what="the Epilog to record cessation")
        c.wait_job(job, lambda j: "COMPLETING" not in j.flags, timeout=120)
    finally:
        c.set_prolog_flags("Alloc")
    assert re.search(rf"^hooks: PrologFlags \S*\b{flags}\b", doctor, re.M), doctor
    assert (hdir / "job.out").read_text().split() == [f"{cdir}/root/exec/{attempt}"]
    assert (hdir / "root" / "exec" / attempt).is_dir() and (hdir / "root" / "epochs").is_dir()
    ceased_at = next(e["t"] for e in events.read(str(hdir / "root")) if e["type"] == "cessation")
    assert ceased_at - seen_ended < CESSATION_WAIT, "the Epilog waited out its whole wait"
    evidence = json.loads(entry.read_text())
    if isinstance(c, VMCluster):  # cgroup v2: the job cgroup is the evidence
        states = {"Contain": ("gone", "empty"), "RunInJob": ("the hook's own",)}[flags]
        assert evidence["by"] == "cgroup v2" and evidence["state"] in states, evidence
    else:
        assert evidence["by"] == "process scan", evidence
    ans = json.loads(c.exec(CONTROLLER, ["dispatch-slurm", "ceased", str(job), "--root", root, "--generation", "0",
                                         "--submission", "1", "--nodes", "c2", "--json"], user="alice").stdout)
    assert ans["answer"] == "ceased", ans


@pytest.mark.one_release  # 2 min on 22.05/24.11 (the node's failure takes SlurmdTimeout to see);
# what differs per release, a requeue raising R, is test_requeue_raises_r_and_resubmission_raises_n
def test_node_failure_requeue_changes_attempt(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    job = c.submit("alice", f"""#!/bin/bash
#SBATCH -o /dev/null --requeue -w c3
echo "$DISPATCH_ATTEMPT $DISPATCH_RESTART $(hostname)" >> {cdir}/executions
sleep 600
""", args=[f"--dispatch-checkpoint={root}"])
    runs = lambda: (hdir / "executions").read_text().splitlines() if (hdir / "executions").exists() else []
    c.wait_until(lambda: len(runs()) == 1, timeout=60, what="first execution")
    c.partition("c3")
    try:
        c.wait_job(job, lambda j: j.restart_count == 1, timeout=180)
        # requeued and pending (BeginTime): let it restart on another node
        c.exec(CONTROLLER, ["scontrol", "update", f"jobid={job}", "ReqNodeList="])
        c.wait_until(lambda: len(runs()) == 2, timeout=180, what="execution after the node failure")
    finally:
        c.heal("c3")
    first, second = (r.split() for r in runs())
    assert (first[1], second[1]) == ("0", "1") and first[0] != second[0] and second[2] != "c3"
    c.cancel(job)
    c.wait_node("c3", "IDLE", timeout=240)


def test_array_tasks_get_their_own_roots(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    make_root(c, f"{cdir}/sweep")
    job = c.submit("alice", f"""#!/bin/bash
#SBATCH -o /dev/null --array=1-3
{ENV_DUMP} > {cdir}/array.$SLURM_ARRAY_TASK_ID
""", args=[f"--dispatch-checkpoint={cdir}/sweep/task-%a"])
    c.wait_until(lambda: len(dumps(hdir, "array.")) == 3, timeout=90, what="three array tasks")
    seen = dumps(hdir, "array.")
    roots = {k: v["DISPATCH_CHECKPOINT"] for k, v in seen.items()}
    assert roots == {f"array.{i}": f"{cdir}/sweep/task-{i}" for i in (1, 2, 3)}
    assert {v["DISPATCH_SUBMISSION"] for v in seen.values()} == {"1"}, "one submission for the array"
    for v in seen.values():
        assert c.path(v["DISPATCH_EXEC_DIR"]).is_dir()
    assert (hdir / "sweep" / "sub" / "000001").exists()
    assert job


# ---- bad input: refused by sbatch, or the job fails; never a drained node -----------

def _snapshot(c: Cluster, own) -> dict[str, str]:
    """What must not change: /etc on every container, and the shared volume outside
    the test's own folder (paths, owners, modes, sizes, mtimes)."""
    snap = {}
    for host in [CONTROLLER, *c.node_names]:
        snap[host] = c.exec(host, "find /etc -xdev -printf '%p %u %m %s %T@\\n' | sort").stdout
    snap["volume"] = sorted(
        (str(p), p.lstat().st_uid, p.lstat().st_mode, p.lstat().st_mtime)
        for p in c.checkpoints.rglob("*") if own not in p.parents and p != own)
    return snap


BAD_OPTIONS = [  # (sbatch options, what the refusal must name)
    (["--dispatch-checkpoint=ROOT", "--dispatch-generation=abc"], "--dispatch-generation"),
    (["--dispatch-checkpoint=ROOT", "--dispatch-generation=100000000"], "0..99,999,999"),
    (["--dispatch-checkpoint=ROOT", "--dispatch-submission=0"], "1..999,999"),
    (["--dispatch-checkpoint=ROOT", "--dispatch-submission=1000000"], "1..999,999"),
    (["--dispatch-checkpoint=ROOT", "--dispatch-grace=301"], "0..300"),
    (["--dispatch-checkpoint=ROOT", "--dispatch-grace=-5"], "--dispatch-grace"),
    (["--dispatch-checkpoint=relative/root"], "absolute"),
    (["--dispatch-checkpoint=ROOT/../../etc"], ".."),
    (["--dispatch-checkpoint=WD/does-not-exist"], "does not exist"),
    (["--dispatch-checkpoint=WD/readonly"], "not writable"),
    (["--dispatch-checkpoint=WD/bobs"], "belongs to uid 2002"),
    (["--dispatch-checkpoint=/etc"], "belongs to uid 0"),
    (["--dispatch-checkpoint=WD/" + "x" * 300], "name too long"),
    (["--dispatch-generation=1"], "need --dispatch-checkpoint"),
]


@pytest.mark.vm("full")  # the same cases on both beds (this list drives both); on the VMs with
# DISPATCH_VM_FULL=1 (47 s under TCG; what it checks is sbatch's and the hooks', not cgroup v2's)
def test_bad_input_matrix(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    make_root(c, f"{cdir}/readonly", mode="500")
    make_root(c, f"{cdir}/bobs", user="bob", mode="777")
    make_root(c, f"{cdir}/root2")
    before = _snapshot(c, hdir)
    for opts, needle in BAD_OPTIONS:
        opts = [o.replace("ROOT", root).replace("WD", cdir) for o in opts]
        res = c.exec(CONTROLLER, ["sbatch", "--parsable", *opts, "--wrap", "true"], user="alice", check=False)
        assert res.returncode != 0 and not res.stdout.strip(), f"{opts} was accepted: {res.stdout}"
        assert needle in res.stderr, f"{opts}: {res.stderr!r} does not name {needle!r}"
    # errors only visible once the job runs: the job fails, with the message in its stderr
    c.exec("c1", f"ln -s /etc {root}/exec", user="alice")  # planted where exec/ goes
    failing = {  # name -> (options, what the job's stderr must say)
        "symlink": ([f"--dispatch-checkpoint={root}"], "symlink"),
        "array": ([f"--dispatch-checkpoint={cdir}/root2", "--array=1-2"], "%a"),
    }
    for name, (opts, _) in failing.items():
        c.submit("alice", args=[*opts, "-o", f"{cdir}/{name}.%a.out", "-e", f"{cdir}/{name}.%a.err",
                                "--wrap", f"touch {cdir}/{name}.ran"])
    c.wait_until(lambda: not c.exec(CONTROLLER, ["squeue", "-h", "-u", "alice"]).stdout.strip(),
                 timeout=120, what="alice's failing jobs to end")
    for name, (_, needle) in failing.items():
        assert not (hdir / f"{name}.ran").exists(), f"{name}: the job ran although its input was bad"
        errs = [p.read_text() for p in hdir.glob(f"{name}.*.err")]
        assert errs and all(needle in e for e in errs), f"{name}: stderr does not say why: {errs!r}"
    assert _snapshot(c, hdir) == before, "something outside the user's tree changed"
    reasons = c.exec(CONTROLLER, ["sinfo", "-R", "-h"]).stdout.strip()
    assert reasons == "", f"a node was drained: {reasons}"


# ---- no user input makes a hook exit non-zero, hang, or read a node dry ---------------------

SENTINEL = "dispatch-checkpoint-complete"


def _ended(c: Cluster, job: int) -> bool:
    j = c.slurm.find_job(job)
    return j is None or (j.ended and "COMPLETING" not in j.flags)


def _ceased(root, job: int) -> list[str]:
    d = root / "ceased"
    return [e for e in (os.listdir(d) if d.is_dir() else []) if f".{job}." in e]


@pytest.mark.vm("full")
def test_no_user_input_makes_a_hook_fail_hang_or_drain(slurm_cluster: Cluster, workdir):
    """The bad-input probe's cases, through sbatch as alice: a root with a newline, one
    with a non-UTF-8 byte, a root removed (non-UTF-8) before the job starts, stdout on
    /dev/zero, a 3 GiB log holding the sentinel at its end. Every Prolog and Epilog exits
    0 (no node drained, no BUG logged), and the Epilog records cessation for every job that
    had an execution folder, and nothing of the job's output (the sentinel in an appended
    log is no fact of this execution: the Epilog never reads it)."""
    c = slurm_cluster
    cdir, hdir = workdir
    make_root(c, f"{cdir}/plain")
    roots = {"newline": b"a\nb", "bytes": b"r\xff\xfe"}
    for leaf in roots.values():
        os.mkdir(os.fsencode(hdir) + b"/" + leaf, 0o700)
        os.chown(os.fsencode(hdir) + b"/" + leaf, 2001, 2001)
    big = f"{cdir}/big.log"
    c.exec("c1", f"truncate -s 3G {big}", user="alice")  # sparse: no disk, but 3 GiB to read

    def sbatch(leaf: bytes, *args: str) -> int:
        """sbatch as alice with the root's bytes spelled $'\\xNN' (docker exec takes text only)."""
        spelled = "".join(chr(b) if 0x20 < b < 0x7F and chr(b) not in "'\\" else f"\\x{b:02x}" for b in leaf)
        out = c.exec(CONTROLLER, f"sbatch --parsable --dispatch-checkpoint=$'{cdir}/{spelled}' "
                                 + " ".join(args), user="alice").stdout
        return int(out.strip().split(";")[0])

    jobs = {name: sbatch(leaf, "-o /dev/null --wrap true") for name, leaf in roots.items()}
    jobs["dev-zero"] = sbatch(b"plain", "-o /dev/zero --wrap true")
    jobs["big-log"] = sbatch(b"plain", f"-o {big} --open-mode=append --wrap 'echo {SENTINEL}'")
    gone = os.fsencode(hdir) + b"/gone\xff"
    os.mkdir(gone, 0o700)
    os.chown(gone, 2001, 2001)
    jobs["removed"] = sbatch(b"gone\xff", f"-H -o {cdir}/removed.out -e {cdir}/removed.err --wrap true")
    shutil.rmtree(gone)  # with the sub/ entry the plugin allocated at submit time
    c.exec(CONTROLLER, ["scontrol", "release", str(jobs["removed"])], user="alice")
    c.wait_until(lambda: all(_ended(c, j) for j in jobs.values()), timeout=180, what="every probe job to end")
    for name, leaf in roots.items():
        root = pathlib.Path(os.fsdecode(os.fsencode(hdir) + b"/" + leaf))
        c.wait_until(lambda: _ceased(root, jobs[name]), timeout=60, what=f"{name}: the Epilog's cessation record")
    for name in ("dev-zero", "big-log"):
        c.wait_until(lambda: _ceased(hdir / "plain", jobs[name]), timeout=60,
                     what=f"{name}: the Epilog's cessation record")
    ev = [json.loads(line) for p in (hdir / "plain" / "events").glob("*.jsonl") for line in p.read_text().splitlines()]
    big_attempt = f".{jobs['big-log']}."
    assert not [e for e in ev if e["type"] == "checkpoint_complete" and big_attempt in e["attempt"]], \
        "the Epilog took the sentinel in the job's output for a fact of the execution"
    assert b"does not exist" in (hdir / "removed.err").read_bytes()
    every = "".join(c.exec(n, "cat /var/log/dispatch-slurm.log 2>/dev/null || true").stdout for n in c.node_names)
    # the cluster is shared with other tests, whose users may remove a root before a sweep by
    # one of this test's hooks reaches their execution (then "cessation not recorded" is right,
    # said once): only what the hooks say of this test's own executions is judged here
    mine = {str(j) for j in jobs.values()}

    def ours(line: str) -> bool:
        m = re.search(r"\bjob (\d+)\b", line)
        others = {a for a in re.findall(r"\b[A-Za-z0-9_]+\.(\d+)\.\d{7,}\b", line) if a not in mine}
        return m is not None and m[1] in mine and not others

    logs = "".join(line for line in every.splitlines(keepends=True) if ours(line))
    assert logs, every[-2000:]
    assert "BUG" not in logs and "not recorded" not in logs and "timed out" not in logs, logs[-2000:]
    assert "\\udcff" in logs  # the removed root's byte, logged escaped (syslog refused it raw)
    reasons = c.exec(CONTROLLER, ["sinfo", "-R", "-h"]).stdout.strip()
    assert reasons == "", f"a node was drained: {reasons}"


def test_the_task_prolog_ignores_a_site_conf_named_by_the_job(slurm_cluster: Cluster, workdir):
    """The TaskProlog runs in the task's environment: DISPATCH_SITE_CONF there is the
    user's, so the site's settings come only from the admin's file."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    c.exec("c1", f"printf 'grace = 299\\n' > {cdir}/mine.conf", user="alice")
    hosts = [CONTROLLER, *c.node_names]
    shipped = {h: c.exec(h, ["cat", "/etc/dispatch-slurm/site.conf"]).stdout for h in hosts}  # the package's
    for h in hosts:
        c.exec(h, "printf 'grace = 45\\n' > /etc/dispatch-slurm/site.conf")
    c.exec("c1", ["python3", "-c", f"from dispatch_slurm import store; store.allocate_submission({root!r})"],
           user="alice")  # N=1, as `dispatch-slurm submit` allocates it (the hooks refuse one never allocated)
    try:
        env = {"DISPATCH_CHECKPOINT": root, "DISPATCH_SUBMISSION": "1", "DISPATCH_SITE_CONF": f"{cdir}/mine.conf"}
        c.submit("alice", args=["--export=ALL," + ",".join(env), "-o", "/dev/null",
                                "--wrap", f"srun bash -c '{ENV_DUMP} > {cdir}/task'"], env=env)
        c.wait_until(lambda: dumps(hdir, "task"), timeout=90, what="the task's DISPATCH_* dump")
    finally:
        for h in hosts:
            c.exec(h, "cat > /etc/dispatch-slurm/site.conf", input=shipped[h])
    assert "DISPATCH_GRACE_S=45" in (hdir / "task").read_text().splitlines()


# what dispatch_env(8) says each refusal exits with, per kind and command
REFUSALS = {  # kind -> (options, exit status of sbatch / salloc / srun)
    "a bad value (read when the option is)": (["--dispatch-checkpoint=ROOT", "--dispatch-generation=abc"], 255),
    "a root that cannot be used (checked once every option is read)": (["--dispatch-checkpoint=WD/missing"], 1),
}


def test_refusals_exit_as_dispatch_env_8_says(slurm_cluster: Cluster, workdir):
    """A value the option callback refuses makes sbatch, salloc and srun exit 255; what the
    plugin refuses after every option was read (the root: missing, not a folder, not yours,
    not writable; --dispatch-* without --dispatch-checkpoint) exits 1. The man page says so."""
    c = slurm_cluster
    cdir, _ = workdir
    root = make_root(c, f"{cdir}/root")
    got = {}
    for kind, (opts, _) in REFUSALS.items():
        opts = [o.replace("ROOT", root).replace("WD", cdir) for o in opts]
        for cmd in (["sbatch", *opts, "--wrap", "true"], ["salloc", *opts, "true"], ["srun", *opts, "true"]):
            res = c.exec(CONTROLLER, cmd, user="alice", check=False)
            assert "dispatch" in res.stderr, (cmd, res.stderr)
            got[(kind, cmd[0])] = res.returncode
    print(got)
    assert got == {(kind, cmd): code for kind, (_, code) in REFUSALS.items() for cmd in ("sbatch", "salloc", "srun")}
    page = " ".join((pathlib.Path(__file__).parents[2] / "admin" / "man" / "dispatch_env.8").read_text().split())
    assert "is refused as the option is read: the command exits 255" in page, page
    assert "is refused after them: the command exits 1" in page, page
