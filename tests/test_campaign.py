"""The fault campaign's seeded draws and commands, without a cluster (tests/testbed/campaign/):
one seed is one run (its setup and its fault schedule), fixing a setup axis leaves the other
draws as they were, the documented commands parse and cover what they claim, and the
trainer's state is a pure function of the steps applied."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO
from testbed import campaign, dettrain
from testbed.bed import ClusterError

P = campaign.Params()


def test_a_seed_is_one_run_and_fixing_an_axis_keeps_the_other_draws():
    assert campaign.setup_for(5) == campaign.setup_for(5) and campaign.schedule_for(5, P) == campaign.schedule_for(5, P)
    seeds = range(1, 60)
    assert len({campaign.setup_for(s).label() for s in seeds}) > 30, "setups vary with the seed"
    assert len({tuple(f.kind for f in campaign.schedule_for(s, P)) for s in seeds}) > 40
    for s in seeds:
        free, fixed = campaign.setup_for(s), campaign.setup_for(s, {"output": "append"})
        assert fixed.output == "append"
        assert (fixed.trainer, fixed.ranks, fixed.launcher, fixed.signal) == \
            (free.trainer, free.ranks, free.launcher, free.signal)
        assert campaign.schedule_for(s, P) == campaign.schedule_for(s, P)  # a setup never moves the faults


def test_the_runs_take_the_checkouts_readme_job_script():
    """A run's dispatch side submits the README's job script (its `job-script` snippet, without
    the view): the campaign finds this checkout's README wherever its own module lives."""
    assert campaign.README == Path(__file__).resolve().parents[1] / "README.md"
    script = campaign.readme_job_script(campaign.README)
    assert "#SBATCH --time=" in script and "dispatch-slurm latest --resume" in script


def test_setups_that_cannot_be_run_are_redrawn_or_refused():
    for s in range(1, 80):
        got = campaign.setup_for(s, hf=False)
        assert got.trainer != "hf"
        if got.launcher == "plugin":
            assert got.gc == 0, "gc is run's --keep-last"
        if campaign.setup_for(s).trainer == "hf":
            assert campaign.setup_for(s).ranks == 1
    with pytest.raises(ClusterError, match="--suite bookworm"):
        campaign.setup_for(1, {"trainer": "hf"}, hf=False)
    with pytest.raises(ClusterError, match="launcher=run"):
        campaign.setup_for(1, {"launcher": "plugin", "gc": 2})
    with pytest.raises(ClusterError, match="unknown axis 'rank'"):
        campaign.parse_setup("rank=2")
    assert campaign.parse_setup("trainer=own,ranks=2,signal=1") == {"trainer": "own", "ranks": 2, "signal": True}


def test_faults_overlap_and_kinds_can_be_limited():
    overlapping = 0
    for s in range(1, 100):
        sched = campaign.schedule_for(s, P)
        assert 2 <= len(sched) <= 5 and sched == sorted(sched, key=lambda f: f.at)
        overlapping += any(a.at + a.duration > b.at for a, b in zip(sched, sched[1:]))
        for f in sched:
            if f.kind == "partition-long":
                assert f.duration > P.min_job_age, "longer than MinJobAge"
    assert overlapping > 30, "many schedules put a fault in force while the next one starts"
    quick = campaign.Params(kinds=("cancel", "stall"))
    assert {f.kind for s in range(1, 40) for f in campaign.schedule_for(s, quick)} == {"cancel", "stall"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True,
                          cwd=REPO / "tests", timeout=120)


def documented(page: str, name: str) -> list[list[str]]:
    """The `python -m testbed campaign` lines of the snippet ``name`` of ``page``, as argv."""
    text = (REPO / "docs" / page).read_text()
    block = re.search(rf"<!-- snippet: {name};.*?-->\n```sh\n(.*?)```", text, re.S)
    assert block, f"{page} has no snippet {name}"
    lines = block[1].replace("\\\n", " ").splitlines()
    out = []
    for line in lines:
        words = shlex.split(line.split("#")[0])
        if words[1:5] == ["python", "-m", "testbed", "campaign"]:
            out.append(words[5:])
    assert out, f"{page}'s snippet {name} runs no campaign"
    return out


def test_the_long_campaign_command_covers_every_fault_kind_and_setup():
    (argv,) = documented("evidence.md", "long-campaign")
    res = cli("campaign", *argv, "--dry-run")
    assert res.returncode == 0, res.stderr
    summary = res.stdout.splitlines()[-1]
    m = re.match(r"(\d+) runs, (\d+) setups, (\d+) faults: (.*)", summary)
    assert m and int(m[3]) >= 200 and int(m[2]) >= 10, summary
    assert {k.split()[0] for k in m[4].split(", ")} == set(campaign.KINDS), "every fault kind"
    assert "hf/" in res.stdout, "the Hugging Face setups (bookworm)"


