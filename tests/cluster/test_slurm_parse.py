"""dispatch_slurm.slurm against what real Slurm 22.05 and 24.11 printed: each dialect
(slurm/dialects.py) on its release's recorded outputs.

No cluster needed: data/slurm-<release>.json holds job and node objects, sacct's records of
three ended jobs and ``scontrol show partition -o``, recorded from the docker-slurm clusters
(trimmed to the keys the parser reads). The runner below replays them as the commands the
client runs on each release, so these tests pin both the command choice (squeue/sinfo and
sacct text on 22.05, scontrol and sacct --json=v0.0.42 on 24.11) and the shape handling.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dispatch_slurm.slurm import command, dialects
from dispatch_slurm.slurm.client import CommandResult, Slurm, SlurmError
from testbed.cluster import SUITES, base_state, slurm_at_least, slurm_release

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


def replay(release: str, *, job_comment: bool = False):
    """A runner answering as Slurm `release` would, from the recorded objects: the jobs of
    ``jobs`` in slurmctld's memory (renumbered from 100), those of ``sacct`` forgotten by
    slurmctld and in the accounting database only. ``job_comment``: sacct's text also
    carries each job's comment, as 22.05 records it with AccountingStoreFlags=job_comment
    (docker-slurm does not set it: the comments are the ones slurmctld gave)."""
    data = json.loads((DATA / f"slurm-{release}.json").read_text())
    jobs = []
    for i, (label, j) in enumerate(sorted(data["jobs"].items()), start=100):
        jobs.append({**j, "job_id": i, "name": label})
    nodes = [n for label, n in data["nodes"].items() if label.startswith("partitioned-")]
    old = release == "22.05"
    calls: list[list[str]] = []
    accounting = _accounting(data["sacct"], old, job_comment)

    def run(argv, *, env=None, input=None):
        calls.append(list(argv))
        ok = lambda out: CommandResult(0, out, "")  # noqa: E731
        if argv == ["scontrol", "--version"]:
            return ok(f"slurm {release}.8\n")
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return ok("\n".join(expand(argv[3])) + "\n")
        if argv == ["scontrol", "show", "partition", "-o"]:
            return ok(data["partitions"])
        if old and argv == ["squeue", "--json"]:
            return ok(json.dumps({"errors": [], "jobs": jobs}))
        if old and argv == ["sinfo", "--json"]:
            return ok(json.dumps({"errors": [], "nodes": nodes}))
        if not old and argv[:3] == ["scontrol", "show", "job"] and argv[-1] == "--json=v0.0.42":
            wanted = [j for j in jobs if len(argv) == 4 or j["job_id"] == int(argv[3])]
            if not wanted and int(argv[3]) not in data["sacct"]["labels"].values():
                return CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n")
            # A job slurmctld forgot: no job, no error (tests/cluster/test_accounting.py: on the cluster).
            return ok(json.dumps({"errors": [], "warnings": [], "jobs": wanted}))
        if not old and argv == ["scontrol", "show", "nodes", "--json=v0.0.42"]:
            return ok(json.dumps({"errors": [], "nodes": nodes}))
        if argv[0] == "sacct":
            return accounting(argv, env)
        return CommandResult(1, "", f"unexpected command for Slurm {release}: {argv}")

    return run, jobs, calls


def _accounting(sacct: dict, old: bool, job_comment: bool):
    """sacct's side of the replay: the recorded records of the jobs asked for (``-j``) or of
    every job (``-S``), in the form asked for; anything else is refused."""
    rows = sacct["parsable2"].splitlines()
    if job_comment:
        comment = {str(sacct["labels"][k]): h["comment"] for k, h in sacct["held"].items()}
        rows = ["|".join(f[:10] + [comment[f[0]]] + f[11:]) for f in (r.split("|") for r in rows)]

    def answer(argv, env):
        ids = {int(i) for i in argv[argv.index("-j") + 1].split(",")} if "-j" in argv else None
        mine = [r for r in rows if ids is None or int(r.split("|")[0]) in ids]
        if argv[3:] == ["-X", "-n", "-P", "-o", "State"]:  # cancelled_by: the last execution's state
            return CommandResult(0, "".join(r.split("|")[1] + "\n" for r in mine[-1:]), "")
        if "--duplicates" not in argv or "--allusers" not in argv:
            return CommandResult(1, "", f"the replay answers only for every execution of every user: {argv}")
        fmt = argv[-1].removeprefix("--format=").split(",")
        recorded = sacct["format"].split(",")
        if old and argv[-4:-1] == ["-X", "-n", "--parsable2"] and fmt[:len(recorded)] == recorded and \
                env == {"SLURM_TIME_FORMAT": "%s"}:
            # Fields read since the recording (Timelimit) come back empty, as sacct prints a
            # field it has no value for: the parser must not depend on them.
            pad = "|" * (len(fmt) - len(recorded))
            return CommandResult(0, "".join(r + pad + "\n" for r in mine), "")
        if not old and argv[-1] == "--json=v0.0.42":
            records = [j for j in sacct["json"]["jobs"] if ids is None or j["job_id"] in ids]
            return CommandResult(0, json.dumps({**sacct["json"], "errors": [], "jobs": records}), "")
        return CommandResult(1, "", f"sacct as the replay does not know it: {argv} {env}")

    return answer


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


# --- the dialects' other reads, against the recorded outputs ------------------------------

# label -> what the accounting record says of the job slurmctld forgot: (state, restart_count,
# nodes, exit_code, exit_signal). The cancelled job's record has the 0:0 it had when it was
# cancelled, where slurmctld said signal 15 (see tests/cluster/test_accounting.py::_same).
FORGOTTEN = {
    "failed": ("FAILED", 0, ["c1"], 3, None),
    "cancelled": ("CANCELLED", 0, ["c1", "c2"], 0, None),
    "requeued": ("COMPLETED", 1, ["c3"], 0, None),
}


def recorded(release: str) -> dict:
    return json.loads((DATA / f"slurm-{release}.json").read_text())["sacct"]


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_forgotten_jobs_are_read_from_sacct_the_same_on_both_releases(release):
    """A job slurmctld forgot is read from the accounting database (22.05: sacct text,
    24.11: sacct --json=v0.0.42) with the facts slurmctld gave while it held it; a
    requeued job's record is its last execution, its restart count the executions before."""
    run, _, calls = replay(release)
    slurm, sacct = Slurm(run), recorded(release)
    for label, want in FORGOTTEN.items():
        job, held = slurm.job(sacct["labels"][label]), sacct["held"][label]
        assert (job.state, job.restart_count, job.nodes, job.exit_code, job.exit_signal) == want, label
        assert (job.source, job.partition, job.user, job.name) == ("sacct", "normal", "alice", "wrap")
        assert (job.state, job.restart_count, job.nodes) == (held["state"], held["restart_count"], held["nodes"])
        assert (job.start_time, job.end_time) == (held["start_time"], held["end_time"]), label
        assert job.cluster.startswith("dslurm_") and slurm.accounted_job(job.job_id) == job
    assert {"--json=v0.0.42" in c for c in calls if c[0] == "sacct"} == {release != "22.05"}
    assert slurm.cancelled_by(sacct["labels"]["cancelled"]) == 2001  # alice
    assert slurm.cancelled_by(sacct["labels"]["failed"]) is None


