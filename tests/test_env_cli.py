"""The env contract (shared vectors) and the real CLI in subprocesses."""

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from dispatch_slurm import store
from dispatch_slurm.contract import env, siteconf
from dispatch_slurm.errors import EnvError, EpochError
from dispatch_slurm.slurm import sitefile
from support import allocate, cli, fill, vectors

ENV = vectors("env.json")


def _site(v):
    s = v.get("site")
    return siteconf.Site(s["grace"], s["account_grace"]) if s else siteconf.Site()


@pytest.mark.parametrize("v", ENV["valid"], ids=lambda v: v["name"])
def test_env_vectors(v):
    out = env.compute(v["env"], _site(v))
    assert out == v["expect"]
    assert list(out) == [k for k in env.ORDER if k in out]


@pytest.mark.parametrize("v", ENV["errors"], ids=lambda v: v["error"])
def test_env_errors_name_the_input(v):
    with pytest.raises((EnvError, EpochError)) as e:
        env.compute(v["env"], siteconf.Site())
    assert v["error"] in str(e.value)


def test_siteconf_parse_and_errors(tmp_path):
    s = siteconf.parse("# site\ngrace = 90\ngrace.ml-team = 250  # long saves\nexec_mode = 0750\n")
    assert (s.grace, s.account_grace, s.exec_mode) == (90, {"ml-team": 250}, 0o750)
    for bad in ("grace = -1", "exec_mode = 0777", "grace: 60", "unknown = 1"):
        with pytest.raises(siteconf.SiteConfError, match=":1:"):
            siteconf.parse(bad)
    with pytest.raises(siteconf.SiteConfError, match="does not exist"):
        sitefile.load(str(tmp_path / "nope.conf"))


def slurm_env(root, **extra):
    return {"SLURM_JOB_ID": "42", "SLURM_CLUSTER_NAME": "linux", "DISPATCH_CHECKPOINT": str(root),
            "DISPATCH_SUBMISSION": "1", "DISPATCH_SITE_CONF": "", **extra}


def test_cli_env_creates_exec_dir_and_evals(root):
    allocate(root)
    e = slurm_env(root, SLURM_RESTART_COUNT="1")
    proc = cli("env", env=e, check=True)
    assert "export DISPATCH_ATTEMPT=linux.42.1000001" in proc.stdout
    exec_dir = root / "exec" / "linux.42.1000001"
    assert stat.S_IMODE(exec_dir.stat().st_mode) == 0o700
    # what a sbatch script does with it
    sh = subprocess.run(["bash", "-c", f'eval "$({sys.executable} -m dispatch_slurm env)"; '
                                       'echo "$DISPATCH_EPOCH $DISPATCH_EXEC_DIR"'],
                        env={**os.environ, **e}, capture_output=True, text=True, check=True)
    assert sh.stdout.split() == ["1000001", str(exec_dir)]
    js = json.loads(cli("env", "--format", "json", env=e, check=True).stdout)
    assert js["DISPATCH_EPOCH"] == "1000001"
    assert "DISPATCH_RESTART=1\n" in cli("env", "--format", "dotenv", env=e, check=True).stdout