def test_the_long_campaign_in_two_halves_covers_200_faults_and_makes_one_table(tmp_path):
    """What ran: two halves side by side on two clusters, each from its own seed, merged."""
    *halves, merge = documented("evidence.md", "long-campaign-halves")
    total, seeds = 0, []
    for argv in halves:
        res = cli("campaign", *argv, "--dry-run")
        assert res.returncode == 0, res.stderr
        m = re.match(r"(\d+) runs, (\d+) setups, (\d+) faults", res.stdout.splitlines()[-1])
        assert m, res.stdout
        total += int(m[3])
        seeds.append(set(re.findall(r"^seed (\d+):", res.stdout, re.M)))
    assert len(halves) == 2 and total >= 200 and not seeds[0] & seeds[1], (total, "no seed run twice")
    files = [a for a in merge if a.endswith((".json", ".md"))]
    for i, name in enumerate(f for f in files if f.endswith(".json")):
        (tmp_path / name).write_text(json.dumps([result(1000 + 100 * i, [])]))
    res = subprocess.run([sys.executable, "-m", "testbed", "campaign", *merge], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    assert res.returncode == 0, res.stderr
    assert "| 2 (1000, 1100) |" in (tmp_path / files[-1]).read_text()


def test_the_development_pages_campaign_commands_parse():
    for argv in documented("development.md", "campaign-one-seed"):
        argv = [a for a in argv if a != "--dry-run"]
        res = cli("campaign", *argv, "--dry-run")
        assert res.returncode == 0, res.stderr
        assert "runs," in res.stdout.splitlines()[-1]


def test_the_slurmd_stop_campaign_command_parses():
    """Before and after the fix: the same runs under the same schedule."""
    plans = []
    for name in ("campaign-slurmd-stop", "campaign-slurmd-stop-after"):
        (argv,) = documented("evidence.md", name)
        res = cli("campaign", *argv, "--dry-run")
        assert res.returncode == 0, res.stderr
        assert re.match(r"3 runs, 3 setups, \d+ faults: slurmd-stop \d+$", res.stdout.splitlines()[-1]), res.stdout
        plans.append(res.stdout)
    assert plans[0] == plans[1]


def test_slurmd_is_frozen_longer_than_slurmd_timeout_beside_the_other_kinds():
    """slurmd-stop is drawn among every kind; each one outlasts the profile's SlurmdTimeout
    (15 s fast; Slurm's default 300 s), so slurmctld takes the node for dead while the job's
    processes run on."""
    drawn = [f for s in range(1, 100) for f in campaign.schedule_for(s, P) if f.kind == "slurmd-stop"]
    assert len(drawn) > 10 and all(45 <= f.duration <= 90 for f in drawn)
    assert "slurmd-stop" in campaign.NODE_FAULTS and "slurmd-stop" in campaign.checker.OTHER_ENDS
    site = campaign.Params(slurmd_timeout=300, kinds=("slurmd-stop",))
    assert all(f.duration >= 330 for s in range(1, 20) for f in campaign.schedule_for(s, site))
    before = campaign.Params(kinds=tuple(k for k in campaign.KINDS if k not in campaign.ADDED))
    for s in range(1000, 1140):  # an older seed keeps its faults, but for those the added kind took
        now, then = campaign.schedule_for(s, P), campaign.schedule_for(s, before)
        assert [(f.at, f.pick) for f in now] == [(f.at, f.pick) for f in then]
        assert all(a == b or a.kind in campaign.ADDED for a, b in zip(now, then)), s


def test_the_replay_command_replays_the_same_run():
    cmd = campaign.replay_command("trixie", 17, "dispatch", setup="ranks=2", steps=200, kinds=("cancel",))
    argv = shlex.split(cmd.split("python -m testbed ", 1)[1])
    res = cli(*argv, "--dry-run")
    assert res.returncode == 0, res.stderr
    want = campaign.setup_for(17, {"ranks": 2}, hf=False).label()
    assert res.stdout.startswith(f"seed 17: {want}: cancel@"), res.stdout


def test_the_trainers_state_is_a_pure_function_of_the_steps_applied():
    ref = dettrain.chain(7, 2, 50)
    h = ref[20]
    for k in range(21, 51):
        h = dettrain.step_hash(h, k, 7, 2)
    assert h == ref[50], "resuming from step 20's state ends where the uninterrupted run ends"
    repeated = dettrain.step_hash(ref[20], 20, 7, 2)  # step 20 applied twice
    for k in range(21, 51):
        repeated = dettrain.step_hash(repeated, k, 7, 2)
    skipped = ref[19]
    for k in range(21, 51):
        skipped = dettrain.step_hash(skipped, k, 7, 2)
    assert len({ref[50], repeated, skipped, dettrain.chain(8, 2, 50)[50], dettrain.chain(7, 1, 50)[50]}) == 5


def test_a_resume_folds_in_the_id_of_the_save_it_loaded(tmp_path, monkeypatch):
    """The trainer itself: two executions' saves of one step hold one state (the chain), but
    a resume from each diverges by the save's id, as real training does after a restart."""
    ref = dettrain.chain(7, 1, 30)
    states = {}
    for attempt in ("c.1.1000000", "c.2.2000000"):
        out = tmp_path / attempt
        log = tmp_path / f"{attempt}.jsonl"
        monkeypatch.setenv("DISPATCH_ATTEMPT", attempt)  # the save's writer
        dettrain.main(["--output-dir", str(out), "--max-steps", "20", "--save-every", "10", "--step-time", "0",
                       "--seed", "7", "--ranks", "1", "--log", str(log)])
        assert (out / "checkpoint-20" / "model.bin").read_text().split()[0] == ref[20]
        nxt = tmp_path / f"next-{attempt}"
        monkeypatch.setenv("DISPATCH_ATTEMPT", f"next-{attempt}")
        dettrain.main(["--output-dir", str(nxt), "--resume-from", str(out / "checkpoint-20"), "--max-steps", "30",
                       "--step-time", "0", "--seed", "7", "--ranks", "1", "--log", str(log)])
        recs = [json.loads(line) for line in log.read_text().splitlines()]
        resume, done = (next(r for r in reversed(recs) if r["op"] == op) for op in ("resume", "done"))
        sid = json.loads((out / "checkpoint-20" / "data.json").read_text())["save_id"]
        h = dettrain.resumed(ref[20], sid)
        for k in range(21, 31):
            h = dettrain.step_hash(h, k, 7, 1)
        assert resume["h"] == ref[20] and resume["save_id"] == sid and done["h"] == h != ref[30]
        states[attempt] = done["h"]
    assert len(set(states.values())) == 2, "resumes from two lineages' saves of one step end apart"


def result(seed: int, anomalies: list[str]) -> dict:
    """One run's result as the campaign's --json holds it."""
    gp = {"goodput": 0.5, "wall_s": 100.0, "buckets": {k: 0.0 for k in campaign.goodput.BUCKETS},
          "prediction": {"young": 0.4, "daly": 0.6}}
    gp["buckets"].update(productive=50.0, restart=50.0)
    mode = {"outcome": {"state": "done"}, "events": [], "goodput": gp,
            "anomalies": [{"cls": c, "detail": ""} for c in anomalies]}
    return {"seed": seed, "label": f"own/1r/default/run/{seed}", "faults": [{"kind": "cancel", "missed": False}],
            "modes": {"dispatch": mode, "naive": {**mode, "anomalies": []}}}


def test_campaigns_run_side_by_side_make_one_table(tmp_path):
    for name, seeds in (("a.json", (1000, 1001)), ("b.json", (1100,))):
        (tmp_path / name).write_text(json.dumps([result(s, []) for s in seeds]))
    res = cli("campaign", "--from-json", str(tmp_path / "a.json"), "--from-json", str(tmp_path / "b.json"),
              "--table", str(tmp_path / "table.md"))
    assert res.returncode == 0, res.stderr
    assert "| 3 (1000-1001, 1100) |" in (tmp_path / "table.md").read_text()


def test_the_evidence_table_names_each_anomaly_class_with_its_seeds():
    table = campaign.evidence([result(3, ["end-misjudged", "end-misjudged"]), result(4, []), result(5, ["final-state"]),
                               result(9, [])])
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert "| 4 (3-5, 9) |" in rows["runs (seeds)"], "seeds as runs: campaigns merged by --from-json"
    assert "end-misjudged: 1 runs (3); final-state: 1 runs (5)" in rows["anomalies by class (seeds)"]
    assert rows["anomalies by class (seeds)"].endswith("| none |"), "naive mode had none"
    assert "cancel 4" in rows["faults applied"] and "**50.0%**" in rows["goodput (productive steps / wall)"]
    assert "40.0% / 60.0%" in rows["Young / Daly predicted (per run, mean)"]


def test_evidence_explains_every_anomaly_class():
    text = (REPO / "docs" / "evidence.md").read_text()
    for cls, meaning in campaign.checker.CLASSES.items():
        assert f"| `{cls}` | {meaning} |" in text, f"docs/evidence.md does not explain {cls}"
