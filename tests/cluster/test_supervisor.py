"""On the real cluster (Slurm 22.05 and 24.11): the supervisor's rules, holds and
restart, and the cessation signal.

The supervisor runs where a user would run it, on a login node: inside the controller
container, as alice, in the background (`dispatch-slurm run ... &`), talking to Slurm
through its CLI. The test reads what it recorded (ROOT/record.jsonl) from the host
through the shared volume, and asks Slurm itself (squeue/scontrol JSON) what exists.
Every wait polls real state with a deadline."""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest

from testbed.cluster import CONTROLLER, Cluster, slurm_at_least
from dispatch_slurm.supervisor.record import Record

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]
CRASH = "/src/dispatch-slurm/tests/testbed/crash.py"  # the test bed's copy in docker-slurm's image

# fast profile: SlurmdTimeout=15 (node DOWN ~26 s after a partition), cred_expire=10
# (a requeued job restarts ~11 s later), a healed node is back ~45 s later.
T_START, T_DOWN, T_HEAL = 60, 120, 240


class Sup:
    """A supervisor process in the controller container, as alice."""

    def __init__(self, c: Cluster, cdir: str, hdir, root: str):
        self.c, self.cdir, self.hdir, self.root = c, cdir, hdir, root
        self.runs = 0

    def start(self, verb: str, *args: str, env: dict | None = None, crash: str | None = None) -> int:
        """Start `dispatch-slurm VERB ROOT ARGS` in the background; its number (for rc/log).
        ``crash``: SIGKILL it at that point of its first submission (testbed/crash.py)."""
        self.runs += 1
        k = self.runs
        cmd = f"python3 {CRASH} {crash}" if crash else "dispatch-slurm"
        inner = f"{cmd} {verb} {shlex.quote(self.root)} {shlex.join(args)}; echo $? > {self.cdir}/sup.{k}.rc"
        prefix = " ".join(f"{key}={shlex.quote(v)}" for key, v in (env or {}).items())
        self.c.exec(CONTROLLER, f"cd {self.cdir} && {prefix} setsid nohup bash -c {shlex.quote(inner)} "
                                f"> {self.cdir}/sup.{k}.log 2>&1 < /dev/null &", user="alice")
        return k

    def rc(self, k: int) -> int | None:
        p = self.hdir / f"sup.{k}.rc"
        text = p.read_text().strip() if p.exists() else ""
        return int(text) if text else None

    def log(self, k: int) -> str:
        p = self.hdir / f"sup.{k}.log"
        return p.read_text() if p.exists() else ""

    def wait_rc(self, k: int, timeout: float) -> int:
        return self.c.wait_until(lambda: self.rc(k) is not None, timeout=timeout,
                                 what=f"supervisor run {k} to exit (log: {self.log(k)[-800:]})") and self.rc(k)

    def facts(self, type_: str | None = None) -> list[dict]:
        return [f for f in Record(str(self.host_root)).read() if type_ is None or f["type"] == type_]

    @property
    def host_root(self):
        return self.hdir / self.root.rsplit("/", 1)[1]

    def wait_fact(self, pred, timeout: float, what: str) -> dict:
        def probe():
            return next((f for f in self.facts() if pred(f)), None)
        try:
            return self.c.wait_until(probe, timeout=timeout, what=what)
        except Exception as e:
            raise AssertionError(f"{e}\nrecord: {[describe(f) for f in self.facts()]}\n"
                                 f"last log: {self.log(self.runs)[-1500:]}") from None

    def pid(self) -> int | None:
        """The pid (in the controller) of the current writer: the highest claim under
        ROOT/supervisor/, unless it exited."""
        folder = self.host_root / "supervisor"
        claims = sorted(folder.glob("[0-9]" * 6)) if folder.exists() else []
        if not claims or (folder / f"{claims[-1].name}.exited").exists():
            return None
        return json.loads(claims[-1].read_text() or "{}").get("pid")

    def alive(self, pid: int) -> bool:
        res = self.c.exec(CONTROLLER, f"tr '\\0' ' ' < /proc/{pid}/cmdline", check=False)
        return res.returncode == 0 and "dispatch-slurm" in res.stdout

    def kill(self, pid: int, sig: str = "KILL") -> None:
        self.c.exec(CONTROLLER, ["kill", f"-{sig}", str(pid)], user="alice")
        self.c.wait_until(lambda: not self.alive(pid), timeout=10, what=f"supervisor pid {pid} to go")

    def stop_all(self) -> None:
        pid = self.pid()
        if pid and self.alive(pid):
            self.c.exec(CONTROLLER, ["kill", "-TERM", str(pid)], user="alice", check=False)


