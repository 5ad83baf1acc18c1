"""The campaign's checker (tests/testbed/checker.py) on histories made for the test, no cluster:
a correct history passes, and each broken design the checker exists to catch is flagged:
resuming from the newest folder by name, gc without cessation, a continuation taken as
done, publication before fsync (a crash leaves the published save torn or gone), a
mixed shared folder. A real local run through dispatch-slurm's own commands passes too."""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO
from testbed import checker, dettrain, wait

SEED, RANKS, MAX = 3, 1, 100
REF = dettrain.chain(SEED, RANKS, MAX)


def pub_name(epoch: int, step: int, path: str) -> str:
    return f"{epoch:020d}-{step:020d}-{base64.b32encode(path.encode()).decode().rstrip('=')}"


class History:
    """A root, a trainer log and Slurm's accounting, written as a run would leave them, on
    one clock ``t`` that the test moves (mtimes and log lines carry it)."""

    def __init__(self, tmp: Path):
        self.execs: dict[str, Exec] = {}
        self.root = tmp / "root"
        (self.root / "pub").mkdir(parents=True)
        self.log = tmp / "train.jsonl"
        self.sacct = tmp / "sacct.json"
        self.t = 1_000_000.0
        self.jobs: list[dict] = []
        self.faults: list[dict] = []

    def line(self, attempt: str, op: str, **f) -> None:
        self.t += 0.25
        with open(self.log, "a") as out:
            out.write(json.dumps({"t": self.t, "attempt": attempt, "job": attempt.split(".")[1], "restart": 0,
                                  "rank": 0, "op": op, **f}) + "\n")

    def execution(self, attempt: str, resume: int | None = None, source: str | None = None) -> "Exec":
        """A new execution, from scratch or resumed at step ``resume`` from ``source`` (a path
        the trainer logs: by default the one save of that step under exec/), as dettrain.py
        resumes: the save's state with the save's id folded in."""
        job = int(attempt.split(".")[1])
        self.t += 2  # Slurm starts it (sacct has whole seconds)
        self.jobs.append({"job_id": job, "state": {"current": ["RUNNING"]}, "time": {"start": int(self.t), "end": 0}})
        self.t += 1
        ex = Exec(self, attempt)
        if resume is not None:
            src = source or f"/r/exec/{self.owner(resume)}/checkpoint-{resume}"
            writer = self.execs[re.search(r"exec/([^/]+)/(?:dispatch-resume/[^/]+/)?checkpoint-", src)[1]]
            if "dispatch-resume" in src:  # the copy names the publication, whose save is its writer's
                writer = self.execs[self.owner(resume)]
            self.line(attempt, "start", resume_from=src, lineage=True)
            sid = dettrain.save_id(writer.attempt, resume)
            ex.step, ex.h = resume, dettrain.resumed(writer.states[resume], sid)
            self.line(attempt, "resume", path=src, step=resume, h=writer.states[resume], save_id=sid)
        else:
            self.line(attempt, "start", resume_from=None, lineage=True)
        return ex

    def owner(self, step: int) -> str:
        for name in os.listdir(self.root / "exec"):
            if (self.root / "exec" / name / f"checkpoint-{step}").exists():
                return name
        raise AssertionError(step)

    def end(self, attempt: str, state: str) -> None:
        job = int(attempt.split(".")[1])
        for j in self.jobs:
            if j["job_id"] == job:
                j["state"]["current"], j["time"]["end"] = [state], int(self.t) + 1

    def run(self, outcome: str = "done", message: str = "", **more) -> checker.Run:
        self.sacct.write_text(json.dumps({"jobs": self.jobs}))
        return checker.Run(mode="dispatch", trainer="det", max_steps=MAX, save_every=10, step_time=0.25, ranks=RANKS,
                           seed=SEED, trap="own", trainer_log=str(self.log), sacct=str(self.sacct),
                           root=str(self.root), root_in_cluster="/r", outcome={"state": outcome, "message": message},
                           faults=self.faults, **more)


