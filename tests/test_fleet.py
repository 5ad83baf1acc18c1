"""One supervisor process for many roots (supervisor/fleet.py, sweep.py), without a
cluster: the stand-in slurmctld of test_supervisor_rules answers as Slurm 24.11 does and
counts every command, so the tests count the Slurm reads a poll costs. The cluster test
(tests/cluster/test_supervisor.py) and benchmarks/bench_supervisor_rpc.py show the same
on real Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from support import fill
from test_supervisor_rules import Clock, FakeSlurm, defn, facts, slurm_number

from dispatch_slurm import supervisor as sv
from dispatch_slurm.errors import DispatchError
from dispatch_slurm.slurm.client import Slurm
from dispatch_slurm.supervisor import fleet as fl
from dispatch_slurm.supervisor import sweep

POLL = 10.0


def member(root, fake, clock, slurm=None, **kw):
    sup = sv.Supervisor(str(root), slurm or Slurm(fake), poll=POLL, clock=clock, sleep=clock.sleep, say=lambda m: None)
    sup.open("test")
    sup.start(defn(**kw))
    return sup


def roots(tmp_path, n):
    out = []
    for i in range(n):
        (tmp_path / f"r{i}").mkdir()
        out.append(tmp_path / f"r{i}")
    return out


def make_fleet(fake, clock, sups, **kw):
    f = fl.Fleet(Slurm(fake), poll=POLL, clock=clock, sleep=clock.sleep, say=lambda m: None, name_roots=True, **kw)
    for s in sups:
        f.add(s)
    return f


def reads(fake):
    """(reads of every job at once, reads of one job)."""
    show = [c for c in fake.calls if c[:3] == ["scontrol", "show", "job"]]
    return sum(len(c) == 4 for c in show), sum(len(c) == 5 for c in show)


class Until:
    """A sleep that ends the fleet's run (raising Stop) once ``clock.t`` passes ``t``, after
    doing what the test scheduled at given times: the fleet runs as it would for real,
    and the stand-in's jobs change under it."""

    class Stop(Exception):
        pass

    def __init__(self, clock, t_end, at=()):
        self.clock, self.t_end, self.at = clock, t_end, sorted(at, key=lambda x: x[0])

    def __call__(self, s):
        self.clock.sleep(s)
        while self.at and self.at[0][0] <= self.clock.t:
            self.at.pop(0)[1]()
        if self.clock.t >= self.t_end:
            raise Until.Stop


def test_many_roots_share_one_read_per_poll_and_read_slowly_while_all_run(tmp_path):
    fake, clock = FakeSlurm(), Clock()
    rs = roots(tmp_path, 20)
    one = Slurm(fake)  # one client per process, as `run` makes it
    f = make_fleet(fake, clock, [member(r, fake, clock, one) for r in rs])
    t0 = clock.t
    started = lambda: [fake.start(j) for j in range(100, 120)]  # noqa: E731
    f.sleep = Until(clock, t0 + 600, at=[(t0 + 30, started)])
    with pytest.raises(Until.Stop):
        f.run()
    assert len(fake.sbatch) == 20
    every, one = reads(fake)
    assert one == 0, "a poll read one job"
    # pending for 30 s: a read every poll; then running: the first polls after the start,
    # then one read per max_poll (60 s) for ~9 minutes: ~3 + ~3 + ~9
    assert every == f.reads and 8 <= every <= 20, every
    assert all(len(facts(r, "started")) == 1 for r in rs)
    # what does not change is asked once per process, not per root or per poll
    assert fake.calls.count(["scontrol", "show", "config"]) == 1 and fake.calls.count(["scontrol", "--version"]) == 1


def test_the_per_root_poll_would_have_read_every_job_every_poll(tmp_path):
    """The reference the fleet beats: today's one-supervisor-per-root reads one job per
    poll per root (this is the count the shared read replaces)."""
    fake, clock = FakeSlurm(), Clock()
    sups = [member(r, fake, clock) for r in roots(tmp_path, 5)]
    for s in sups:
        s._submit()
    for j in range(100, 105):
        fake.start(j)
    for _ in range(10):
        for s in sups:
            s.step()
    assert reads(fake) == (0, 50)


