"""The layers above the store open a root's store once and keep it: a supervisor for its
whole life (its record, claim, requests, gc), a watch for all its scans. Counted by wrapping
the store: store objects made, and opens of the root itself (a session: one fd of the root,
under which every call of a step or a publication works). benchmarks/bench_store_opens.py
prints the same counts for any checkout, before and after."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import claim
from test_supervisor_rules import Clock, FakeSlurm, defn
from test_watch import hf_save

from dispatch_slurm import supervisor as sv
from dispatch_slurm.runtime import watch
from dispatch_slurm.slurm.client import Slurm
from dispatch_slurm.store import base, posix

E1 = 1_000_000


@pytest.fixture
def opens(monkeypatch):
    """{"objects": store objects made, "sessions": opens of a root} since the last clear()."""
    seen = {"objects": 0, "sessions": 0}
    init, open_root = base.Store.__init__, posix.open_root

    def counted_init(self, *a, **k):
        seen["objects"] += 1
        init(self, *a, **k)

    def counted_open(root):
        seen["sessions"] += 1
        return open_root(root)
    monkeypatch.setattr(base.Store, "__init__", counted_init)
    monkeypatch.setattr(posix, "open_root", counted_open)
    return seen


def test_a_supervisor_opens_its_store_once_and_its_root_once_a_step(root, opens):
    """A job that failed once and was resubmitted, then completed: 13 facts. Each step is
    one session of the root (the claim's check and heartbeat, a person's requests, the
    facts), and no step makes a store of its own."""
    fake, clock = FakeSlurm(), Clock()
    sup = sv.Supervisor(str(root), Slurm(fake), poll=10.0, clock=clock, sleep=clock.sleep, say=lambda m: None)
    sup.open("test")
    sup.start(defn(resubmit=1))
    steps, result = 0, None
    while result is None and steps < 500:
        steps += 1
        try:
            wait = sup.step()
        except sv.Finished as f:
            result = f
            break
        if wait:  # the cluster moves on while the supervisor waits
            clock.sleep(wait)
            j = fake.jobs.get(sup.state.job)
            if j and j["job_state"] == ["PENDING"]:
                fake.start(j["job_id"])
            elif j and j["job_state"] == ["RUNNING"] and sup.state.started:
                fake.end(j["job_id"], "FAILED" if j["job_id"] == 100 else "COMPLETED", code=int(j["job_id"] == 100))
    sup.close()
    counted = dict(opens)
    assert result is not None and result.code == 0, result
    assert len(sv.Record(str(root)).read()) == 13
    assert counted["objects"] == 1, f"{counted['objects']} store objects for one root (one per reopening)"
    # one a step, and one each to open (claim, replay), start and close (the claim's exit)
    assert counted["sessions"] <= steps + 3, f"{counted['sessions']} opens of the root in {steps} steps"


def test_a_watch_opens_its_store_once_and_its_root_once_a_publication(root, opens, monkeypatch):
    attempt = "c.1.1000000"
    ex = root / "exec" / attempt
    ex.mkdir(parents=True)
    claim(root, attempt)
    for k, v in {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EXEC_DIR": str(ex), "DISPATCH_EPOCH": str(E1),
                 "DISPATCH_ATTEMPT": attempt}.items():
        monkeypatch.setenv(k, v)
    opens.update(objects=0, sessions=0)
    w = watch.Watcher(str(ex), str(root), E1, watch.Layout())
    assert opens == {"objects": 1, "sessions": 0}
    hf_save(ex, 1)
    hf_save(ex, 2)
    assert [p.step for p in w.scan()] == [1, 2]
    assert opens == {"objects": 1, "sessions": 3}, "the first scan: pub/ read once, then one session a publication"
    hf_save(ex, 3)
    assert [p.step for p in w.scan()] == [3] and opens == {"objects": 1, "sessions": 4}
    assert w.scan() == [] and opens == {"objects": 1, "sessions": 4}, "nothing new: the root is not opened"


def _cli(argv: list[str], capsys) -> str:
    from dispatch_slurm.cli import main
    capsys.readouterr()
    try:
        main(argv)
    except SystemExit as e:
        assert not e.code, (argv, e.code, capsys.readouterr())
    return capsys.readouterr().out


def test_env_local_resume_point_gc_and_report_each_open_one_store(root, opens, monkeypatch, capsys):
    """A command that has only the root's name opens its store once and hands it to every
    reader below it (the look-up's checks, its event, the unpublished-saves warning; gc's
    record, pins and verdicts; the report's goodput): a reopening is a new fd of the root,
    on S3 a new client."""
    from dispatch_slurm import store
    for k in [k for k in os.environ if k.startswith("DISPATCH_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("DISPATCH_CHECKPOINT", str(root))
    first = json.loads(_cli(["env", "--local", "--format", "json"], capsys))
    for k, v in first.items():
        monkeypatch.setenv(k, v)
    hf_save(Path(first["DISPATCH_EXEC_DIR"]), 10)
    _cli(["watch", "--once"], capsys)
    counted = {}
    opens.update(objects=0, sessions=0)
    second = json.loads(_cli(["env", "--local", "--format", "json"], capsys))
    counted["env --local"] = opens["objects"]
    for k, v in second.items():
        monkeypatch.setenv(k, v)
    opens.update(objects=0, sessions=0)
    assert store.resume_point() is not None
    counted["resume_point"] = opens["objects"]
    for name, argv in (("gc", ["gc", "--keep-last", "1", str(root)]), ("report", ["report", str(root)])):
        opens.update(objects=0, sessions=0)
        _cli(argv, capsys)
        counted[name] = opens["objects"]
    assert counted == {"env --local": 1, "resume_point": 1, "gc": 1, "report": 1}