class Exec:
    """One execution of dettrain.py: its state ``h`` after each step (``states``)."""

    def __init__(self, hist: History, attempt: str):
        self.hist, self.attempt, self.step, self.h = hist, attempt, 0, REF[0]
        self.states = {0: REF[0]}
        self.epoch = int(attempt.rsplit(".", 1)[1])
        self.folder = hist.root / "exec" / attempt
        self.folder.mkdir(parents=True)
        hist.execs[attempt] = self

    def steps(self, to: int, publish: bool = True) -> None:
        while self.step < to:
            self.step += 1
            self.h = self.states[self.step] = dettrain.step_hash(self.h, self.step, SEED, RANKS)
            self.hist.line(self.attempt, "step", step=self.step, h=self.h)
            if self.step % 10 == 0:
                self.save(publish)

    def save(self, publish: bool = True) -> None:
        self.states[self.step] = self.h
        d = self.folder / f"checkpoint-{self.step}"
        d.mkdir()
        (d / "model.bin").write_text(self.h + "\nxx")
        (d / "data.json").write_text(json.dumps({"cursor": self.step * RANKS,
                                                 "save_id": dettrain.save_id(self.attempt, self.step)}))
        (d / "trainer_state.json").write_text(json.dumps({"global_step": self.step}))
        self.hist.line(self.attempt, "save", step=self.step, path=f"/r/exec/{self.attempt}/checkpoint-{self.step}",
                       h=self.h)
        if publish:
            self.publish(self.step)

    def publish(self, step: int) -> Path:
        self.hist.t += 0.05
        p = self.hist.root / "pub" / pub_name(self.epoch, step, f"exec/{self.attempt}/checkpoint-{step}")
        p.touch()
        os.utime(p, (self.hist.t, self.hist.t))
        return p

    def done(self) -> None:
        self.hist.line(self.attempt, "done", step=self.step, h=self.h)


A, B, C = "c.99.1000000", "c.101.2000000", "c.102.3000000"


def overlapped(h: History, old_to: int = 60) -> None:
    """A to step 35; its replacement B resumes from A's 30 while A trains on at its lower
    epoch (to ``old_to``); B reaches 50; both end."""
    a = h.execution(A)
    a.steps(35)
    b = h.execution(B, resume=30)
    a.steps(old_to)
    b.steps(50)
    h.end(A, "NODE_FAIL")
    h.end(B, "CANCELLED")


def classes(run: checker.Run) -> set[str]:
    return {a.cls for a in checker.check(run)}


