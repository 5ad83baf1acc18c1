"""Issue 5 in CI: one short overlap trial of each scenario (fast profile) with both
modes side by side. Dispatch mode: no wrong resume, no mixed folder, no lost save.
Naive mode: the failure shows (the test can see it). Trials run on one cluster only
(one_release: the newest release, with cgroup tracking): they measure Slurm's timings,
which tests/cluster/test_cluster.py already checks on every release, and a trial costs
minutes."""

from __future__ import annotations

import time

import pytest

from testbed import trial
from testbed.cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]


@pytest.mark.parametrize("scenario", trial.SCENARIOS)
def test_overlap_is_harmless_in_dispatch_mode(slurm_cluster: Cluster, scenario):
    c = slurm_cluster
    t = trial.DockerTarget(c)
    base = f"/checkpoints/trial-{scenario}-{int(time.time())}"
    t.mkdir(base)
    results = {r.mode: r for r in trial.cluster_trial(t, scenario, ("naive", "dispatch"), base,
                                                      interval=1.0, warmup=3.0, log=print)}
    naive, dispatch = results["naive"], results["dispatch"]
    print(trial.table([naive, dispatch]))
    for r in results.values():  # the overlap really happened: the old one wrote after "ended"
        assert r.overlap_s > 0 and r.details["old_writes_after_end"] > 0, r
        assert r.details["lineages"]["new"] and r.details["lineages"]["third"], r
    assert (dispatch.wrong_resume, dispatch.mixed, dispatch.lost) == (False, 0, 0), dispatch
    assert dispatch.resumed_from == dispatch.details["lineages"]["new"]
    assert naive.wrong_resume or naive.mixed or naive.lost, f"naive mode showed no failure: {naive}"
