"""Issue 28 on docker-slurm 26.05 with the plugin: a submitit job (the integration's
``Checkpointable``, submitted by submitit as its user does, the root given with
``slurm_additional_parameters={"dispatch-checkpoint": ROOT}``) through two time limits
(submitit's USR2, its checkpoint and ``scontrol requeue``), a preemption (SIGTERM: the
preemption handler saves, Slurm requeues) and a network cut (the cut-off execution keeps
counting while Slurm runs its replacement on another node). A user's loop polls the answer
all along (testbed/submitit_client.py): it is never an older execution's than the restart
count Slurm gave just before the look, and the last one is the last execution's. Every
execution resumed from the latest publication when it started, never from submitit's pickle."""

from __future__ import annotations

import json
import shlex
import time

import pytest

from dispatch_slurm.store import events
from testbed.cluster import CONTROLLER, Cluster
from test_spank_site import make_root

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]

CLIENT = "PYTHONPATH=/src/dispatch-slurm/tests python3 -m testbed.submitit_client"
STEPS, EVERY, PACE = 300, 10, 0.5  # 150 s of counting: past two 30 s executions, a preemption, a cut


def _records(folder, job: int) -> dict[int, list[dict]]:
    """Each execution's own log lines (the integration's per-execution logs), by R."""
    out = {}
    for path in sorted(folder.glob(f"{job}_0_log.*.out")):
        r = int(path.name.split(".")[-2]) % 10**6
        out[r] = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return out


def _text(path) -> str:
    return path.read_text() if path.exists() else ""


def _step_of(records: list[dict]) -> int:
    return max([r.get("step", 0) for r in records] + [records[0]["resumed"]]) if records else 0


def test_submitit_job_through_time_limits_preemption_and_a_cut(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    folder, hfolder = f"{cdir}/submitit", hdir / "submitit"
    job = int(c.exec(CONTROLLER, f"{CLIENT} submit {folder} {root} {STEPS} {EVERY} {PACE}",
                     user="alice").stdout.split()[-1])
    c.exec(CONTROLLER, f"setsid nohup bash -c {shlex.quote(f'{CLIENT} poll {folder} {job} {cdir}/polls {cdir}/stop')}"
                       f" > {cdir}/poll.log 2>&1 < /dev/null &", user="alice")
    runs = lambda: _records(hfolder, job)  # noqa: E731
    started = lambda r: (lambda: r in runs() and runs()[r])  # noqa: E731
    try:
        # two time limits: submitit's USR2 30 s before each, its checkpoint publishes, it requeues
        c.wait_job(job, lambda j: j.restart_count == 2, timeout=240)
        c.wait_until(started(2), timeout=120, what="execution R=2 to start")
        # a preemption: SIGTERM to the task, the handler saves and exits 0, Slurm requeues
        at = _step_of(runs()[2]) + EVERY
        c.wait_until(lambda: _step_of(runs()[2]) >= at, timeout=60, what="R=2 to publish")
        preemptor = c.preempt(job)
        c.wait_job(job, lambda j: j.restart_count == 3, timeout=120)
        c.exec(CONTROLLER, ["scontrol", "update", f"jobid={job}", "TimeLimit=5"])  # the rest in one limit
        c.cancel(preemptor)
        c.wait_until(started(3), timeout=120, what="execution R=3 to start")
        node = c.job(job).nodes[0]
        at = _step_of(runs()[3]) + EVERY
        c.wait_until(lambda: _step_of(runs()[3]) >= at, timeout=60, what="R=3 to publish")
        # the network cut: R=3 keeps counting on its node; Slurm requeues the job elsewhere
        c.partition(node)
        try:
            c.wait_job(job, lambda j: j.restart_count == 4, timeout=180)
            c.wait_until(started(4), timeout=180, what="execution R=4 to start on another node")
            final = c.wait_job(job, lambda j: j.ended, timeout=240)
            c.wait_until(lambda: any(r["event"] == "done" for r in runs()[3])
                         and "a newer execution" in _text(hfolder / f"{job}_0_log.{1_000_003}.err")
                         or (hfolder / f"{job}_0_result.{1_000_003}.pkl").exists(),
                         timeout=240, what="the cut-off R=3 to end (outranked, or answered first)")
        finally:
            c.heal(node)
        answer = json.loads(c.exec(CONTROLLER, f"{CLIENT} result {folder} {job}", user="alice").stdout)
    finally:
        c.exec(CONTROLLER, f"touch {cdir}/stop", user="alice")
    assert "COMPLETED" in final.states, final
    recs = runs()
    assert sorted(recs) == [0, 1, 2, 3, 4], sorted(recs)
    newest = f"{recs[4][0]['attempt']}"
    assert answer == {"answer": STEPS, "attempt": newest, "resumed": recs[4][0]["resumed"]}, answer

    # every execution resumed from the latest publication when it started; none from the pickle
    pubs = [e for e in events.read(str(hdir / "root")) if e["type"] == "published"]
    resumed = {}
    for r, rec in recs.items():
        start = rec[0]
        assert start["event"] == "start" and start["pickled_step"] is None, start
        before = [e for e in pubs if e["t"] < start["t_resume"]]
        want = max(before, key=lambda e: (e["epoch"], e["step"]), default=None)
        assert start["resumed"] == (want["step"] if want else 0), (r, start, want)
        resumed[r] = (start["host"], start["resumed"])

    # the user's loop: never an older execution's answer than Slurm's restart count at the look
    polls = [json.loads(line) for line in (hdir / "polls").read_text().splitlines()]
    answers = [p for p in polls if p["outcome"] == "answer"]
    for p in answers:
        r = int(p["value"]["attempt"].rsplit(".", 1)[1]) % 10**6
        assert p["restarts"] is None or r >= p["restarts"], p
    assert not [p for p in polls if p["outcome"] == "error"], [p for p in polls if p["outcome"] == "error"][:3]
    old_err = _text(hfolder / f"{job}_0_log.{1_000_003}.err")
    r4_start, r3_end = recs[4][0]["t"], recs[3][-1]["t"]
    overlap = [p for p in polls if r4_start <= p["t"] <= r3_end]
    late = [e for e in pubs if e["epoch"] % 10**6 == 3 and e["t"] > r4_start]
    seen = {
        "executions": {r: {"host": h, "resumed_from": s, "last_step": _step_of(recs[r]),
                           "last_event": recs[r][-1]["event"]} for r, (h, s) in resumed.items()},
        "cut_node": node,
        "old_R3_ended": "exited writing nothing (a newer execution existed)" if "a newer execution" in old_err
                        else "answered before R=4 claimed its epoch",
        "overlap_s": round(r3_end - r4_start, 1),
        "old_R3_publications_during_overlap": [e["step"] for e in late],
        "latest_at_end": max(((e["epoch"], e["step"]) for e in pubs)),
        "polls": {k: sum(p["outcome"] == k for p in polls) for k in ("absent", "stale", "answer")},
        "polls_during_overlap": {k: sum(p["outcome"] == k for p in overlap) for k in ("absent", "stale", "answer")},
        "answers_by_attempt": sorted({p["value"]["attempt"] for p in answers}),
        "stale_reasons": sorted({p["why"][:90] for p in polls if p["outcome"] == "stale"}),
        "publications": len(pubs), "final": answer, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (hdir / "observed.json").write_text(json.dumps(seen, indent=1))
    print("submitit on slurm:", json.dumps(seen, indent=1))