def test_2205_sacct_json_says_a_failed_batch_script_exited_0():
    """Why the 22.05 dialect reads sacct's text: its JSON says SUCCESS, 0 for the job whose
    script exited 3 (the text and slurmctld say 3)."""
    sacct = recorded("22.05")
    (rec,) = sacct["json"]["jobs"]
    assert rec["job_id"] == sacct["labels"]["failed"] and rec["exit_code"]["return_code"] == 0
    run, _, _ = replay("22.05")
    assert Slurm(run).job(sacct["labels"]["failed"]).exit_code == sacct["held"]["failed"]["exit_code"] == 3


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_find_jobs_reads_many_jobs_in_one_call_per_source(release):
    """Many job ids, one read of slurmctld's memory and one sacct query for those it forgot;
    each job as ``job`` reads it alone; an id neither knows is absent."""
    run, jobs, calls = replay(release)
    slurm = Slurm(run)
    held = [j["job_id"] for j in jobs if j["name"] in ("running", "failed", "requeued-pending")]
    forgotten = sorted(recorded(release)["labels"].values())
    slurm.version
    calls.clear()
    found = slurm.find_jobs([*held, *forgotten, 9999])
    reads = [c for c in calls if c[:3] != ["scontrol", "show", "hostnames"]]
    assert [c[0] for c in reads] == ["squeue" if release == "22.05" else "scontrol", "sacct"]
    assert reads[1][1:3] == ["-j", ",".join(map(str, [*forgotten, 9999]))]
    assert sorted(found) == sorted([*held, *forgotten])
    assert all(found[i] == slurm.job(i) for i in found)
    assert [found[i].source for i in held + forgotten] == ["slurmctld"] * 3 + ["sacct"] * 3
    calls.clear()
    assert sorted(slurm.find_jobs(held)) == sorted(held) and len(calls) == 1 + 1  # + one hostlist: c[1-2]
    calls.clear()
    assert slurm.find_jobs([]) == {} and calls == []


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_jobs_with_comment_looks_in_sacct_since(release):
    """The jobs that carry a tag: in slurmctld's memory, and with ``since`` in the accounting
    database: 24.11 records the submit line (``--comment=TAG``), 22.05 the comment itself only
    with AccountingStoreFlags=job_comment."""
    sacct = recorded(release)
    tag = sacct["held"]["failed"]["comment"]
    tagged = sorted(sacct["labels"][k] for k, h in sacct["held"].items() if h["comment"] == tag)
    run, _, calls = replay(release)
    assert Slurm(run).jobs_with_comment(tag) == [] and not [c for c in calls if c[0] == "sacct"]
    found = Slurm(run).jobs_with_comment(tag, since=0)
    assert sorted(j.job_id for j in found) == (tagged if release != "22.05" else [])
    run, _, _ = replay(release, job_comment=True)
    assert sorted(j.job_id for j in Slurm(run).jobs_with_comment(tag, since=0)) == tagged
    assert all(j.source == "sacct" for j in Slurm(run).jobs_with_comment(tag, since=0))
    assert Slurm(run).jobs_with_comment("dispatch-slurm:/elsewhere:7", since=0) == []


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_without_accounting_a_forgotten_job_is_unknown_and_slurmdbd_down_raises(release):
    run, jobs, _ = replay(release)
    forgotten = recorded(release)["labels"]["failed"]

    def said(stderr):
        return lambda argv, **kw: CommandResult(1, "", stderr) if argv[0] == "sacct" else run(argv, **kw)

    slurm = Slurm(said("sacct: error: Slurm accounting storage is disabled\n"))
    assert slurm.accounted_job(forgotten) is None and slurm.find_job(forgotten) is None
    assert sorted(slurm.find_jobs([jobs[0]["job_id"], forgotten])) == [jobs[0]["job_id"]]
    assert slurm.jobs_with_comment("x", since=0) == []
    slurm = Slurm(said("sacct: error: Problem talking to the database: Connection refused\n"))
    for read in (lambda: slurm.find_job(forgotten), lambda: slurm.find_jobs([forgotten]),
                 lambda: slurm.jobs_with_comment("x", since=0)):
        with pytest.raises(SlurmError, match="Connection refused"):
            read()