def describe(f: dict) -> str:
    keep = ("type", "job", "n", "r", "state", "rule", "held", "answer", "by", "outcome")
    return " ".join(f"{k}={f[k]}" for k in keep if k in f)


def dispatch_jobs(c: Cluster, root: str) -> dict[str, list[int]]:
    """tag -> job ids, for every job the supervisor tagged for ROOT: those slurmctld holds
    and, as it forgets ended jobs after MinJobAge, those sacct recorded (its submit line
    names the tag, 24.11 on)."""
    found = {j.job_id: j.comment for j in c.slurm.jobs() if j.comment.startswith(f"dispatch-slurm:{root}:")}
    if slurm_at_least(c, "24.11"):
        lines = c.exec(CONTROLLER, ["sacct", "--allusers", "-X", "-n", "--parsable2", "-S", "2000-01-01",
                                    "-o", "JobID,SubmitLine"]).stdout.splitlines()
        for job, _, line in (row.partition("|") for row in lines):
            m = re.search(rf"--comment=(dispatch-slurm:{re.escape(root)}:g\d+:n\d+)(\s|$)", line)
            if m and job.isdigit():
                found.setdefault(int(job), m[1])
    out: dict[str, list[int]] = {}
    for job, tag in sorted(found.items()):
        out.setdefault(tag, []).append(job)
    return out


@pytest.fixture
def sup(slurm_cluster: Cluster, workdir):
    cdir, hdir = workdir
    root = f"{cdir}/root"
    slurm_cluster.exec(CONTROLLER, f"mkdir -m 700 {root}", user="alice")
    s = Sup(slurm_cluster, cdir, hdir, root)
    yield s
    s.stop_all()  # before the fixture cancels alice's jobs: a live supervisor would resubmit


def writes(hdir) -> list[tuple[str, float]]:
    p = hdir / "writes"
    rows = []
    for line in p.read_text().splitlines() if p.exists() else []:
        parts = line.split()
        if len(parts) == 2:
            rows.append((parts[0], float(parts[1])))
    return rows


SHARED_JOB = """#!/bin/bash
#SBATCH -N 1 -o {cdir}/slurm-%j.out -e {cdir}/slurm-%j.err
# one shared file, a timestamped line every 0.2 s, until told to stop
while [ ! -e {cdir}/stop ]; do
  echo "$DISPATCH_ATTEMPT $(date +%s.%N)" >> {cdir}/writes
  sleep 0.2
done
"""