def test_a_correct_history_with_an_overlap_passes(tmp_path):
    """A's replacement B resumes from the greatest publication; A keeps publishing late at its
    lower epoch; C resumes from B's; the run ends done at the uninterrupted run's state."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(35)
    b = h.execution(B, resume=30)
    a.steps(60)  # the old execution goes on (a partition): later steps, lower epoch
    b.steps(50)
    h.end(A, "NODE_FAIL")
    h.end(B, "CANCELLED")
    c = h.execution(C, resume=50, source=f"/r/exec/{B}/checkpoint-50")
    c.steps(MAX)
    c.done()
    assert checker.check(h.run()) == []


def test_resume_from_the_newest_folder_by_name_is_flagged(tmp_path):
    """The broken design: resume from the exec folder whose name sorts last (A's, c.99...),
    its highest save: another lineage than the greatest publication (B's, epoch 2)."""
    h = History(tmp_path)
    overlapped(h)
    newest = sorted(os.listdir(h.root / "exec"))[-1]
    assert newest == A, "the folder that sorts last is the old lineage's"
    top = max(int(n.split("-")[1]) for n in os.listdir(h.root / "exec" / newest))
    c = h.execution(C, resume=top, source=f"/r/exec/{newest}/checkpoint-{top}")
    c.steps(MAX)
    c.done()
    found = checker.check(h.run())
    assert {a.cls for a in found} == {"resume-not-latest", "final-state"}, found
    assert "exec/c.101.2000000/checkpoint-50" in next(a for a in found if a.cls == "resume-not-latest").detail


@pytest.mark.parametrize("which", ["latest", "older"])
def test_a_resume_from_the_executions_copy_counts_as_from_the_save_its_publication_names(tmp_path, which):
    """`latest --resume` gives exec/<mine>/dispatch-resume/<publication>/<leaf> (DESIGN.md): a
    copy of the greatest publication is a resume from it; a copy of an older one is flagged."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(35)
    h.end(A, "NODE_FAIL")
    step = 30 if which == "latest" else 20
    copy = f"/r/exec/{B}/dispatch-resume/{pub_name(1000000, step, f'exec/{A}/checkpoint-{step}')}/checkpoint-{step}"
    b = h.execution(B, resume=step, source=copy)
    b.steps(MAX)
    b.done()
    found = checker.check(h.run())
    if which == "latest":
        assert found == []
    else:
        assert {x.cls for x in found} == {"resume-not-latest", "final-state"}, found
        assert f"resumed from exec/{A}/checkpoint-20 (epoch 1000000, step 20)" in \
            next(x for x in found if x.cls == "resume-not-latest").detail


def test_gc_without_cessation_is_flagged(tmp_path):
    """gc removes B's published save while B still runs (its log goes on after the removal)."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(30)
    h.end(A, "CANCELLED")
    b = h.execution(B, resume=30)
    b.steps(50)
    victim = "exec/c.101.2000000/checkpoint-40"
    import shutil
    shutil.rmtree(h.root / victim)
    h.t += 1
    (h.root / "events").mkdir()
    (h.root / "events" / "gc.host.1.jsonl").write_text(json.dumps({"t": h.t, "type": "gc", "removed": [victim]}) + "\n")
    b.steps(MAX)
    b.done()
    found = checker.check(h.run())
    assert [a.cls for a in found] == ["gc-without-cessation"], found
    # the same removal after B's last line is gc doing its job
    h2 = History(tmp_path / "ok")
    a = h2.execution(A)
    a.steps(40)
    h2.end(A, "CANCELLED")
    b = h2.execution(B, resume=40)
    b.steps(MAX)
    b.done()
    shutil.rmtree(h2.root / "exec" / A / "checkpoint-30")
    (h2.root / "events").mkdir()
    (h2.root / "events" / "gc.host.1.jsonl").write_text(
        json.dumps({"t": h2.t + 5, "type": "gc", "removed": [f"exec/{A}/checkpoint-30"]}) + "\n")
    assert checker.check(h2.run()) == []


def test_a_continuation_taken_as_done_is_flagged(tmp_path):
    """The execution stopped at a time limit (saved on the signal, exit 0: COMPLETED) and the
    run was declared done at step 45 of 100."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(45)
    h.line(A, "signal", step=45)
    h.line(A, "stop", step=45, h=REF[45])
    a.save()
    h.end(A, "COMPLETED")
    found = checker.check(h.run("done", "training completed"))
    assert [x.cls for x in found] == ["end-misjudged"], found
    assert "continuation taken as done" in found[0].detail
    assert classes(h.run("stopped", "job 99 ended CANCELLED by its user")) == {"end-misjudged"}, \
        "nobody stops a campaign's run: a stop is an admin's cancel taken for the user's"


def test_a_failure_is_judged_by_its_cause_not_by_its_message(tmp_path):
    """A run that ended failed or held is a true failure only when a fault of the run could
    have ended the execution that ended it: "no resubmission is left" is no reason by itself."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(45)
    h.end(A, "FAILED")
    for outcome, message in (("failed", "job 99 ended FAILED"), ("held", "held for a person"),
                             ("failed", "failed: job 99 ended FAILED and no resubmission is left (--resubmit 3)")):
        found = checker.check(h.run(outcome, message))
        assert [x.cls for x in found] == ["false-failure"], (message, found)
        assert "job 99's execution that started at" in found[0].detail and "with no fault to end it" in found[0].detail
    h.faults.append({"kind": "crash", "t0": h.t - 5, "t1": h.t + 20, "jobs": [], "nodes": []})
    assert classes(h.run("failed", "no resubmission is left")) == {"false-failure"}, "a crash of another node"
    h.faults[-1]["jobs"] = [99]
    assert classes(h.run("failed", "no resubmission is left")) == set(), "its own node crashed"


def test_a_run_failed_by_a_refusal_no_fault_explains_is_a_false_failure(tmp_path):
    """After a fault that ended A, every execution after it failed before any step, refused
    its resume while no fault was in force (the supervisor spent its budget on them): a
    false failure. The same refusals while the checkpoint filesystem was full are explained."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(45)
    h.faults.append({"kind": "cancel", "t0": h.t, "t1": h.t, "jobs": [99], "nodes": []})
    h.end(A, "CANCELLED")
    for job in (101, 102, 103):
        h.t += 10
        h.jobs.append({"job_id": job, "state": {"current": ["FAILED"]}, "time": {"start": int(h.t), "end": int(h.t) + 1}})
    message = "job 103 ended FAILED and no resubmission is left (--resubmit 3)"
    found = checker.check(h.run("failed", message))
    assert [x.cls for x in found] == ["false-failure"], found
    assert "job 101's execution" in found[0].detail and "ended FAILED before any step with no fault" in found[0].detail
    h.faults.append({"kind": "enospc", "t0": h.t - 40, "t1": h.t + 5, "jobs": [], "nodes": []})
    assert classes(h.run("failed", message)) == set()


@pytest.mark.parametrize("crash", ["torn", "gone"])
def test_publication_before_fsync_is_flagged(tmp_path, crash):
    """The broken design publishes before the save is durable; a node's crash then loses the
    save's unsynced data (torn) or its directory entries (gone), and the next execution
    resumes from the publication that names it."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(40)
    save = h.root / "exec" / A / "checkpoint-40"
    if crash == "torn":
        (save / "model.bin").write_text("")
    else:
        import shutil
        shutil.rmtree(save)
    h.end(A, "NODE_FAIL")
    b = h.execution(B)
    h.line(B, "start", resume_from=f"/r/exec/{A}/checkpoint-40")
    h.line(B, "resume_failed", path=f"/r/exec/{A}/checkpoint-40", error="model.bin: empty")
    found = checker.check(h.run("unfinished", "deadline"))
    got = {x.cls for x in found}
    assert "torn-resume" in got, found
    assert ("torn-publication" in got) if crash == "torn" else ({"removed-publication", "unexplained-removal"} <= got)


def test_a_wrong_final_state_and_a_skipped_step_are_flagged(tmp_path):
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(40)
    h.end(A, "CANCELLED")
    b = h.execution(B, resume=40)
    b.step = 41  # resumed one step late: a step skipped
    b.steps(MAX)
    h.line(B, "done", step=MAX, h=dettrain.chain(SEED, RANKS, MAX + 1)[-1])
    assert "final-state" in classes(h.run())


def test_work_recomputed_beyond_the_save_interval_is_flagged(tmp_path):
    """B resumes from an old publication (step 10) although A's step 40 save exists but was
    not published: 35 steps recomputed, more than 10 + slack."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(10)
    a.steps(45, publish=False)
    h.end(A, "CANCELLED")
    b = h.execution(B, resume=10)
    b.steps(MAX)
    b.done()
    assert classes(h.run()) == {"recompute-excess"}
    h.faults.append({"kind": "enospc", "t0": h.t - 60, "t1": h.t - 30})  # saves failed meanwhile: excused
    assert classes(h.run()) == set()


def test_an_old_executions_steps_after_its_replacement_started_are_not_recomputed_work(tmp_path):
    """A partition longer than MinJobAge: the cut-off execution A trains on (to step 90, at its
    lower epoch) long after its replacement B started from step 30; C resumes from B's step 50.
    Correct (A's late steps are the overlap's, never a resume point), and not a recompute of
    40 steps; but B's own steps beyond its save are."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(35)
    b = h.execution(B, resume=30)
    a.steps(90)
    b.steps(50)
    h.end(B, "CANCELLED")
    c = h.execution(C, resume=50, source=f"/r/exec/{B}/checkpoint-50")
    c.steps(MAX)
    c.done()
    assert checker.check(h.run()) == []


def test_a_step_lost_at_a_time_limit_is_flagged(tmp_path):
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(43)
    h.end(A, "TIMEOUT")
    b = h.execution(B, resume=40)
    b.steps(MAX)
    b.done()
    assert classes(h.run()) == {"step-lost-at-time-limit"}


def test_the_shared_folder_of_naive_mode_shows_mixed_and_lost_saves(tmp_path):
    """Two executions in one folder: both write checkpoint-40, and the old one's rotation
    deletes the replacement's save while the replacement still runs."""
    log = tmp_path / "train.jsonl"
    recs = []
    t = 0.0
    for attempt, op, step in (("naive.1.0", "save", 30), ("naive.1.0", "save", 40), ("naive.2.0", "save", 40),
                              ("naive.1.0", "delete", 30), ("naive.1.0", "save", 50), ("naive.1.0", "delete", 40),
                              ("naive.2.0", "step", 41)):
        t += 1
        recs.append({"t": t, "attempt": attempt, "job": attempt.split(".")[1], "op": op, "step": step,
                     "path": f"/s/checkpoint-{step}", "h": REF[step]})
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    run = checker.Run(mode="naive", trainer="det", max_steps=MAX, save_every=10, step_time=0.25, ranks=1, seed=SEED,
                      trap="none", trainer_log=str(log), folder=str(tmp_path), folder_in_cluster="/s",
                      outcome={"state": "failed", "message": "no resubmission is left"})
    assert {x.cls for x in checker.check(run)} == {"mixed-save", "lost-save"}


def test_a_supervisor_that_exited_and_was_started_again_is_flagged(tmp_path):
    """`run` died mid-run (the campaign found it on a full filesystem) and its user started it
    again: the root's record shows a second supervisor process. One process is no finding."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(MAX)
    a.done()
    record = h.root / "record.jsonl"
    first = {"v": 1, "seq": 1, "t": h.t, "type": "supervisor", "host": "db", "pid": 10, "resumed": False}
    record.write_text(json.dumps(first) + "\n")
    assert checker.check(h.run()) == []
    again = {**first, "seq": 9, "pid": 11, "resumed": True}
    record.write_text(json.dumps(first) + "\n" + json.dumps(again) + "\n")
    assert classes(h.run()) == {"supervisor-exited"}
    superseded = {"v": 1, "seq": 10, "t": h.t, "type": "superseded", "from_g": 0, "to_g": 1}
    record.write_text("".join(json.dumps(f) + "\n" for f in (first, again, superseded)))
    assert checker.check(h.run()) == [], "a person's supersede starts a supervisor of its own"


def test_an_execution_that_never_loaded_its_resume_save_is_flagged_not_counted_as_recompute(tmp_path):
    """Seed 1122 of the long campaign: a requeued execution was to resume from the old
    execution's published checkpoint, which the old one (cut off, still training) rotated
    away while it loaded; it died before its first step, and the next one resumed. That is a
    failed resume, not 100-odd steps recomputed."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(45)
    src = f"/r/exec/{A}/checkpoint-40"
    h.t += 2
    h.jobs.append({"job_id": 101, "state": {"current": ["FAILED"]}, "time": {"start": int(h.t), "end": int(h.t) + 5}})
    (h.root / "exec" / B).mkdir(parents=True)
    h.line(B, "start", resume_from=src)  # and nothing more: it died loading
    c = h.execution(C, resume=40)
    c.steps(MAX)
    c.done()
    assert classes(h.run()) == {"resume-failed"}


def test_the_checker_imports_nothing_of_the_package():
    """Independent of the code under test: no import of dispatch_slurm in the checker or the
    trainer's module scope, and importing them loads none."""
    for name in ("checker.py", "dettrain.py"):
        tree = ast.parse((REPO / "tests" / "testbed" / name).read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        mods = [a.name for n in top if isinstance(n, ast.Import) for a in n.names] + \
               [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not any(m.startswith("dispatch_slurm") for m in mods), (name, mods)
    code = "import sys, testbed.checker; print([m for m in sys.modules if m.startswith('dispatch_slurm')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "tests")}).stdout
    assert out.strip() == "[]"


def test_a_real_local_run_through_dispatch_slurm_passes(tmp_path):
    """Two executions on this machine with dispatch-slurm's own commands (env --local,
    latest --resume, watch): the first is stopped by SIGTERM (its own handler saves and
    prints the sentinel), the second resumes and finishes: nothing to flag; and the same
    root with the second's resume pointed at an older save is flagged. The trainer loads
    for a few seconds first, as a real one does: on a loaded machine the second's 15
    steps were over before `watch` had started (`--until-pid`: no such process)."""
    bindir = Path(sys.executable).parent
    root = tmp_path / "root"
    root.mkdir()
    log = tmp_path / "train.jsonl"
    script = (f"set -euo pipefail\neval \"$({bindir}/dispatch-slurm env --local)\"\n"
              f"resume=$({bindir}/dispatch-slurm latest --resume)\n"
              f"{sys.executable} {REPO}/tests/testbed/dettrain.py --output-dir \"$DISPATCH_EXEC_DIR\" "
              "${resume:+--resume-from \"$resume\"} " + f"--max-steps 60 --step-time 0.05 --save-every 10 "
              f"--trap own --seed {SEED} --log {log} --warmup 5 & T=$!\n"
              f"{bindir}/dispatch-slurm watch --until-pid $T --no-inotify --poll 0.1\nwait $T\n")
    env = {**os.environ, "DISPATCH_CHECKPOINT": str(root)}
    first = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
    # 45 steps: the saves of steps 10 and 20 are published well over a second before the
    # second execution starts (the checker allows a second for Slurm's whole-second times)
    wait.until(lambda: log.exists() and '"step": 45' in log.read_text(), timeout=60, what="45 steps")
    os.killpg(first.pid, signal.SIGTERM)  # Slurm signals every process of the job
    first.wait(60)
    second = subprocess.run(["bash", "-c", script], env=env, timeout=120)
    assert second.returncode == 0
    run = checker.Run(mode="dispatch", trainer="det", max_steps=60, save_every=10, step_time=0.05, ranks=1,
                      seed=SEED, trap="own", trainer_log=str(log), root=str(root), root_in_cluster=str(root),
                      outcome={"state": "done"})
    assert checker.check(run) == []
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    stop = next(r for r in recs if r["op"] == "stop")
    assert any(r["op"] == "resume" and r["step"] == stop["step"] for r in recs), "resumed from the signal's save"
    # the second execution claims it resumed from the first's oldest save: flagged
    older = next(r["path"] for r in recs if r["op"] == "save")
    log.write_text("".join(json.dumps({**r, "resume_from": older} if r["op"] == "start" and r.get("resume_from")
                                      else r) + "\n" for r in recs))
    assert "resume-not-latest" in {a.cls for a in checker.check(run)}


def test_a_latest_publication_the_old_executions_rotation_removed_is_flagged(tmp_path):
    """slurmd frozen on A's node: Slurm requeued the job while A's trainer trained on, saving
    unpublished (its step ended, and its watch with it) and rotating (keep 2) until it
    removed the latest published save, checkpoint-40. Every execution after it was refused
    its resume, before any step, while no fault was in force any more; the supervisor spent
    its budget on them. The removal is A's own (no unexplained removal), the latest
    publication names nothing, and the failure is a false one, whatever its message."""
    h = History(tmp_path)
    a = h.execution(A)
    a.steps(45)
    h.faults.append({"kind": "slurmd-stop", "t0": h.t - 2, "t1": h.t + 60, "jobs": [], "nodes": ["c1"]})
    h.jobs[0]["nodes"] = "c1"
    h.end(A, "NODE_FAIL")
    a.steps(70, publish=False)  # its step ended: nothing publishes its saves any more
    for step in (30, 40, 50):  # its save_total_limit rotation
        import shutil
        shutil.rmtree(a.folder / f"checkpoint-{step}")
        h.line(A, "delete", step=step, path=f"/r/exec/{A}/checkpoint-{step}")
    h.t += 60
    for job in (100, 101, 102, 103):  # the requeue, then one execution per resubmission: refused at once
        h.jobs.append({"job_id": job, "state": {"current": ["FAILED"]}, "time": {"start": int(h.t), "end": int(h.t) + 1},
                       "nodes": "c2"})
        h.t += 1
    found = checker.check(h.run("failed", "job 103 ended FAILED and no resubmission is left (--resubmit 3)"))
    assert {x.cls for x in found} == {"removed-publication", "false-failure"}, found
    removed = next(x for x in found if x.cls == "removed-publication")
    assert f"exec/{A}/checkpoint-40, which no longer exists" in removed.detail
    assert f"the latest publication's save exec/{A}/checkpoint-40 is gone" in \
        next(x for x in found if x.cls == "false-failure").detail


def test_a_resume_from_another_lineage_ends_in_another_final_state(tmp_path):
    """`latest` ignoring the epoch: C resumes from the old execution A's step 60 (epoch 1,
    trained on after its replacement B resumed from 30) instead of B's step 50 (epoch 2).
    A's save holds the right state of its own lineage, but B's diverged at its resume, so C
    ends in another state than the uninterrupted run's along the greatest publications:
    final-state flags it on its own, also when C's log names B's save as the one it resumed
    from (only the save's own id says what it loaded)."""
    h = History(tmp_path)
    overlapped(h)
    by_step = max(checker.publications(str(h.root))[0], key=lambda p: p.step)
    assert by_step.path == f"exec/{A}/checkpoint-60", "the greatest step is the old lineage's"
    c = h.execution(C, resume=60, source=f"/r/{by_step.path}")
    c.steps(MAX)
    c.done()
    only = checker.Checker(h.run())
    only.final_state()
    assert [x.cls for x in only.found] == ["final-state"], only.found
    assert {x.cls for x in checker.check(h.run())} == {"final-state", "resume-not-latest"}
    said = f"/r/exec/{B}/checkpoint-50"
    h.log.write_text("".join(json.dumps({**r, **({"resume_from": said} if r["op"] == "start" else {}),
                                         **({"path": said} if r["op"] == "resume" else {})}) + "\n"
                             if r["attempt"] == C else json.dumps(r) + "\n" for r in checker.read_log(str(h.log))))
    assert {x.cls for x in checker.check(h.run())} == {"final-state"}
    # the same history along the right lineage passes
    right = History(tmp_path / "right")
    overlapped(right)
    c = right.execution(C, resume=50, source=f"/r/exec/{B}/checkpoint-50")
    c.steps(MAX)
    c.done()
    assert checker.check(right.run()) == []
