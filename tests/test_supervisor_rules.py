"""The supervisor's rules, record, restart and holds, and the cessation evidence rule,
without a cluster: a stand-in runner answers the Slurm commands with the objects Slurm
24.11 printed on docker-slurm (tests/cluster/data/slurm-24.11.json, CLI JSON and sacct),
so dispatch_slurm.slurm parses what it would on a login node. The cluster tests
(tests/cluster/test_supervisor.py) show the same on real Slurm."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal as signal_module
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support import cli

from dispatch_slurm import store
from dispatch_slurm import supervisor as sv
from dispatch_slurm.contract import names
from dispatch_slurm.store import events
from dispatch_slurm.slurm import cessation
from dispatch_slurm.store import ceased
from dispatch_slurm.supervisor import holds, rules
from dispatch_slurm.supervisor.question import Question
from testbed import wait
from dispatch_slurm.supervisor.state import State
from dispatch_slurm.supervisor.record import execution
from dispatch_slurm.errors import DispatchError
from dispatch_slurm.slurm.client import CommandResult, Slurm

CLUSTER = "testc"


#: what Slurm 24.11 printed on a docker-slurm cluster (trimmed to the keys dispatch_slurm.slurm
#: reads): the stand-in's job, node and sacct objects are copies of these, changed where its jobs differ
RECORDED = json.loads((Path(__file__).parent / "cluster" / "data" / "slurm-24.11.json").read_text())


def slurm_number(n: int) -> dict:
    """A number as 24.11 prints one ({infinite, number, set}), shaped as the recorded ones."""
    return {**RECORDED["jobs"]["failed"]["exit_code"]["return_code"], "number": n}


def exit_code(code: int | None = 0, signal: int | None = None) -> dict:
    """The exit_code object 24.11 prints for a job that exited ``code``, was killed by
    ``signal``, or never ran (``code`` None): the recorded completed, failed and
    killed-by-signal jobs' objects, with the number changed."""
    if signal:
        e = copy.deepcopy(RECORDED["jobs"]["killed-by-signal"]["exit_code"])
        e["signal"].update(id=slurm_number(signal), name=signal_module.Signals(signal).name.removeprefix("SIG"))
        return e
    e = copy.deepcopy(RECORDED["jobs"]["completed" if not code else "failed"]["exit_code"])
    if code is None:
        e.update(status=["PENDING"], return_code={**e["return_code"], "set": False})
    else:
        e["return_code"]["number"] = code
    return e


class FakeSlurm:
    """slurmctld and slurmdbd's side of the CLI, as Slurm 24.11 answers: enough for the
    supervisor. Its objects are the recorded ones (RECORDED) with the test's jobs' values;
    the times, comment and cluster (trimmed from the recording) in 24.11's number shape.
    ``accounting``: sacct answers from the records of every job this slurmctld ever had
    (forgotten or not); off, sacct says accounting is disabled, as on a site without
    slurmdbd."""

    def __init__(self, accounting: bool = False):
        self.jobs: dict[int, dict] = {}  # what slurmctld holds (a test pops one to purge it)
        self.accounted: dict[int, dict] = {}  # what slurmdbd recorded: the same objects, kept when purged
        self.accounting = accounting
        self.cancelled_by: dict[int, int] = {}  # job -> the uid whose cancel ended it (sacct's "CANCELLED by")
        self.submit_lines: dict[int, str] = {}
        self.node_state = {n: {"state": ["IDLE"], "boot_time": 1000} for n in ("c1", "c2", "c3")}
        self.next_id = 100
        self.sbatch: list[tuple[list[str], dict]] = []
        self.calls: list[list[str]] = []
        self.sbatch_error: str | None = None
        self.refuse_once: str | None = None  # the next real sbatch fails, --test-only passes
        self.down = False  # slurmctld unreachable
        self.plugin = True  # sbatch --help lists the SPANK plugin's options
        self.cwds: list[str | None] = []  # where each sbatch ran (None: the caller's own folder)

    def __call__(self, argv, *, env=None, input=None, cwd=None):
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "sbatch":
            self.cwds.append(cwd)
        ok = lambda out="": CommandResult(0, out, "")  # noqa: E731
        if self.down:
            return CommandResult(1, "", "slurm_load_jobs error: Unable to contact slurm controller")
        if argv == ["scontrol", "--version"]:
            return ok("slurm 24.11.5\n")
        if argv == ["scontrol", "show", "config"]:
            return ok(f"Configuration data as of now\nClusterName             = {CLUSTER}\n")
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return ok("\n".join(argv[3].split(",")) + "\n")
        if argv == ["sbatch", "--help"]:
            plugins = "\nOptions provided by plugins:\n      --dispatch-checkpoint=DIR  root\n" if self.plugin else ""
            return ok("Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]\n" + plugins)
        if argv[0] == "sacct":
            return self._sacct(argv)
        if argv[0] == "sbatch":
            return self._sbatch(argv, env)
        if argv[:3] == ["scontrol", "show", "job"]:
            if len(argv) == 4:
                return ok(json.dumps({"jobs": list(self.jobs.values())}))
            # a job slurmctld does not hold: no job and no error with --json (on the cluster:
            # tests/cluster/test_accounting.py, job(999999) is unknown to both, not an error)
            jid = int(argv[3])
            return ok(json.dumps({"jobs": [self.jobs[jid]] if jid in self.jobs else []}))
        if argv[:3] == ["scontrol", "show", "nodes"]:
            return ok(json.dumps({"nodes": [{**RECORDED["nodes"][f"idle-{n}"], "state": s["state"],
                                             "boot_time": slurm_number(s["boot_time"])}
                                            for n, s in self.node_state.items()]}))
        if argv[0] == "scancel":
            self.end(int(argv[-1]), "CANCELLED", by=os.geteuid())
            return ok()
        if argv[:2] in (["scontrol", "hold"], ["scontrol", "release"]):
            j, hold = self.jobs[int(argv[2])], argv[1] == "hold"
            j.update(hold=hold, state_reason="JobHeldUser" if hold else "None", priority=slurm_number(0 if hold else 1))
            if not hold:
                j.pop("state_description", None)
            return ok()
        raise AssertionError(f"the stand-in does not know {argv}")

    def _sbatch(self, argv, env):
        if self.sbatch_error:
            return CommandResult(1, "", self.sbatch_error)
        if "--test-only" in argv:
            # the plugin (in sbatch) would refuse an N not yet allocated under sub/
            assert not [a for a in argv if a.startswith("--dispatch-submission")], argv
            self.calls[-1] = ["sbatch --test-only"]
            return CommandResult(0, "", "sbatch: Job 0 to start at 2026-12-01T10:00:00\n")
        if self.refuse_once:
            err, self.refuse_once = self.refuse_once, None
            return CommandResult(1, "", err)
        self.sbatch.append((argv, dict(env or {})))
        jid = self.next_id
        self.next_id += 1
        self.submitted(jid, next(a.split("=", 1)[1] for a in argv if a.startswith("--comment=")), " ".join(argv))
        return CommandResult(0, f"{jid}\n", "")

    def _sacct(self, argv):
        """sacct as 24.11 prints it: the State column alone (`cancelled_by`'s query), or every
        execution's record in JSON (the jobs of -j, else every job: the query by submit time)."""
        if not self.accounting:
            return CommandResult(1, "", "sacct: error: Slurm accounting storage is disabled")
        ids = [int(i) for i in argv[argv.index("-j") + 1].split(",")] if "-j" in argv else sorted(self.accounted)
        found = [self.accounted[i] for i in ids if i in self.accounted]
        if argv[-2:] == ["-o", "State"]:
            return CommandResult(0, "".join(f"{self._state_column(j)}\n" for j in found), "")
        return CommandResult(0, json.dumps({"jobs": [self._record(j) for j in found],
                                            "meta": RECORDED["sacct"]["json"]["meta"]}), "")

    def _state_column(self, j):
        state = j["job_state"][0]
        by = self.cancelled_by.get(j["job_id"])
        return f"{state} by {by}" if state == "CANCELLED" and by is not None else state

    def _record(self, j):
        """Job ``j``'s accounting record (its last execution), shaped as the recorded ones;
        the job comment is not kept (docker-slurm sets no AccountingStoreFlags), the
        submit line names it."""
        rec = copy.deepcopy(RECORDED["sacct"]["json"]["jobs"][0])
        rec.update(job_id=j["job_id"], nodes=j["nodes"], restart_cnt=j["restart_cnt"], name=j["name"],
                   user=j["user_name"], cluster=j["cluster"], exit_code=copy.deepcopy(j["exit_code"]),
                   submit_line=self.submit_lines.get(j["job_id"], ""),
                   state={"current": list(j["job_state"]), "reason": j["state_reason"]},
                   time={"start": j["start_time"]["number"], "end": j.get("end_time", slurm_number(0))["number"]})
        return rec

    # -- what happens to jobs --
    def submitted(self, jid, comment="", argv="job.sh"):
        """Job ``jid`` queued, as a pending job shows (the recorded requeued-pending one, never run)."""
        j = copy.deepcopy(RECORDED["jobs"]["requeued-pending"])
        j.update(job_id=jid, restart_cnt=0, state_reason="None", user_name="alice", name="job", comment=comment,
                 cluster=CLUSTER, exit_code=exit_code(None), start_time=slurm_number(0), time_limit=slurm_number(60))
        self.jobs[jid] = self.accounted[jid] = j
        self.submit_lines[jid] = f"sbatch --parsable {argv}"
        return j

    def start(self, jid, nodes=("c1",), t=2000):
        self.jobs[jid].update(job_state=["RUNNING"], nodes=",".join(nodes), batch_host=nodes[0],
                              start_time=slurm_number(t))

    def end(self, jid, state, completing=False, code=0, after=100, signal=None, by=None):
        """End job ``jid`` ``after`` seconds after it started (its time limit is an hour), with
        exit ``code`` or killed by ``signal``; ``by``: the uid whose cancel it was."""
        j = self.jobs[jid]
        j["job_state"] = [state] + (["COMPLETING"] if completing else [])
        j["exit_code"] = exit_code(code, signal)
        j["end_time"] = slurm_number(j["start_time"]["number"] + after)
        if by is not None:
            self.cancelled_by[jid] = by

    def launch_fail(self, jid):
        """What Slurm 22.05 showed in the fault campaign (seed 1122): the batch launch failed on
        a node ("Duplicate jobid", the node drained), and Slurm requeued the job and held it."""
        j = self.jobs[jid]
        j.update(job_state=["PENDING"], restart_cnt=j["restart_cnt"] + 1, nodes="", state_reason="JobHeldUser",
                 state_description="launch failed requeued held", priority=slurm_number(0))

    def requeue(self, jid):
        j = self.jobs[jid]
        j.update(job_state=["PENDING"], restart_cnt=j["restart_cnt"] + 1, nodes="", state_reason="BeginTime")

    def by_comment(self):
        out = {}
        for j in self.jobs.values():
            out.setdefault(j["comment"], []).append(j["job_id"])
        return out