def test_one_corrupt_record_stops_its_root_only(tmp_path):
    fake, clock = FakeSlurm(), Clock()
    rs = roots(tmp_path, 3)
    (rs[1] / "record.jsonl").write_text('{"type": "job"\n{"type": "job", "t": 1}\n')
    f = make_fleet(fake, clock, [])
    for r in rs:
        try:
            f.add(member(r, fake, clock))
        except DispatchError as e:
            f.fail(str(r), e)
    def end_all():
        for j in (100, 101):
            fake.start(j)
            fake.end(j, "COMPLETED")
    f.sleep = Until(clock, clock.t + 3600, at=[(clock.t + 20, end_all)])
    res = f.run()
    assert res[str(rs[0])].code == 0 and res[str(rs[2])].code == 0
    assert res[str(rs[1])].code == 2 and "record.jsonl" in res[str(rs[1])].message
    out = fl.outcome(res)
    assert out.code == 2 and out.message.splitlines()[0] == "3 roots: 2 done, 0 failed, 0 held, 1 error"


def test_a_root_whose_record_breaks_while_followed_stops_alone(tmp_path):
    fake, clock = FakeSlurm(), Clock()
    a, b = roots(tmp_path, 2)
    f = make_fleet(fake, clock, [member(a, fake, clock), member(b, fake, clock)])

    def breaks():
        fake.start(100)
        fake.start(101)
        def broken(fact):  # the disk under b fails: its appends fail as write(2) would
            raise OSError(5, "Input/output error", str(b / "record.jsonl"))
        f.members[str(b)].sup.record.append = broken

    def ends():
        fake.end(100, "COMPLETED")
        fake.end(101, "COMPLETED")
    f.sleep = Until(clock, clock.t + 3600, at=[(clock.t + 20, breaks), (clock.t + 200, ends)])
    res = f.run()
    assert res[str(a)].code == 0 and res[str(b)].code == 2 and "Input/output error" in res[str(b)].message


def test_a_full_filesystem_under_a_root_is_waited_out_not_taken_for_a_broken_root(small_fs):
    """The fault campaign's ENOSPC on the checkpoint filesystem killed `run` (its job ran on
    unsupervised; the campaign's user started it again). A full disk or quota is waited out:
    said once, the record read again from disk when space is back (no fact it could not write
    is taken as written), and the job's end then decided as usual."""
    fake, clock, said = FakeSlurm(), Clock(), []
    root = small_fs / "r"
    root.mkdir()
    sup = sv.Supervisor(str(root), Slurm(fake), poll=POLL, clock=clock, sleep=clock.sleep, say=said.append)
    sup.open("test")
    sup.start(defn())
    f = fl.Fleet(Slurm(fake), poll=POLL, clock=clock, sleep=clock.sleep, say=said.append)
    f.add(sup)
    filler = small_fs / "filler"

    def full():
        fake.start(100)
        fill(filler)
        try:  # the record's last page filled too, as a busy root's would be: a torn line is left
            while True:
                sup.record.append({"type": "note", "text": "the test fills the record's last page"})
        except OSError:
            pass
    t = clock.t
    f.sleep = Until(clock, t + 3600, at=[(t + 20, full),
                                          (t + 100, lambda: fake.end(100, "COMPLETED")),
                                          (t + 400, filler.unlink)])
    res = f.run()
    assert res[str(root)].code == 0, (res[str(root)].message, said)
    full = [m for m in said if "is full" in m or "space" in m]
    assert len(full) == 2 and "No space left on device" in full[0] and "again" in full[1], said
    kinds = [x["type"] for x in sv.Record(str(root)).read()]
    assert kinds.count("started") == 1 and kinds.count("ended") == 1 and kinds[-1] == "finished", kinds
    assert "torn_tail_dropped" in kinds  # the line the full disk tore, cut once there was space
    assert facts(root, "ended")[0]["t"] >= t + 400 and facts(root, "finished")[0]["outcome"] == "done"


def test_an_end_while_everything_runs_is_seen_within_max_poll_and_at_once_with_evidence(tmp_path):
    fake, clock = FakeSlurm(), Clock()
    a, b = roots(tmp_path, 2)
    f = make_fleet(fake, clock, [member(a, fake, clock), member(b, fake, clock)])
    t0 = clock.t
    marks = {}

    def fail(jid, evidence):
        def go():
            fake.end(jid, "FAILED", code=1)
            marks[jid] = clock.t
            if evidence:  # the Epilog's cessation entry (ceased/<attempt>.<node>)
                (tmp_path / f"r{jid - 100}" / "ceased").mkdir(exist_ok=True)
                (tmp_path / f"r{jid - 100}" / "ceased" / "x.c1").write_text("")
        return go
    f.sleep = Until(clock, t0 + 3600, at=[(t0 + 15, lambda: (fake.start(100), fake.start(101))),
                                          (t0 + 301, fail(100, False)), (t0 + 901, fail(101, True))])
    res = f.run()
    assert res[str(a)].code == 1 and res[str(b)].code == 1
    lag = {j: facts(r, "ended")[0]["t"] - marks[j] for j, r in ((100, a), (101, b))}
    assert lag[100] <= f.max_poll + POLL, lag  # no evidence: the slow read finds it
    assert lag[101] <= POLL + 0.01, lag  # the Epilog's entry: the next poll reads Slurm