def test_shared_checkpoint_partition_holds_until_the_old_execution_ceased(sup: Sup):
    """A shared-checkpoint job whose node is cut off: the supervisor holds instead of
    resubmitting; `ceased` says no while the node is cut off and the old process still
    writes; after the heal and the Epilog it says yes, the hold lifts, the resubmission
    runs, and the old process had stopped writing before the new one started."""
    c, cdir, hdir = sup.c, sup.cdir, sup.hdir
    (hdir / "job.sh").write_text(SHARED_JOB.format(cdir=cdir))
    k = sup.start("run", "--shared-checkpoint", "--resubmit", "1", "--cessation-interval", "3s",
                  "--poll", "1", "--", f"{cdir}/job.sh")
    first = sup.wait_fact(lambda f: f["type"] == "started", T_START, "the first execution to start")
    job, node, a0 = first["job"], first["nodes"][0], first["attempt"]
    assert first["n"] == 1 and first["r"] == 0 and first["epoch"] == 1_000_000
    c.wait_until(lambda: any(a == a0 for a, _ in writes(hdir)), timeout=30, what="the job's first writes")
    argv_seen = sup.facts("intent")[0]
    assert argv_seen["tag"] == f"dispatch-slurm:{sup.root}:g0:n1"

    c.partition(node)
    try:
        hold = sup.wait_fact(lambda f: f["type"] == "hold", T_DOWN, "a hold after the node failure")
        ended = sup.facts("ended")[0]
        assert ended["state"] == "NODE_FAIL" and ended["r"] == 0, ended
        rule = sup.facts("rule")[0]
        assert rule["rule"] == "resubmit" and rule["held"] is True and rule["cause"] == "node_failure"
        assert hold["replaces"] == "resubmit" and hold["nodes"] == [node] and hold["attempt"] == a0
        # the old process keeps writing into the shared file while it is cut off...
        c.wait_until(lambda: max(t for a, t in writes(hdir) if a == a0) > hold["t"] + 3, timeout=30,
                     what="the cut-off execution to keep writing after the hold")
        # ...the cessation signal says so, and nothing new was submitted
        c.wait_until(lambda: len([f for f in sup.facts("cessation") if f["answer"] == "not_ceased"]) >= 2,
                     timeout=30, what="two 'not ceased' answers (asked every 3 s)")
        res = c.exec(CONTROLLER, ["dispatch-slurm", "ceased", str(job), "--restart", "0", "--root", sup.root,
                                  "--json"], user="alice", check=False)
        ans = json.loads(res.stdout)
        assert res.returncode == 1 and ans["answer"] == "not_ceased", (res.returncode, res.stdout, res.stderr)
        assert ans["nodes"][node]["ceased"] is False
        assert "down or not responding" in ans["nodes"][node]["evidence"], ans
        assert not sup.facts("release") and len(sup.facts("intent")) == 1
        assert list(dispatch_jobs(c, sup.root)) == [argv_seen["tag"]], "a job was submitted during the hold"
    finally:
        c.heal(node)
    t_heal = time.time()

    released = sup.wait_fact(lambda f: f["type"] == "release", T_HEAL, "the hold to lift after the heal")
    assert released["by"] == "cessation signal"
    epilog = hdir / "root" / "ceased" / f"{a0}.{node}"
    assert epilog.exists(), "the Epilog recorded the old execution's end on its node"
    answers = [f for f in sup.facts("cessation")]
    assert answers[-1]["answer"] == "ceased" and answers[-1]["evidence"]["nodes"][node]["ceased"]
    assert all(f["answer"] == "not_ceased" for f in answers[:-1]), [describe(f) for f in answers]
    assert all(f["t"] >= epilog.stat().st_mtime - 1 for f in answers if f["answer"] == "ceased")
    assert len([f for f in answers if f["t"] < t_heal]) >= 2, "asked every few seconds during the hold"

    second = sup.wait_fact(lambda f: f["type"] == "started" and f["n"] == 2, T_START, "the resubmission to start")
    a1 = second["attempt"]
    assert second["epoch"] == 2_000_000 and second["job"] != job
    c.wait_until(lambda: any(a == a1 for a, _ in writes(hdir)), timeout=30, what="the new execution's writes")
    old_last = max(t for a, t in writes(hdir) if a == a0)
    new_first = min(t for a, t in writes(hdir) if a == a1)
    assert old_last < new_first, f"the old execution wrote at {old_last}, after the new one started at {new_first}"

    t0 = sup.facts()[0]["t"]
    print("\n" + "\n".join(f"{f['t'] - t0:7.1f}s {describe(f)}" for f in sup.facts()))
    print(f"old execution's last write {old_last - t0:.1f}s, new execution's first {new_first - t0:.1f}s, "
          f"epilog record {epilog.stat().st_mtime - t0:.1f}s, heal {t_heal - t0:.1f}s")
    (hdir / "stop").touch()
    assert sup.wait_rc(k, T_START) == 0, sup.log(k)
    kinds = [f["type"] for f in sup.facts() if f["type"] not in ("cessation", "supervisor", "job")]
    assert kinds == ["intent", "submitted", "started", "ended", "rule", "hold", "release", "rule", "intent",
                     "submitted", "started", "ended", "rule", "finished"], kinds
    assert sup.facts("finished")[0]["outcome"] == "done"
    assert {tag: len(ids) for tag, ids in dispatch_jobs(c, sup.root).items()} == \
        {f"dispatch-slurm:{sup.root}:g0:n1": 1, f"dispatch-slurm:{sup.root}:g0:n2": 1}


NORMAL_JOB = """#!/bin/bash
#SBATCH -N 1 -o /dev/null
echo "$DISPATCH_SUBMISSION $DISPATCH_RESTART $DISPATCH_EPOCH $DISPATCH_ATTEMPT $(hostname)" >> {cdir}/executions
while [ ! -e {cdir}/stop ]; do [ -e {cdir}/fail.$DISPATCH_SUBMISSION ] && exit 3; sleep 0.5; done
"""