class Clock:
    def __init__(self, t=10_000.0):
        self.t = t

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


JOBS = tempfile.mkdtemp(prefix="dispatch-jobs-")  # where the jobs are defined: job.sh asks for no --signal
with open(os.path.join(JOBS, "job.sh"), "w") as _f:
    _f.write("#!/bin/sh\n#SBATCH -N 1\ntrue\n")


def defn(**kw):
    d = {"g": 0, **sv.DEFAULTS, "via": "spank", "args": ["job.sh"], "cwd": JOBS}
    d.update(kw)
    return d


def new(root, fake, clock=None, answers=None, start_defn=None, poll=1.0):
    """A supervisor on root with the stand-in; `answers`: what the cessation signal says, in turn."""
    clock = clock or Clock()
    asked = []

    def ask(h):
        asked.append(h)
        a = answers.pop(0) if answers else "not_ceased"
        return {"answer": a, "exit": {"ceased": 0, "not_ceased": 1}.get(a, 2)}

    sup = sv.Supervisor(str(root), Slurm(fake), poll=poll, clock=clock, sleep=clock.sleep,
                        ask=ask, say=lambda m: None)
    sup.asked = asked
    sup.open("test")
    sup.start(start_defn)
    return sup


def drive(sup, until, steps=5000):
    """Step the supervisor until `until()` holds; Finished propagates."""
    for _ in range(steps):
        if until():
            return
        wait = sup.step()
        if wait:
            sup.sleep(wait)
    raise AssertionError(f"not reached in {steps} steps; record: {[f['type'] for f in sup.record.read()]}")


def types(root, *only):
    return [f["type"] for f in sv.Record(str(root)).read() if not only or f["type"] in only]


def facts(root, type_):
    return [f for f in sv.Record(str(root)).read() if f["type"] == type_]


# ---- the record ------------------------------------------------------------------------------

def test_record_appends_fsynced_lines_and_cuts_a_torn_tail(root):
    rec = sv.Record(str(root))
    rec.open_for_append()
    rec.append({"type": "note", "text": "a"})
    rec.append({"type": "note", "text": "b"})
    with open(root / "record.jsonl", "ab") as f:
        f.write(b'{"type":"note","te')  # a crash in the middle of a write
    assert [f["text"] for f in sv.Record(str(root)).read()] == ["a", "b"], "readers ignore a torn tail"
    rec = sv.Record(str(root))
    got = rec.open_for_append()
    assert [f["type"] for f in got] == ["note", "note", "torn_tail_dropped"]
    assert got[-1]["bytes"] == '{"type":"note","te' and got[-1]["seq"] == 3
    assert (root / "record.jsonl").read_bytes().endswith(b"}\n")


def test_record_line_that_does_not_parse_is_an_error_naming_it(root):
    note = '{"type":"note","t":1,"text":"x"}'
    (root / "record.jsonl").write_text(f'{note}\nnot json\n{note}\n')
    with pytest.raises(DispatchError, match=r"record.jsonl:2: not a record fact"):
        sv.Record(str(root)).read()
    (root / "record.jsonl").write_text(f'{note}\n{{"type":"ended","t":1,"job":"7","r":0,"state":"FAILED"}}\n')
    with pytest.raises(DispatchError, match=r"record.jsonl:2: ended fact field 'job' is str '7'"):
        sv.Record(str(root)).read()


# ---- rules ---------------------------------------------------------------------------------

def test_done_on_success(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    drive(sup, lambda: sup.state.job)
    fake.start(100, ["c1", "c2"])
    drive(sup, lambda: sup.state.started)
    fake.end(100, "COMPLETED")
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 0
    assert types(root) == ["supervisor", "job", "intent", "submitted", "started", "ended", "rule", "finished"]
    st = facts(root, "started")[0]
    assert st["nodes"] == ["c1", "c2"] and st["r"] == 0 and st["epoch"] == 1_000_000
    assert st["attempt"] == f"{CLUSTER}.100.1000000" and st["start_time"] == 2000
    argv, _ = fake.sbatch[0]
    assert "--dispatch-checkpoint=" + str(root) in argv and "--dispatch-submission=1" in argv
    assert "--dispatch-generation=0" in argv and "--no-requeue" not in argv and argv[-1] == "job.sh"


def test_resubmit_until_the_budget_is_spent(root):
    fake = FakeSlurm(accounting=True)
    sup = new(root, fake, start_defn=defn(resubmit=2))
    for jid, state in ((100, "CANCELLED"), (101, "NODE_FAIL")):
        drive(sup, lambda: sup.state.job == jid)
        fake.start(jid)
        drive(sup, lambda: sup.state.started)
        fake.end(jid, state, by=999)  # 100: someone else's cancel (sacct: CANCELLED by 999), an admin's
    drive(sup, lambda: sup.state.job == 102)
    fake.start(102)
    drive(sup, lambda: sup.state.started)
    fake.end(102, "FAILED", code=3)
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 1 and "no resubmission is left" in e.value.message
    rules = [(f["rule"], f["cause"], f.get("budget_left")) for f in facts(root, "rule")]
    assert rules == [("resubmit", "cancel", 1), ("resubmit", "node_failure", 0), ("fail", "failure", 0)]
    assert [(f["n"], f["job"], f["epoch"]) for f in facts(root, "started")] == \
        [(1, 100, 1_000_000), (2, 101, 2_000_000), (3, 102, 3_000_000)]
    assert facts(root, "ended")[2]["exit_code"] == 3
    assert sorted(p.name for p in (root / "sub").iterdir()) == ["000001", "000002", "000003"]


# ---- stop, a user's own cancel, --once, no N spent on a refused sbatch --------------------

@pytest.mark.parametrize("sacct", [True, False], ids=["sacct-names-the-user", "no-accounting"])
def test_a_users_own_cancel_is_a_stop_not_a_failure_to_retry(root, sacct):
    fake = FakeSlurm(accounting=sacct)
    sup = new(root, fake, start_defn=defn(resubmit=3))
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: sup.state.started)
    fake.end(100, "CANCELLED", by=os.geteuid())
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 0 and "nothing is resubmitted" in e.value.message
    assert ("cancelled by you" in e.value.message) == sacct
    assert len(fake.sbatch) == 1 and facts(root, "finished")[-1]["outcome"] == "stopped"
    assert facts(root, "ended")[-1]["cancelled_by"] == (os.geteuid() if sacct else None)


def test_stop_cancels_the_job_and_resubmits_nothing(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=3))
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: sup.state.started)
    sv.requests.make(str(root), "stop.0", {"user": "alice", "message": "wrong learning rate"})
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 0 and "stopped by alice (wrong learning rate)" in e.value.message
    assert ["scancel", "100"] in fake.calls and len(fake.sbatch) == 1
    assert types(root, "stop", "ended", "rule", "finished") == ["stop", "ended", "rule", "finished"]


def test_once_steps_until_it_would_wait_and_resumes_where_it_stopped(root):
    """`run --once` from cron or scrontab: each invocation does what needs doing now and
    exits 0; the record makes the sequence the same as one long-lived supervisor's."""
    fake, clock = FakeSlurm(), Clock()

    def once():
        sup = new(root, fake, clock=clock, start_defn=None if (root / "record.jsonl").exists() else defn(resubmit=1))
        try:
            return sv.follow(sup, once=True)
        except sv.Finished as f:
            return f
        finally:
            sup.close()
    first = once()
    assert first.code == 0 and "job 100" in first.message and len(fake.sbatch) == 1
    quiet = len(sv.Record(str(root)).read())
    assert once().code == 0 and len(sv.Record(str(root)).read()) == quiet, "a run with nothing to do wrote facts"
    fake.start(100)
    once()
    fake.end(100, "FAILED", code=1)
    once()  # records the end, resubmits (N=2)
    assert len(fake.sbatch) == 2
    fake.start(101)
    once()
    fake.end(101, "COMPLETED")
    done = once()
    assert done.code == 0 and "completed" in done.message
    assert [f["type"] for f in facts(root, "started")] == ["started", "started"]
    assert sorted(p.name for p in (root / "supervisor").iterdir() if p.name.endswith(".exited")) == \
        sorted(p.name + ".exited" for p in (root / "supervisor").iterdir() if p.name.isdigit())


