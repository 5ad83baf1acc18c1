"""dispatch_slurm.slurm against JSON that real Slurm 22.05 and 24.11 printed.

No cluster needed: data/slurm-<release>.json holds job and node objects recorded
from the docker-slurm clusters (trimmed to the keys the parser reads). The runner
below replays them as the commands the client runs on each release, so these
tests pin both the command choice (squeue/sinfo on 22.05, scontrol on 24.11) and
the shape handling.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dispatch_slurm.slurm.client import CommandResult, Slurm, SlurmError
from testbed.cluster import base_state

DATA = Path(__file__).parent / "data"

# label -> (state, flags, restart_count, nodes, exit_code, exit_signal, reason); the same
# facts on both releases, except where the release itself differs (noted).
EXPECTED = {
    "running": ("RUNNING", set(), 0, ["c1", "c2"], 0, None, "None"),
    "completed": ("COMPLETED", set(), 0, ["c1"], 0, None, "None"),
    "failed": ("FAILED", set(), 0, ["c1"], 3, None, "NonZeroExitCode"),
    "cancelled": ("CANCELLED", set(), 1, ["c1", "c2"], None, 9, "None"),
    "requeued-pending": ("PENDING", set(), 1, [], 0, None, "BeginTime"),
    "requeued-running": ("RUNNING", set(), 1, ["c1", "c2"], 0, None, "None"),
}


def expand(hostlist: str) -> list[str]:
    out = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", hostlist):
        m = re.fullmatch(r"(.*)\[(.*)\]", part)
        if not m:
            out.append(part)
            continue
        for r in m.group(2).split(","):
            lo, _, hi = r.partition("-")
            out += [f"{m.group(1)}{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def replay(release: str):
    """A runner answering as Slurm `release` would, from the recorded objects."""
    data = json.loads((DATA / f"slurm-{release}.json").read_text())
    jobs = []
    for i, (label, j) in enumerate(sorted(data["jobs"].items()), start=100):
        jobs.append({**j, "job_id": i, "name": label})
    nodes = [n for label, n in data["nodes"].items() if label.startswith("partitioned-")]
    old = release == "22.05"
    calls: list[list[str]] = []

    def run(argv, *, env=None, input=None):
        calls.append(list(argv))
        ok = lambda out: CommandResult(0, out, "")  # noqa: E731
        if argv == ["scontrol", "--version"]:
            return ok(f"slurm {release}.8\n")
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return ok("\n".join(expand(argv[3])) + "\n")
        if old and argv == ["squeue", "--json"]:
            return ok(json.dumps({"errors": [], "jobs": jobs}))
        if old and argv == ["sinfo", "--json"]:
            return ok(json.dumps({"errors": [], "nodes": nodes}))
        if not old and argv[:3] == ["scontrol", "show", "job"] and argv[-1] == "--json=v0.0.42":
            wanted = [j for j in jobs if len(argv) == 4 or j["job_id"] == int(argv[3])]
            if not wanted:
                return CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n")
            return ok(json.dumps({"errors": [], "warnings": [], "jobs": wanted}))
        if not old and argv == ["scontrol", "show", "nodes", "--json=v0.0.42"]:
            return ok(json.dumps({"errors": [], "nodes": nodes}))
        if argv[0] == "sacct":  # the recorded jobs are all in slurmctld's memory
            return ok(json.dumps({"errors": [], "jobs": []}) if not old else "")
        return CommandResult(1, "", f"unexpected command for Slurm {release}: {argv}")

    return run, jobs, calls


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_jobs_parse_the_same_on_both_releases(release):
    run, jobs, calls = replay(release)
    slurm = Slurm(run)
    by_label = {j["name"]: j["job_id"] for j in jobs}
    for label, (state, flags, restarts, nodes, code, sig, reason) in EXPECTED.items():
        job = slurm.job(by_label[label])
        got = (job.state, set(job.flags), job.restart_count, job.nodes, job.exit_code, job.exit_signal, job.reason)
        assert got == (state, flags, restarts, nodes, code, sig, reason), label
        assert job.job_id == by_label[label] and job.partition == "normal"
    # The tool used is the one the release has: 22.05 has no `scontrol --json`.
    tools = {c[0] for c in calls if c[-1].startswith("--json")}
    assert tools == ({"squeue"} if release == "22.05" else {"scontrol"})


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_requeue_in_progress(release):
    """A job being requeued is PENDING+COMPLETING; 22.05 prints only "COMPLETING"."""
    run, jobs, _ = replay(release)
    job = Slurm(run).job(next(j["job_id"] for j in jobs if j["name"] == "requeue-completing"))
    assert "COMPLETING" in job.flags and job.restart_count == 1
    assert job.state == ("COMPLETING" if release == "22.05" else "PENDING")


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_job_killed_by_a_signal_has_no_exit_code(release):
    run, jobs, _ = replay(release)
    job = Slurm(run).job(next(j["job_id"] for j in jobs if j["name"] == "killed-by-signal"))
    assert (job.state, job.exit_code, job.exit_signal) == ("FAILED", None, 9)


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_nodes_parse_the_same_on_both_releases(release):
    run, _, _ = replay(release)
    nodes = {n.name: n for n in Slurm(run).nodes()}
    assert {k: set(n.state) for k, n in nodes.items()} == {
        "c1": {"IDLE"},
        "c2": {"IDLE"},
        "c3": {"DOWN", "NOT_RESPONDING"},
    }
    assert nodes["c3"].reason == "Not responding" and base_state(nodes["c3"]) == "DOWN"


def test_unknown_job_and_failed_command_name_the_command():
    run, _, _ = replay("24.11")
    with pytest.raises(SlurmError, match=r"scontrol show job 9999 --json.*Invalid job id"):
        Slurm(run).job(9999)
    run, _, _ = replay("22.05")
    with pytest.raises(SlurmError, match=r"job 9999 is not known"):
        Slurm(run).job(9999)


def test_submit_parses_parsable_output_and_passes_script_and_env():
    seen = {}

    def run(argv, *, env=None, input=None):
        seen.update(argv=list(argv), env=env, input=input)
        return CommandResult(0, "4242;cluster\n", "")

    jid = Slurm(run).submit(["-p", "high"], {"A": "1"}, script="#!/bin/bash\ntrue\n")
    assert jid == 4242
    assert seen == {"argv": ["sbatch", "--parsable", "-p", "high"], "env": {"A": "1"}, "input": "#!/bin/bash\ntrue\n"}


def test_submit_refusal_raises_with_stderr():
    def run(argv, *, env=None, input=None):
        return CommandResult(1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified\n")

    with pytest.raises(SlurmError) as e:
        Slurm(run).submit(["-p", "nope", "--wrap", "true"])
    assert "sbatch --parsable -p nope" in str(e.value) and "Invalid partition name" in str(e.value)
    assert e.value.returncode == 1


def test_local_runner_missing_binary_is_a_slurm_error():
    from dispatch_slurm.slurm.client import local_runner

    with pytest.raises(SlurmError, match="not found"):
        Slurm(lambda argv, **kw: local_runner(["/nonexistent/sbatch", *argv[1:]], **kw)).submit(["--wrap", "true"])