def test_a_time_limit_makes_the_poll_fast_before_it_ends(tmp_path):
    fake, clock = FakeSlurm(), Clock()
    (r,) = roots(tmp_path, 1)
    sup = member(r, fake, clock, signal="TERM", grace=90)
    f = make_fleet(fake, clock, [sup])
    t0 = clock.t

    def start():
        fake.start(100, t=int(clock.t))
        fake.jobs[100]["end_time"] = slurm_number(int(t0 + 1800))
    f.sleep = Until(clock, t0 + 1800, at=[(t0 + 5, start)])
    with pytest.raises(Until.Stop):
        f.run()
    times = [c for c in fake.calls if c[:3] == ["scontrol", "show", "job"]]
    assert sup.seen is not None and fl.hot(sup, t0 + 1800 - 90 - 30 - 10)
    assert not fl.hot(sup, t0 + 600)
    assert len(times) < 1800 / POLL / 2  # slow in the middle...
    assert f.last_read >= t0 + 1800 - POLL  # ...and every poll near the end


def test_a_job_array_is_one_root_and_one_job_per_task_each_with_its_own_rules(tmp_path):
    (tmp_path / "sweep").mkdir()
    tasks = sweep.expand([str(tmp_path / "sweep" / "t%a")], ["--time=10", "--array=0-4:2,7", "job.sh", "--lr=1"])
    assert [(r.rsplit("/", 1)[1], a, t) for r, a, t in tasks] == [
        (f"t{i}", ["--time=10", f"--array={i}", "job.sh", "--lr=1"], str(tmp_path / "sweep" / "t%a"))
        for i in (0, 2, 4, 7)]
    assert all((tmp_path / "sweep" / f"t{i}").is_dir() for i in (0, 2, 4, 7))
    fake, clock = FakeSlurm(), Clock()
    f = make_fleet(fake, clock, [])
    for r, a, template in tasks:
        sup = sv.Supervisor(r, Slurm(fake), poll=POLL, clock=clock, sleep=clock.sleep, say=lambda m: None)
        sup.open("test")
        sup.start(defn(args=a, resubmit=1, array_root=template))
        f.add(sup)

    def run_all():
        for j in range(100, 104):
            fake.start(j)
            fake.end(j, "FAILED" if j == 101 else "COMPLETED", code=1 if j == 101 else 0)

    def resubmitted():
        fake.start(104)
        fake.end(104, "COMPLETED")
    f.sleep = Until(clock, clock.t + 3600, at=[(clock.t + 20, run_all), (clock.t + 100, resubmitted)])
    res = f.run()
    assert all(x.code == 0 for x in res.values())
    assert [a for a in (argv for argv, _ in fake.sbatch) if "--array=2" in a].__len__() == 2  # task 2 resubmitted
    assert len(fake.sbatch) == 5
    # the job names the %a root (an array task needs it: the plugin and `env` expand it), and its
    # N comes from the folder of the task roots, as for an array submitted by hand
    assert sorted(p.name for p in (tmp_path / "sweep" / "sub").iterdir()) == [f"{n:06d}" for n in range(1, 6)]
    assert all(f"--dispatch-checkpoint={tmp_path / 'sweep' / 't%a'}" in argv for argv, _ in fake.sbatch)


@pytest.mark.parametrize("spec,error", [
    ("0-9%2", "throttle"), ("3-1", "empty range"), ("a-b", "not a task id"), ("0-20000", "more than"),
])
def test_array_specs_the_supervisor_cannot_keep_are_refused_naming_why(spec, error):
    with pytest.raises(DispatchError, match=error):
        sweep.array_tasks(spec)