def test_sbatch_runs_where_the_job_was_defined_and_this_process_stays_put(root, tmp_path, monkeypatch):
    """sbatch finds the script, and the job starts, in the folder `run` was started in (the
    job's definition's cwd), given to sbatch itself: this process never moves, for it
    follows many roots (each with its own folder), and may be a test runner."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    drive(sup, lambda: sup.state.job)
    assert os.getcwd() == str(here), "the supervisor moved its process to the job's folder"
    assert fake.cwds == [JOBS, JOBS], "sbatch --test-only and sbatch run where the job was defined"
    gone = defn(cwd=str(tmp_path / "removed"))  # a folder gone since: sbatch runs where this process is
    sup2 = new(tmp_path, fake, start_defn=gone)
    drive(sup2, lambda: sup2.state.job)
    assert fake.cwds[2:] == [None, None] and os.getcwd() == str(here)


def test_no_submission_number_is_spent_on_a_refused_sbatch(root):
    fake = FakeSlurm()
    fake.sbatch_error = "sbatch: error: invalid partition specified: nope"
    sup = new(root, fake, start_defn=defn())
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 1 and "invalid partition" in e.value.message
    assert not (root / "sub").exists(), "sbatch --test-only refused it: no N was allocated"
    # test-only passes, the real sbatch is refused once (Slurm queued nothing): the same N again
    root2 = root / "again"
    root2.mkdir()
    fake2 = FakeSlurm()
    fake2.refuse_once = "sbatch: error: Batch job submission failed: Socket timed out"
    sup2 = new(root2, fake2, start_defn=defn(resubmit=1))
    drive(sup2, lambda: sup2.state.job)
    assert sorted(p.name for p in (root2 / "sub").iterdir()) == ["000001"]
    assert [(f["type"], f.get("n")) for f in sv.Record(str(root2)).read() if f["type"] in
            ("intent", "submit_failed", "intent_lost", "submitted")] == \
        [("intent", 1), ("submit_failed", 1), ("intent_lost", 1), ("intent", 1), ("submitted", 1)]


def _requeued_once(root):
    """Job 100 (resubmit budget 1) started on c3, then requeued by Slurm (a node failure)."""
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=1))
    drive(sup, lambda: sup.state.job)
    fake.start(100, ["c3"])
    drive(sup, lambda: sup.state.started)
    fake.requeue(100)  # node failure, JobRequeue=1
    return fake, sup


def test_slurm_requeue_is_recorded_without_spending_budget(root):
    fake, sup = _requeued_once(root)
    drive(sup, lambda: 0 in sup.state.ended and not sup.state.pending_decision)
    fake.start(100, ["c1"], t=2100)
    drive(sup, lambda: sup.state.started["r"] == 1)
    ended, = facts(root, "ended")
    assert ended["requeued"] and ended["r"] == 0 and ended["nodes"] == ["c3"]
    assert [f["rule"] for f in facts(root, "rule")] == ["requeue"] and sup.state.used == 0
    s1 = facts(root, "started")[1]
    assert (s1["n"], s1["r"], s1["epoch"], s1["nodes"]) == (1, 1, 1_000_001, ["c1"])
    assert len(fake.sbatch) == 1


def test_a_job_slurm_held_after_its_launch_failed_is_released_then_the_run_ends_held(root):
    """The campaign's seed 1122 replayed on Slurm 22.05: a cut-off node came back still running
    the job requeued elsewhere, Slurm drained it ("Duplicate jobid") and held the job after its
    launch failed ("launch failed requeued held", reason JobHeldUser). `run` followed the
    pending job forever, saying nothing. It now releases it (it starts on another node), three
    times per submission; a fourth such hold ends the run held (exit 3), naming what to do."""
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: sup.state.started)
    for n in (1, 2, 3):
        fake.launch_fail(100)
        drive(sup, lambda: len(facts(root, "launch_released")) == n)
        assert fake.jobs[100]["state_reason"] == "None" and ["scontrol", "release", "100"] in fake.calls
    fake.launch_fail(100)
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 3 and "launch failed requeued held" in e.value.message
    assert "scontrol release 100" in e.value.message and f"dispatch-slurm run {root}" in e.value.message
    assert [f["rule"] for f in facts(root, "rule")] == ["requeue"], "one execution ran: one end, no budget spent"
    assert len(fake.sbatch) == 1 and facts(root, "finished")[0]["outcome"] == "held"


def test_the_supervisors_own_hold_is_not_taken_for_a_failed_launch():
    own = rules.launch_held
    from dispatch_slurm.slurm.facts import JobInfo
    base = dict(job_id=1, state="PENDING", flags=frozenset(), reason="JobHeldUser", restart_count=1, nodes=[],
                batch_host="", exit_code=None, exit_signal=None, partition="p", user="u", name="n")
    assert own(JobInfo(**base, raw={"state_reason": "JobHeldUser", "state_description": "launch failed requeued held"}))
    assert not own(JobInfo(**base, raw={"state_reason": "JobHeldUser"}))  # `scontrol hold`: the supervisor's own
    assert not own(JobInfo(**{**base, "state": "RUNNING"}, raw={"state_description": "launch failed requeued held"}))


def test_a_job_that_ran_between_two_polls_is_still_recorded_as_started(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    drive(sup, lambda: sup.state.job)
    fake.start(100, ["c2"])
    fake.end(100, "COMPLETED")
    with pytest.raises(sv.Finished):
        drive(sup, lambda: False)
    started, = facts(root, "started")
    assert started["late"] and started["nodes"] == ["c2"]


# ---- continuations across time limits ---------------------------------------------------------

def _execution(sup, fake, jid, state, *, signalled=False, step=None, code=0):
    """Run job ``jid`` to its end as a trainer would: optionally publish a save at ``step``
    and record the preemption handler's events (the time-limit signal), then end it."""
    drive(sup, lambda: sup.state.job == jid)
    fake.start(jid)
    drive(sup, lambda: sup.state.started and sup.state.started["job"] == jid)
    attempt, epoch = sup.state.started["attempt"], sup.state.started["epoch"]
    if signalled:
        events.emit("preempt_signal", root=sup.root, attempt=attempt, signal="SIGTERM", grace=30, deadline=0)
    if step is not None:
        save = os.path.join(sup.root, "exec", attempt, f"checkpoint-{step}")
        os.makedirs(save)
        with open(os.path.join(save, "model.bin"), "wb") as f:  # a save holds a file
            f.write(b"w")
        store.publish(save, step, root=sup.root, epoch=epoch, by="test")
    if signalled:
        events.emit("checkpoint_complete", root=sup.root, attempt=attempt, elapsed=0.1, time_remaining=29)
    fake.end(jid, state, code=code)


def test_a_time_limit_is_a_continuation_with_its_own_budget_and_only_an_unsignalled_end_is_done(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=1))
    _execution(sup, fake, 100, "COMPLETED", signalled=True, step=100)  # saved on --signal, exit 0
    _execution(sup, fake, 101, "TIMEOUT", step=150)                   # no trap: Slurm ended it
    _execution(sup, fake, 102, "FAILED", step=180, code=1)            # a crash: a failure
    _execution(sup, fake, 103, "COMPLETED", signalled=True, step=250)
    _execution(sup, fake, 104, "COMPLETED", step=300)                 # finished, never signalled
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 0 and e.value.message.startswith("job 104 completed: it exited 0 and the job has no --signal")
    rules = [(f["rule"], f["cause"], f.get("budget_left"), f.get("latest_step")) for f in facts(root, "rule")]
    assert rules == [("continue", "signalled", 99, 100), ("continue", "time_limit", 98, 150),
                     ("resubmit", "failure", 0, 180), ("continue", "signalled", 97, 250),
                     ("done", "completed", None, None)], "continuations never spend the resubmit budget"
    assert [f["epoch"] for f in facts(root, "started")] == [1_000_000, 2_000_000, 3_000_000, 4_000_000, 5_000_000]
    assert sup.state.used == 1 and sup.state.continued == 3


def test_a_completed_end_without_the_signal_is_done_even_if_it_published(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    _execution(sup, fake, 100, "COMPLETED", step=500)
    events.emit("preempt_signal", root=str(root), attempt=f"{CLUSTER}.999.1000000", signal="SIGTERM", grace=1,
                deadline=0)  # another execution's signal is no evidence for this one
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 0 and [f["rule"] for f in facts(root, "rule")] == ["done"]


def test_a_chain_that_publishes_no_higher_step_is_stopped_after_stalls_continuations(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=5))
    _execution(sup, fake, 100, "TIMEOUT", step=40)
    for jid in range(101, 101 + sv.STALLS):  # the trainer resumes and is killed before it saves anything new
        _execution(sup, fake, jid, "TIMEOUT")
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 1 and f"the last {sv.STALLS} executions published no step above 40" in e.value.message
    rules = [(f["rule"], f.get("progress"), f.get("stalls")) for f in facts(root, "rule")]
    assert rules == [("continue", True, 0), ("continue", False, 1), ("continue", False, 2), ("fail", False, 3)]
    assert sup.state.used == 0, "a stalled chain is not a failure to resubmit"


