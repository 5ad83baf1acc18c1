"""Retention on the real cluster: `dispatch-slurm gc` running in a loop, as a user
would run it on a login node (the controller, as alice), throughout a real overlap
(cancel, preempt, partition: the trials' machinery, dispatch mode) never removes a
save while its execution still writes, and `latest` always names a whole save.

The gc asks Slurm which executions have ceased (the Epilog's ceased/ records for the
nodes Slurm says ran them); with `--keep-last 1 --min-age 0` only that evidence stands
between it and the saves. Checked from the trainers' own logs (every write with its
time) against gc's events (every removal, written once it is done), on one clock.
Slurm 24.11 only: the trials measure Slurm's behaviour, which tests/cluster/
test_trials.py already covers, and the CI budget is tight."""

from __future__ import annotations

import shlex
import time

import pytest

from dispatch_slurm.store import events
from testbed import trial
from testbed.cluster import CONTROLLER, Cluster

pytestmark = pytest.mark.cluster

LOOP = """
i=0
while [ ! -e {base}/gc.stop ]; do
  i=$((i+1))
  dispatch-slurm gc {root} --keep-last 1 --min-age 0 --json > {base}/gc/$i.json 2> {base}/gc/$i.err
  echo $? > {base}/gc/$i.rc
  if p=$(dispatch-slurm latest {root} --resume 2>> {base}/latest.err); then
    [ -z "$p" ] || [ -f "$p/trainer_state.json" ] || echo "$(date +%s.%N) latest: $p not whole" >> {base}/latest.bad
  else
    echo "$(date +%s.%N) latest failed" >> {base}/latest.bad
  fi
  sleep 0.5
done
touch {base}/gc.stopped
"""


def _loop(c: Cluster, base: str, root: str) -> None:
    c.exec(CONTROLLER, f"mkdir -p {base}/gc", user="alice")
    script = LOOP.format(base=base, root=root)
    c.exec(CONTROLLER, f"setsid nohup bash -c {shlex.quote(script)} > {base}/gc.log 2>&1 < /dev/null &", user="alice")


@pytest.mark.parametrize("scenario", trial.SCENARIOS)
def test_gc_in_a_loop_during_a_real_overlap_removes_only_what_has_stopped(slurm_cluster: Cluster, scenario):
    c = slurm_cluster
    if c.suite != "trixie":
        pytest.skip("run on the Slurm 24.11 cluster only (see the module doc)")
    t = trial.DockerTarget(c)
    base = f"/checkpoints/gc-{scenario}-{int(time.time())}"
    t.mkdir(base)
    root = f"{base}/dispatch/root"
    _loop(c, base, root)
    try:
        r, = trial.cluster_trial(t, scenario, ("dispatch",), base, interval=1.0, warmup=3.0, log=print)
    finally:
        c.exec(CONTROLLER, f"touch {base}/gc.stop", user="alice")
    host = c.path(base)
    c.wait_until(lambda: (host / "gc.stopped").exists(), timeout=60, what="the gc loop to stop")
    print(trial.table([r]))
    assert (r.wrong_resume, r.mixed, r.lost) == (False, 0, 0), r
    assert r.resumed_from == r.details["lineages"]["new"], "the third execution resumed from the replacement"

    rcs = {int(p.stem): int(p.read_text()) for p in (host / "gc").glob("*.rc")}
    ran = [i for i, rc in rcs.items() if rc == 0]
    assert ran, (host / "gc" / "1.err").read_text()
    errors = {i: (host / "gc" / f"{i}.err").read_text() for i, rc in rcs.items() if rc and i > min(ran)}
    assert not errors, errors  # before the first run that worked, the root did not exist yet
    assert not (host / "latest.bad").exists(), (host / "latest.bad").read_text()

    logs = trial.read_logs(str(host / "dispatch" / "logs"))
    last_write = {}
    for rec in logs:
        last_write[rec["lineage"]] = max(last_write.get(rec["lineage"], 0), rec["t"])
    removals = [(e["t"], p) for e in events.read(str(host / "dispatch" / "root")) if e["type"] == "gc"
                for p in e["removed"]]
    print(f"{len(ran)} gc runs, {len(removals)} saves removed")
    for when, path in removals:
        attempt = path.split("/")[1]
        assert attempt in last_write, f"gc removed {path}, a save of no execution of this trial"
        assert when > last_write[attempt], (f"gc removed {path} at {when:.3f}, but {attempt} still wrote at "
                                            f"{last_write[attempt]:.3f}")
    assert removals, "gc removed nothing at all"
    old = r.details["lineages"]["old"]
    if scenario != "partition":  # the old execution's Epilog records let gc collect it (after a partition,
        # which nodes ran R=0 of a requeued user-level job is unknown: its saves are kept)
        assert [p for _, p in removals if p.split("/")[1] == old], f"nothing of the old execution: {removals}"