def executions(hdir) -> list[list[str]]:
    p = hdir / "executions"
    return [line.split() for line in p.read_text().splitlines()] if p.exists() else []


def test_resubmit_survives_failure_node_failure_and_supervisor_kills(sup: Sup):
    """--resubmit 2: a crash between sbatch and recording the job id, a failure, a SIGKILL
    of the supervisor mid-run and a node failure; one job per N, N and epochs as expected."""
    c, cdir, hdir, root = sup.c, sup.cdir, sup.hdir, sup.root
    (hdir / "job.sh").write_text(NORMAL_JOB.format(cdir=cdir))
    tag = lambda n: f"dispatch-slurm:{root}:g0:n{n}"  # noqa: E731

    # 1. the supervisor dies (SIGKILL) right after sbatch, before it records the job id
    k = sup.start("run", "--resubmit", "2", "--poll", "1", "--", f"{cdir}/job.sh",
                  crash="after-sbatch")
    assert sup.wait_rc(k, 30) == 137
    assert [f["type"] for f in sup.facts()][-1] == "intent" and not sup.facts("submitted")
    jobs = dispatch_jobs(c, root)
    assert list(jobs) == [tag(1)] and len(jobs[tag(1)]) == 1
    job1 = jobs[tag(1)][0]

    # 2. restarted with the root alone, it finds the job by its tag instead of submitting again
    k = sup.start("run", "--poll", "1")
    sub = sup.wait_fact(lambda f: f["type"] == "submitted", 30, "the job to be found again")
    assert sub["recovered"] is True and sub["job"] == job1 and sub["n"] == 1
    sup.wait_fact(lambda f: f["type"] == "started" and f["job"] == job1, T_START, "execution N=1")

    # 3. a failure (the script exits 3): resubmitted as N=2
    (hdir / "fail.1").touch()
    s2 = sup.wait_fact(lambda f: f["type"] == "started" and f["n"] == 2, T_START, "execution N=2")
    job2, node2 = s2["job"], s2["nodes"][0]

    # 4. the supervisor is killed mid-run and restarted: it follows job2, submits nothing
    pid = sup.pid()
    assert pid and sup.alive(pid)
    sup.kill(pid)
    k = sup.start("run", "--poll", "1")
    c.wait_until(lambda: (p := sup.pid()) not in (None, pid) and sup.alive(p), timeout=30,
                 what="the restarted supervisor's claim")  # it writes no fact while nothing happens

    # 5. a node failure: Slurm requeues the job (R+1) on another node; no budget spent
    c.partition(node2)
    try:
        s3 = sup.wait_fact(lambda f: f["type"] == "started" and f["job"] == job2 and f["r"] == 1,
                           T_DOWN + T_START, "the requeued execution R=1")
    finally:
        c.heal(node2)
    assert s3["nodes"][0] != node2 and s3["epoch"] == 2_000_001

    (hdir / "stop").touch()
    assert sup.wait_rc(k, T_START) == 0, sup.log(k)

    started = [(f["job"], f["n"], f["r"], f["epoch"]) for f in sup.facts("started")]
    assert started == [(job1, 1, 0, 1_000_000), (job2, 2, 0, 2_000_000), (job2, 2, 1, 2_000_001)]
    ended = [(f["job"], f["r"], f["state"]) for f in sup.facts("ended")]
    assert ended == [(job1, 0, "FAILED"), (job2, 0, "REQUEUED"), (job2, 1, "COMPLETED")]
    rules = [(f["rule"], f.get("cause"), f.get("budget_left")) for f in sup.facts("rule")]
    assert rules == [("resubmit", "failure", 1), ("requeue", "requeue", None), ("done", "completed", None)]
    assert [f["n"] for f in sup.facts("intent")] == [1, 2]
    # Slurm's own view: exactly one job per N
    assert dispatch_jobs(c, root) == {tag(1): [job1], tag(2): [job2]}
    # and what the executions themselves saw: (N, R, epoch)
    assert [e[:3] for e in executions(hdir)] == [["1", "0", "1000000"], ["2", "0", "2000000"],
                                                 ["2", "1", "2000001"]]
    c.wait_node(node2, "IDLE", timeout=T_HEAL)


