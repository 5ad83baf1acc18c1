"""Goodput (dispatch_slurm/report/goodput.py): the split of wall time into buckets, Young's
and Daly's predictions, and the estimate `dispatch-slurm report` makes from a root alone,
checked against what the trainer's own log says happened (a real local run)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_slurm import report
from dispatch_slurm.report import goodput
from support import REPO
from testbed import campaign, checker, wait


def test_split_gives_an_instant_to_the_first_bucket_and_the_rest_to_restart():
    got = goodput.split(0, 100, [(10, 50, "recomputed"), (40, 60, "productive"), (55, 70, "save"),
                                 (80, 120, "queue"), (-5, 5, "restore")])
    assert got == {"productive": 20, "save": 10, "recomputed": 30, "restore": 5, "queue": 20, "restart": 15}
    assert sum(got.values()) == 100
    s = goodput.summary(got)
    assert s["goodput"] == 0.2 and s["wall_s"] == 100


def test_daly_and_young_predict_less_goodput_for_more_faults_and_peak_at_their_interval():
    few = goodput.young_daly(300, 10, 60, 24 * 3600)
    many = goodput.young_daly(300, 10, 60, 600)
    assert 0.9 < few["daly"] < 1 and many["daly"] < few["daly"] and many["young"] < few["young"]
    # Daly's optimum for delta=10 s, M=1 h: sqrt(2 delta M)(1 + sqrt(delta/2M)/3 + delta/18M) - delta
    best = goodput.young_daly(1, 10, 0, 3600)["daly_tau_s"]
    assert best == pytest.approx(math.sqrt(72000) * (1 + math.sqrt(10 / 7200) / 3 + 10 / 64800) - 10)
    at = goodput.young_daly(best, 10, 0, 3600)["daly"]
    assert at > goodput.young_daly(best / 2, 10, 0, 3600)["daly"] and at > goodput.young_daly(best * 2, 10, 0, 3600)["daly"]
    assert goodput.young_daly(best, 10, 0, 3600)["young_tau_s"] == pytest.approx(math.sqrt(72000))


def local_run(tmp_path: Path, stop_at: int):
    """Two executions through dispatch-slurm's own commands (env --local, latest --resume,
    watch): the first untrapped and killed by SIGTERM at ``stop_at`` steps (its steps after
    the last published save are lost), the second resumes and finishes."""
    bindir = Path(sys.executable).parent
    root, log = tmp_path / "root", tmp_path / "train.jsonl"
    root.mkdir()
    script = (f"set -euo pipefail\neval \"$({bindir}/dispatch-slurm env --local)\"\n"
              f"resume=$({bindir}/dispatch-slurm latest --resume)\n"
              f"{sys.executable} {REPO}/tests/testbed/dettrain.py --output-dir \"$DISPATCH_EXEC_DIR\" "
              "${resume:+--resume-from \"$resume\"} --max-steps 120 --step-time 0.05 --save-every 20 --warmup 0.5 "
              f"--trap none --log {log} & T=$!\n"
              f"{bindir}/dispatch-slurm watch --until-pid $T --no-inotify --poll 0.1\nwait $T\n")
    env = {**os.environ, "DISPATCH_CHECKPOINT": str(root)}
    first = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
    wait.until(lambda: log.exists() and f'"step": {stop_at},' in log.read_text(), timeout=60, what=f"{stop_at} steps")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(60)
    assert subprocess.run(["bash", "-c", script], env=env, timeout=120).returncode == 0
    return root, log


def test_the_reports_estimate_from_the_root_agrees_with_the_trainers_log(tmp_path):
    """The report's goodput, from the publications' times alone, against the same run's
    buckets from the trainer's log: productive and recomputed within a few seconds, and
    `report` prints it."""
    root, log = local_run(tmp_path, stop_at=50)
    run = checker.Run(mode="dispatch", trainer="det", max_steps=120, save_every=20, step_time=0.05, ranks=1, seed=0,
                      trap="none", trainer_log=str(log), root=str(root), root_in_cluster=str(root))
    measured = campaign.measured_goodput(run, faults=1, p=campaign.Params(steps=120, step_time=0.05))
    est = report.build(str(root))["goodput"]
    print(json.dumps({"measured": measured, "estimate": est}, indent=1))
    assert measured["finished"] and est is not None
    # 120 steps kept; 10 (41-50, after the last publication) recomputed, which the root cannot
    # see without Slurm's word on when the first execution ended (no Slurm here)
    assert measured["buckets"]["recomputed"] == pytest.approx(10 * 0.05, abs=0.3)
    assert est["buckets"]["productive"] == pytest.approx(measured["buckets"]["productive"], rel=0.15)
    assert est["buckets"]["recomputed"] <= measured["buckets"]["recomputed"] + 0.2
    assert 0 < est["goodput"] < 1
    text = subprocess.run([str(Path(sys.executable).parent / "dispatch-slurm"), "report", str(root)],
                          capture_output=True, text=True, check=True).stdout
    assert "goodput: " in text and "badput: " in text, text


def test_a_root_with_nothing_published_has_no_goodput(tmp_path):
    root = tmp_path / "root"
    (root / "pub").mkdir(parents=True)
    assert report.build(str(root))["goodput"] is None
