"""On docker-slurm (Slurm 24.11) with the plugin: a submitit job (the integration's
``Checkpointable``, submitted by submitit as its user does, the root given with
``slurm_additional_parameters={"dispatch-checkpoint": ROOT}``) through two time limits
(submitit's USR2, its checkpoint and ``scontrol requeue``), a preemption (SIGTERM: the
preemption handler saves, Slurm requeues) and a network cut (the cut-off execution keeps
counting while Slurm runs its replacement on another node). A user's loop polls the answer
all along (testbed/submitit_client.py): it is never an older execution's than the restart
count Slurm gave just before the look, and the last one is the last execution's. Every
execution resumed from the latest publication when it started, never from submitit's pickle;
then ``report`` and ``gc`` on that root, no supervisor: every execution's cessation from the
Epilogs' records, and gc collects what --keep-last allows. Last, the same job on a site
without the plugin (the root exported in submitit's ``slurm_setup``): through a time limit and
a preemption with one submission number.

On trixie (24.11) only: Python and submitit, the same on every release, and the 26.05 cluster
is CI's critical path."""

from __future__ import annotations

import json
import shlex
import time

import pytest

from dispatch_slurm.store import events
from testbed.cluster import CONTROLLER, Cluster
from test_epoch_claims import cluster_name
from test_evidence_on_slurm import entries
from test_no_plugin import no_plugin  # noqa: F401 -- the fixture
from test_spank_site import make_root

pytestmark = [pytest.mark.cluster, pytest.mark.only_on("trixie")]

CLIENT = "PYTHONPATH=/src/dispatch-slurm/tests python3 -m testbed.submitit_client"
# 300 s of counting: past two 2-minute executions (submitit's USR2 60-90 s in, see the client),
# a preemption and a cut, with ~100 s left for the last execution
STEPS, EVERY, PACE = 300, 10, 1.0


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


def _submit(c: Cluster, workdir, steps: int, site: str = "plugin"):
    """The job, submitted by submitit as its user does (testbed/submitit_client.py):
    (root, submitit's folder in the containers, the same on this host, job id)."""
    cdir, hdir = workdir
    root, folder = make_root(c, f"{cdir}/root"), f"{cdir}/submitit"
    job = c.exec(CONTROLLER, f"{CLIENT} submit {folder} {root} {steps} {EVERY} {PACE} {site}", user="alice")
    return root, folder, hdir / "submitit", int(job.stdout.split()[-1])


