"""The Epilog's cgroup v2 evidence, read from a tree laid out like Slurm's (the real one
is checked on the VM bed: tests/cluster/test_hooks.py), and how ceased/ carries it."""

import json
import os

from dispatch_slurm.slurm import cessation
from dispatch_slurm.slurm.cessation import cgroup
from dispatch_slurm.store import ceased


def _cg(path, populated: int, procs=()):
    path.mkdir(parents=True)
    (path / "cgroup.events").write_text(f"populated {populated}\nfrozen 0\n")
    (path / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
    return path


def test_state_gone_empty_populated(tmp_path):
    scope = tmp_path / "system.slice" / "c1_slurmstepd.scope"
    job = _cg(scope / "job_7", 1)
    _cg(job / "step_batch" / "user" / "task_0", 1, [41, 42])
    assert cgroup.state([str(job)]) == (cgroup.POPULATED, [str(job)])
    assert cgroup.pids([str(job)]) == [41, 42]
    (job / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert cgroup.state([str(job)])[0] == cgroup.EMPTY
    assert cgroup.state([str(scope / "job_8"), str(scope / "s0123456789abc")]) == (cgroup.GONE, [])


def test_a_job_cgroup_holding_only_the_hook_itself_is_its_own_not_the_jobs(tmp_path):
    """PrologFlags=RunInJob: the Epilog and its slurmstepd run inside the job cgroup. Holding
    only them (this process and its ancestors) it is OWN; one more process makes it POPULATED."""
    from dispatch_slurm.slurm.cessation import node
    mine = node.lineage()
    assert os.getpid() in mine and os.getppid() in mine and 1 not in mine
    job = _cg(tmp_path / "system.slice" / "c1_slurmstepd.scope" / "job_7", 1)
    extern = _cg(job / "step_extern" / "slurm", 1, [os.getppid(), os.getpid()])
    assert cgroup.state([str(job)], mine) == (cgroup.OWN, [str(job)])
    assert cgroup.state([str(job)]) == (cgroup.POPULATED, [str(job)])  # no hook named: the cgroup alone
    (extern.parent / "user").mkdir()
    (extern.parent / "user" / "cgroup.procs").write_text("4242\n")  # a process of the job's (pam_slurm_adopt's)
    assert cgroup.state([str(job)], mine)[0] == cgroup.POPULATED
    assert os.getpid() not in node.processes_with("an.attempt.nobody.has")
    said = cessation.describe({"by": "cgroup v2", "cgroup": str(job), "state": cgroup.OWN})
    assert said.endswith("holding only the Epilog's own processes (PrologFlags=RunInJob)")


def test_proctrack_from_slurm_conf(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n# ProctrackType=proctrack/linuxproc\nInclude more.conf\n")
    (tmp_path / "more.conf").write_text("proctracktype = proctrack/linuxproc\n")
    assert cgroup.proctrack(str(conf)) == "proctrack/linuxproc"
    (tmp_path / "more.conf").write_text("")
    assert cgroup.proctrack(str(conf)) == "proctrack/cgroup"  # Slurm's default
    assert cgroup.proctrack(str(tmp_path / "none.conf")) is None
    # not tracked by cgroup: no cgroup evidence at all, whatever the hierarchy
    (tmp_path / "more.conf").write_text("ProctrackType=proctrack/pgid\n")
    assert cgroup.job_cgroups("7", conf=str(conf)) is None


def test_ceased_entry_carries_the_evidence(root):
    ev = {"by": "cgroup v2", "cgroup": "/sys/fs/cgroup/system.slice/c1_slurmstepd.scope/job_7", "state": "gone"}
    assert ceased.record(str(root), "cl.7.1000000", "c1", ev)
    assert ceased.record(str(root), "cl.7.1000000", "c2")  # an older Epilog: an empty entry
    assert not ceased.record(str(root), "cl.7.1000000", "c1", {"by": "process scan"})  # once
    assert json.loads((root / "ceased" / "cl.7.1000000.c1").read_text()) == ev
    got = ceased.entries(str(root), "cl.7.1000000")
    assert got == {"c1": ev, "c2": {}}
    assert cessation.describe(got["c1"]) == f"cgroup v2: job cgroup {ev['cgroup']} removed"
    assert cessation.describe({"by": "process scan"}).endswith("(process scan)")
    assert cessation.describe({}) == ""


def test_sluid_keyed_cgroups_without_the_sluid_are_no_evidence(tmp_path, monkeypatch):
    """26.05 names job cgroups by SLUID: an Epilog without SLURM_JOB_SLUID cannot tell
    which is its job's, so it has no cgroup evidence (never "gone" for the wrong name)."""
    scope = tmp_path / "system.slice" / "c1_slurmstepd.scope"
    _cg(scope / "s0123456789abc", 1)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ProctrackType=proctrack/cgroup\n")
    monkeypatch.setattr(cgroup, "unified", lambda root=cgroup.ROOT: True)
    assert cgroup.job_cgroups("7", conf=str(conf), root=str(tmp_path)) is None
    paths = cgroup.job_cgroups("7", "s0123456789abc", conf=str(conf), root=str(tmp_path))
    assert cgroup.state(paths)[0] == cgroup.POPULATED
    _cg(tmp_path / "system.slice" / "c2_slurmstepd.scope" / "job_7", 0)  # 22.05-25.11: job_<id>
    got = cgroup.job_cgroups("7", conf=str(conf), root=str(tmp_path))
    assert got is None  # still a SLUID-keyed entry beside it: refuse to guess
