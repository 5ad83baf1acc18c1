"""`dispatch-slurm report`: the executions, overlaps, holds, publications and lost steps
of a root, read from a real root on a real filesystem (the cluster test draws one from a
real docker-slurm run)."""

import json
import os
import pathlib
import time

import pytest
from support import cli

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
    assert i["resumed_from"]["step"] == 20 and i["steps_lost"] == 10  # saved 30, resumed from 20
    (h,) = r["holds"]
    assert [a["answer"] for a in h["answers"]] == ["not_ceased"] and h["released"]["by"] == "cessation signal"
    assert r["latest"]["step"] == 40


def test_report_cli_text_json_and_png(story, tmp_path):
    text = cli("report", story, check=True).stdout
    assert "steps lost: 10" in text and "old kept writing 3.0s" in text and "REQUEUED" in text
    j = json.loads(cli("report", story, "--json", check=True).stdout)
    assert len(j["executions"]) == 2
    png = tmp_path / "timeline.png"
    cli("report", story, "--plot", png, check=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_report_of_an_unusable_root_is_one_line(tmp_path):
    bad = cli("report", tmp_path / "nope")
    assert bad.returncode == 2 and "does not exist" in bad.stderr and len(bad.stderr.splitlines()) == 1


# ---- issue 28: a plugin job nobody supervised, read from the hooks' evidence -----------------

NOBODY = {"SLURM_JOB_UID": "65534", "SLURM_JOB_GID": "65534", "SLURM_JOB_USER": "nobody"}
OPT = "SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the hooks drop to the job user")


def _as_nobody(fn, *args):
    from dispatch_slurm.slurm import hooks
    res = hooks.as_job_user(NOBODY, fn, *args)
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
    Epilog on nodes n1 and n2, as the issue saw it: R=0 starts at T0, publishes 60 and 70,
    and publishes 80 a second after R=1 started (T0+100): R=1 resumed from 70 and saves 90
    at T0+130. R=1 last writes at T0+171; R=2 starts at T0+200, first saves at T0+230."""
    import shutil
    import tempfile
    from dispatch_slurm.slurm import hooks
    monkeypatch.setattr(hooks, "LOG", str(tmp_path / "hooks.log"))
    monkeypatch.setattr(hooks, "hostnames", getattr(hooks, "expand_hostlist", None), raising=False)
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
        for node in ("n1", "n2"):
            monkeypatch.setattr(hooks, "RUN_DIR", str(tmp_path / f"run-{node}"))
            assert getattr(hooks, name)(env(node, r)) == 0

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
