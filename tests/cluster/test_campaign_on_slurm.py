"""A short fault campaign on the real cluster (CI's cut of `python -m testbed campaign`):
a few seeded runs, dispatch mode beside one shared folder under the same overlapping
faults, each mode judged by the independent checker (tests/testbed/checker.py) from the
root, sacct and the trainer's log; dispatch mode must end every run done, at the
uninterrupted run's state, with no anomaly.

The seeds and setups are fixed (a failing run is replayed by the command the test prints);
the faults are the quick kinds (no node crash or long partition: CI's cluster time is ~5
minutes), and the filesystem the conftest cluster has no tmpfs of its own to fill. The
long campaign is docs/evidence.md's command."""

from __future__ import annotations

import pytest

from testbed import campaign

pytestmark = [pytest.mark.cluster, pytest.mark.only_on("trixie")]

QUICK = ("timelimit", "cancel", "preempt", "requeue", "partition", "stall", "ctld-restart", "stray")
RUNS = {  # seed -> the setup axes fixed (the rest drawn from the seed)
    7: "trainer=handler,launcher=run,output=append,ranks=1",
    11: "trainer=own,launcher=plugin,ranks=2,output=default",
}


def test_a_short_campaign_keeps_every_dispatch_run_whole(slurm_cluster):
    params = campaign.Params(steps=160, deadline_s=330, mean_gap_s=12, kinds=QUICK)
    camp = campaign.Campaign(slurm_cluster, params, say=lambda m: print(m, flush=True), suite=slurm_cluster.suite)
    results = []
    for seed, fixed in RUNS.items():
        camp.fixed_text = fixed
        results.append(camp.run_one(seed, ("dispatch", "naive"), campaign.parse_setup(fixed)))
    print(campaign.summarize(results))
    assert sum(1 for r in results for a in r["faults"] if not a["missed"]) >= 3, "the nemesis hit the runs"
    for r in results:
        d = r["modes"]["dispatch"]
        assert d["anomalies"] == [], (r["seed"], d["anomalies"], d["replay"])
        assert d["outcome"]["state"] == "done", (r["seed"], d["outcome"], d["replay"])
        assert d["goodput"]["finished"] and 0 < d["goodput"]["goodput"] <= 1, d["goodput"]
        assert "naive" in r["modes"] and r["modes"]["naive"]["goodput"].get("wall_s"), "both modes ran"
