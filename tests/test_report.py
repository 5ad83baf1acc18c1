"""`dispatch-slurm report`: the executions, overlaps, holds, publications and lost steps
of a root, read from a real root on a real filesystem (the cluster test draws one from a
real docker-slurm run)."""

import json
import os
import pathlib
import sys
import time

import pytest
from support import LOCAL_SAVE, cli, local_run

from dispatch_slurm import report, store
from dispatch_slurm.supervisor.record import Record

T0 = 1_800_000_000.0
A1, A2 = "cl.100.1000000", "cl.100.1000001"  # job 100, requeued once (R=0, then R=1)


def write_save(root, attempt, step, at):
    d = root / "exec" / attempt / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.bin").write_bytes(b"w")
    for p in (d / "model.bin", d):
        os.utime(p, (at, at))
    return d


@pytest.fixture
def story(root, monkeypatch):
    """R=0 saves 10, 20, 30 (publishes 10 and 20), is requeued at T0+50 but keeps
    writing until T0+58 (saves 30); R=1 starts at T0+55, resumes from 20, publishes 40."""
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    for step, at, pub in ((10, 10, True), (20, 30, True), (30, 58, False)):
        d = write_save(root, A1, step, T0 + at)
        if pub:
            store.publish(d, root=str(root), epoch=1_000_000)
            name = [n for n in os.listdir(root / "pub") if n.startswith(f"{1_000_000:020d}-{step:020d}")][0]
            os.utime(root / "pub" / name, (T0 + at + 1, T0 + at + 1))
    d = write_save(root, A2, 40, T0 + 70)
    store.publish(d, root=str(root), epoch=1_000_001)
    for e in (root / "events").iterdir():
        e.unlink()  # the entries' mtimes stand in for the publications' times here
    rec = Record(str(root), clock=lambda: T0 + 50)
    rec.open_for_append()
    ex = {"g": 0, "n": 1, "job": 100, "nodes": ["c1"]}
    rec.append({"type": "started", **ex, "r": 0, "attempt": A1, "start_time": int(T0)})
    rec.append({"type": "ended", **ex, "r": 0, "attempt": A1, "state": "REQUEUED", "requeued": True})
    rec.append({"type": "hold", "hold": 1, "replaces": "requeue", "job": 100, "r": 0, "until": T0 + 999,
                "interval": 5.0, "cessation_cmd": "x", "attempt": A1})
    rec.append({"type": "cessation", "hold": 1, "answer": "not_ceased"})
    rec.append({"type": "release", "hold": 1, "by": "cessation signal"})
    rec.append({"type": "started", **ex, "nodes": ["c2"], "r": 1, "attempt": A2, "start_time": int(T0 + 55)})
    return root


def test_report_tells_the_story(story):
    r = report.build(str(story))
    old, new = r["executions"]
    assert (old["attempt"], old["restart"], old["nodes"], old["max_step"]) == (A1, 0, ["c1"], 30)
    assert old["ended"]["state"] == "REQUEUED" and new["ended"] is None
    assert [p["step"] for p in old["publications"]] == [10, 20] and new["nodes"] == ["c2"]
    (i,) = r["interruptions"]
    assert i["overlap_s"] == pytest.approx(3.0)  # the old one wrote until +58, the new started at +55
    assert i["resumed_from"]["step"] == 20 and i["resumed_by"] == "the latest publication when it started"
    # saved 30, resumed from 20; what it computed after 30 nothing under the root tells (no handler event)
    assert i["steps_lost"] is None and i["steps_lost_at_least"] == 10
    (h,) = r["holds"]
    assert [a["answer"] for a in h["answers"]] == ["not_ceased"] and h["released"]["by"] == "cessation signal"
    assert r["latest"]["step"] == 40


def test_report_cli_text_json_and_png(story, tmp_path):
    text = cli("report", story, check=True).stdout
    assert "steps lost: unknown, at least 10" in text and "old kept writing 3.0s" in text and "REQUEUED" in text
    j = json.loads(cli("report", story, "--json", check=True).stdout)
    assert len(j["executions"]) == 2
    png = tmp_path / "timeline.png"
    cli("report", story, "--plot", png, check=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_report_of_an_unusable_root_is_one_line(tmp_path):
    bad = cli("report", tmp_path / "nope")
    assert bad.returncode == 2 and "does not exist" in bad.stderr and len(bad.stderr.splitlines()) == 1


# ---- a plugin job nobody supervised, read from the hooks' evidence --------------------------

NOBODY = {"SLURM_JOB_UID": "65534", "SLURM_JOB_GID": "65534", "SLURM_JOB_USER": "nobody"}
OPT = "SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the hooks drop to the job user")


