"""`dispatch-slurm report`: the executions, overlaps, holds, publications and lost steps
of a root, read from a real root on a real filesystem (the cluster test draws one from a
real docker-slurm run)."""

import json
import os

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