def test_the_continuations_budget_runs_out_and_is_refused_negative(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(continuations=1))
    _execution(sup, fake, 100, "TIMEOUT", step=10)
    _execution(sup, fake, 101, "TIMEOUT", step=20)
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 1 and "no continuation is left (--continuations 1)" in e.value.message
    assert cli("plan", root / "x", "--continuations", "-1", "--", "j.sh").returncode == 2


def test_a_shared_checkpoint_continuation_waits_for_its_hold(root):
    fake, clock = FakeSlurm(), Clock()
    sup = new(root, fake, clock, answers=["ceased"], start_defn=defn(shared=True, cessation_interval=60.0))
    _execution(sup, fake, 100, "COMPLETED", signalled=True, step=7)
    drive(sup, lambda: sup.state.job == 101)
    held, applied = facts(root, "rule")
    assert (held["rule"], held["held"], held["cause"]) == ("continue", True, "signalled")
    assert facts(root, "hold")[0]["replaces"] == "continue"
    assert (applied["rule"], applied["after_hold"], applied["budget_left"]) == ("continue", 1, 99)
    assert sup.state.continued == 1


# ---- restart without double submission --------------------------------------------------------

class Crash(BaseException):
    pass


def crash_at(sup, fact_type):
    """Make the supervisor die just before it records `fact_type` (as SIGKILL would)."""
    real = sup.record.append

    def append(f):
        if f["type"] == fact_type:
            raise Crash
        return real(f)
    sup.record.append = append


def test_crash_after_sbatch_before_the_job_id_is_recorded(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    crash_at(sup, "submitted")
    with pytest.raises(Crash):
        drive(sup, lambda: False)
    assert types(root)[-1] == "intent" and len(fake.sbatch) == 1
    again = new(root, fake)  # restart: resumes from the record
    drive(again, lambda: again.state.job)
    assert len(fake.sbatch) == 1, "the restarted supervisor submitted again"
    sub = facts(root, "submitted")
    assert sub == [sub[0]] and sub[0]["recovered"] and sub[0]["job"] == 100 and sub[0]["n"] == 1
    assert fake.by_comment() == {f"dispatch-slurm:{root}:g0:n1": [100]}


def test_crash_before_sbatch_allocates_a_fresh_n(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    real = fake.__call__
    fake_calls = []

    def die_on_sbatch(argv, **kw):
        if argv[0] == "sbatch" and "--test-only" not in argv:
            fake_calls.append(argv)
            raise Crash
        return real(argv, **kw)
    sup.slurm.runner = die_on_sbatch
    with pytest.raises(Crash):
        drive(sup, lambda: False)
    again = new(root, fake)
    drive(again, lambda: again.state.job)
    assert [(f["type"], f.get("n")) for f in sv.Record(str(root)).read()
            if f["type"] in ("intent", "intent_lost", "submitted")] == \
        [("intent", 1), ("intent_lost", 1), ("intent", 2), ("submitted", 2)]
    assert len(fake.sbatch) == 1, "N=1 never reached Slurm; N=2 did, once"


def test_resume_follows_the_recorded_job_and_refuses_other_arguments(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=1))
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: sup.state.started)
    # killed: no exit marker
    with pytest.raises(DispatchError, match="resubmit"):
        sv.check_resume({"resubmit": 5}, [], sv.State.replay(sv.Record(str(root)).read()).defn)
    with pytest.raises(DispatchError, match="omit the sbatch arguments"):
        sv.check_resume({}, ["other.sh"], sv.State.replay(sv.Record(str(root)).read()).defn)
    again = new(root, fake)
    fake.end(100, "COMPLETED")
    with pytest.raises(sv.Finished) as e:
        drive(again, lambda: False)
    assert e.value.code == 0 and len(fake.sbatch) == 1
    assert len(facts(root, "started")) == 1, "the execution it had seen start is not recorded twice"


def test_slurm_unreachable_is_waited_out_not_taken_for_an_end(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=3))
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: sup.state.started)
    fake.down = True
    for _ in range(5):
        assert sup.step() == sup.poll
    assert types(root)[-1] == "started"
    fake.down = False
    fake.jobs.pop(100)  # purged (MinJobAge): how it ended cannot be told
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 1 and "not resubmitting blindly" in e.value.message and len(fake.sbatch) == 1


def test_a_job_slurmctld_forgot_is_read_from_the_accounting_database(root):
    """On a site with slurmdbd a job purged from slurmctld's memory (MinJobAge) is still
    known: its end comes from sacct's record (--json=v0.0.42), and the rule applies to it."""
    fake = FakeSlurm(accounting=True)
    sup = new(root, fake, start_defn=defn(resubmit=1))
    drive(sup, lambda: sup.state.job)
    fake.start(100, ["c2", "c3"])
    drive(sup, lambda: sup.state.started)
    fake.end(100, "FAILED", code=3)
    fake.jobs.pop(100)
    drive(sup, lambda: sup.state.job == 101, steps=50)
    ended, = facts(root, "ended")
    assert (ended["state"], ended["exit_code"], ended["via"], ended["nodes"]) == ("FAILED", 3, "sacct", ["c2", "c3"])
    assert [(f["rule"], f["cause"]) for f in facts(root, "rule")] == [("resubmit", "failure")]
    assert any(c[0] == "sacct" and "--json=v0.0.42" in c for c in fake.calls)


def test_a_second_live_supervisor_is_refused_and_a_dead_one_is_taken_over(root):
    fake = FakeSlurm()
    new(root, fake, start_defn=defn())
    # make the claim belong to a live process that looks like a supervisor
    # argv[0] set by exec itself: Popen returns once the exec is done, so /proc/<pid>/cmdline is
    # already this (through `bash -c "exec -a ..."` a look during bash's own exec could read nothing)
    p = subprocess.Popen(["dispatch-slurm-fake", "60"], executable=shutil.which("sleep"))
    try:
        info = json.loads((root / "supervisor" / "000001").read_text())
        os.chmod(root / "supervisor" / "000001", 0o644)
        (root / "supervisor" / "000001").write_text(json.dumps({**info, "pid": p.pid}))
        with pytest.raises(DispatchError, match="already running"):
            new(root, fake)
    finally:
        p.kill()
        p.wait()
    again = new(root, fake)
    assert again.claim.seq == 2


def test_a_claim_on_another_host_is_in_doubt_until_its_heartbeat_moves_or_stands_still(root):
    """Each look returns at once: a claimant on another host is alive once its heartbeat
    moved, gone once it stood still for three of its polls (+5 s), in doubt until then."""
    from dispatch_slurm.supervisor.claim import LOOK
    (root / "supervisor").mkdir()
    entry = root / "supervisor" / "000001"
    entry.write_text(json.dumps({"host": "elsewhere", "pid": 1, "poll": 10.0, "purpose": "run"}))
    os.utime(entry, (1000, 1000))
    clock = Clock()
    claim = sv.Claim(str(root), 1.0, "test", clock=clock)
    assert claim.attempt() == LOOK
    clock.sleep(34)
    assert claim.attempt() == LOOK and claim.seq is None
    os.utime(entry, (1010, 1010))  # its heartbeat: the claimant lives
    with pytest.raises(DispatchError, match="already running"):
        claim.attempt()
    other = sv.Claim(str(root), 1.0, "test", clock=clock)
    assert other.attempt() == LOOK
    clock.sleep(35)
    assert other.attempt() is None and other.seq == 2 and (root / "supervisor" / "000002").exists()