def _as_nobody(fn, *args):
    from dispatch_slurm.slurm.hooks import node
    res = node.as_job_user(NOBODY, fn, *args)
    assert "ok" in res, res
    return res["ok"]


def _save_and_publish(root: str, attempt: str, step: int) -> str:
    d = os.path.join(root, "exec", attempt, f"checkpoint-{step}")
    os.makedirs(d)
    with open(os.path.join(d, "model.bin"), "wb") as f:
        f.write(b"w" * 4096)
    store.publish(d, step, root=root, epoch=int(attempt.rsplit(".", 1)[1]), sync=False)
    return d


def _at(root, saves: dict, t0: float) -> None:
    """Give each save, its publication and its `published` event the time the story says."""
    for d, t in saves.values():
        for p in (os.path.join(d, "model.bin"), d):
            os.utime(p, (t0 + t, t0 + t))
    by_path = {os.path.relpath(d, root): t for d, t in saves.values()}
    for name in os.listdir(root / "pub"):
        t = by_path[json.loads((root / "pub" / name).read_text())["path"]] \
            if (root / "pub" / name).read_text().startswith("{") else None
        if t is not None:
            os.utime(root / "pub" / name, (t0 + t, t0 + t))
    for f in (root / "events").iterdir():
        lines = []
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["type"] == "published":
                e["t"] = t0 + by_path[e["path"]]
            lines.append(json.dumps(e))
        f.write_text("\n".join(lines) + "\n")


@pytest.fixture
def plugin_story(tmp_path, monkeypatch):
    """A plugin job (sbatch --dispatch-checkpoint, no `run`), through the real Prolog and
    Epilog on nodes n1 and n2, as a real run showed it: R=0 starts at T0, publishes 60 and 70,
    and publishes 80 a second after R=1 started (T0+100): R=1 resumed from 70 and saves 90
    at T0+130. R=1 last writes at T0+171; R=2 starts at T0+200, first saves at T0+230."""
    import shutil
    import tempfile
    from dispatch_slurm.slurm.hooks import epilog, job, node, prolog
    from dispatch_slurm.slurm.hostlist import expand_hostlist
    monkeypatch.setattr(node, "LOG", str(tmp_path / "hooks.log"))
    monkeypatch.setattr(job, "hostnames", expand_hostlist)  # no scontrol here
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    base = tempfile.mkdtemp(prefix="dispatch-report-")
    os.chmod(base, 0o755)
    root = pathlib.Path(base) / "ck"
    root.mkdir()
    os.chown(root, 65534, 65534)
    _as_nobody(store.allocate_submission, str(root))
    t0 = float(int(time.time()) - 3600)  # Slurm gives whole seconds
    saves = {}

    def env(node, r):
        return {**NOBODY, "SLURM_JOB_ID": "79", "SLURM_CLUSTER_NAME": "linux", "SLURMD_NODENAME": node,
                "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_RESTART_COUNT": str(r),
                "SLURM_JOB_START_TIME": str(int(t0 + 100 * r)), OPT + "checkpoint": str(root), OPT + "submission": "1"}

    def hook(name, r):
        for n in ("n1", "n2"):
            monkeypatch.setattr(node, "RUN_DIR", str(tmp_path / f"run-{n}"))
            assert {"prolog": prolog, "epilog": epilog}[name].run(env(n, r)) == 0

    plan = {0: [(60, 40), (70, 70), (80, 101)], 1: [(90, 130), (100, 171)], 2: [(110, 230)]}
    for r, steps in plan.items():
        hook("prolog", r)
        attempt = f"linux.79.{1_000_000 + r}"
        for step, t in steps:
            saves[step] = (_as_nobody(_save_and_publish, str(root), attempt, step), t)
        if r < 2:
            hook("epilog", r)
    _at(root, saves, t0)
    yield root, t0
    shutil.rmtree(base)