def test_cli_env_refusals_exit_2(root, tmp_path):
    proc = cli("env", env=slurm_env(tmp_path / "typo"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert not (tmp_path / "typo").exists()
    proc = cli("env", env=slurm_env(root, DISPATCH_SUBMISSION="0"))
    assert proc.returncode == 2 and "DISPATCH_SUBMISSION" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (root / "exec").exists()


def test_cli_array_task_root(root):
    allocate(root)  # one submission number for the array, beside its task roots
    e = slurm_env(f"{root}/task-%a", SLURM_ARRAY_TASK_ID="5")
    out = json.loads(cli("env", "--format", "json", env=e, check=True).stdout)
    assert out["DISPATCH_CHECKPOINT"] == f"{root}/task-5"
    assert (root / "task-5" / "exec" / "linux.42.1000000").is_dir()
    # a step recomputing inside the same execution keeps the expanded root
    again = cli("env", "--format", "json", env={**e, **out}, check=True).stdout
    assert json.loads(again) == out
    shared = cli("env", env=slurm_env(root, SLURM_ARRAY_TASK_ID="5"))
    assert shared.returncode == 2 and "%a" in shared.stderr


def test_cli_publish_latest_ls(root):
    a = "c.1.1000000"  # this execution's attempt
    e = {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": "1000000", "DISPATCH_ATTEMPT": a}
    assert cli("latest", env=e).returncode == 1
    for step in (10, 20):
        (root / "exec" / a / f"checkpoint-{step}").mkdir(parents=True)
        ((root / "exec" / a / f"checkpoint-{step}") / "model.bin").write_bytes(b"w")  # a save holds a file
        cli("publish", root / "exec" / a / f"checkpoint-{step}", env=e, check=True)
    late = root / "exec" / a / "final"
    late.mkdir(parents=True)
    (late / "model.bin").write_bytes(b"w")
    refused = cli("publish", late, "--epoch", "999999", env=e)  # N=0
    assert refused.returncode == 2 and "submission N=0" in refused.stderr
    nostep = cli("publish", late, env=e)
    assert nostep.returncode == 2 and "cannot tell the step" in nostep.stderr and "--step" in nostep.stderr
    proc = cli("publish", late, "--epoch", "1000000", "--step", "999", "--json", env=e, check=True)
    assert json.loads(proc.stdout)["step"] == 999 and json.loads(proc.stdout)["existed"] is False
    again = cli("publish", late, "--step", "999", env=e, check=True)
    assert again.stdout.startswith("already published (durability confirmed): step 999")
    assert cli("latest", "--path", env=e, check=True).stdout.strip() == str(late)
    assert json.loads(cli("latest", "--json", str(root), check=True).stdout)["step"] == 999
    table = cli("ls", str(root), check=True).stdout.splitlines()
    assert table[0].split() == ["G", "N", "R", "STEP", "EXISTS", "SIZE", "STATE", "PATH"]
    assert [r.split()[3] for r in table[1:]] == ["10", "20", "999"]
    shutil.rmtree(late)  # the trainer's rotation: the publication's held links keep it
    assert cli("ls", str(root), check=True).stdout.splitlines()[-1].split()[4] == "held"
    shutil.rmtree(root / "held" / store.latest(str(root)).name)  # and by hand: gone
    assert cli("ls", str(root), check=True).stdout.splitlines()[-1].split()[4] == "NO"
    (root / "pub" / "stray.tmp").touch()
    bad = cli("latest", str(root))
    assert bad.returncode == 2 and "'stray.tmp'" in bad.stderr


def test_cli_epoch():
    assert cli("epoch", "compose", "1", "2", "3", check=True).stdout.strip() == "1000002000003"
    assert cli("epoch", "decompose", "1000002000003", check=True).stdout.strip() == "G=1 N=2 R=3"
    proc = cli("epoch", "compose", "0", "0", "0")
    assert proc.returncode == 2 and "submission N 0 is out of range 1..999,999" in proc.stderr


@pytest.mark.parametrize("cmd", [[], ["publish"], ["latest"], ["ls"], ["epoch"], ["epoch", "compose"],
                                 ["env"], ["submit"]])
def test_help_everywhere(cmd):
    proc = cli(*cmd, "--help", check=True)
    assert "Usage:" in proc.stdout


def test_submit_allocates_and_passes_inputs(root, tmp_path):
    """Against a stand-in sbatch that records what it got (the real sbatch is
    exercised in tests/cluster): N is allocated once per submit and exported by name."""
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n{ printf '%s\\n' \"$@\"; env | grep ^DISPATCH_ | sort; } > \"$FAKE_OUT\"\n"
                    "echo 4242\n")
    fake.chmod(0o755)
    e = {"PATH": f"{fake.parent}:{os.environ['PATH']}", "FAKE_OUT": str(tmp_path / "out")}
    first = cli("submit", root, "--json", "--", "--nodes=2", "job.sh", env=e, check=True)
    assert json.loads(first.stdout) == {"job_id": 4242, "submission": 1, "generation": 0,
                                        "epoch": 1000000, "root": str(root)}
    got = (tmp_path / "out").read_text().splitlines()
    assert got[:4] == ["--parsable", "--export=ALL,DISPATCH_CHECKPOINT,DISPATCH_GENERATION,DISPATCH_SUBMISSION",
                       "--nodes=2", "job.sh"]
    assert f"DISPATCH_CHECKPOINT={root}" in got and "DISPATCH_SUBMISSION=1" in got
    second = cli("submit", root, "--generation", "1", "--", "job.sh", env=e, check=True)
    assert "submission 2 (epoch 1000002000000)" in second.stdout
    bad = cli("submit", root, "--generation", "-1", "--", "job.sh", env=e)
    assert bad.returncode == 2 and "--generation" in bad.stderr and len(bad.stderr.splitlines()) == 1
    unknown = cli("submit", root, "--nodes=2", "job.sh", env=e)  # sbatch options need `--`
    assert unknown.returncode == 2 and "--nodes" in unknown.stderr
    assert sorted(os.listdir(root / "sub")) == ["000001", "000002"]  # refused: no N spent


def test_the_execution_view_reads_the_job_environment_and_arguments_override_it():
    """Execution.current(): what a process inside the job reads (contract/env.py)."""
    environ = {"DISPATCH_CHECKPOINT": "/ckpt/run1", "DISPATCH_EPOCH": "2000001", "DISPATCH_ATTEMPT": "c.7.2000001",
               "DISPATCH_EXEC_DIR": "/ckpt/run1/exec/c.7.2000001", "DISPATCH_GRACE_S": "90", "SLURM_JOB_ID": "7",
               "DISPATCH_PREEMPT_LINGER": "1", "DISPATCH_LOCAL": "0"}
    ex = env.Execution.current(environ)
    assert (ex.root, ex.epoch, ex.attempt, ex.exec_dir, ex.grace, ex.job) == (
        "/ckpt/run1", 2_000_001, "c.7.2000001", "/ckpt/run1/exec/c.7.2000001", 90.0, "7")
    assert ex.linger and not ex.local and ex.probe_dir is None
    assert ex.save_path(300) == "/ckpt/run1/exec/c.7.2000001/checkpoint-300"
    assert ex.need("root") == "/ckpt/run1" and ex.need("epoch", "attempt") == (2_000_001, "c.7.2000001")
    given = env.Execution.current(environ, root="/other", epoch=5, exec_dir="/x", grace=0)
    assert (given.root, given.epoch, given.exec_dir, given.grace) == ("/other", 5, "/x", 0.0)
    bare = env.Execution.current({})
    assert (bare.root, bare.epoch, bare.attempt, bare.exec_dir, bare.grace) == (None, None, None, None, 60.0)
    for field, variable in env.FIELDS.items():
        with pytest.raises(EnvError) as e:
            bare.need(field)
        assert str(e.value) == env.MISSING[variable]
    with pytest.raises(EnvError, match="DISPATCH_EXEC_DIR is not set"):
        bare.save_path(1)


def test_a_bad_value_fails_only_the_reader_of_its_field():
    ex = env.Execution.current({"DISPATCH_CHECKPOINT": "/r", "DISPATCH_EPOCH": "12x", "DISPATCH_GRACE_S": "301"})
    assert ex.need("root") == "/r"  # a publication's root is not stopped by a bad grace
    with pytest.raises(EpochError, match="DISPATCH_EPOCH must be a decimal integer"):
        ex.need("epoch")
    assert env.Execution.current({"DISPATCH_EPOCH": str(10**20 - 1)}).epoch == 10**20 - 1  # EPOCH_MAX
    with pytest.raises(EpochError, match="DISPATCH_EPOCH"):
        env.Execution.current({"DISPATCH_EPOCH": str(10**20)}).epoch
    with pytest.raises(EnvError, match=r"DISPATCH_GRACE_S must be 0\.\.300 seconds, got '301'"):
        ex.grace


def test_one_grace_parser_for_the_job_option_and_the_handler():
    """env.grace (DISPATCH_GRACE, whole seconds as the C plugin reads them) and the handler's
    grace (DISPATCH_GRACE_S or grace=, fractions allowed) share parse_grace and its cap."""
    assert env.grace({"DISPATCH_GRACE": "120"}, siteconf.Site()) == 120
    assert env.Execution.current({"DISPATCH_GRACE_S": "2.5"}).grace == 2.5
    for bad in ("301", "1e3", "1.5", "-1"):
        with pytest.raises(EnvError, match="DISPATCH_GRACE"):
            env.grace({"DISPATCH_GRACE": bad}, siteconf.Site())
    for bad in ("abc", "301", "-1", "nan"):
        with pytest.raises(EnvError, match="DISPATCH_GRACE_S"):
            env.Execution.current({"DISPATCH_GRACE_S": bad}).grace
    with pytest.raises(EnvError, match=r"^grace must be 0\.\.300"):
        env.Execution.current({"DISPATCH_GRACE_S": "5"}, grace=1000).grace
    assert env.parse_grace("x", "300") == env.parse_grace("x", "300", whole=True) == siteconf.GRACE_CAP


def test_env_local_refuses_an_empty_dispatch_checkpoint(tmp_path):
    """DISPATCH_CHECKPOINT="" is a mistake (a variable left empty), never a request
    for ./dispatch-local: refused, naming the variable, nothing created."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    res = subprocess.run([sys.executable, "-m", "dispatch_slurm", "env", "--local"], cwd=tmp_path,
                         env={**clean, "DISPATCH_CHECKPOINT": ""}, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "DISPATCH_CHECKPOINT is set but empty" in res.stderr, res
    assert not (tmp_path / "dispatch-local").exists()
    res = subprocess.run([sys.executable, "-m", "dispatch_slurm", "env", "--local"], cwd=tmp_path,
                         env=clean, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and (tmp_path / "dispatch-local" / "exec").is_dir(), res.stderr


def test_env_local_refuses_a_named_root_that_does_not_exist_as_the_readme_says(tmp_path):
    """A named root is never created (a typo would start a new lineage from step 0, as the
    plugin, `submit` and `env` in a job refuse it); only ./dispatch-local is. The Quickstart
    says so."""
    from test_readme_snippets import REPO
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    res = subprocess.run([sys.executable, "-m", "dispatch_slurm", "env", "--local"], cwd=tmp_path,
                         env={**clean, "DISPATCH_CHECKPOINT": str(tmp_path / "typo")}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "does not exist" in res.stderr and not (tmp_path / "typo").exists()
    step2 = (REPO / "README.md").read_text().split("**2. ", 1)[1].split("<!-- snippet", 1)[0]
    assert "must exist" in step2 and "./dispatch-local`, created" in " ".join(step2.split()), step2


@pytest.mark.parametrize("link", ["exec", "attempt"])
def test_env_refuses_an_exec_folder_linked_to_node_local_storage_and_says_so(root, tmp_path, link):
    """`env` run again in a step (or a user's `ln -s` before it) finds the exec
    folder, or exec/, linked to node-local storage: refused, naming the link, its target and why."""
    allocate(root)
    e = slurm_env(root)
    cli("env", env=e, check=True)
    local = tmp_path / "local-ssd"
    local.mkdir()
    where = root / "exec" if link == "exec" else root / "exec" / "linux.42.1000000"
    if link == "exec":
        (local / "linux.42.1000000").mkdir()
        (root / "exec" / "linux.42.1000000").rmdir()
    where.rmdir()
    where.symlink_to(local)
    proc = cli("env", env=e)
    assert proc.returncode == 2 and proc.stdout.endswith("exit 2\n"), proc
    assert f"{where} is a symlink to {local}, outside the checkpoint root" in proc.stderr, proc.stderr
    assert "node-local" in proc.stderr and "refusing to follow it" in proc.stderr


def _tree(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_env_local_on_a_full_filesystem_leaves_no_execution_behind(small_fs):
    """A full filesystem refuses `env --local` (exit 2) before the execution starts: nothing
    of it is left (no sub/ number, exec folder or empty epochs/ claim), so `report` lists no
    execution that never ran, and the next call, once there is room, takes the next number."""
    root = small_fs / "r"
    root.mkdir()
    local = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    local["DISPATCH_CHECKPOINT"] = str(root)
    assert cli("env", "--local", env=local).returncode == 0
    before = _tree(root)
    fill(small_fs / "filler")
    for _ in range(3):
        proc = cli("env", "--local", env=local)
        assert proc.returncode == 2 and "No space left on device" in proc.stderr, proc.stderr
    assert _tree(root) == before, "the refused calls left entries behind"
    report = json.loads(cli("report", root, "--json", env=local).stdout)
    assert [e["attempt"] for e in report["executions"]] == ["local.1.1000000"]
    (small_fs / "filler").unlink()
    assert "DISPATCH_ATTEMPT=local.2.2000000" in cli("env", "--local", env=local).stdout


def test_latest_resume_refuses_what_every_resume_call_refuses(root):
    """`latest --resume` in a job script makes resume_point()'s checks: a DISPATCH_EPOCH
    changed after env, another execution's DISPATCH_EXEC_DIR, a made-up DISPATCH_ATTEMPT,
    each refused in one line before any copy is made; what it writes is the refusal alone (a
    `warning` event, kind `refused`, that `run` reads to stop a refusal that repeats)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    base["DISPATCH_CHECKPOINT"] = str(root)
    first = json.loads(cli("env", "--local", "--format", "json", env=base, check=True).stdout)
    save = root / "exec" / first["DISPATCH_ATTEMPT"] / "checkpoint-5"
    save.mkdir()
    (save / "model.bin").write_bytes(b"w")
    cli("publish", save, env={**base, **first}, check=True)
    second = {**base, **json.loads(cli("env", "--local", "--format", "json", env=base, check=True).stdout)}
    forger = f"other.9.{second['DISPATCH_EPOCH']}"  # a made-up attempt at this execution's epoch, its folder made
    (root / "exec" / forger).mkdir()
    before, events_before = _tree(root), sorted(os.listdir(root / "events"))
    for change, says in [({"DISPATCH_EPOCH": "9000000"}, "was $DISPATCH_EPOCH changed"),
                         ({"DISPATCH_EXEC_DIR": str(save.parent)}, "belongs to execution"),
                         ({"DISPATCH_ATTEMPT": "local.7.7000000", "DISPATCH_EXEC_DIR": f"{root}/exec/local.7.7000000",
                           "DISPATCH_EPOCH": "7000000"}, "does not exist"),
                         ({"DISPATCH_ATTEMPT": forger, "DISPATCH_EXEC_DIR": f"{root}/exec/{forger}"},
                          f"is claimed by execution {second['DISPATCH_ATTEMPT']}")]:
        proc = cli("latest", "--resume", env={**second, **change})
        assert proc.returncode == 2 and says in proc.stderr and proc.stdout == "", (change, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    def unevented(tree):
        return [p for p in tree if not p.startswith("events/")]
    assert unevented(_tree(root)) == unevented(before)
    said = [json.loads(line) for name in sorted(set(os.listdir(root / "events")) - set(events_before))
            for line in (root / "events" / name).read_text().splitlines()]
    assert said and {(e["type"], e.get("kind")) for e in said} == {("warning", "refused")}, said
    held = cli("latest", "--resume", env=second, check=True).stdout.strip()
    assert held.startswith(second["DISPATCH_EXEC_DIR"] + "/dispatch-resume/")