def test_array_roots_need_the_array_on_the_command_line_and_only_percent_a(tmp_path):
    with pytest.raises(DispatchError, match="no --array"):
        sweep.expand([str(tmp_path / "t%a")], ["job.sh"])
    with pytest.raises(DispatchError, match="only %a"):
        sweep.expand([str(tmp_path / "t%A_%a")], ["--array=0-1", "job.sh"])
    (tmp_path / "job.sh").write_text("#!/bin/sh\n")
    script = str(tmp_path / "job.sh")
    assert sweep.expand([str(tmp_path)], [script, "--array=3"]) == [(str(tmp_path), [script, "--array=3"], None)]
    # an option's value is not the script (sbatch's own options: the first word naming a file ends them)
    assert sweep.expand([str(tmp_path / "t%a")], ["-o", "/dev/null", "-a", "1", script, "--array=9"]) == \
        [(str(tmp_path / "t1"), ["-o", "/dev/null", "--array=1", script, "--array=9"], str(tmp_path / "t%a"))]
    for args in (["--array=0-1", "job.sh"], ["-a", "3", "job.sh"], ["-a3", "job.sh"]):  # on a plain root
        with pytest.raises(DispatchError, match="name the root with %a"):
            sv.make_defn({**sv.DEFAULTS, "via": "spank"}, args)
    assert sv.make_defn({**sv.DEFAULTS, "via": "spank"}, ["--array=3", "job.sh"])["args"] == ["--array=3", "job.sh"]