def test_a_writer_that_lost_its_claim_stops_without_writing(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    before = types(root)
    (root / "supervisor" / "000002").write_text("{}")  # someone else claimed the root
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 2 and "took over" in e.value.message
    assert types(root) == before and (root / "supervisor" / "000001.exited").exists()


# ---- shared checkpoints: holds --------------------------------------------------------------

def shared_job_ended(root, fake, clock, answers, **kw):
    sup = new(root, fake, clock, answers=answers,
              start_defn=defn(shared=True, resubmit=1, cessation_interval=60.0, hold_for=3600.0, **kw))
    drive(sup, lambda: sup.state.job)
    fake.start(100, ["c1", "c2"])
    drive(sup, lambda: sup.state.started)
    fake.end(100, "NODE_FAIL")
    drive(sup, lambda: sup.state.hold)
    return sup


def test_shared_checkpoint_holds_until_the_cessation_signal_says_ceased(root):
    fake, clock = FakeSlurm(), Clock()
    sup = shared_job_ended(root, fake, clock, ["not_ceased", "unknown", "not_ceased", "ceased"])
    argv = fake.sbatch[0][0]
    assert "--no-requeue" in argv and "--dispatch-shared-checkpoint" in argv
    t_hold = clock.t
    drive(sup, lambda: sup.state.job == 101)
    assert len(sup.asked) == 4 and clock.t - t_hold >= 3 * 60, "asked every 60 s, not faster"
    assert types(root)[5:] == ["ended", "rule", "hold", "cessation", "cessation", "cessation", "cessation",
                               "release", "rule", "intent", "submitted"]
    held, hold = facts(root, "rule")[0], facts(root, "hold")[0]
    assert held["rule"] == "resubmit" and held["held"] and held["cause"] == "node_failure"
    assert hold["replaces"] == "resubmit" and hold["nodes"] == ["c1", "c2"]
    assert hold["attempt"] == f"{CLUSTER}.100.1000000" and hold["until"] == pytest.approx(t_hold + 3600)
    assert [f["answer"] for f in facts(root, "cessation")] == ["not_ceased", "unknown", "not_ceased", "ceased"]
    assert facts(root, "release")[0]["by"] == "cessation signal"
    applied = facts(root, "rule")[1]
    assert applied == {**applied, "rule": "resubmit", "after_hold": 1, "budget_left": 0}
    assert len(fake.sbatch) == 2 and "--dispatch-submission=2" in fake.sbatch[1][0]


def test_a_step_never_waits_for_the_cessation_command(root):
    """The site's command runs as a child: the step that asks it returns at once, the next
    ones find it running and return too, and closing the supervisor kills it."""
    fake, clock = FakeSlurm(), Clock()
    sup = sv.Supervisor(str(root), Slurm(fake), poll=1.0, clock=clock, sleep=clock.sleep, say=lambda m: None)
    sup.open("test")
    sup.start(defn(shared=True, resubmit=1, cessation_cmd="sleep 60", cessation_interval=60.0, hold_for=3600.0))
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: sup.state.started)
    fake.end(100, "NODE_FAIL")
    drive(sup, lambda: sup.state.hold)
    try:
        for _ in range(3):
            t0 = time.monotonic()
            wait = sup.step()
            assert time.monotonic() - t0 < 5 and wait == sup.poll, (time.monotonic() - t0, wait)
        assert sup.asking is not None and sup.asking.proc.poll() is None and not facts(root, "cessation")
    finally:
        proc = sup.asking and sup.asking.proc
        sup.close()
    assert proc is not None and proc.poll() is not None and sup.asking is None


def test_a_person_releases_the_hold(root):
    fake, clock = FakeSlurm(), Clock()
    sup = shared_job_ended(root, fake, clock, [])
    drive(sup, lambda: len(sup.asked) == 2)
    got = sv.release(str(root), "node c2 power-cycled")
    assert got["hold"] == 1 and got["replaces"] == "resubmit"
    with pytest.raises(DispatchError, match="already released"):
        sv.release(str(root))
    drive(sup, lambda: sup.state.job == 101)
    rel, = facts(root, "release")
    assert rel["by"] == "person" and rel["message"] == "node c2 power-cycled" and rel["user"]
    with pytest.raises(DispatchError, match="no hold stands"):
        sv.release(str(root))


def test_an_expired_hold_leaves_the_job_held_and_says_so(root):
    fake, clock = FakeSlurm(), Clock()
    sup = shared_job_ended(root, fake, clock, [])
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 3 and "expired" in e.value.message and "stays held" in e.value.message
    assert types(root)[-2:] == ["hold_expired", "finished"] and len(fake.sbatch) == 1
    assert len(sup.asked) == 61  # at the hold, then every 60 s for an hour
    sup.close()
    # a restart asks once more, then says so again; nothing is submitted
    again = new(root, fake, clock)
    with pytest.raises(sv.Finished) as e:
        drive(again, lambda: False)
    assert e.value.code == 3 and len(again.asked) == 1 and len(fake.sbatch) == 1
    again.close()
    # the person's answer comes later: the next run applies it
    sv.release(str(root))
    last = new(root, fake, clock)
    drive(last, lambda: last.state.job == 101)
    assert len(fake.sbatch) == 2


def test_shared_job_requeued_by_slurm_anyway_is_held_in_slurm(root):
    fake, clock = FakeSlurm(), Clock()
    sup = new(root, fake, clock, answers=["ceased"], start_defn=defn(shared=True, resubmit=1))
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: sup.state.started)
    fake.requeue(100)
    drive(sup, lambda: sup.state.hold)
    assert fake.jobs[100]["hold"] is True
    drive(sup, lambda: not sup.state.hold and not sup.state.pending_apply)
    assert fake.jobs[100]["hold"] is False and len(fake.sbatch) == 1
    assert [f["rule"] for f in facts(root, "rule")] == ["requeue", "requeue"]


def asked(h, root, now=0.0):
    """The cessation command's answer for hold ``h``, collected as a supervisor's steps do
    (polled, with a bounded deadline)."""
    q = Question.start(h, str(root), CLUSTER, now)
    return wait.until(lambda: q.answer(now), timeout=30, what="the cessation command's answer", every=0.02)


def test_the_cessation_command_is_run_with_the_execution_filled_in(root, tmp_path):
    out = tmp_path / "argv"
    script = (f"import json, sys; open({str(out)!r}, 'w').write(' '.join(sys.argv[1:])); "
              "print(json.dumps(dict(by='test'))); sys.exit(int(sys.argv[1]))")
    h = {"hold": 1, "job": 100, "r": 2, "g": 0, "n": 3, "epoch": 3_000_002, "attempt": "testc.100.3000002",
         "nodes": ["c1", "c2"], "start_time": 2000, "interval": 5.0}
    for code, answer in ((0, "ceased"), (1, "not_ceased"), (7, "unknown")):
        h["cessation_cmd"] = f"{sys.executable} -c {script!r} {code} {{job}} {{restart}} {{nodes}} {{root}} {{attempt}}"
        got = asked(h, root)
        assert got["answer"] == answer and got["exit"] == code and got["evidence"] == {"by": "test"}, got
    assert out.read_text() == f"7 100 2 c1,c2 {root} testc.100.3000002"
    h["cessation_cmd"] = "/nonexistent/ceased {job}"
    assert asked(h, root)["answer"] == "unknown"


def test_a_cessation_command_past_its_time_is_killed_and_cannot_tell(root):
    """Collected, never waited for: while it runs there is no answer; past its time (at least
    30 s, or the interval) it is killed, and the answer is "unknown"."""
    h = {"hold": 1, "job": 100, "r": 0, "interval": 60.0, "cessation_cmd": "sleep 600"}
    q = Question.start(h, str(root), CLUSTER, 1000.0)
    try:
        assert q.answer(1000.0) is None and q.answer(1059.9) is None and q.proc.poll() is None
        got = q.answer(1060.0)
        assert got == {"answer": "unknown", "exit": None, "error": "no answer within 60 s"}
        assert q.proc.poll() is not None, "killed and reaped"
    finally:
        q.close()


# ---- the hold's rules and the loop's other decisions, as pure functions ------------------------

def held(**kw):
    """The state while hold #1 stands (instead of a resubmission; until 13,600; asked every 60 s)."""
    d = defn(shared=True, resubmit=1, hold_for=3600.0, cessation_interval=60.0, keep_last=kw.pop("keep_last", None))
    h = {"hold": 1, "replaces": kw.pop("replaces", "resubmit"), "cause": "node_failure", "job": 100, "r": 0,
         "attempt": f"{CLUSTER}.100.1000000", "slurm_held": kw.pop("slurm_held", False), "until": 13_600.0,
         "interval": 60.0, "cessation_cmd": d["cessation_cmd"]}
    return State(defs={0: d}, g=0, n=1, job=100, hold=h, holds=1, **kw)


PERSON = {"user": "alice", "uid": 1000, "host": "login1", "message": "c7 power-cycled",
          "entry": "/r/requests/release.1", "t": 12_000.0}
NOT_CEASED, CEASED = {"answer": "not_ceased", "exit": 1}, {"answer": "ceased", "exit": 0}


def kinds(look):
    return [t for t, _ in look.facts]


def test_a_persons_release_wins_over_a_due_question_and_over_expiry():
    for now in (10_000.0, 20_000.0):  # the question is due (never asked); the hold expired
        look = holds.look(held(), now, 10.0, "/r", request=PERSON)
        assert look.stage == "person" and not look.ask and look.finish is None and look.wait == 0
        (kind, rel), = look.facts
        assert kind == "release" and rel["by"] == "person" and rel["message"] == "c7 power-cycled"
        assert rel["requested_t"] == 12_000.0 and rel["hold"] == 1 and "t" not in rel


def test_the_cessation_signal_is_asked_at_the_hold_then_every_interval():
    assert holds.look(held(), 10_000.0, 10.0, "/r").ask, "never asked: ask now"
    st = held(last_answer_t=10_000.0)
    look = holds.look(st, 10_030.0, 100.0, "/r", asked_this_run=True)
    assert (look.stage, look.facts, look.wait) == ("wait", (), 30.0), "the next question in 30 s"
    assert holds.look(st, 10_030.0, 10.0, "/r", asked_this_run=True).wait == 10.0, "a poll sooner"
    assert holds.look(st, 10_060.0, 100.0, "/r", asked_this_run=True).ask


def test_a_ceased_answer_releases_the_hold():
    look = holds.look(held(), 10_000.0, 10.0, "/r", answer=CEASED, asked_this_run=True)
    assert look.stage == "ceased" and look.finish is None and look.wait == 0
    assert look.facts == (("cessation", {"hold": 1, "job": 100, "r": 0, **CEASED}),
                          ("release", {"hold": 1, "by": "cessation signal"}))
    assert [holds.event({"type": t, **f}) for t, f in look.facts] == [
        {"answer": "ceased", "source": "supervisor"}, {"by": "cessation signal"}], "the events/ lines report reads"


