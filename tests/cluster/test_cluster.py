"""docker-slurm cluster tests, on Slurm 22.05 (bookworm) and 24.11 (trixie).

Every test drives the real cluster and asserts the states Slurm reports (through
dispatch_slurm.slurm, i.e. squeue/sinfo --json on 22.05, scontrol --json on 24.11)
and what the processes did; waits poll with a bounded deadline.
"""

from __future__ import annotations

import stat
import time

import pytest

from testbed.cluster import CONTROLLER, DBD, Cluster, slurm_release

pytestmark = pytest.mark.cluster

# Deadlines for the "fast" profile (SlurmdTimeout=15, KillWait=5, GraceTime=5,
# cred_expire=10, sched_interval=bf_interval=5); "site" uses Slurm's defaults.
DEADLINES = {
    "fast": dict(start=60, end=60, grace=5, node_down=120, requeue_start=90, heal=240),
    "site": dict(start=120, end=180, grace=60, node_down=900, requeue_start=400, heal=900),
    "vm": dict(start=120, end=120, grace=30, node_down=120, requeue_start=120, heal=240),  # TCG: slow starts
}


def deadlines(cluster: Cluster) -> dict:
    return DEADLINES[cluster.profile]


def log_lines(host_dir, name="log") -> list[str]:
    p = host_dir / name
    return p.read_text().splitlines() if p.exists() else []


def trapped_step(c: Cluster, host_dir, node: str, marker: str, restart: int = 0) -> list[int]:
    """The TRAPPING_JOB step's pids once its SIGTERM trap is installed."""
    c.wait_until(lambda: f"step trapping restart={restart}" in log_lines(host_dir), timeout=30,
                 what="the step's trap installed")
    return c.wait_until(lambda: c.pids(node, marker, user="alice"), timeout=30, what="the job's step process")


# (The step waits in `wait`, which a trapped signal interrupts at once: behind a foreground
# `sleep 1` the trap ran only when the sleep ended, which on a loaded host came after KillWait.)
# A job whose batch shell and whose step both trap SIGTERM and keep running: so
# Slurm itself must end it (after GraceTime / KillWait), and the log shows which
# process got which signal. $1 = the log folder, $2 = a unique marker for pgrep.
# (The step's process shows in pgrep before bash has run its `trap`: a SIGTERM in between
# killed it untrapped once under load. Wait for its "step trapping" line: trapped_step.)
TRAPPING_JOB = """#!/bin/bash
#SBATCH -o /dev/null
log={dir}/log
echo "start restart=${{SLURM_RESTART_COUNT:-0}} host=$(hostname) user=$(id -un)" >> $log
trap 'echo "batch TERM restart=${{SLURM_RESTART_COUNT:-0}}" >> $log' TERM
srun --quiet bash -c 'trap "echo step TERM restart=${{SLURM_RESTART_COUNT:-0}} >> {dir}/log" TERM; \
  echo step trapping restart=${{SLURM_RESTART_COUNT:-0}} >> {dir}/log; \
  while :; do sleep 1 & wait $!; done; : {marker}' &
wait; wait
"""


def test_boot_all_nodes_idle(slurm_cluster: Cluster):
    c = slurm_cluster
    nodes = c.nodes()
    assert sorted(n.name for n in nodes) == ["c1", "c2", "c3"]
    assert {n.name: n.state for n in nodes} == {name: {"IDLE"} for name in ("c1", "c2", "c3")}
    # The Slurm release is the suite's, and the timing profile is the one asked for.
    assert c.slurm.version == slurm_release(c.slurm_release)
    config = c.exec(CONTROLLER, ["scontrol", "show", "config"]).stdout
    expected = {"fast": "SlurmdTimeout           = 15 sec", "site": "SlurmdTimeout           = 300 sec"}
    assert expected[c.profile] in config
    assert "PreemptType             = preempt/partition_prio" in config
    # 25.11+: jobs may ask for an expedited requeue (the expedite trial, README)
    assert ("enable_expedited_requeue" in config) == (c.slurm.version >= slurm_release("25.11")), config[-1500:]
    # Same users, same uids everywhere; one munge key: a credential made on one node is
    # accepted on every other.
    for host in [CONTROLLER, *c.node_names]:
        assert c.exec(host, "id -u alice; id -u bob").stdout.split() == ["2001", "2002"]
    cred = c.exec("c1", "munge -n", user="alice").stdout
    for host in [CONTROLLER, "c2", "c3"]:
        out = c.exec(host, ["unmunge"], input=cred).stdout
        assert "STATUS:          Success (0)" in out and "UID:             alice (2001)" in out