@needs_root
def test_report_dates_executions_by_the_hooks_and_shows_their_cessation(plugin_story):
    root, t0 = plugin_story
    r = report.build(str(root))
    ex = r["executions"]
    assert [e["started_at"] - t0 for e in ex] == pytest.approx([0, 100, 200], abs=1)
    assert [e["started_by"] for e in ex] == ["prolog"] * 3
    assert all({"n1", "n2"} <= set(e["nodes"]) for e in ex)  # and this host, which published
    assert [e["ended"] and e["ended"]["state"] for e in ex] == ["ceased", "ceased", None]
    assert [e["cessation"]["missing"] for e in ex] == [[], [], ["n1", "n2"]]
    first, second = r["interruptions"]
    assert first["resumed_from"]["step"] == 70, "R=0 published 80 after R=1 had started"
    assert first["overlap_s"] == pytest.approx(1, abs=0.1)
    assert second["resumed_from"]["step"] == 100 and second["overlap_s"] == 0
    assert second["gap_s"] == pytest.approx(29, abs=1)
    text = cli("report", root, check=True).stdout
    assert "old stopped writing 29" in text and "resumed from step 70" in text, text
    assert text.count("ceased on n1,n2 (Epilog)") == 2 and "no Epilog record from n1,n2" in text, text


@needs_root
def test_gc_collects_a_plugin_job_from_the_root_alone(plugin_story):
    """No supervisor record, no --nodes, Slurm unreachable: every node of R=0 and R=1
    recorded its Epilog, naming both nodes, so their saves past --keep-last go."""
    from dispatch_slurm.retention.policy import Policy
    from dispatch_slurm.slurm.client import Slurm
    from dispatch_slurm.slurm.command import CommandResult
    from dispatch_slurm import retention
    root, _ = plugin_story
    dry = cli("gc", root, "--keep-last", "2", "--dry-run", env={"PATH": "/nonexistent"}, check=True)
    assert "would remove" in dry.stdout and "every node that ran it recorded its Epilog" in dry.stdout, dry.stdout
    assert "Slurm did not answer" not in dry.stdout and "unknown" not in dry.stdout, dry.stdout
    assert "would remove 4 saves" in dry.stderr, dry.stderr

    def unreachable(argv, **kw):
        return CommandResult(1, "", "Unable to contact slurm controller")

    gone = _as_nobody(lambda: sorted(v.save.path for v in retention.gc(
        str(root), Policy(keep_last=2, min_age=0), slurm=Slurm(unreachable)) if v.action == "remove"))
    assert gone == [f"exec/linux.79.1000000/checkpoint-{s}" for s in (60, 70, 80)] + \
        ["exec/linux.79.1000001/checkpoint-90"]
    assert sorted(os.listdir(root / "exec" / "linux.79.1000001")) == ["checkpoint-100"]


# ---- the report says only what happened -----------------------------------------------------