def test_any_other_answer_is_recorded_and_the_hold_waits_for_the_next_question():
    for answer in (NOT_CEASED, {"answer": "unknown", "exit": 2}):
        look = holds.look(held(last_answer_t=9_000.0), 10_000.0, 100.0, "/r", answer=answer, asked_this_run=True)
        assert look.stage == "wait" and kinds(look) == ["cessation"] and look.finish is None
        assert look.wait == 60.0, "an interval after this answer, not after the last one"
    near = holds.look(held(), 13_580.0, 100.0, "/r", answer=NOT_CEASED, asked_this_run=True)
    assert near.wait == 20.0, "the expiry comes first"


def test_a_hold_past_until_with_no_answer_finishes_held():
    st = held(last_answer_t=13_590.0)
    look = holds.look(st, 13_600.0, 10.0, "/r", asked_this_run=True)
    assert look.stage == "expired" and kinds(look) == ["hold_expired"] and look.facts[0][1]["until"] == 13_600.0
    outcome, message = look.finish
    assert outcome == "held" and "stays held" in message and "dispatch-slurm release /r" in message
    # a supervisor that has not asked yet (a restart after the expiry) asks once more first
    assert holds.look(st, 13_600.0, 10.0, "/r").ask
    last = holds.look(st, 13_601.0, 10.0, "/r", answer=NOT_CEASED, asked_this_run=True)
    assert kinds(last) == ["cessation", "hold_expired"] and last.finish[0] == "held"
    assert holds.look(st, 13_601.0, 10.0, "/r", answer=CEASED, asked_this_run=True).finish is None


def test_a_lifted_hold_applies_the_replaced_rule_and_lifts_slurms_own_hold():
    st = held()
    st.pending_apply = st.hold
    fact, release = holds.applied(st, st.hold)
    assert (fact["rule"], fact["budget_left"], fact["after_hold"], release) == ("resubmit", 0, 1, None)
    st = held(replaces="requeue", slurm_held=True)
    assert holds.applied(st, st.hold) == ({"rule": "requeue", "job": 100, "r": 0, "after_hold": 1}, 100)
    st = held(replaces="requeue")
    assert holds.applied(st, st.hold)[1] is None, "Slurm was not told to hold it: nothing to release"


def test_a_shared_job_requeued_by_slurm_is_to_be_held_in_slurm():
    ended = {"job": 100, "r": 0, "state": "REQUEUED", "requeued": True}
    shared, unshared = held(), State(defs={0: defn()}, g=0, n=1, job=100)
    d = rules.decide(shared, ended, "requeue", None, "/r")
    assert d.fact["rule"] == "requeue" and d.slurm_hold and d.finish is None
    assert not rules.decide(unshared, ended, "requeue", None, "/r").slurm_hold
    assert rules.held_in_slurm(d.fact, None) == {**d.fact, "held": True, "slurm_held": True}
    failed = rules.held_in_slurm(d.fact, "Access/permission denied")
    assert failed["held"] is False and "permission denied" in failed["warning"] and "overlap" in failed["warning"]


def test_the_keep_last_collection_is_a_step_of_its_own():
    st = State(defs={0: defn(keep_last=2)}, g=0, n=1, job=100, started={"r": 0})
    assert rules.next_action(st) == "follow"
    assert rules.next_action(st, quiet=True) == "gc_again", "Slurm said nothing new: the second chance"
    st.defs[0]["keep_last"] = None
    assert rules.next_action(st, quiet=True) == "follow", "no --keep-last: nothing to collect"
    st.defs[0]["keep_last"] = 2
    st.apply({"type": "ended", "t": 1.0, "job": 100, "r": 0, "state": "FAILED"})
    assert rules.next_action(st) == "gc", "after an end: collect before deciding"
    st.apply({"type": "gc", "t": 2.0, "removed": 0, "freed": 0})
    assert rules.next_action(st) == "decide"
    st.defs[0]["keep_last"] = None
    st.apply({"type": "ended", "t": 3.0, "job": 100, "r": 1, "state": "FAILED"})
    assert rules.next_action(st) == "decide"


def test_sbatch_failures_give_up_after_the_tries_or_at_once_when_the_first_test_refuses():
    st = State(defs={0: defn()}, g=0)
    assert rules.give_up(st) is None
    st.apply({"type": "submit_failed", "t": 1.0, "g": 0, "error": "invalid partition", "test_only": True})
    assert rules.give_up(st) == "sbatch failed 1 time(s): invalid partition", "the job's own arguments are wrong"
    st.submitted_in_g = 1  # a resubmission: Slurm may be busy, try again
    assert rules.give_up(st) is None
    for _ in range(rules.SUBMIT_TRIES - 1):
        st.apply({"type": "submit_failed", "t": 2.0, "g": 0, "error": "timeout"})
    assert rules.give_up(st) == f"sbatch failed {rules.SUBMIT_TRIES} time(s): timeout"


def test_an_intent_is_recovered_from_the_job_slurm_holds_or_lost():
    st = State(defs={0: defn()}, g=0, n=2, tag="dispatch-slurm:/r:g0:n2")
    got, wait = rules.recovered(st, [105, 104], refused=False)
    assert got[0] == ("submitted", {"g": 0, "n": 2, "job": 104, "tag": st.tag, "recovered": True}) and not wait
    assert got[1][0] == "note" and "job 105 also carries tag" in got[1][1]["text"] and len(got) == 2
    assert rules.recovered(st, [], refused=True) == (
        (("intent_lost", {"g": 0, "n": 2, "tag": st.tag, "reuse": True}),), False), "sbatch refused: N again"
    st.submit_failures = 1
    assert rules.recovered(st, [], refused=False) == (
        (("intent_lost", {"g": 0, "n": 2, "tag": st.tag, "reuse": False}),), True), "after a failure: a poll first"


def test_a_supersession_of_a_shared_checkpoint_job_that_ran_is_held():
    ran = {"job": 100, "r": 1, "g": 0, "n": 1, "epoch": 1_000_001, "attempt": "a", "nodes": ["c1"], "start_time": 5}
    old = State(defs={0: defn(shared=True)}, g=0, n=1, job=100, started=ran)
    f = rules.supersession(old, defn(), "RUNNING")
    assert (f["rule"], f["cause"], f["held"], f["job"], f["r"]) == ("supersede", "supersession", True, 100, 1)
    assert f["execution"] == {k: ran[k] for k in ("g", "n", "epoch", "attempt", "nodes", "start_time")}
    assert rules.supersession(old, defn(), None) is None, "Slurm was not asked: no job"
    unshared = State(defs={0: defn()}, g=0, n=1, job=100, started=ran)
    assert rules.supersession(unshared, defn(), "RUNNING") is None
    assert rules.supersession(unshared, defn(shared=True), "COMPLETED")["held"], "the new generation shares it"
    assert rules.supersession(State(defs={0: defn(shared=True)}, g=0, n=1, job=100), defn(), "PENDING") is None


class Collector:
    """Stands in for retention.Collector: counts the calls; ``again`` retires a save once."""

    def __init__(self):
        self.runs, self.agains = [], 0

    def run(self, keep_last):
        self.runs.append(keep_last)
        return {"removed": 0, "freed": 0, "keep_last": keep_last}

    def again(self, defn):
        self.agains += 1
        return {"removed": 1, "freed": 5, "retired": 1} if self.agains == 2 else None


def test_run_keep_last_collects_after_each_end_and_between_quiet_polls(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(keep_last=2, resubmit=1))
    sup.gc = gc = Collector()
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: gc.agains == 3)
    assert gc.runs == [] and types(root, "started", "gc") == ["started", "gc"]
    fake.end(100, "FAILED")
    drive(sup, lambda: sup.state.job == 101)
    assert gc.runs == [2] and gc.agains == 3, "no second chance while an end is decided"
    assert types(root)[-6:] == ["gc", "ended", "gc", "rule", "intent", "submitted"]


# ---- supersession --------------------------------------------------------------------------

def test_supersede_cancels_generation_g_and_supervises_g_plus_1(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=1))
    drive(sup, lambda: sup.state.job)
    fake.start(100)
    drive(sup, lambda: sup.state.started)
    sup.close()
    sv.requests.make(str(root), "supersede.1", {})
    new_sup = sv.Supervisor(str(root), Slurm(fake), clock=Clock(), say=lambda m: None)
    new_sup.open("supersede", takeover=True)
    new_sup.start(None)
    new_sup.supersede({**sv.make_defn({}, ["job2.sh"], base=new_sup.state.defn)})
    drive(new_sup, lambda: new_sup.state.job == 101)
    fake.start(101)
    drive(new_sup, lambda: new_sup.state.started)
    assert fake.jobs[100]["job_state"] == ["CANCELLED"]
    sup_f, = facts(root, "superseded")
    assert (sup_f["from_g"], sup_f["to_g"], sup_f["job"], sup_f["cancelled"]) == (0, 1, 100, True)
    job1 = facts(root, "job")[1]
    assert job1["g"] == 1 and job1["args"] == ["job2.sh"] and job1["resubmit"] == 1
    argv = fake.sbatch[1][0]
    assert "--dispatch-generation=1" in argv and "--dispatch-submission=2" in argv
    assert facts(root, "started")[1]["epoch"] == 1_000_002_000_000
    # the cancel of generation 0 is not a failure of generation 1: no rule applies to it
    assert [f["rule"] for f in facts(root, "rule")] == []