def test_submitit_job_through_time_limits_preemption_and_a_cut(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    root, folder, hfolder, job = _submit(c, workdir, STEPS)
    c.exec(CONTROLLER, f"setsid nohup bash -c {shlex.quote(f'{CLIENT} poll {folder} {job} {cdir}/polls {cdir}/stop')}"
                       f" > {cdir}/poll.log 2>&1 < /dev/null &", user="alice")
    runs = lambda: _records(hfolder, job)  # noqa: E731
    started = lambda r: (lambda: r in runs() and runs()[r])  # noqa: E731
    try:
        # two time limits: submitit's USR2 30 s before each, its checkpoint publishes, it requeues
        c.wait_job(job, lambda j: j.restart_count == 2, timeout=420)
        c.wait_until(started(2), timeout=120, what="execution R=2 to start")
        # a preemption: SIGTERM to the task, the handler saves and exits 0, Slurm requeues
        at = _step_of(runs()[2]) + EVERY
        c.wait_until(lambda: _step_of(runs()[2]) >= at, timeout=60, what="R=2 to publish")
        preemptor = c.preempt(job)
        c.wait_job(job, lambda j: j.restart_count == 3, timeout=120)
        c.set_time_limit(job, 5)  # the rest in one limit
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
            # and its batch script with it, while the node is still cut off (its slurmstepd stays,
            # retrying the completion): healed with the script still running, the node's
            # registration reports the job, slurmctld kills it, and an Epilog runs for it
            c.wait_until(lambda: not c.pids(node, f"submitit.core._submit|job0*{job}/slurm_script"),
                         timeout=180, what="R=3's batch script to end on the cut-off node")
        finally:
            c.heal(node)
        answer = json.loads(c.exec(CONTROLLER, f"{CLIENT} result {folder} {job}", user="alice").stdout)
        # R=3 ended while its node was cut off: Slurm runs no Epilog for it (its slurmstepd's
        # completion, sent once the node is back, is answered "wrong node"); the node's next
        # job, anyone's, records its cessation from the Prolog's record (the sweep, hooks/epilog.py)
        nxt = c.submit("bob", args=["-w", node, "-o", "/dev/null", "--wrap", "true"])
        c.wait_job(nxt, lambda j: j.ended, timeout=180)
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
    seen["report_gc"] = _report_and_gc(c, root, hdir, recs)
    (hdir / "observed.json").write_text(json.dumps(seen, indent=1))
    print("submitit on slurm:", json.dumps(seen, indent=1))


def _report_and_gc(c: Cluster, root: str, hdir, recs: dict[int, list[dict]]) -> dict:
    """``report`` and ``gc`` on the submitit root as its user, no supervisor record: every
    execution shown ceased on the node it ran on (the cut-off R=3 from the record the node's
    next job's hook made: its Epilog never ran), and gc removes all but the --keep-last newest saves."""
    attempts = [recs[r][0]["attempt"] for r in sorted(recs)]
    hosts = {recs[r][0]["attempt"]: recs[r][0]["host"] for r in recs}
    for a in attempts:
        c.wait_until(lambda: hosts[a] in entries(hdir, a), timeout=240, what=f"{a}'s Epilog record on {hosts[a]}")
    text = c.exec(CONTROLLER, ["dispatch-slurm", "report", root], user="alice").stdout
    print("\n" + text)
    ex = json.loads(c.exec(CONTROLLER, ["dispatch-slurm", "report", root, "--json"], user="alice").stdout)["executions"]
    assert [e["attempt"] for e in ex] == attempts, [e["attempt"] for e in ex]
    # each ended as Slurm or its events say (R=2: "PREEMPTED (grace save)"), and ceased on its node
    assert [e["cessation"]["ceased"] for e in ex] == [True] * len(attempts), [e["cessation"] for e in ex]
    assert [e["cessation"]["nodes"] for e in ex] == [[hosts[a]] for a in attempts], [e["cessation"] for e in ex]
    assert "running, or unknown" not in text, text
    exec_dir = hdir / "root" / "exec"
    c.wait_until(lambda: time.time() - max(p.stat().st_mtime for p in exec_dir.rglob("*")) > 6,
                 timeout=30, what="the exec folders to be quiet for --min-age")
    gc = ["dispatch-slurm", "gc", root, "--keep-last", "2", "--min-age", "5"]
    dry = c.exec(CONTROLLER, [*gc, "--dry-run"], user="alice").stdout
    assert "would remove" in dry and "unknown" not in dry and "not shown to have ceased" not in dry, dry
    real = json.loads(c.exec(CONTROLLER, [*gc, "--json"], user="alice").stdout)
    kept = [v["path"] for v in real if v["action"] == "keep"]
    removed = [v["path"] for v in real if v["action"] == "remove"]
    assert len(kept) == 2 and all(attempts[-1] in p for p in kept), kept
    assert removed and not any((hdir / p).exists() for p in removed), removed
    sources = {e["attempt"]: e["source"] for e in events.read(str(hdir / "root")) if e["type"] == "cessation"}
    assert sources[attempts[3]] == "sweep", sources
    return {"ended": [e["ended"]["state"] for e in ex if e["ended"]],
            "cessation_nodes": [e["cessation"]["nodes"] for e in ex], "cessation_sources": [sources[a] for a in attempts],
            "gc_kept": kept, "gc_removed": len(removed)}


NO_PLUGIN_STEPS = 150  # one time limit (R=0 counts 50-80), a preemption, the rest in R=2


def test_submitit_job_on_a_site_without_the_plugin(no_plugin: Cluster, workdir):  # noqa: F811
    """docs/submitit.md's submitit-no-plugin: the root exported in ``slurm_setup``; the
    TaskProlog of the job's srun step allocates its submission number (jobs/<cluster>.<job
    id>) in the first execution, the time limit's requeue (submitit's) and a preemption's
    (Slurm's) keep it; every execution resumes from the latest publication and the answer is
    the last execution's."""
    c = no_plugin
    cdir, hdir = workdir
    root, folder, hfolder, job = _submit(c, workdir, NO_PLUGIN_STEPS, "no-plugin")
    runs = lambda: _records(hfolder, job)  # noqa: E731
    c.wait_job(job, lambda j: j.restart_count == 1, timeout=240)
    c.wait_until(lambda: runs().get(1), timeout=120, what="execution R=1 to start")
    at = _step_of(runs()[1]) + EVERY
    c.wait_until(lambda: _step_of(runs()[1]) >= at, timeout=60, what="R=1 to publish")
    preemptor = c.preempt(job)
    c.wait_job(job, lambda j: j.restart_count == 2, timeout=120)
    c.cancel(preemptor)
    final = c.wait_job(job, lambda j: j.ended, timeout=300)
    answer = json.loads(c.exec(CONTROLLER, f"{CLIENT} result {folder} {job}", user="alice").stdout)
    assert "COMPLETED" in final.states, final
    recs = runs()
    assert sorted(recs) == [0, 1, 2], sorted(recs)
    name = cluster_name(c)
    assert [recs[r][0]["attempt"] for r in (0, 1, 2)] == [f"{name}.{job}.{1_000_000 + r}" for r in (0, 1, 2)]
    assert answer == {"answer": NO_PLUGIN_STEPS, "attempt": f"{name}.{job}.1000002", "resumed": recs[2][0]["resumed"]}
    assert (hdir / "root" / "jobs" / f"{name}.{job}").exists(), "the submission number is keyed by the job id"
    pubs = [e for e in events.read(str(hdir / "root")) if e["type"] == "published"]
    for r, rec in recs.items():
        before = [e for e in pubs if e["t"] < rec[0]["t_resume"]]
        want = max(before, key=lambda e: (e["epoch"], e["step"]), default=None)
        assert rec[0]["resumed"] == (want["step"] if want else 0), (r, rec[0], want)
    print("submitit without the plugin:", json.dumps({r: {"resumed_from": recs[r][0]["resumed"],
                                                          "last_step": _step_of(recs[r])} for r in recs}))