def test_a_users_scancel_and_stop_end_supervision_and_once_drives_it_from_cron(sup: Sup):
    """The user's own `scancel` is a stop, not a failure to retry; `dispatch-slurm
    stop` cancels and stops; `run --once`, called again and again as scrontab would, carries a
    job to its end with the same facts as a long-lived supervisor."""
    c, cdir, hdir = sup.c, sup.cdir, sup.hdir
    (hdir / "job.sh").write_text(NORMAL_JOB.format(cdir=cdir))
    k = sup.start("run", "--resubmit", "2", "--poll", "1", "--", f"{cdir}/job.sh")
    job = sup.wait_fact(lambda f: f["type"] == "started", T_START, "the execution")["job"]
    c.cancel(job, user="alice")
    assert sup.wait_rc(k, T_START) == 0, sup.log(k)
    assert sup.facts("finished")[-1]["outcome"] == "stopped" and len(sup.facts("intent")) == 1
    assert "cancelled by" in sup.log(k) and "nothing is resubmitted" in sup.log(k)

    other = f"{cdir}/other"  # a second root: `dispatch-slurm stop` while the supervisor runs
    c.exec(CONTROLLER, f"mkdir -p {other}", user="alice")
    s2 = Sup(c, cdir, hdir, other)
    s2.runs = 10
    k2 = s2.start("run", "--resubmit", "2", "--poll", "1", "--", f"{cdir}/job.sh")
    job2 = s2.wait_fact(lambda f: f["type"] == "started", T_START, "the second root's execution")["job"]
    c.exec(CONTROLLER, ["dispatch-slurm", "stop", other, "-m", "enough"], user="alice")
    assert s2.wait_rc(k2, T_START) == 0, s2.log(k2)
    assert s2.facts("stop")[0]["message"] == "enough" and c.slurm.find_job(job2).state == "CANCELLED"

    cron = f"{cdir}/cron"  # a third: only `run --once`, as scrontab would call it
    c.exec(CONTROLLER, f"mkdir -p {cron}", user="alice")
    s3 = Sup(c, cdir, hdir, cron)

    def once(*args):
        return c.exec(CONTROLLER, ["dispatch-slurm", "run", cron, "--once", "--poll", "1", *args],
                      user="alice", workdir=cdir, check=False)
    assert once("--", f"{cdir}/job.sh").returncode == 0
    c.wait_until(lambda: once().returncode == 0 and s3.facts("started"), timeout=T_START, what="--once: started")
    (hdir / "stop").touch()
    c.wait_until(lambda: once().returncode == 0 and s3.facts("finished"), timeout=T_START, what="--once: done")
    assert s3.facts("finished")[0]["outcome"] == "done"
    kinds = [f["type"] for f in s3.facts() if f["type"] not in ("supervisor", "job")]
    assert kinds == ["intent", "submitted", "started", "ended", "rule", "finished"], kinds


def test_supersede_starts_generation_1_and_stops_generation_0(sup: Sup):
    c, cdir, hdir, root = sup.c, sup.cdir, sup.hdir, sup.root
    (hdir / "job.sh").write_text(NORMAL_JOB.format(cdir=cdir))
    k0 = sup.start("run", "--resubmit", "1", "--poll", "1", "--", f"{cdir}/job.sh")
    s0 = sup.wait_fact(lambda f: f["type"] == "started", T_START, "generation 0 to start")
    plan = c.exec(CONTROLLER, ["dispatch-slurm", "plan", root], user="alice").stdout
    assert "generation 0" in plan and f"job {s0['job']}" in plan and "resubmit" in plan

    k1 = sup.start("supersede", "--poll", "1")
    assert sup.wait_rc(k0, 30) == 0, sup.log(k0)
    assert "superseded by generation 1" in sup.log(k0)
    s1 = sup.wait_fact(lambda f: f["type"] == "started" and f["g"] == 1, T_START, "generation 1 to start")
    assert (s1["n"], s1["r"], s1["epoch"]) == (2, 0, 1_000_002_000_000)
    sup_fact = sup.facts("superseded")[0]
    assert (sup_fact["from_g"], sup_fact["to_g"], sup_fact["job"], sup_fact["cancelled"]) == (0, 1, s0["job"], True)
    c.wait_job(s0["job"], "CANCELLED", timeout=30)
    assert [f["rule"] for f in sup.facts("rule")] == [], "the cancel of generation 0 triggered no rule"
    (hdir / "stop").touch()
    assert sup.wait_rc(k1, T_START) == 0, sup.log(k1)
    assert [e[:3] for e in executions(hdir)] == [["1", "0", "1000000"], ["2", "0", "1000002000000"]]


