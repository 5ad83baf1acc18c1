"""Accounting on the real cluster (every release): slurmdbd with MariaDB records every
job, and the Slurm client reads a job slurmctld no longer holds from ``sacct`` with the
same facts slurmctld gave while it held it. The ``--json`` data_parser version is pinned.

Slurm forgets an ended job MinJobAge after it ended (fast profile: 180 s, Slurm's
default 300 s; its purge runs every minute). Every release here checks what sacct records
against what slurmctld gave, through the client's sacct path; the wait for slurmctld to
really forget (MinJobAge + the purge) is paid once, on one release, by
tests/cluster/test_supervisor.py::test_stopped_longer_than_min_job_age_decides_as_if_it_never_stopped,
whose supervisor then reads the job from sacct (`"via": "sacct"`)."""

from __future__ import annotations

import pytest

from dispatch_slurm.slurm import dialects
from testbed.cluster import CONTROLLER, Cluster, ClusterError, slurm_at_least
from dispatch_slurm.slurm.client import SlurmError

pytestmark = pytest.mark.cluster

def facts(j) -> tuple:
    return (j.job_id, j.state, j.restart_count, j.nodes, j.exit_code, j.exit_signal, j.start_time, j.end_time,
            j.partition, j.user, j.name)


def _three_ended_jobs(c: Cluster, cdir: str) -> dict[int, tuple]:
    """A failed job, a cancelled one and one requeued once, ended: their facts as
    slurmctld gives them while it holds them, in that order."""
    failed = c.submit("alice", args=["-o", "/dev/null", "-w", "c1", "--wrap", "exit 3"])
    cancelled = c.submit("alice", args=["-o", "/dev/null", "-w", "c2", "--wrap", "sleep 300"])
    requeued = c.submit("alice", args=["-o", "/dev/null", "-w", "c3", "--requeue", "--wrap",
                                       f"if [ -e {cdir}/again ]; then exit 0; fi; touch {cdir}/again; sleep 300"])
    c.wait_job(cancelled, "RUNNING")
    c.wait_job(requeued, "RUNNING")
    c.cancel(cancelled, user="alice")
    c.exec(CONTROLLER, ["scontrol", "requeue", str(requeued)])
    held = {}
    for job, state in ((failed, "FAILED"), (cancelled, "CANCELLED"), (requeued, "COMPLETED")):
        j = c.wait_job(job, lambda j, s=state: j.state == s and "COMPLETING" not in j.flags, timeout=120)
        assert j.source == "slurmctld"
        held[job] = facts(j)
    assert held[failed][4:6] == (3, None) and held[requeued][2] == 1
    return held


def _same(got, want: tuple, cancelled: bool) -> bool:
    """Every fact the supervisor uses is the same. (Not the exit status of a cancelled job,
    which the supervisor records but never decides by: slurmctld shows how the batch script
    ended, the accounting record the 0:0 it had when it was cancelled.)"""
    if cancelled:
        want = want[:4] + (got.exit_code, got.exit_signal) + want[6:]
    return facts(got) == want


def test_sacct_gives_the_facts_slurmctld_gave(slurm_cluster: Cluster, workdir):
    """Every release: what ``sacct`` records (read through the client's sacct path, as for a
    job slurmctld forgot) is what slurmctld gave, for a failed, a cancelled and a requeued
    job. slurmdbd records asynchronously: polled until it has the job's end."""
    c = slurm_cluster
    alice = c.slurm_as("alice")
    held = _three_ended_jobs(c, workdir[0])
    cancelled = list(held)[1]
    assert all(alice.job(j).source == "slurmctld" for j in held)  # held: job() asks slurmctld first
    for job, want in held.items():
        def recorded(job=job, want=want):
            got = alice.accounted_job(job)
            return got is not None and got.source == "sacct" and _same(got, want, job == cancelled)
        try:
            c.wait_until(recorded, timeout=60, what=f"sacct to record job {job} as slurmctld gave it")
        except ClusterError as e:
            raise AssertionError(f"{e}: sacct has {alice.accounted_job(job)}, slurmctld gave {want}") from None
    assert alice.find_job(999_999) is None
    with pytest.raises(SlurmError, match="not known to slurmctld nor to sacct"):
        alice.job(999_999)


def test_the_json_version_is_pinned(slurm_cluster: Cluster, monkeypatch):
    """24.11 and 26.05 print data_parser v0.0.42 when asked (26.05's default is v0.0.45);
    a version the release lacks is refused with a message naming it. 22.05 has none."""
    c = slurm_cluster
    s = c.slurm_as("alice")
    if not slurm_at_least(c, "24.11"):
        assert isinstance(s.dialect, dialects.Slurm2205)
        return
    assert isinstance(s.dialect, dialects.Slurm2411)
    data = s.dialect.pinned_json(s, ["scontrol", "show", "nodes"])
    assert data["meta"]["plugin"]["data_parser"] == f"data_parser/{dialects.DATA_PARSER}"
    monkeypatch.setattr(dialects, "DATA_PARSER", "v0.0.39")
    with pytest.raises(SlurmError, match=r"has no data_parser v0\.0\.39, the JSON version dispatch-slurm reads"):
        s.nodes()
