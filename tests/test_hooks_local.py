"""The hooks' logic on this machine (the cluster tests run them under Slurm)."""

import io
import os
import stat

import pytest

from dispatch_slurm.slurm import hooks

OPT = hooks.SPANK_OPT


def job_env(root, **extra):
    return {"SLURM_JOB_ID": "42", "SLURM_CLUSTER_NAME": "linux", "DISPATCH_CHECKPOINT": str(root),
            "DISPATCH_SUBMISSION": "3", "DISPATCH_SITE_CONF": "", **extra}


def test_task_prolog_prints_verbatim_exports_and_makes_the_folder(root):
    out, err = io.StringIO(), io.StringIO()
    assert hooks.task_prolog(job_env(root, SLURM_RESTART_COUNT="2"), out, err) == 0
    lines = out.getvalue().splitlines()
    assert "export DISPATCH_ATTEMPT=linux.42.3000002" in lines
    assert f"export DISPATCH_EXEC_DIR={root}/exec/linux.42.3000002" in lines  # no shell quotes
    assert stat.S_IMODE((root / "exec" / "linux.42.3000002").stat().st_mode) == 0o700


def test_task_prolog_fails_the_task_with_a_message(root, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    assert hooks.task_prolog(job_env(tmp_path / "nope"), out, err) == 1
    assert "does not exist" in err.getvalue() and out.getvalue() == ""
    (root / "exec").symlink_to("/etc")
    err = io.StringIO()
    assert hooks.task_prolog(job_env(root), io.StringIO(), err) == 1
    assert "symlink" in err.getvalue()


def test_task_prolog_ignores_other_jobs():
    out = io.StringIO()
    assert hooks.task_prolog({"SLURM_JOB_ID": "1"}, out, io.StringIO()) == 0 and out.getvalue() == ""


def test_spank_inputs_map_options():
    env = {OPT + "checkpoint": "/ck", OPT + "submission": "4", OPT + "generation": "1",
           OPT + "shared_checkpoint": "(null)", "SLURM_JOB_ID": "9", "DISPATCH_CHECKPOINT": "/user/set"}
    got = hooks.spank_inputs(env)
    assert got["DISPATCH_CHECKPOINT"] == "/ck" and got["DISPATCH_SUBMISSION"] == "4"
    assert got["DISPATCH_GENERATION"] == "1" and got["DISPATCH_SHARED_CHECKPOINT"] == "1"
    assert hooks.spank_inputs({"SLURM_JOB_ID": "9"}) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")
def test_as_job_user_really_drops_privileges(tmp_path):
    """The child that touches the root runs as the job user: nobody cannot write a
    root-owned folder, and says so as a user error (never an exception in the hook)."""
    folder = tmp_path / "rootowned"
    folder.mkdir(mode=0o755)
    env = {"SLURM_JOB_UID": "65534", "SLURM_JOB_GID": "65534", "SLURM_JOB_USER": "nobody"}
    assert hooks.as_job_user(env, os.geteuid) == {"ok": 65534}
    res = hooks.as_job_user(env, lambda: open(folder / "x", "w"))
    assert "user_error" in res and "Permission denied" in res["user_error"]
    assert not (folder / "x").exists()