@pytest.mark.parametrize("release, dialect", [("22.05", dialects.Slurm2205), ("24.11", dialects.Slurm2411)])
def test_the_dialect_is_chosen_once_from_the_version(release, dialect):
    run, jobs, calls = replay(release)
    slurm = Slurm(run)
    slurm.jobs(), slurm.nodes(), slurm.job(jobs[0]["job_id"]), slurm.find_jobs([1, 2])
    assert isinstance(slurm.dialect, dialect) and calls.count(["scontrol", "--version"]) == 1


@pytest.mark.parametrize("printed, dialect", [("slurm 21.08.8-2", dialects.Slurm2205), ("slurm 22.05.8", dialects.Slurm2205),
                                              ("slurm 24.11.5", dialects.Slurm2411), ("slurm 26.05.0", dialects.Slurm2411),
                                              ("slurm 23.02.7", None), ("slurm-wlm 24.05.1", None)])
def test_a_release_between_the_families_is_refused_naming_it(printed, dialect):
    slurm = Slurm(lambda argv, **kw: CommandResult(0, printed + "\n", ""))
    if dialect:
        assert isinstance(slurm.dialect, dialect)
        return
    with pytest.raises(SlurmError, match=r"Slurm 2\d\.0\d cannot print JSON in data_parser v0\.0\.42.*needs "
                                         r"Slurm 22\.05, or 24\.11 or later"):
        slurm.jobs()


def test_this_hosts_version_is_read_once_per_process(tmp_path, monkeypatch):
    """The local runner's Slurm (this host's) is asked its version once, however many
    clients a process makes (the CLI and the supervisor make several)."""
    asked = tmp_path / "asked"
    (tmp_path / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {asked}\necho slurm 24.11.5\n")
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(command, "_HOST_VERSION", [])
    assert [Slurm().version for _ in range(3)] == [(24, 11)] * 3
    assert isinstance(Slurm().dialect, dialects.Slurm2411)
    assert asked.read_text() == "--version\n"


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_partitions_from_scontrol_text(release):
    run, _, _ = replay(release)
    parts = Slurm(run).partitions()
    assert {k: (p["PreemptMode"], p["GraceTime"], p["PriorityTier"]) for k, p in parts.items()} == {
        "normal": ("REQUEUE", "5", "1"), "scavenger": ("CANCEL", "5", "1"), "high": ("OFF", "0", "10")}
    assert parts["normal"]["Nodes"] == "c[1-3]" and parts["normal"]["TRES"] == "cpu=6,mem=3000M,node=3,billing=6"


def test_slurm_releases_compare_as_versions_not_as_text():
    """As text "9.05" sorts after "24.11" and "100.02" before it: the cluster tests' release
    checks compare numbers."""
    assert slurm_release("9.05") < slurm_release("24.11") < slurm_release("100.02")
    assert slurm_release("24.11") < slurm_release("24.11.5") < slurm_release("25.05")
    assert [slurm_release(r) for r in SUITES.values()] == [(22, 5), (24, 11), (26, 5)]

    class Bed:
        slurm_release = "9.05"
    assert not slurm_at_least(Bed, "24.11") and slurm_at_least(Bed, "9.5") and slurm_at_least(Bed, "9.05")
    with pytest.raises(ValueError, match="'24.x' is not a Slurm release"):
        slurm_release("24.x")