# ---- the cessation evidence rule ---------------------------------------------------------------

def ended_job(fake, root, state="NODE_FAIL", nodes=("c1", "c2")):
    fake.submitted(100)
    fake.start(100, nodes, t=2000)
    fake.end(100, state)
    return {"root": str(root), "generation": 0, "submission": 1}


def test_ceased_needs_an_ended_job_and_evidence_from_every_node(root):
    fake = FakeSlurm()
    kw = ended_job(fake, root)
    attempt = f"{CLUSTER}.100.1000000"
    fake.jobs[100]["job_state"] = ["RUNNING"]
    a = cessation.check(Slurm(fake), 100, 0, **kw)
    assert a["answer"] == "not_ceased" and "still RUNNING" in a["why"]
    fake.jobs[100]["job_state"] = ["NODE_FAIL", "COMPLETING"]
    ceased.record(str(root), attempt, "c1")
    ceased.record(str(root), attempt, "c2")
    a = cessation.check(Slurm(fake), 100, 0, **kw)
    assert a["answer"] == "not_ceased" and "completing" in a["why"], "COMPLETING is not ended"
    fake.jobs[100]["job_state"] = ["NODE_FAIL"]
    a = cessation.check(Slurm(fake), 100, 0, **kw)
    assert a["answer"] == "ceased" and a["attempt"] == attempt
    assert all(v["ceased"] and "epilog" in v["evidence"] for v in a["nodes"].values())


def test_a_down_or_merely_responding_node_is_no_evidence(root):
    fake = FakeSlurm()
    kw = ended_job(fake, root)
    ceased.record(str(root), f"{CLUSTER}.100.1000000", "c1")
    fake.node_state["c2"] = {"state": ["DOWN", "NOT_RESPONDING"], "boot_time": 1000}
    a = cessation.check(Slurm(fake), 100, 0, **kw)
    assert a["answer"] == "not_ceased" and a["nodes"]["c1"]["ceased"]
    assert not a["nodes"]["c2"]["ceased"] and "down or not responding" in a["nodes"]["c2"]["evidence"]
    # back, IDLE and responding (the orphan may still run): still no evidence
    fake.node_state["c2"] = {"state": ["IDLE"], "boot_time": 1000}
    a = cessation.check(Slurm(fake), 100, 0, **kw)
    assert a["answer"] == "not_ceased" and "not rebooted" in a["nodes"]["c2"]["evidence"]
    assert cessation.exit_code(a) == 1
    # rebooted after the execution started: its old processes are gone
    fake.node_state["c2"] = {"state": ["IDLE"], "boot_time": 2500}
    a = cessation.check(Slurm(fake), 100, 0, **kw)
    assert a["answer"] == "ceased" and "booted" in a["nodes"]["c2"]["evidence"]
    # ...but a node that rebooted and then went down again is still not evidence
    fake.node_state["c2"] = {"state": ["DOWN"], "boot_time": 2500}
    assert cessation.check(Slurm(fake), 100, 0, **kw)["answer"] == "not_ceased"


def test_ceased_takes_g_n_and_nodes_from_the_record_and_cannot_tell_without_them(root):
    fake, sup = _requeued_once(root)
    fake.start(100, ["c1"], t=2100)  # R=1 runs elsewhere; Slurm now shows R=1's nodes
    ceased.record(str(root), f"{CLUSTER}.100.1000000", "c3")
    a = cessation.check(Slurm(fake), 100, 0, root=str(root), known=execution(str(root), 100, 0))
    assert a["answer"] == "ceased" and list(a["nodes"]) == ["c3"]
    b = cessation.check(Slurm(fake), 100, 0)  # no record: R=0's nodes are unknown
    assert b["answer"] == "unknown" and "--nodes" in b["why"] and cessation.exit_code(b) == 2
    fake.down = True
    assert cessation.check(Slurm(fake), 100, 0, root=str(root), known=execution(str(root), 100, 0))["answer"] == "unknown"


def test_a_purged_job_is_ended_and_the_record_names_its_nodes(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn())
    drive(sup, lambda: sup.state.job)
    fake.start(100, ["c2"])
    drive(sup, lambda: sup.state.started)
    fake.jobs.pop(100)
    a = cessation.check(Slurm(fake), 100, 0, root=str(root), known=execution(str(root), 100, 0))
    assert a["answer"] == "not_ceased" and a["slurm"]["ended"] is True
    ceased.record(str(root), f"{CLUSTER}.100.1000000", "c2")
    assert cessation.check(Slurm(fake), 100, 0, root=str(root), known=execution(str(root), 100, 0))["answer"] == "ceased"


# ---- the CLI -----------------------------------------------------------------------------

def test_plan_shows_the_hold_substitution(root):
    p = cli("plan", root, "--via", "spank", "--shared-checkpoint", "--resubmit", "2", "--hold-for", "12h",
            "--cessation-interval", "30s", "--", "-N", "2", "train.sbatch", check=True).stdout
    assert "hold instead of resubmit" in p and "waits up to 12h" in p and "every 30s" in p
    assert "--no-requeue" in p and "--dispatch-shared-checkpoint" in p and "--dispatch-submission=<N>" in p
    j = json.loads(cli("plan", root, "--via", "spank", "--resubmit", "1", "--json", "--", "train.sbatch",
                       check=True).stdout)
    assert {r["cause"]: r["rule"] for r in j["rules"]} == {
        "finished": "done", "completed": "done", "time_limit": "continue", "signalled": "continue",
        "preempted": "continue", "signal_time": "continue", "killed_at_signal": "continue", "unsure": "continue",
        "failure": "resubmit",
        "preemption": "resubmit", "node_failure": "resubmit", "cancel": "resubmit", "user_cancel": "stop",
        "stop": "stop", "requeue": "requeue", "unknown": "fail"}, "a user's own scancel is a stop, not a resubmit"
    assert j["hold"] is None and "--no-requeue" not in j["sbatch"]


def test_plan_shows_the_hold_stages_with_the_jobs_values(root):
    p = cli("plan", root, "--via", "spank", "--shared-checkpoint", "--hold-for", "12h", "--cessation-interval",
            "30s", "--json", "--", "train.sbatch", check=True).stdout
    stages = json.loads(p)["hold"]["stages"]
    assert [s["stage"] for s in stages] == [s for s, _, _ in holds.STAGES] == \
        ["person", "asking", "ask", "ceased", "expired", "wait"], "a person's release is looked at first"
    assert "may run for 30s, at least 30s" in stages[1]["when"] and "every 30s" in stages[2]["when"]
    assert "12h" in stages[4]["when"] and "exits 3" in stages[4]["then"]
    text = cli("plan", root, "--via", "spank", "--shared-checkpoint", "--", "train.sbatch", check=True).stdout
    assert all(s["then"] in text for s in stages) and "every 1m" in text


def test_plan_warns_when_the_plugin_via_needs_is_absent(root, tmp_path):
    """`--via spank` where sbatch has no --dispatch-* options is a warning in
    the plan (and refused by run); `auto` takes the environment there."""
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Usage: sbatch [OPTIONS...] script'\n")  # no plugin options
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:{os.environ['PATH']}"}
    spank = cli("plan", root, "--via", "spank", "--", "train.sbatch", env=env, check=True).stdout
    assert "WARNING: --via spank, but sbatch here has no --dispatch-checkpoint option" in spank
    auto = json.loads(cli("plan", root, "--json", "--", "train.sbatch", env=env, check=True).stdout)
    assert auto["via"] == "env" and not any("WARNING" in n for n in auto["notes"])
    refused = cli("run", root, "--via", "spank", "--", "train.sbatch", env=env)
    assert refused.returncode == 2 and "no --dispatch-checkpoint option" in refused.stderr
    assert not (root / "sub").exists() and not (root / "record.jsonl").exists()


def test_run_sets_sbatch_signal_from_the_grace_and_warns_when_saves_do_not_fit(root):
    """`run --signal` (as `submit --signal`): SIG the grace before the time limit."""
    p = cli("plan", root, "--via", "spank", "--signal", "B:USR2@90", "--", "t.sbatch", check=True).stdout
    assert "--signal=B:USR2@90" in p and "--dispatch-grace=90" in p and "WARNING" not in p
    (root / "events").mkdir()
    (root / "events" / "a.h.1.jsonl").write_text(json.dumps({"t": 1.0, "type": "checkpoint_complete",
                                                             "elapsed": 120.0}) + "\n")
    slow = cli("plan", root, "--via", "spank", "--signal", "TERM@90", "--", "t.sbatch", check=True)
    assert "WARNING: saves of this root took up to 120.0 s" in slow.stdout


@pytest.mark.parametrize("args,needle", [
    (["--", "--comment=mine", "x.sh"], "--comment"),
    (["--", "--dispatch-generation=3", "x.sh"], "--dispatch-"),
    (["--", "--array=1-3", "x.sh"], "array"),
    (["--shared-checkpoint", "--", "--requeue", "x.sh"], "--no-requeue"),
    (["--via", "env", "--", "--export=NONE", "x.sh"], "--export"),
    (["--hold-for", "soon", "--", "x.sh"], "--hold-for"),
    (["--cessation-cmd", "ceased {jobid}", "--", "x.sh"], "placeholders"),
    ([], "no sbatch arguments"),
    (["--signal", "TERM@0", "--", "x.sh"], "--signal needs a grace of 1..65535 s"),
    (["--grace", "60", "--signal", "TERM@30", "--", "x.sh"], "--signal TERM@30 and --grace 60 disagree"),
    (["--signal", "TERM@400", "--", "x.sh"], "at most 300 s"),
    (["--signal", "TERM@60", "--", "--signal=USR1@9", "x.sh"], "--signal is set from run's own"),
])
def test_bad_input_is_refused_with_a_message_naming_it(root, args, needle):
    p = cli("run", root, *args)
    assert p.returncode == 2 and needle in p.stderr, p.stderr
    assert list(root.iterdir()) == [], "a new root's bad arguments leave it as it was (no claim, no record, no N)"