def test_network_is_internal_and_key_not_in_image(slurm_cluster: Cluster):
    c = slurm_cluster
    info = c.network_info()
    assert info["Internal"] is True
    assert sorted(v["Name"] for v in info["Containers"].values()) == sorted(
        f"{c.id}-{h}" for h in [DBD, CONTROLLER, *c.node_names]
    )
    # The containers reach each other by name (slurmd listens on c2).
    assert c.exec("c1", "exec 3<>/dev/tcp/c2/6818 && echo open").stdout.strip() == "open"
    # The munge key was made at start (host side, mounted read-only), never baked in the image.
    import docker

    client = docker.from_env()
    try:
        probe = client.containers.run(c.image, entrypoint=["ls", "/etc/munge/"], remove=True, network_mode="none")
    finally:
        client.close()
    assert b"munge.key" not in probe


def test_job_as_alice_writes_shared_volume(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    jid = c.submit(
        "alice",
        f"#!/bin/bash\n#SBATCH -o {cdir}/slurm-%j.out\n"
        f'echo "$(id -un) $(hostname) job=$SLURM_JOB_ID" > {cdir}/result\n',
    )
    job = c.wait_job(jid, lambda j: j.ended, timeout=deadlines(c)["end"])  # (22.05 shows COMPLETING as the state)
    assert (job.state, job.exit_code, job.user) == ("COMPLETED", 0, "alice")
    assert job.nodes and job.nodes[0] in c.node_names and job.batch_host == job.nodes[0]
    # Read from the host: the bind-mounted shared volume, written by uid 2001.
    assert c.read(f"{cdir}/result").split() == ["alice", job.batch_host, f"job={jid}"]
    st = (hdir / "result").stat()
    assert st.st_uid == 2001 and stat.S_ISREG(st.st_mode)


def test_export_list_job_keeps_slurmd_alive(slurm_cluster: Cluster, workdir):
    """`sbatch --export=ALL,VAR` (what `dispatch-slurm submit` does) makes slurmd load the
    user's login environment; on 24.11 that is a clone() into new pid+mount namespaces,
    which killed slurmd in a container without SYS_ADMIN."""
    c = slurm_cluster
    cdir, _ = workdir
    jid = c.slurm_as("alice").submit(
        ["--export=ALL,PROBE", "-w", "c2", "-o", "/dev/null", "--wrap", f"echo $PROBE $HOME > {cdir}/env"],
        {"PROBE": "exported"},
    )
    job = c.wait_job(jid, lambda j: j.state not in ("PENDING", "RUNNING") and not j.flags,
                     timeout=deadlines(c)["end"])
    assert (job.state, job.exit_code, job.nodes) == ("COMPLETED", 0, ["c2"])
    assert c.read(f"{cdir}/env").split() == ["exported", "/home/alice"]
    assert c.node("c2").state == {"IDLE"}


def test_failed_job_reports_exit_code(slurm_cluster: Cluster):
    c = slurm_cluster
    jid = c.submit("bob", args=["-o", "/dev/null", "--wrap", "exit 3"])
    job = c.wait_job(jid, lambda j: j.ended, timeout=deadlines(c)["end"])  # (22.05 shows COMPLETING as the state)
    assert (job.state, job.exit_code, job.exit_signal, job.user) == ("FAILED", 3, None, "bob")


def test_admin_requeue_counts_a_restart(slurm_cluster: Cluster):
    c = slurm_cluster
    jid = c.submit("bob", args=["-o", "/dev/null", "--wrap", "sleep 300"])
    c.wait_job(jid, "RUNNING", timeout=deadlines(c)["start"])
    c.requeue(jid)
    # Requeued jobs wait cred_expire+1 s before they may start again (Reason=BeginTime).
    job = c.wait_job(jid, lambda j: j.state == "PENDING" and not j.flags and j.reason == "BeginTime",
                     timeout=deadlines(c)["end"])
    assert job.restart_count == 1 and job.nodes == []
    c.cancel(jid, user="bob")
    assert c.wait_job(jid, lambda j: j.state == "CANCELLED" and not j.flags, timeout=deadlines(c)["end"]).restart_count == 1


def test_cancel_gives_cancelled(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    marker = f"cancel-{time.time_ns()}"
    jid = c.submit("alice", TRAPPING_JOB.format(dir=cdir, marker=marker))
    running = c.wait_job(jid, "RUNNING", timeout=deadlines(c)["start"])
    node = running.batch_host
    trapped_step(c, hdir, node, marker)
    c.cancel(jid, user="alice")
    job = c.wait_job(jid, lambda j: j.state == "CANCELLED" and not j.flags, timeout=deadlines(c)["end"])
    assert job.state == "CANCELLED" and job.restart_count == 0
    # scancel: SIGTERM first (both trap it and keep going), then SIGKILL after KillWait.
    c.wait_until(lambda: not c.pids(node, marker), timeout=30, what="the step process gone")
    assert any(line.startswith("step TERM") for line in log_lines(hdir))


# A helper that leaves the job's process tree (double fork + setsid), as a daemonized
# data loader would, and writes until it is killed.
ESCAPING_JOB = """#!/bin/bash
#SBATCH -o /dev/null
( setsid bash -c 'echo $$ > {dir}/escaped.pid; while :; do date +%s >> {dir}/escaped; sleep 0.2; done' \\
  < /dev/null > /dev/null 2>&1 & )
sleep 300
"""


@pytest.mark.vm
def test_escaped_process_outlives_a_cancel_only_without_cgroup_tracking(slurm_cluster: Cluster, workdir):
    """What the tracking mode changes for an old execution: proctrack/cgroup kills every
    process of the job's cgroup when the job ends, wherever it moved in the process tree;
    proctrack/linuxproc follows parent pids and loses a process that left the tree."""
    _escaped(slurm_cluster, *workdir)


@pytest.mark.vm_only
@pytest.mark.vm("full")
def test_on_the_vm_linuxproc_loses_the_escaped_process_on_the_same_kernel(slurm_cluster, workdir):
    """The negative control on the cgroup v2 VMs: the same kernel and Slurm with
    proctrack/linuxproc, and the escaped helper survives the cancel."""
    c = slurm_cluster
    c.set_tracking("linuxproc")
    try:
        _escaped(c, *workdir)
    finally:
        c.set_tracking("cgroup")


def _escaped(c, cdir, hdir) -> None:
    jid = c.submit("alice", ESCAPING_JOB.format(dir=cdir))
    node = c.wait_job(jid, "RUNNING", timeout=deadlines(c)["start"]).batch_host
    c.wait_until(lambda: (hdir / "escaped.pid").exists() and log_lines(hdir, "escaped"), timeout=30,
                 what="the escaped helper to write")
    pid = (hdir / "escaped.pid").read_text().strip()
    c.cancel(jid, user="alice")
    c.wait_job(jid, lambda j: j.state == "CANCELLED" and "COMPLETING" not in j.flags, timeout=deadlines(c)["end"])
    alive = lambda: c.exec(node, ["kill", "-0", pid], check=False).returncode == 0  # noqa: E731
    if c.tracking == "cgroup":
        assert not alive(), "proctrack/cgroup killed the escaped helper with the job"
        return
    n = len(log_lines(hdir, "escaped"))
    c.wait_until(lambda: len(log_lines(hdir, "escaped")) > n + 2, timeout=30, what="the escaped helper to go on")
    c.exec(node, ["kill", pid], user="alice")
    c.wait_until(lambda: not alive(), timeout=10, what="the escaped helper to stop")


def test_preempt_cancel_mode_gives_preempted(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    marker = f"preempt-cancel-{time.time_ns()}"
    jid = c.submit("alice", TRAPPING_JOB.format(dir=cdir, marker=marker), args=["-p", "scavenger"])
    victim = c.wait_job(jid, "RUNNING", timeout=deadlines(c)["start"])
    trapped_step(c, hdir, victim.batch_host, marker)
    t0 = time.monotonic()
    pre = c.preempt(jid)
    job = c.wait_job(jid, lambda j: j.state == "PREEMPTED" and not j.flags, timeout=deadlines(c)["end"])
    elapsed = time.monotonic() - t0
    assert (job.state, job.restart_count, job.partition) == ("PREEMPTED", 0, "scavenger")
    # The job ignored SIGTERM, so it ran out the GraceTime before Slurm ended it.
    assert elapsed >= deadlines(c)["grace"] - 0.5
    assert any(line.startswith("step TERM") for line in log_lines(hdir))
    preemptor = c.wait_job(pre, "RUNNING", timeout=deadlines(c)["start"])
    assert preemptor.nodes == victim.nodes and preemptor.partition == "high"
    assert not c.pids(victim.batch_host, marker)
    c.cancel(pre)


def test_preempt_requeue_mode_restarts(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    marker = f"preempt-requeue-{time.time_ns()}"
    jid = c.submit("alice", TRAPPING_JOB.format(dir=cdir, marker=marker), args=["-p", "normal"])
    victim = c.wait_job(jid, "RUNNING", timeout=deadlines(c)["start"])
    assert victim.restart_count == 0
    trapped_step(c, hdir, victim.batch_host, marker)
    pre = c.preempt(jid)
    # While the requeue completes (the step traps SIGTERM: KillWait at least), slurmctld refuses
    # a new time limit: the job keeps its preempt_time until its nodes are done. Hence
    # Cluster.set_time_limit waits that out (the submitit test's update once came in between).
    c.wait_job(jid, lambda j: j.restart_count == 1 and "COMPLETING" in j.states, timeout=deadlines(c)["end"])
    refused = c.exec(CONTROLLER, ["scontrol", "update", f"jobid={jid}", "TimeLimit=5"], check=False)
    assert refused.returncode != 0 and "Job has already finished" in refused.stderr, refused
    # (22.05 shows the requeue as COMPLETING first: its job_state string hides PENDING.)
    requeued = c.wait_job(jid, lambda j: j.restart_count == 1 and j.state == "PENDING", timeout=deadlines(c)["end"])
    assert requeued.restart_count == victim.restart_count + 1
    c.set_time_limit(jid, 5)
    assert "TimeLimit=00:05:00" in c.exec(CONTROLLER, ["scontrol", "show", "job", "-o", str(jid)]).stdout
    preemptor = c.wait_job(pre, "RUNNING", timeout=deadlines(c)["start"])
    assert preemptor.nodes == victim.nodes
    # Held back while the preemptor runs; once it is gone the job runs again, restart count 1.
    c.cancel(pre)
    again = c.wait_job(jid, "RUNNING", timeout=deadlines(c)["requeue_start"])
    assert again.restart_count == 1
    c.wait_until(
        lambda: any(line.startswith("start restart=1") for line in log_lines(hdir)),
        timeout=30,
        what="the second execution's first log line",
    )
    lines = log_lines(hdir)
    assert [line.split()[1] for line in lines if line.startswith("start")] == ["restart=0", "restart=1"]
    assert any(line == "step TERM restart=0" for line in lines)
    c.cancel(jid)
    c.wait_job(jid, lambda j: j.state == "CANCELLED" and not j.flags, timeout=deadlines(c)["end"])


def test_preempt_clean_exit_during_grace(slurm_cluster: Cluster, workdir):
    """A job that checkpoints on SIGTERM and exits 0 inside GraceTime: Slurm 24.05+
    records PREEMPTED and requeues it; 22.05 records COMPLETED and does not requeue
    (SchedMD commit a689104d, "Treat jobs completing after being signalled for
    GraceTime as preempted", first in 24.05)."""
    c = slurm_cluster
    cdir, hdir = workdir
    script = f"""#!/bin/bash
#SBATCH -o /dev/null
echo "start restart=${{SLURM_RESTART_COUNT:-0}}" >> {cdir}/log
srun --quiet bash -c 'trap "echo checkpointed >> {cdir}/log; exit 0" TERM; while :; do sleep 1; done'
"""
    jid = c.submit("alice", script, args=["-p", "normal"])
    c.wait_job(jid, "RUNNING", timeout=deadlines(c)["start"])
    c.wait_until(lambda: log_lines(hdir), timeout=30, what="the job's first log line")
    pre = c.preempt(jid)
    if c.slurm.version >= slurm_release("24.05"):
        job = c.wait_job(jid, lambda j: j.restart_count == 1 and j.state == "PENDING", timeout=deadlines(c)["end"])
        assert job.partition == "normal"
    else:
        job = c.wait_job(jid, lambda j: j.state not in ("PENDING", "RUNNING") and not j.flags,
                         timeout=deadlines(c)["end"])
        assert (job.state, job.exit_code, job.restart_count) == ("COMPLETED", 0, 0)
    assert "checkpointed" in log_lines(hdir)
    c.cancel(pre)


@pytest.mark.one_release
def test_partition_requeues_then_heal_returns_node(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    d = deadlines(c)
    cdir, hdir = workdir
    marker = f"partition-{time.time_ns()}"
    jid = c.submit("alice", TRAPPING_JOB.format(dir=cdir, marker=marker), args=["-p", "normal"])
    first = c.wait_job(jid, "RUNNING", timeout=d["start"])
    node = first.batch_host
    old = trapped_step(c, hdir, node, marker)
    c.partition(node)
    try:
        t0 = time.monotonic()
        down = c.wait_node(node, "DOWN", timeout=d["node_down"])
        t_down = time.monotonic() - t0
        assert "DOWN" in down.state and "NOT_RESPONDING" in down.state
        requeued = c.wait_job(jid, lambda j: j.restart_count == first.restart_count + 1, timeout=d["node_down"])
        assert requeued.restart_count == 1
        # Slurm has moved on, but the old execution is still running on the cut-off node.
        assert set(old) <= set(c.pids(node, marker, user="alice"))
        # The replacement starts on another node while the old one still runs.
        again = c.wait_job(jid, "RUNNING", timeout=d["requeue_start"])
        assert again.restart_count == 1 and again.batch_host != node
        c.wait_until(
            lambda: any(line.startswith("start restart=1") for line in log_lines(hdir)),
            timeout=30, what="the replacement's first log line",
        )
        assert set(old) <= set(c.pids(node, marker, user="alice")), "both executions run at once"
        print(f"{c.id}: {node} DOWN {t_down:.0f} s after the partition")
    finally:
        c.heal(node)
    t1 = time.monotonic()
    back = c.wait_node(node, lambda n: n.state == {"IDLE"}, timeout=d["heal"])
    print(f"{c.id}: {node} back in service {time.monotonic() - t1:.0f} s after the heal")
    assert back.state == {"IDLE"}
    # Back in contact, slurmd reported the stale job and slurmctld had it killed.
    c.wait_until(lambda: not c.pids(node, marker), timeout=60, what="the orphaned execution killed")
    job = c.job(jid)
    assert (job.state, job.restart_count, job.batch_host) == ("RUNNING", 1, again.batch_host)
    c.cancel(jid)
    c.wait_job(jid, lambda j: j.state == "CANCELLED" and not j.flags, timeout=d["end"])