ESCAPING_JOB = """#!/bin/bash
#SBATCH -N 1 -o {cdir}/slurm-%j.out -e {cdir}/slurm-%j.err
if [ "$DISPATCH_SUBMISSION" = 1 ]; then
  # a helper that leaves the job's process tree (double fork + setsid), as a daemonized
  # loader would: proctrack/linuxproc does not kill it (proctrack/cgroup does: the
  # test runs where tracking is linuxproc)
  ( setsid bash -c 'echo $$ > {cdir}/escaped.pid
    while [ ! -e {cdir}/stop ]; do echo "$DISPATCH_ATTEMPT $(date +%s.%N)" >> {cdir}/writes; sleep 0.2; done' \\
    < /dev/null > /dev/null 2>&1 & )
fi
while [ ! -e {cdir}/stop ]; do
  echo "$DISPATCH_ATTEMPT $(date +%s.%N)" >> {cdir}/writes; [ -e {cdir}/fail ] && exit 3; sleep 0.2
done
"""


@pytest.mark.tracking("linuxproc")
def test_an_idle_responding_node_is_no_evidence_and_a_person_releases(sup: Sup):
    """Slurm says the job ended, nothing is completing, the node is IDLE and responding,
    and yet a process of the old execution still writes: the cessation signal keeps
    saying "not ceased" (no Epilog record, no reboot). A person stops the process and
    runs `dispatch-slurm release`; the resubmission then runs."""
    c, cdir, hdir, root = sup.c, sup.cdir, sup.hdir, sup.root
    (hdir / "job.sh").write_text(ESCAPING_JOB.format(cdir=cdir))
    k = sup.start("run", "--shared-checkpoint", "--resubmit", "1", "--cessation-interval", "2s",
                  "--poll", "1", "--", f"{cdir}/job.sh")
    first = sup.wait_fact(lambda f: f["type"] == "started", T_START, "the first execution to start")
    job, node, a0 = first["job"], first["nodes"][0], first["attempt"]
    c.wait_until(lambda: (hdir / "escaped.pid").exists() and any(a == a0 for a, _ in writes(hdir)),
                 timeout=30, what="the job and its escaped helper to write")
    escaped = int((hdir / "escaped.pid").read_text())

    (hdir / "fail").touch()  # the job fails (exit 3); its escaped helper goes on
    hold = sup.wait_fact(lambda f: f["type"] == "hold", T_START, "a hold after the failure")
    (hdir / "fail").unlink()
    assert sup.facts("ended")[0]["state"] == "FAILED" and hold["replaces"] == "resubmit"
    # Slurm's view: ended, not completing (the Epilog gave up waiting), node IDLE and responding
    c.wait_until(lambda: "COMPLETING" not in c.job(job).states and c.node(node).state == {"IDLE"},
                 timeout=T_START, what="the job to finish completing and its node to be IDLE")
    t_idle = time.time()
    c.wait_until(lambda: max(t for a, t in writes(hdir) if a == a0) > t_idle + 2, timeout=30,
                 what="the escaped process to keep writing")
    sup.wait_fact(lambda f: f["type"] == "cessation" and f["t"] > t_idle + 2, 30, "an answer while IDLE")
    answers = sup.facts("cessation")
    assert answers and all(f["answer"] == "not_ceased" for f in answers), [describe(f) for f in answers]
    ev = answers[-1]["evidence"]
    assert ev["slurm"]["ended"] is True and ev["nodes"][node]["ceased"] is False
    assert "recorded no epilog" in ev["nodes"][node]["evidence"], ev
    assert not (hdir / "root" / "ceased" / f"{a0}.{node}").exists()
    assert "still alive; no cessation recorded" in c.exec(node, ["cat", "/var/log/dispatch-slurm.log"]).stdout
    assert len(sup.facts("intent")) == 1, "nothing was submitted during the hold"

    # the person: stops the stray process, then answers the hold
    c.exec(node, ["kill", str(escaped)], user="alice")
    c.wait_until(lambda: c.exec(node, ["kill", "-0", str(escaped)], check=False).returncode != 0,
                 timeout=10, what="the escaped process to stop")
    out = c.exec(CONTROLLER, ["dispatch-slurm", "release", root, "-m", "killed the stray writer"],
                 user="alice").stdout
    assert "released hold #1" in out
    again = c.exec(CONTROLLER, ["dispatch-slurm", "release", root], user="alice", check=False)
    assert again.returncode != 0 and ("already released" in again.stderr or "no hold stands" in again.stderr)
    rel = sup.wait_fact(lambda f: f["type"] == "release", 30, "the release to be recorded")
    assert rel["by"] == "person" and rel["message"] == "killed the stray writer" and rel["user"] == "alice"
    second = sup.wait_fact(lambda f: f["type"] == "started" and f["n"] == 2, T_START, "the resubmission")
    a1 = second["attempt"]
    c.wait_until(lambda: any(a == a1 for a, _ in writes(hdir)), timeout=30, what="the new execution's writes")
    assert max(t for a, t in writes(hdir) if a == a0) < min(t for a, t in writes(hdir) if a == a1)
    (hdir / "stop").touch()
    assert sup.wait_rc(k, T_START) == 0, sup.log(k)
    assert [f["by"] for f in sup.facts("release")] == ["person"]