def test_roots_from_with_bad_arguments_writes_into_no_root(tmp_path):
    """The fuzz test's `run --roots-from /` as root once left a supervisor/ claim in every
    folder of / (the claim came before the arguments were read): each new root is refused alone,
    and none is written to."""
    parent = tmp_path / "runs"
    for name in ("a", "b"):
        (parent / name).mkdir(parents=True)
    p = cli("run", parent / "a", "--roots-from", parent)
    assert p.returncode == 2 and p.stderr.count("no sbatch arguments") >= 2, p.stderr
    assert all(line.startswith("dispatch-slurm: ") for line in p.stderr.splitlines()), p.stderr
    assert [list(r.iterdir()) for r in sorted(parent.iterdir())] == [[], []]


def test_release_without_a_hold_and_ceased_exit_codes(root):
    p = cli("release", root)
    assert p.returncode == 1 and "no hold stands" in p.stderr
    p = cli("run", root / "missing", "--", "x.sh")
    assert p.returncode == 2 and "does not exist" in p.stderr


def test_roots_from_a_binary_file_is_refused_in_one_line(root, tmp_path):
    """The CLI fuzz test's --roots-from named a PNG another command had saved: a traceback
    (UnicodeDecodeError) before."""
    (tmp_path / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    p = cli("run", root, "--roots-from", tmp_path / "plot.png", "--", "x.sh")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "plot.png: not UTF-8 text (byte 0)" in lines[0], p.stderr
    assert list(root.iterdir()) == []


# ---- a failure that repeats before the trainer starts is not resubmitted again ----------------

REFUSAL = ("the latest publication /r/pub/X (step 180) names the save /r/exec/a/checkpoint-180, which no longer "
           "exists: nothing can resume from it. To resume from the previous publication instead: dispatch-slurm "
           "retire /r --latest -m 'save vanished' (or restore the save first)")


def refused_in(root, job: int, message: str = REFUSAL, epoch: int | None = None) -> None:
    """What `latest --resume` leaves of a refusal in the job's execution: its own warning event."""
    attempt = f"{CLUSTER}.{job}.{epoch or (job - 99) * 1_000_000}"
    (root / "events").mkdir(exist_ok=True)
    with open(root / "events" / f"{attempt}.c1.7.jsonl", "a") as f:
        f.write(json.dumps({"v": 1, "t": 1.0, "type": "warning", "kind": "refused", "by": "latest --resume",
                            "attempt": attempt, "message": message}) + "\n")


def fail_next(sup, fake, jid: int, code: int = 2, then=None) -> None:
    drive(sup, lambda: sup.state.job == jid)
    fake.start(jid)
    drive(sup, lambda: sup.state.started)
    if then:
        then(jid)
    fake.end(jid, "FAILED", code=code, after=3)


def test_a_refusal_that_repeats_before_the_trainer_starts_fails_at_once_naming_it(root):
    """A root whose latest publication's save was removed (by hand, or an old execution's
    rotation): every execution's `latest --resume` refuses it the same way, seconds after it
    started. One resubmission is tried; the second identical refusal ends the run failed,
    naming the refusal (its fix) and how to go on, with budget left: not --resubmit 3
    spent in seconds."""
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=3))
    fail_next(sup, fake, 100, then=lambda j: refused_in(root, j))
    fail_next(sup, fake, 101, then=lambda j: refused_in(root, j))
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.code == 1 and len(fake.sbatch) == 2, e.value.message
    assert e.value.message.startswith(f"job 101 was refused its resume: {REFUSAL}; job 100 failed the same way "
                                      "before it, so it is not resubmitted again (2 of --resubmit 3 left)")
    assert e.value.message.endswith(f"`dispatch-slurm supersede {root}` starts it again")
    got = [(f["rule"], f.get("budget_left"), f.get("repeated", False)) for f in facts(root, "rule")]
    assert got == [("resubmit", 2, False), ("fail", 2, True)]
    assert facts(root, "rule")[0]["before_training"] == {"exit_code": 2, "signal": None, "refusal": REFUSAL}


@pytest.mark.parametrize("between", ["another-exit", "another-refusal", "it-trained", "a-publication"])
def test_a_failure_unlike_the_one_before_is_resubmitted(root, between):
    """Only the same failure twice in a row before any training stops the run: a second one
    with another exit status or refusal, an execution in between whose trainer started
    (its resume resolved), or a publication since, is resubmitted as before."""
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=3))
    fail_next(sup, fake, 100, then=lambda j: refused_in(root, j))
    if between == "it-trained":
        def trained(j):
            refused_in(root, j)
            attempt = f"{CLUSTER}.{j}.{(j - 99) * 1_000_000}"
            with open(root / "events" / f"{attempt}.c1.8.jsonl", "w") as f:
                f.write(json.dumps({"v": 1, "t": 2.0, "type": "resumed", "attempt": attempt, "step": None}) + "\n")
        fail_next(sup, fake, 101, code=1, then=trained)
    elif between == "a-publication":
        def published(j):  # the execution before, still running on, published meanwhile
            refused_in(root, j)
            save = root / "exec" / f"{CLUSTER}.100.1000000" / "checkpoint-10"
            save.mkdir(parents=True)
            (save / "model.bin").write_bytes(b"w")
            store.publish(str(save), 10, root=str(root), epoch=1_000_000)
        fail_next(sup, fake, 101, then=published)
    else:
        fail_next(sup, fake, 101, code=3 if between == "another-exit" else 2,
                  then=lambda j: refused_in(root, j, REFUSAL if between == "another-exit" else "another refusal"))
    drive(sup, lambda: sup.state.job == 102)
    assert [f["rule"] for f in facts(root, "rule")] == ["resubmit", "resubmit"]


def test_no_resubmission_left_names_the_failure_before_the_trainer_started(root):
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=0))
    fail_next(sup, fake, 100, then=lambda j: refused_in(root, j))
    with pytest.raises(sv.Finished) as e:
        drive(sup, lambda: False)
    assert e.value.message == f"job 100 ended FAILED and no resubmission is left (--resubmit 0): it was refused " \
                              f"its resume: {REFUSAL.rstrip('.')}"


def test_what_counts_as_failing_before_the_trainer_started():
    """From the execution's own events: Slurm's FAILED and none of the events a started
    trainer writes; a node's failure, a cancel, or events that cannot be read are never
    taken for it."""
    from dispatch_slurm.supervisor import ends
    failed = {"state": "FAILED", "exit_code": 2, "signal": None}
    refusal = ends.own_events([{"type": "warning", "kind": "refused", "message": "no"},
                               {"type": "warning", "kind": "unpublished_saves", "message": "other"}])
    assert ends.before_training(failed, refusal) == {"exit_code": 2, "signal": None, "refusal": "no"}
    assert ends.before_training(failed, ends.Own()) == {"exit_code": 2, "signal": None, "refusal": None}
    for t in ("resumed", "published", "preempt_signal", "checkpoint_complete", "training_finished"):
        assert ends.before_training(failed, ends.own_events([{"type": t}])) is None, t
    assert ends.before_training(failed, ends.Own(error="unreadable")) is None
    for state in ("NODE_FAIL", "CANCELLED", "COMPLETED", "TIMEOUT", "OUT_OF_MEMORY"):
        assert ends.before_training({**failed, "state": state}, ends.Own()) is None, state


def test_latest_resume_records_its_refusal_as_the_executions_event(tmp_path):
    """The real CLI in a local execution: the latest publication's save removed by hand (with
    its held links);
    `latest --resume` refuses it (exit 2, the fix named) and leaves the refusal as an event
    of its execution, which the supervisor reads; the event says what stderr says."""
    from support import LOCAL_SAVE, local_run
    root = tmp_path / "root"
    root.mkdir()
    local_run(root, f"save() {{ {LOCAL_SAVE}; }}\nsave 10")
    (latest,) = os.listdir(root / "pub")
    shutil.rmtree(root / names.parse(latest).path)
    shutil.rmtree(root / "held" / latest)  # by hand: the save and its publication's held links
    p = local_run(root, "dispatch-slurm latest --resume; echo $DISPATCH_ATTEMPT", wait=False)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2 and not out.strip()
    attempts = sorted({e["attempt"] for e in events.read(str(root)) if e["type"] == "warning"})
    assert len(attempts) == 1
    own = ends_of(root, attempts[0])
    assert "which no longer exists" in own.refusal and "dispatch-slurm retire" in own.refusal
    from dispatch_slurm.supervisor import ends
    assert ends.before_training({"state": "FAILED", "exit_code": 2}, own)["refusal"] == own.refusal


def ends_of(root, attempt: str):
    from dispatch_slurm.supervisor import ends
    return ends.own_events(events.read(str(root), attempt=attempt))