def test_roots_from_a_folder_or_a_list_file(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    (d / "b").mkdir()
    (d / "a").mkdir()
    (d / ".hidden").mkdir()
    (d / "notes.txt").write_text("")
    assert list(sweep.listed(str(d))) == [str(d / "a"), str(d / "b")]
    lst = tmp_path / "roots.txt"
    lst.write_text(f"# my runs\n{d / 'a'}\n\nruns/b\n")
    assert list(sweep.listed(str(lst))) == [str(d / "a"), str(tmp_path / "runs" / "b")]
    with pytest.raises(DispatchError, match="name a folder of roots or a file"):
        list(sweep.listed(str(tmp_path / "nope")))


def test_once_over_many_roots_steps_each_until_it_waits(tmp_path):
    fake, clock = FakeSlurm(), Clock()
    rs = roots(tmp_path, 3)
    f = make_fleet(fake, clock, [member(r, fake, clock) for r in rs])
    res = f.run(once=True)
    assert len(fake.sbatch) == 3 and all(x.code == 0 and "nothing more to do" in x.message for x in res.values())


def test_each_root_submits_from_its_own_folder_and_the_process_stays_put(tmp_path, monkeypatch):
    """One process follows roots defined in different folders: each sbatch runs in its job's
    own (its script is found there), and the process's working directory never moves."""
    fake, clock = FakeSlurm(), Clock()
    monkeypatch.chdir(tmp_path)
    folders = []
    for name in ("jobs-a", "jobs-b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "job.sh").write_text("#!/bin/sh\n#SBATCH -N 1\ntrue\n")
        folders.append(str(tmp_path / name))
    rs = roots(tmp_path, 2)
    f = make_fleet(fake, clock, [member(r, fake, clock, cwd=d) for r, d in zip(rs, folders)])
    f.run(once=True)
    assert len(fake.sbatch) == 2 and os.getcwd() == str(tmp_path)
    assert sorted(fake.cwds) == sorted(folders * 2)  # --test-only, then sbatch, each in its own folder


@pytest.mark.parametrize("argv,roots,sbatch", [
    (["run", "r1", "--resubmit", "1", "--", "--nodes=2", "job.sh"], "r1", ["--nodes=2", "job.sh"]),
    (["run", "r1", "job.sh", "x"], "r1", ["job.sh", "x"]),  # no `--`: one root, then sbatch's (as before)
    (["run", "r1", "r2", "--once", "r3", "--", "job.sh"], ["r1", "r2", "r3"], ["job.sh"]),
    (["run", "r1", "--"], "r1", []),  # resume: the root alone
])
def test_run_reads_roots_before_the_double_dash_and_sbatch_after(tmp_path, monkeypatch, argv, roots, sbatch):
    from click.testing import CliRunner

    from dispatch_slurm.cli import dispatch
    seen = {}

    def fake_run(r, opts, args, poll, slurm, once, max_poll, roots_from):
        seen.update(roots=r, args=args)
        return sv.Finished(0, "ok")
    monkeypatch.setattr(sv, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(dispatch, argv)
    assert res.exit_code == 0, res.output
    want = str(tmp_path / roots) if isinstance(roots, str) else [str(tmp_path / r) for r in roots]
    assert seen == {"roots": want, "args": sbatch}


def test_members_that_fall_due_apart_each_get_every_read(tmp_path):
    """Each step takes time, so roots fall due a moment apart: each must still be given every
    read (once), or one not due at the read waits while the pacing keeps reads rare (seen in
    the benchmark: 10 roots, 4 minutes late). The clock here moves 10 ms at every look."""
    class Ticking(Clock):
        def __call__(self):
            self.t += 0.01
            return self.t
    fake, clock = FakeSlurm(), Ticking()
    rs = roots(tmp_path, 4)
    one = Slurm(fake)
    f = make_fleet(fake, clock, [member(r, fake, clock, one) for r in rs])
    t0 = clock.t
    marks = {}

    def end_all():
        for j in range(100, 104):
            fake.end(j, "COMPLETED")
        marks["end"] = clock.t
    f.sleep = Until(clock, t0 + 3600, at=[(t0 + 15, lambda: [fake.start(j) for j in range(100, 104)]),
                                          (t0 + 400, end_all)])
    res = f.run()
    assert all(x.code == 0 for x in res.values())
    lags = [facts(r, "ended")[0]["t"] - marks["end"] for r in rs]
    assert max(lags) <= f.max_poll + POLL, lags


def test_run_once_on_a_full_filesystem_exits_2_for_the_next_scrontab_run(small_fs):
    """`run --once` waits for nothing: a root it cannot write now ends this run with the error."""
    fake, clock = FakeSlurm(), Clock()
    root = small_fs / "r"
    root.mkdir()
    sup = sv.Supervisor(str(root), Slurm(fake), poll=POLL, clock=clock, sleep=clock.sleep, say=lambda m: None)
    sup.open("test")
    sup.start(defn())
    while sup.step() == 0:  # submitted, then waiting for the job to start
        pass
    fake.start(100)
    fill(small_fs / "filler")
    try:
        while True:
            sup.record.append({"type": "note", "text": "the test fills the record's last page"})
    except OSError:
        pass
    f = fl.Fleet(Slurm(fake), poll=POLL, clock=clock, sleep=clock.sleep, say=lambda m: None)
    f.add(sup)
    res = f.run(once=True)
    assert res[str(root)].code == 2 and "No space left on device" in res[str(root)].message


# ---- nothing one root waits for holds up another ----------------------------------------------

class Live:
    """The fleet's sleep in real time: before each sleep, ``react`` makes the stand-in's jobs
    change as the supervisors' state calls for; the run stops (Until.Stop) once ``done()``
    holds, or at ``deadline`` (real seconds), whichever first: a bounded run."""

    def __init__(self, react, done, deadline):
        self.react, self.done, self.deadline = react, done, time.time() + deadline

    def __call__(self, s):
        self.react()
        if self.done() or time.time() > self.deadline:
            raise Until.Stop
        time.sleep(s)  # the fleet's own pace between polls, as in `run`


def sleeping_children() -> list[int]:
    """This process's children running `sleep` (the cessation command of these tests), from /proc."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue  # gone meanwhile
        if ppid == str(os.getpid()) and cmd.startswith(b"sleep\0"):
            found.append(int(pid))
    return found


def live_member(root, fake, poll, **kw):
    sup = sv.Supervisor(str(root), Slurm(fake), poll=poll, say=lambda m: None)
    sup.open("test")
    sup.start(defn(**kw))
    return sup


def test_a_slow_cessation_command_holds_up_no_other_root(tmp_path):
    """Root a's job fails under a shared checkpoint: its hold asks a cessation command that
    takes 60 s. Root b's job starts and ends meanwhile: b's start is recorded within a poll
    or two, its end within the paced read's (--max-poll), and b finishes, while a's command
    still runs; when the fleet
    stops, the command is killed with its supervisor."""
    poll = 0.2
    fake = FakeSlurm()
    a, b = roots(tmp_path, 2)
    sa = live_member(a, fake, poll, shared=True, resubmit=1, cessation_cmd="sleep 60", cessation_interval=60.0)
    sb = live_member(b, fake, poll)
    f = fl.Fleet(Slurm(fake), poll=poll, clock=time.time, sleep=time.sleep, say=lambda m: None, name_roots=True)
    f.add(sa)
    f.add(sb)
    marks: dict[str, float] = {}

    def react():
        ja, jb = sa.state.job, sb.state.job
        if ja is not None and fake.jobs[ja]["job_state"] == ["PENDING"] and not sa.state.ended:
            fake.start(ja)
        if sa.state.started and not sa.state.ended and fake.jobs[ja]["job_state"] == ["RUNNING"]:
            fake.end(ja, "NODE_FAIL")
        if sa.state.hold is not None and "b started" not in marks:  # a's hold asks its command: now b's job
            fake.start(jb, t=int(time.time()))
            marks["b started"] = time.time()
        if sb.state.started and "b ended" not in marks:
            fake.end(jb, "COMPLETED")
            marks["b ended"] = time.time()
    f.sleep = Live(react, lambda: str(b) in f.results, deadline=45)
    with pytest.raises(Until.Stop):
        f.run()
    assert f.results[str(b)].code == 0, (f.results, marks)
    assert sleeping_children(), "a's command still runs"
    started, ended = facts(b, "started")[0]["t"], facts(b, "ended")[0]["t"]
    assert started - marks["b started"] <= 2 * poll + 0.5, (started - marks["b started"], marks)
    assert ended - marks["b ended"] <= f.max_poll + poll + 0.5, (ended - marks["b ended"], marks)  # as any end
    assert facts(a, "cessation") == [], "no answer yet: a's command was never waited for"
    for sup in list(m.sup for m in f.members.values()):
        sup.close()
    assert sleeping_children() == [], "killed with its supervisor, and reaped"


def test_a_claim_in_doubt_holds_up_no_other_root(tmp_path, monkeypatch):
    """Root b's last claimant ran on another host: whether it is gone is told only once its
    heartbeat stood still for three of its polls (here 0.5 s: 6.5 s with the margin). Root
    a submits and follows its job meanwhile; b joins once that time has passed, not before."""
    poll = 0.2
    fake = FakeSlurm()
    a, b = roots(tmp_path, 2)
    (b / "supervisor").mkdir()
    (b / "supervisor" / "000001").write_text(json.dumps({"host": "elsewhere", "pid": 1, "poll": 0.5, "purpose": "run"}))
    monkeypatch.chdir(os.path.dirname(defn()["cwd"] + "/"))  # where job.sh is: a new root's definition is made here
    t0 = time.time()
    f = fl.Fleet(Slurm(fake), poll=poll, clock=time.time, sleep=time.sleep, say=lambda m: None, name_roots=True)
    f.add(live_member(a, fake, poll))
    sb = sv.open_root(str(b), {"via": "spank"}, ["job.sh"], poll, Slurm(fake))
    f.add(sb)
    marks: dict[str, float] = {}

    def react():
        ja = f.members[str(a)].sup.state.job
        if ja is not None and "a started" not in marks:
            fake.start(ja, t=int(time.time()))
            marks["a started"], marks["b joining"] = time.time(), not (b / "record.jsonl").exists()
    f.sleep = Live(react, lambda: sb.state.job is not None, deadline=30)
    with pytest.raises(Until.Stop):
        f.run()
    submitted_a, started_a = facts(a, "submitted")[0]["t"], facts(a, "started")[0]["t"]
    assert submitted_a - t0 <= 2 * poll + 0.5 and started_a - marks["a started"] <= 2 * poll + 0.5, marks
    assert marks["b joining"], "a stepped while b's claim was in doubt"
    joined = facts(b, "supervisor")[0]["t"]
    assert joined - t0 >= 3 * 0.5 + 5 - 0.5, joined - t0  # b waited out the heartbeat window...
    assert sb.claim.seq == 2 and sb.state.job is not None  # ...then took the root over
    for m in f.members.values():
        m.sup.close()


def test_run_once_again_and_again_carries_a_job_to_its_end(tmp_path, monkeypatch):
    """As scrontab calls it: each `run --once` joins the root (claim, record), reads Slurm
    once for it and does what that calls for, then exits 0; the job's start and end are
    recorded by the runs that come after them."""
    fake, clock = FakeSlurm(), Clock()
    (r,) = roots(tmp_path, 1)
    monkeypatch.chdir(defn()["cwd"])

    def once(*args):
        sup = sv.open_root(str(r), {"via": "spank"}, list(args), POLL, Slurm(fake), once=True)
        sup.clock, sup.sleep, sup.say = clock, clock.sleep, lambda m: None
        try:
            return fl.follow(sup, once=True)
        finally:
            sup.close()
    assert once("job.sh").code == 0 and len(fake.sbatch) == 1
    fake.start(100)
    assert once().code == 0 and facts(r, "started")
    fake.end(100, "COMPLETED")
    assert once().code == 0 and facts(r, "finished")[0]["outcome"] == "done"
    assert [f["type"] for f in sv.Record(str(r)).read() if f["type"] not in ("supervisor", "job")] == [
        "intent", "submitted", "started", "ended", "rule", "finished"]