@pytest.fixture(autouse=True)
def no_slurm_here(monkeypatch):
    """This host has no Slurm: a report asks none (the Slurm tests put a stand-in on PATH)."""
    monkeypatch.setenv("PATH", f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin")


def _record(root, t, *facts):
    rec = Record(str(root), clock=lambda: t)
    rec.open_for_append()
    for f in facts:
        rec.append(f)


def _event(root, attempt, type_, t, **fields):
    """One event of ``attempt`` at time ``t``, as its process would write it."""
    from dispatch_slurm.store import events
    e = events.emit(type_, root=str(root), attempt=attempt, **fields)
    f = next((root / "events").glob(f"{attempt}.*.{os.getpid()}.jsonl"))
    lines = f.read_text().splitlines()
    lines[-1] = json.dumps({**e, "t": t})
    f.write_text("\n".join(lines) + "\n")


def _publish(root, attempt, step, at):
    d = write_save(root, attempt, step, at)
    store.publish(d, root=str(root), epoch=int(attempt.rsplit(".", 1)[1]), sync=False)
    name = [n for n in os.listdir(root / "pub") if f"-{step:020d}-" in n][0]
    os.utime(root / "pub" / name, (at + 0.5, at + 0.5))
    for f in (root / "events").iterdir():  # the `published` event at the same time
        f.write_text("".join(json.dumps({**e, "t": at + 0.5}) + "\n" if e["type"] == "published"
                             and e.get("step") == step else json.dumps(e) + "\n"
                             for e in map(json.loads, f.read_text().splitlines())))
    return d


def test_an_execution_that_wrote_nothing_is_not_said_to_have_kept_writing(root, monkeypatch):
    """Job 100's first execution wrote nothing and ended (Slurm's word) 15 s before the next
    one started: no "old kept writing - after the new one started"."""
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    (root / "exec" / A1).mkdir(parents=True)
    (root / "exec" / A2).mkdir(parents=True)
    ex = {"g": 0, "n": 1, "job": 100, "nodes": ["c1"]}
    _record(root, T0 + 5, {"type": "started", **ex, "r": 0, "attempt": A1, "start_time": int(T0)},
            {"type": "ended", **ex, "r": 0, "attempt": A1, "state": "FAILED"})
    _record(root, T0 + 20, {"type": "started", **ex, "r": 1, "attempt": A2, "start_time": int(T0 + 20)})
    text = cli("report", root, check=True).stdout
    assert "old kept writing -" not in text, text
    assert "old wrote nothing and ended 15.0s before the new one started" in text, text
    (i,) = report.build(str(root))["interruptions"]
    assert i["old_wrote"] is False and i["overlap_s"] is None


def test_steps_computed_after_the_last_save_are_never_counted_as_0(root, monkeypatch):
    """R=0 saved and published 300, computed on to 319 and was killed at its
    time limit (no handler); R=1 resumed from 300. Nothing under the root tells what R=0
    computed after 300: "unknown", never "steps lost: 0". With the handler's own
    checkpoint_complete (it saved at its stop and exited), 0 is known."""
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    _publish(root, A1, 300, T0 + 30)
    (root / "exec" / A2).mkdir()
    ex = {"g": 0, "n": 1, "job": 100, "nodes": ["c1"]}
    _record(root, T0 + 60, {"type": "started", **ex, "r": 0, "attempt": A1, "start_time": int(T0)},
            {"type": "ended", **ex, "r": 0, "attempt": A1, "state": "TIMEOUT"},
            {"type": "started", **ex, "r": 1, "attempt": A2, "start_time": int(T0 + 70)})
    text = cli("report", root, check=True).stdout
    assert "steps lost: 0" not in text and "steps lost: unknown (nothing under the root tells what it computed " \
        "after its last save (step 300))" in text, text
    (i,) = report.build(str(root))["interruptions"]
    assert i["resumed_from"]["step"] == 300 and i["steps_lost"] is None and i["steps_lost_at_least"] == 0
    _event(root, A1, "checkpoint_complete", T0 + 31, elapsed=1.0, time_remaining=50.0)
    (i,) = report.build(str(root))["interruptions"]
    assert i["steps_lost"] == 0, i


def test_an_older_epilogs_sentinel_is_no_grace_save_of_the_execution(root, monkeypatch):
    """Roots written before ends were decided from the execution's own facts hold
    checkpoint_complete events an Epilog wrote from a scan of an output file other jobs may
    have written too: they say nothing of how the execution ended, or of its stop."""
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    _publish(root, A1, 300, T0 + 30)
    _event(root, A1, "checkpoint_complete", T0 + 40, source="epilog")
    (ex,) = report.build(str(root), ask_slurm=False)["executions"]
    assert (ex["ended"] or {}).get("state") != "PREEMPTED (grace save)" and not ex["saved_at_stop"], ex["ended"]
    _event(root, A1, "checkpoint_complete", T0 + 41, elapsed=1.0, time_remaining=50.0)  # its own handler's
    (ex,) = report.build(str(root), ask_slurm=False)["executions"]
    assert ex["ended"]["state"] == "PREEMPTED (grace save)" and ex["saved_at_stop"], ex["ended"]


def test_a_resume_is_dated_by_what_the_execution_resumed_from(root, monkeypatch):
    """R=0 published 700, R=1 started at +100, R=0 published 800 at +103.4
    (3.4 s after that start) and saved on to 1812 (its handler saved at the stop); R=1
    restored checkpoint-800, as its own resume event says: resumed from 800, 1012 lost (not
    "resumed from step 700; steps lost: 1112")."""
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    _publish(root, A1, 700, T0 + 50)
    _publish(root, A1, 800, T0 + 102.9)
    write_save(root, A1, 1812, T0 + 140)
    _event(root, A1, "checkpoint_complete", T0 + 141, elapsed=2.0, time_remaining=40.0)
    write_save(root, A2, 900, T0 + 160)
    ex = {"g": 0, "n": 1, "job": 100, "nodes": ["c1"]}
    _record(root, T0 + 100, {"type": "started", **ex, "r": 0, "attempt": A1, "start_time": int(T0)},
            {"type": "ended", **ex, "r": 0, "attempt": A1, "state": "REQUEUED", "requeued": True},
            {"type": "started", **ex, "r": 1, "attempt": A2, "start_time": int(T0 + 100)})
    (i,) = report.build(str(root))["interruptions"]
    assert i["resumed_from"]["step"] == 700 and i["steps_lost"] is None, "no resume event: 700 or 800"
    assert [c["step"] for c in i["resume_candidates"]] == [800] and i["steps_lost_at_least"] == 1012
    pub800 = next(n for n in os.listdir(root / "pub") if f"-{800:020d}-" in n)
    _event(root, A2, "resumed", T0 + 104, step=800, name=pub800, path=f"exec/{A1}/checkpoint-800",
           by="latest --resume")
    text = cli("report", root, check=True).stdout
    assert f"resumed from step 800 (exec/{A1}/checkpoint-800); steps lost: 1012" in text, text
    (i,) = report.build(str(root))["interruptions"]
    assert i["resumed_from"]["step"] == 800 and i["resumed_by"] == "its resume event"
    assert i["steps_lost"] == 1012, i


def test_latest_resume_and_the_integrations_record_what_they_returned(tmp_path, monkeypatch):
    """`latest --resume` and store.resume_point (every integration's resume call) record a
    `resumed` event naming the publication they returned (none: from scratch), in an
    execution's first rank only."""
    from support import allocate
    from dispatch_slurm.store import events
    root = tmp_path / "root"
    root.mkdir()
    allocate(root, 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_", "RANK"))}
    env.update(DISPATCH_CHECKPOINT=str(root), DISPATCH_ATTEMPT="c.7.2000000", DISPATCH_EPOCH="2000000")
    for k in [k for k in os.environ if k.startswith(("DISPATCH_", "SLURM_", "RANK"))]:
        monkeypatch.delenv(k)
    for k in ("DISPATCH_CHECKPOINT", "DISPATCH_ATTEMPT", "DISPATCH_EPOCH"):
        monkeypatch.setenv(k, env[k])
    assert cli("latest", "--resume", env=env).stdout == ""
    d = root / "exec" / "c.6.1000000" / "checkpoint-5"
    d.mkdir(parents=True)
    (d / "model.bin").write_bytes(b"w")  # a save holds a file
    monkeypatch.setenv("DISPATCH_ATTEMPT", "c.6.1000000")  # the execution that saved it publishes it
    pub = store.publish(str(d), root=str(root), epoch=1_000_000).publication
    monkeypatch.setenv("DISPATCH_ATTEMPT", "c.7.2000000")
    assert cli("latest", "--resume", env=env).stdout.strip() == str(d)
    assert store.resume_point(str(root)) == (str(d), 5)
    cli("latest", "--resume", env={**env, "RANK": "1"})  # another rank: nothing recorded
    got = [(e["by"], e["step"], e["name"]) for e in events.read(str(root), "c.7.2000000") if e["type"] == "resumed"]
    assert got == [("latest --resume", None, None), ("latest --resume", 5, pub.name), ("resume_point", 5, pub.name)]


def test_the_sweeps_record_is_not_called_an_epilogs(root, monkeypatch):
    """A node whose Epilog never ran for the execution (cut off) has its cessation recorded
    by a later job's sweep on that node: the report says so, not "(Epilog)"."""
    from dispatch_slurm.store import ceased
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    write_save(root, A1, 10, T0 + 10)
    for node, source in (("n1", "epilog"), ("n2", "sweep")):
        ceased.record(str(root), A1, node, {"by": "process scan"}, nodes=["n1", "n2"])
        _event(root, A1, "cessation", T0 + 60, node=node, source=source, nodes=["n1", "n2"])
    text = cli("report", root, check=True).stdout
    assert "ceased on n1 (Epilog), n2 (a later job's sweep)" in text, text
    (e,) = report.build(str(root))["executions"]
    assert e["cessation"]["sources"] == {"n1": "epilog", "n2": "sweep"}


def test_a_latest_whose_save_is_gone_is_said_and_fails_the_report(root, monkeypatch):
    """`latest` refuses a latest publication whose save is gone (exit 2): the report's header
    must not say "latest: step 20" and exit 0."""
    import shutil
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    _publish(root, A1, 10, T0 + 10)
    shutil.rmtree(_publish(root, A1, 20, T0 + 20))
    shutil.rmtree(root / "held" / store.latest(str(root)).name)  # by hand: the save and its held links
    assert cli("latest", root).returncode == 2
    res = cli("report", root)
    assert res.returncode == 2, res
    head = res.stdout.splitlines()[0]
    assert "latest: step 20" in head and "GONE" in head, head
    assert "retire" in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr


def test_the_report_names_which_execution_removed_which_published_save(root, monkeypatch):
    """The trainer's rotation (or an rm in its job script) removed its own published saves,
    the latest too: the report says whose folder they left, that the latest is still whole
    (its publication's held links), and exits 0."""
    import shutil
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    for step in (10, 20, 30):
        _publish(root, A1, step, T0 + step)
    for step in (10, 20, 30):
        shutil.rmtree(root / "exec" / A1 / f"checkpoint-{step}")
    res = cli("report", root)
    assert res.returncode == 0, res.stderr
    assert "latest: step 30" in res.stdout.splitlines()[0] and "GONE" not in res.stdout
    line = next(x for x in res.stdout.splitlines() if x.startswith(f"  {A1}: 3 saves removed"))
    assert "by that execution (its trainer's rotation, or an rm in its job script)" in line
    assert "step 30 kept whole by its publication's held links" in line and "step 10, 20 gone for good" in line
    got = json.loads(cli("report", root, "--json", check=True).stdout)["removed"]
    assert [(x["attempt"], x["held"], x["gone"]) for x in got] == [(A1, [30], [10, 20])]


FAKE_SLURM = r"""#!/usr/bin/env python3
import json, os, sys
cmd, args = os.path.basename(sys.argv[0]), sys.argv[1:]
if cmd == "sacct":
    print(json.dumps({"jobs": []}))
elif args == ["--version"]:
    print("slurm 24.11.5")
elif args[:2] == ["show", "config"]:
    print("ClusterName             = linux")
elif args[:2] == ["show", "job"]:
    print(open(os.environ["FAKE_SLURM_JOBS"]).read())
else:
    sys.exit(f"stand-in: {args}")
"""


def test_a_plugin_job_without_a_supervisor_record_is_read_from_slurm(tmp_path, monkeypatch):
    """A plugin job nobody supervised, its Epilog not (yet) recorded: its executions' ends
    come from Slurm (R=0 and R=1 requeued, R=2 COMPLETED), not "running, or unknown"; a job
    Slurm forgot says so."""
    monkeypatch.delenv("DISPATCH_ATTEMPT", raising=False)
    root = tmp_path / "root"
    for r in range(3):
        write_save(root, f"linux.79.{1_000_000 + r}", 10 * (r + 1), T0 + 100 * r)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("scontrol", "sacct"):
        (bin_ / name).write_text(FAKE_SLURM)
        (bin_ / name).chmod(0o755)
    job = {"job_id": 79, "job_state": ["COMPLETED"], "restart_cnt": 2, "nodes": "n1", "state_reason": "None",
           "user_name": "alice", "name": "train", "end_time": {"set": True, "number": int(T0 + 300)},
           "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "number": 0}}, "cluster": "linux"}
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": [job]}))
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_JOBS", str(tmp_path / "jobs.json"))
    text = cli("report", root, check=True).stdout
    assert "running, or unknown" not in text and "COMPLETED (Slurm)" in text, text
    r = report.build(str(root))
    assert [(e["ended"]["state"], e["ended"]["source"]) for e in r["executions"]] == \
        [("REQUEUED", "slurm"), ("REQUEUED", "slurm"), ("COMPLETED", "slurm")]
    assert r["executions"][2]["ended"]["at"] == T0 + 300
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": []}))
    gone = report.build(str(root))
    assert all(e["ended"] is None and "Slurm knows the job no more" in e["end_unknown"] for e in gone["executions"])


def test_a_finished_local_execution_is_said_to_have_ended(tmp_path):
    """`env --local` executions: one that finished (its processes are gone from this host)
    is "ended", one still running is "running" (the shell that ran `env --local` lives),
    never "running, or unknown"."""
    root = tmp_path / "root"
    root.mkdir()
    local_run(root, "set -- 10; " + LOCAL_SAVE)
    live = local_run(root, "set -- 20; " + LOCAL_SAVE + "; echo saved; read -r _", wait=False)
    try:
        assert live.stdout.readline().strip() == "saved"
        text = cli("report", root, check=True).stdout
        assert "running, or unknown" not in text and f"running: pid {live.pid} still runs" in text, text
        done, running = report.build(str(root))["executions"]
        assert (done["ended"]["state"], running["ended"]["state"]) == ("ended", "running"), (done, running)
    finally:
        live.kill()
        live.wait()
    assert all(e["ended"]["state"] == "ended" for e in report.build(str(root))["executions"])