FAIL_FIRST_JOB = """#!/bin/bash
#SBATCH -N 1 -o /dev/null
while [ ! -e {cdir}/go ]; do sleep 0.5; done
[ "$DISPATCH_SUBMISSION" = 1 ] && exit 3
exit 0
"""


def decisions(s: Sup) -> list[tuple]:
    """What a supervisor recorded and decided, without when and by which process."""
    keep = ("intent", "submitted", "started", "ended", "rule", "finished")
    return [(f["type"], f.get("n"), f.get("r"), f.get("state"), f.get("exit_code"), f.get("rule"), f.get("cause"),
             f.get("budget_left"), f.get("outcome")) for f in s.facts() if f["type"] in keep]


def test_stopped_longer_than_min_job_age_decides_as_if_it_never_stopped(sup: Sup):
    """Two supervisors of the same job on two roots; one is killed while its first
    execution runs and stays down until slurmctld has forgotten the job (MinJobAge after
    it ended). `run ROOT` then reads the job from sacct: the same facts, the same rules,
    the same outcome as the supervisor that never stopped."""
    c, cdir, hdir = sup.c, sup.cdir, sup.hdir
    bdir, bhost = f"{cdir}/b", hdir / "b"
    c.exec(CONTROLLER, f"mkdir -m 755 {bdir} && mkdir -m 700 {bdir}/root", user="alice")
    other = Sup(c, bdir, bhost, f"{bdir}/root")
    for s in (sup, other):
        (s.hdir / "job.sh").write_text(FAIL_FIRST_JOB.format(cdir=cdir))
    ka = sup.start("run", "--resubmit", "1", "--poll", "1", "--", f"{cdir}/job.sh")
    kb = other.start("run", "--resubmit", "1", "--poll", "1", "--", f"{bdir}/job.sh")
    first = other.wait_fact(lambda f: f["type"] == "started", T_START, "B's first execution")
    sup.wait_fact(lambda f: f["type"] == "started", T_START, "A's first execution")
    other.kill(other.pid())
    (hdir / "go").touch()  # both first executions fail (exit 3) now, B's while nobody watches
    assert sup.wait_rc(ka, 2 * T_START) == 0, sup.log(ka)
    c.wait_until(lambda: "Invalid job id" in c.exec(CONTROLLER, ["scontrol", "show", "job", str(first["job"])],
                                                    check=False).stderr,
                 timeout=330, what="slurmctld to forget B's first job (MinJobAge + its purge interval)")
    kb = other.start("run", "--poll", "1")
    assert other.wait_rc(kb, 2 * T_START) == 0, other.log(kb)
    assert decisions(other) == decisions(sup)
    assert [f.get("via") for f in other.facts("ended")] == ["sacct", None]
    assert [(f["state"], f["exit_code"]) for f in sup.facts("ended")] == [("FAILED", 3), ("COMPLETED", 0)]
    assert [f["rule"] for f in sup.facts("rule")] == ["resubmit", "done"]
