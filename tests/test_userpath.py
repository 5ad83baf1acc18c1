"""The user's path: what a person copies and types works, and what goes wrong says
so. No text recommends `$(dispatch-slurm latest ...)` inside an argument; `watch --until-pid`
of no process, `publish --step` against the name, relative roots, a read-only root, an empty
root's report, sizes and plurals, `env --local`. The real CLI, a real filesystem."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from support import REPO, allocate, claim, cli

from dispatch_slurm import store
from dispatch_slurm.cli import dispatch

E1 = 1_000_000
A1 = f"c.1.{E1}"

# ---- no `$(dispatch-slurm latest ...)` inside an argument --------------------------------------------

# `set -e` stops a script when an assignment's command substitution fails, not when one inside an
# argument does: `--resume-from "$(dispatch-slurm latest --resume)"` trains from step 0 on an error.
SUBST = re.compile(r"\$\(\s*dispatch-slurm\s+latest\b")
# allowed: a plain assignment starting a command (a line, `if`, `;`, `&&`, an inline code span)
ASSIGNED = re.compile(r"(?:^|[;&|(`]|\bif|\bthen|\bdo|\bwhile)\s*[A-Za-z_][A-Za-z0-9_]*=$")


def offenders(text: str) -> list[str]:
    """Every line of ``text`` with `$(dispatch-slurm latest` used other than as an assignment."""
    out = []
    for line in text.splitlines():
        for m in SUBST.finditer(line):
            if not ASSIGNED.search(line[:m.start()]):
                out.append(line.strip())
    return out


def _docs() -> dict[str, str]:
    files = [*REPO.glob("*.md"), *REPO.glob("docker-slurm/*.md"), *(REPO / "docs").rglob("*"),
             *(REPO / "examples").rglob("*")]
    return {str(p.relative_to(REPO)): p.read_text(errors="replace") for p in files if p.is_file()}


def _helps() -> dict[str, str]:
    out, runner = {}, CliRunner()

    def walk(cmd, path):
        out[" ".join(path) or "dispatch-slurm"] = runner.invoke(dispatch, [*path, "--help"]).output
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(click.Context(cmd)):
                walk(cmd.get_command(click.Context(cmd), name), [*path, name])
    walk(dispatch, [])
    return out


def _package_strings() -> dict[str, str]:
    """Every string constant of the package (docstrings, messages), per module."""
    out = {}
    for p in (REPO / "dispatch_slurm").rglob("*.py"):
        tree = ast.parse(p.read_text())
        out[str(p.relative_to(REPO))] = "\n".join(n.value for n in ast.walk(tree)
                                                  if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return out


def test_the_detector_finds_the_pattern_the_issue_reproduced():
    assert offenders('torchrun train.py --save-to "$DISPATCH_EXEC_DIR" --resume-from "$(dispatch-slurm latest '
                     '--resume)" &')
    assert offenders('    --resume-from "$(dispatch-slurm latest --resume)" and still stop on an error.')
    assert offenders("export R=$(dispatch-slurm latest --path)") and offenders("local r=$(dispatch-slurm latest)")
    assert not offenders('resume=$(dispatch-slurm latest --resume)    # an error stops the job')
    assert not offenders("  if p=$(dispatch-slurm latest /r --resume 2>> err); then")
    assert not offenders("for `p=$(dispatch-slurm latest --path)`.")


@pytest.mark.parametrize("where", ["docs", "help", "package"])
def test_no_text_recommends_latest_inside_an_argument(where):
    texts = {"docs": _docs, "help": _helps, "package": _package_strings}[where]()
    assert len(texts) >= (20 if where == "help" else 3)
    found = {name: bad for name, text in texts.items() if (bad := offenders(text))}
    assert not found, f"$(dispatch-slurm latest ...) inside an argument (set -e does not stop on it): {found}"


# ---- watch --until-pid, its banner ------------------------------------------------------------------

@pytest.fixture
def job(root):
    exec_dir = root / "exec" / A1
    exec_dir.mkdir(parents=True)
    env = {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": str(E1), "DISPATCH_ATTEMPT": A1,
           "DISPATCH_EXEC_DIR": str(exec_dir)}
    return root, exec_dir, env


def _gone_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_watch_until_a_pid_that_does_not_exist_is_refused_at_start(job):
    root, exec_dir, env = job
    (exec_dir / "checkpoint-1").mkdir()
    (exec_dir / "checkpoint-1" / "trainer_state.json").write_text("{}")
    pid = _gone_pid()
    proc = cli("watch", "--until-pid", pid, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc
    assert f"--until-pid {pid}: no such process" in proc.stderr and "wait $T" in proc.stderr
    assert store.latest(str(root)) is None, "refused before anything: no scan, no publication"
    huge = cli("watch", "--until-pid", 2**40, env=env)
    assert huge.returncode == 2 and "Traceback" not in huge.stderr


def test_watch_banner_names_the_marker_a_file_save_waits_for(job):
    root, exec_dir, env = job
    (exec_dir / "checkpoint-3").write_bytes(b"weights")  # a file save
    (exec_dir / "checkpoint-3.done").touch()
    proc = cli("watch", "--once", "--marker", "done", env=env, check=True)
    assert "<save>/done exists, for a file save <save>.done" in proc.stderr
    assert store.latest(str(root)).step == 3


# ---- publish: the step its name says, and --root's errors --------------------------------------------

def test_publish_refuses_a_step_its_name_contradicts(job):
    root, exec_dir, env = job
    save = exec_dir / "checkpoint-8"
    save.mkdir()
    (save / "model.bin").write_bytes(b"w")  # a save holds a file
    bad = cli("publish", save, "--step", "9", env=env)
    assert bad.returncode == 2 and "its name says step 8" in bad.stderr and not (root / "pub").exists()
    cli("publish", save, "--step", "8", env=env, check=True)
    cli("publish", save, env=env, check=True)
    assert [p.step for p in store.publications(str(root))] == [8], "one save, one step"
    other = exec_dir / "state.bin"  # no step in its name: --step says it
    other.write_bytes(b"x")
    cli("publish", other, "--step", "9", env=env, check=True)


def test_publish_without_a_root_names_its_option_not_a_root_argument(job):
    root, exec_dir, env = job
    (exec_dir / "checkpoint-1").mkdir()
    ((exec_dir / "checkpoint-1") / "model.bin").write_bytes(b"w")  # a save holds a file
    keep = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    proc = subprocess.run([sys.executable, "-m", "dispatch_slurm", "publish", str(exec_dir / "checkpoint-1"),
                           "--epoch", str(E1)], env=keep, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--root" in proc.stderr and "pass ROOT" not in proc.stderr


# ---- relative roots: one rule for every command ---------------------------------------------------

def test_a_root_named_relative_is_made_absolute_and_a_relative_env_root_refused(job):
    root, exec_dir, env = job
    (exec_dir / "checkpoint-4").mkdir()
    ((exec_dir / "checkpoint-4") / "model.bin").write_bytes(b"w")  # a save holds a file
    store.publish(str(exec_dir / "checkpoint-4"), root=str(root), epoch=E1)
    here, name = str(root.parent), root.name
    want = f"{root}/exec/{A1}/checkpoint-4\n"
    assert cli("latest", name, "--path", cwd=here, check=True).stdout == want
    assert cli("latest", f"./{name}/", "--resume", cwd=here, check=True).stdout == want
    assert json.loads(cli("ls", name, "--json", cwd=here, check=True).stdout)[0]["abspath"] == want[:-1]
    assert json.loads(cli("report", name, "--json", cwd=here, check=True).stdout)["root"] == str(root)
    assert cli("gc", name, "--keep-last", "1", "--dry-run", cwd=here, check=True).returncode == 0
    for argv in (["latest"], ["ls"], ["report"], ["gc", "--keep-last", "1", "--dry-run"]):
        proc = cli(*argv, env={**env, "DISPATCH_CHECKPOINT": name}, cwd=here)
        assert proc.returncode == 2 and "is relative" in proc.stderr, (argv, proc)
    proc = cli("publish", "--root", name, exec_dir / "checkpoint-4", "--json", env={**env}, cwd=here, check=True)
    assert json.loads(proc.stdout)["abspath"] == want[:-1]
    refused = cli("env", env={**env, "DISPATCH_CHECKPOINT": name, "DISPATCH_SUBMISSION": "1", "SLURM_JOB_ID": "3",
                              "SLURM_CLUSTER_NAME": "c"}, cwd=here)
    assert refused.returncode == 2 and "absolute" in refused.stderr
    assert cli("latest", "", cwd=here).returncode == 2


def test_latest_usage_shows_root_optional_and_names_the_variable():
    out = cli("latest", "--help", check=True).stdout
    assert "Usage: dispatch-slurm latest [OPTIONS] [ROOT]" in out and "$DISPATCH_CHECKPOINT" in out
    keep = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    proc = subprocess.run([sys.executable, "-m", "dispatch_slurm", "latest"], env=keep, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "DISPATCH_CHECKPOINT" in proc.stderr


# ---- report, sizes, plurals ----------------------------------------------------------------------

def test_report_on_an_empty_root_says_nothing_is_there_without_none_or_1970(root):
    out = cli("report", root, check=True).stdout
    assert "None" not in out and "1970" not in out and "no execution" in out, out
    (root / "exec" / A1).mkdir(parents=True)  # an execution that saved nothing yet
    out = cli("report", root, check=True).stdout
    assert "None" not in out and "1970" not in out, out


def test_one_size_format_and_proper_plurals_in_ls_gc_and_report(job):
    root, exec_dir, env = job
    save = exec_dir / "checkpoint-1"
    save.mkdir()
    (save / "model.bin").write_bytes(b"w")  # a save holds a file
    (save / "w").write_bytes(b"x" * 5000)
    store.publish(str(save), root=str(root), epoch=E1)
    outs = [cli("ls", root, check=True), cli("gc", root, "--keep-last", "1", "--dry-run", check=True),
            cli("report", root, check=True)]
    text = "".join(o.stdout + o.stderr for o in outs)
    assert re.search(r"\d KiB\b", text), text
    assert not re.search(r"\d(?:KB|MB|GB|TB|B)\b", text), "a size without its IEC unit and space"
    assert not re.search(r"\b1 (saves|publications|executions)\b", text) and "(s)" not in text, text
    assert "kept 1 save (" in outs[1].stderr and "1 execution, 1 publication" in outs[2].stdout


def test_gc_checks_every_option_before_it_pins(job):
    """Found by the CLI fuzz test: a bad --pattern was refused after --pin had pinned, on two lines."""
    root, exec_dir, env = job
    proc = cli("gc", root, "--pin", exec_dir, "--keep-last", "1", "--pattern", "x")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--pattern" in proc.stderr
    assert not (root / "pinned").exists()


# ---- a read-only root: the full path --------------------------------------------------------------

def test_a_read_only_root_names_the_full_path(job):
    root, exec_dir, env = job
    (exec_dir / "checkpoint-1").mkdir()
    ((exec_dir / "checkpoint-1") / "model.bin").write_bytes(b"w")  # a save holds a file
    (root / "pub").mkdir()  # the entry's create fails, not the folder's (whose error always had the path)
    claim(root, A1)  # the epoch is this execution's already (env claimed it): publish creates only pub/<name>
    allocate(root, 2)  # N=2 was allocated: env gets as far as the exec folder
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a read-only bind mount needs root and unshare")
    ro = f"mount --bind {root} {root} && mount -o remount,ro,bind {root} {root}"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", ro], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode()[-200:]}")
    py = f"{sys.executable} -m dispatch_slurm"
    script = (f"{ro} && {py} publish {exec_dir}/checkpoint-1; echo rc=$?; "
              f"SLURM_JOB_ID=9 SLURM_CLUSTER_NAME=c DISPATCH_SUBMISSION=2 {py} env; echo rc=$?")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120)
    errors = [x for x in proc.stderr.splitlines() if x.startswith("dispatch-slurm: error:")]
    assert proc.stdout.count("rc=2") == 2 and len(errors) == 2, proc
    assert errors[0].startswith(f"dispatch-slurm: error: {root}/pub/00000000000001000000-") and \
        errors[0].endswith("Read-only file system")
    assert errors[1] == f"dispatch-slurm: error: {root}/exec/c.9.2000000: Read-only file system"


# ---- env --local: the user path without Slurm -----------------------------------------------------

def test_env_local_gives_each_call_a_new_execution_without_slurm(tmp_path):
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    run = lambda *a, **kw: subprocess.run([sys.executable, "-m", "dispatch_slurm", *a], cwd=tmp_path,  # noqa: E731
                                          capture_output=True, text=True, timeout=60, **kw)
    first = json.loads(run("env", "--local", "--format", "json", env={**keep, "SLURM_JOB_ID": "77"}).stdout)
    second = json.loads(run("env", "--local", "--format", "json", env=keep).stdout)
    assert first["DISPATCH_CHECKPOINT"] == second["DISPATCH_CHECKPOINT"] == str(tmp_path / "dispatch-local")
    assert first["DISPATCH_ATTEMPT"] == "local.1.1000000" and second["DISPATCH_ATTEMPT"] == "local.2.2000000"
    assert int(second["DISPATCH_EPOCH"]) > int(first["DISPATCH_EPOCH"]), "a later execution outranks"
    assert os.path.isdir(second["DISPATCH_EXEC_DIR"]) and os.path.isdir(first["DISPATCH_EXEC_DIR"])
    named = tmp_path / "mine"
    named.mkdir()
    third = json.loads(run("env", "--local", "--format", "json", env={**keep, "DISPATCH_CHECKPOINT": str(named)}
                           ).stdout)
    assert third["DISPATCH_EXEC_DIR"] == f"{named}/exec/local.1.1000000"
    for bad in ("mine", str(tmp_path / "typo")):
        proc = run("env", "--local", env={**keep, "DISPATCH_CHECKPOINT": bad})
        assert proc.returncode == 2 and proc.stdout.endswith("exit 2\n") and not (tmp_path / "typo").exists()
