"""The shell snippets of README.md and docs/*.md run as written, under `bash -euo pipefail`, and
stop or resume correctly when a failure is injected (env fails, latest errors, nothing
published yet, a vanished save). Every snippet that starts a trainer in the
background ends with the trainer's exit status, so a crash fails the job. External programs
are small stand-ins on PATH: `python`/`torchrun` (a trainer that records its arguments,
writes one Hugging Face-style save or a DCP-style one on S3, and exits 0 or, asked to, 1),
`srun`/`sbatch`/`scontrol` (tests/stubs/slurm-cli); dispatch-slurm itself is the real one.
Each block is found by the marker above it (`<!-- snippet: NAME -->`), and one that
another test runs names it (`<!-- snippet: NAME; run by PATH::TEST -->`); a block with
neither fails `test_every_shell_block_is_run_here_or_names_the_test_that_runs_it`."""

import fnmatch
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import NamedTuple

import pytest

from dispatch_slurm import store
from support import allocate, held_copy

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = ("sh", "bash", "shell", "console")
# <!-- snippet: NAME --> right above a block this module runs, or
# <!-- snippet: NAME; run by PATH[::TEST] [(why)], ... --> above one another test (or CI) runs
MARKER = re.compile(r"<!-- snippet: ([a-z0-9-]+)(?:; run by (.*?))? -->\n$")
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)


class Block(NamedTuple):
    where: str  # file:line
    name: str | None
    run_by: str | None
    text: str


def blocks(pages: dict[str, str]) -> list[Block]:
    """Every shell block of the pages, with the marker above it (None when there is none)."""
    out = []
    for path, text in pages.items():
        for m in FENCE.finditer(text):
            if m[1].strip() not in SHELL:
                continue
            marker = MARKER.search(text[:m.start()][-400:])
            line = text[:m.start()].count("\n") + 1
            out.append(Block(f"{path}:{line}", marker and marker[1], marker and marker[2], m[2]))
    return out


def run_by_problems(b: Block) -> list[str]:
    """Each `PATH[::TEST]` a marker names must exist: the file, and the test function in it."""
    refs = re.findall(r"((?:\.?[\w-]+/)*\.?[\w.-]+\.(?:py|yml|yaml)|(?:[\w.-]+/)+[\w.-]+|\.ci/run)(?:::(\w+))?",
                      b.run_by)
    if not refs:
        return [f"{b.where}: snippet {b.name!r} names no test that runs it"]
    bad = []
    for path, test in refs:
        f = REPO / path
        if not f.is_file():
            bad.append(f"{b.where}: snippet {b.name!r}: {path} does not exist")
        elif test and not re.search(rf"^def {test}\(", f.read_text(), re.M):
            bad.append(f"{b.where}: snippet {b.name!r}: {path} has no test {test}")
    return bad


def problems(pages: dict[str, str], run_here: dict[str, str]) -> list[str]:
    """Why the pages' shell blocks are not all accounted for: a block without a marker, a
    name used twice, a block this module should run but does not, a test named that is not
    there."""
    found, bad = {}, []
    for b in blocks(pages):
        if b.name is None:
            bad.append(f"{b.where}: a shell block with no `<!-- snippet: NAME -->` marker above it")
        elif b.name in found:
            bad.append(f"{b.where}: snippet name {b.name!r} is used twice (also {found[b.name].where})")
        elif b.run_by is not None:
            bad += run_by_problems(b)
            if b.name in run_here:
                bad.append(f"{b.where}: snippet {b.name!r} says it is run elsewhere, but RUN_HERE runs it")
        elif b.name not in run_here:
            bad.append(f"{b.where}: snippet {b.name!r}: nobody runs it (add it to RUN_HERE, or `; run by ...`)")
        if b.name:
            found.setdefault(b.name, b)
    tests = {n for n in globals() if n.startswith("test_")}
    for name, test in run_here.items():
        if name not in found:
            bad.append(f"RUN_HERE names {name!r}, which no page has")
        if not fnmatch.filter(tests, test):
            bad.append(f"RUN_HERE: {name!r} is run by {test}, which this module does not have")
    return bad


BLOCKS = {b.name: b for b in blocks({p.relative_to(REPO).as_posix(): p.read_text() for p in PAGES}) if b.name}


def block(name: str) -> str:
    return BLOCKS[name].text


# the stand-in trainer, started by a `python` or `torchrun` on PATH that execs the real interpreter
# (so the pid a job script's `$!` names is this process)
TRAINER = r"""
import os, re, sys, time
args = sys.argv[1:]
with open(os.environ["TRAINER_ARGS"], "wb") as f:
    f.write(b"".join(os.fsencode(a) + b"\n" for a in args))
out = args[args.index("--output-dir" if "--output-dir" in args else "--save-to") + 1]
resumed = args[args.index("--resume-from") + 1] if "--resume-from" in args else None
step = 10 + (int(re.search(r"checkpoint-(\d+)", resumed)[1]) if resumed else 0)
if out.startswith("s3://"):  # a DCP save through fsspec: the shard, then .metadata last
    import boto3
    bucket, _, prefix = out[len("s3://"):].partition("/")
    c = boto3.session.Session().client("s3")
    for name in ("__0_0.distcp", ".metadata"):
        c.put_object(Bucket=bucket, Key=f"{prefix}/checkpoint-{step}/{name}", Body=b"w")
else:  # Hugging Face: trainer_state.json last
    os.makedirs(f"{out}/checkpoint-{step}")
    with open(f"{out}/checkpoint-{step}/trainer_state.json", "w") as f:
        f.write('{"global_step": %d}' % step)
if os.environ.get("WAIT_WATCH"):  # until a `watch --until-pid <me>` holds a pidfd on this process
    me, deadline = str(os.getpid()), time.monotonic() + 60
    def watched():
        for p in os.listdir("/proc"):
            try:
                argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
                if b"--until-pid" not in argv or argv[argv.index(b"--until-pid") + 1] != me.encode():
                    continue
                for fd in os.listdir(f"/proc/{p}/fdinfo"):
                    if f"Pid:\t{me}\n" in open(f"/proc/{p}/fdinfo/{fd}").read():
                        return True
            except (OSError, IndexError):
                continue
        return False
    while not watched():
        if time.monotonic() > deadline:
            sys.exit("stand-in trainer: no watch --until-pid on me within 60 s")
        time.sleep(0.02)
sys.exit(int(os.environ.get("TRAINER_EXIT", "0")))
"""


# each snippet this module runs, and its test
RUN_HERE = {
    "install": "test_the_install_snippet_installs_without_root",
    "local-trial": "test_the_local_trial_is_the_first_thing_to_try",
    "local-user-path": "test_the_local_user_path_without_slurm",
    "job-script": "test_the_job_script_*",
    "publish-by-hand": "test_publishing_by_hand",
    "submit-run-report": "test_submit_supervise_once_and_report",
    "watch-beside-a-trainer": "test_watch_beside_a_trainer",
    "s3-job": "test_the_s3_job_snippet",
    "gc": "test_gc_dry_run_then_gc_then_pin",
    "stray-entry-in-pub": "test_troubleshooting_a_stray_entry_in_pub",
    "vanished-latest-save": "test_troubleshooting_a_vanished_latest_save",
    "moving-a-root": "test_troubleshooting_moving_a_root",
}


def test_every_shell_block_is_run_here_or_names_the_test_that_runs_it():
    pages = {p.relative_to(REPO).as_posix(): p.read_text() for p in PAGES}
    bad = problems(pages, RUN_HERE)
    assert not bad, "\n".join(bad)
    assert len(BLOCKS) >= len(RUN_HERE) + 5


def test_the_snippet_check_finds_each_kind_of_gap():
    """Injected: an unmarked block, a duplicate name, a block nobody runs, a test that does
    not exist (here and elsewhere), a RUN_HERE entry no page has."""
    page = ("```sh\necho unmarked\n```\n\n<!-- snippet: a -->\n```sh\necho a\n```\n\n"
            "<!-- snippet: a -->\n```bash\necho again\n```\n\n<!-- snippet: b -->\n```sh\necho b\n```\n\n"
            "<!-- snippet: c; run by tests/test_docs.py::test_no_such_test -->\n```sh\necho c\n```\n\n"
            "<!-- snippet: d; run by tests/no_such_file.py -->\n```sh\necho d\n```\n\n"
            "<!-- snippet: e; run by tests/test_docs.py::test_every_page_is_in_the_navigation -->\n```sh\n"
            "echo e\n```\n\n```python\nprint('not shell')\n```\n")
    bad = problems({"x.md": page}, {"a": "test_the_snippet_check_finds_each_kind_of_gap", "z": "test_none"})
    want = ["x.md:1: a shell block with no", "used twice", "snippet 'b': nobody runs it", "has no test test_no_such_test",
            "tests/no_such_file.py does not exist", "RUN_HERE names 'z'", "is run by test_none"]
    for w in want:
        assert any(w in x for x in bad), (w, bad)
    assert len(bad) == len(want), bad  # e is fine, and the python block is no shell block


def test_every_background_trainer_ends_the_script_with_its_exit_status():
    """A trainer started with `&` must be waited for by its pid (`wait $T`): a bare `wait`
    returns 0 whatever the trainer did."""
    for b in (b.text for b in BLOCKS.values()):
        lines = [x.split("#")[0].strip() for x in b.splitlines()]
        started = [x for x in lines if re.search(r"&(\s*[A-Z]+=\$!)?$", x)]
        if not started:
            continue
        pid = re.search(r"\b([A-Z]+)=\$!", "\n".join(lines))
        assert pid, f"the trainer's pid is not kept:\n{b}"
        assert f"wait ${pid[1]}" in lines[-1] and "wait" not in lines[:-1], f"not ended by wait ${pid[1]}:\n{b}"


@pytest.fixture
def job(tmp_path):
    """A job's world: a root, stand-in programs on PATH, the variables `submit` exports."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (tmp_path / "trainer.py").write_text(TRAINER)
    for name in ("python", "torchrun"):
        (bin_ / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path}/trainer.py" "$@"\n')
        (bin_ / name).chmod(0o755)
    for name in ("srun", "sbatch", "scontrol", "sacct"):
        (bin_ / name).symlink_to(REPO / "tests" / "stubs" / "slurm-cli")
    root = tmp_path / "root"
    root.mkdir()
    n = allocate(root, 2)  # the submissions that gave this job its N=2
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(PATH=f"{bin_}:{pathlib.Path(sys.executable).parent}:/usr/bin:/bin", HOME=str(tmp_path),
               USER="me", TRAINER_ARGS=str(tmp_path / "trainer.args"), STUB_SLURM_STATE=str(tmp_path / "slurm.json"),
               SLURM_JOB_ID="7", SLURM_CLUSTER_NAME="c", DISPATCH_CHECKPOINT=str(root), DISPATCH_SUBMISSION=str(n))
    return tmp_path, root, env


def bash(script: str, env: dict, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, cwd=cwd, capture_output=True,
                          timeout=timeout)


def trainer_args(tmp) -> list[bytes] | None:
    p = tmp / "trainer.args"
    return p.read_bytes().splitlines() if p.exists() else None


def resumed_from(tmp) -> bytes | None:
    args = trainer_args(tmp)
    return args[args.index(b"--resume-from") + 1] if b"--resume-from" in args else None


def test_the_job_script_starts_fresh_and_publishes(job):
    tmp, root, env = job
    res = bash(block("job-script"), {**env, "WAIT_WATCH": "1"}, tmp)
    assert res.returncode == 0, res.stderr
    assert resumed_from(tmp) is None, "nothing was published: the trainer must start fresh"
    assert store.latest(str(root)).path == "exec/c.7.2000000/checkpoint-10"


def test_the_job_script_fails_when_the_trainer_crashes(job):
    """The trainer exits 1 (after a save): the script exits 1, so the job ends
    FAILED, not COMPLETED; the save it made is still published by the watch's final scan."""
    tmp, root, env = job
    res = bash(block("job-script"), {**env, "WAIT_WATCH": "1", "TRAINER_EXIT": "1"}, tmp)
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert store.latest(str(root)).step == 10


def test_the_job_script_resumes_from_the_latest_publication_whatever_its_bytes(job):
    tmp, root, env = job
    earlier = os.fsencode(root) + b"/exec/c.6.1000000/checkpoint-5\xff"  # a non-UTF-8 save name
    os.makedirs(earlier)
    with open(earlier + b"/model.bin", "wb") as f:  # a save holds a file
        f.write(b"w")
    store.publish(os.fsdecode(earlier), 5, root=str(root), epoch=1_000_000)
    res = bash(block("job-script"), {**env, "WAIT_WATCH": "1"}, tmp)
    assert res.returncode == 0, res.stderr
    assert resumed_from(tmp) == os.fsencode(held_copy(root, "c.7.2000000", os.fsdecode(earlier)))
    assert store.latest(str(root)).path == "exec/c.7.2000000/checkpoint-15"


@pytest.mark.parametrize("fault", ["env fails", "latest errors", "the latest save vanished"])
def test_the_job_script_stops_before_training_on_an_error(job, fault):
    tmp, root, env = job
    if fault == "env fails":  # a hand-set number no submission allocated (unset, the job would allocate one)
        env["DISPATCH_SUBMISSION"] = "999"
    elif fault == "latest errors":
        (root / "pub").mkdir()
        (root / "pub" / "README.txt").write_text("a stray file: an entry that does not parse")
    else:
        save = root / "exec" / "c.6.1000000" / "checkpoint-5"
        save.mkdir(parents=True)
        (save / "model.bin").write_bytes(b"w")
        pub = store.publish(str(save), root=str(root), epoch=1_000_000).publication
        shutil.rmtree(save)
        shutil.rmtree(root / "held" / pub.name)  # a person (a scratch purge) removed its held links too
    res = bash(block("job-script"), env, tmp)
    assert res.returncode == 2, "the job went on after an error"
    assert trainer_args(tmp) is None, "the trainer ran: it would have started from step 0"
    assert b"dispatch-slurm" in res.stderr and b"Traceback" not in res.stderr
    fix = {"env fails": b"DISPATCH_SUBMISSION", "latest errors": b"mv ", "the latest save vanished":
           b"dispatch-slurm retire "}[fault]
    assert fix in res.stderr, res.stderr


def test_publishing_by_hand(job):
    tmp, root, env = job
    env.update(DISPATCH_EPOCH="2000000", DISPATCH_ATTEMPT="c.7.2000000",
               DISPATCH_EXEC_DIR=str(root / "exec" / "c.7.2000000"))
    missing = bash(block("publish-by-hand"), env, tmp)
    assert missing.returncode == 2 and missing.stderr.count(b"\n") == 1 and b"does not exist" in missing.stderr
    (root / "exec" / "c.7.2000000" / "checkpoint-500").mkdir(parents=True)
    (root / "exec" / "c.7.2000000" / "checkpoint-500" / "model.bin").write_bytes(b"w")
    ok = bash(block("publish-by-hand"), env, tmp)
    assert ok.returncode == 0 and store.latest(str(root)).step == 500


@pytest.mark.parametrize("exit_", [0, 1])
def test_watch_beside_a_trainer(job, exit_):
    tmp, root, env = job
    env.update(DISPATCH_EPOCH="2000000", DISPATCH_ATTEMPT="c.7.2000000", WAIT_WATCH="1", TRAINER_EXIT=str(exit_),
               DISPATCH_EXEC_DIR=str(root / "exec" / "c.7.2000000"))
    (root / "exec" / "c.7.2000000").mkdir(parents=True)
    res = bash(block("watch-beside-a-trainer"), env, tmp)
    assert res.returncode == exit_, res.stderr
    assert store.latest(str(root)).step == 10


def test_submit_supervise_once_and_report(job):
    tmp, root, env = job
    script = block("submit-run-report").replace("/scratch/$USER", str(tmp / "scratch"))
    res = bash(script, env, tmp)
    assert res.returncode == 0, res.stderr
    log = (tmp / "slurm.json.log").read_text()
    assert '"--export=ALL,DISPATCH_CHECKPOINT,DISPATCH_GENERATION,DISPATCH_SUBMISSION"' in log
    assert "--test-only" in log and (tmp / "scratch" / "run1" / "record.jsonl").exists()
    assert (tmp / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    typo = bash(block("submit-run-report").replace("/scratch/$USER", str(tmp / "typo"))
                .replace("mkdir -p", "true"), env, tmp)  # the root was never made: stop at submit
    assert typo.returncode == 2 and b"does not exist" in typo.stderr


def test_gc_dry_run_then_gc_then_pin(job):
    """The gc block as written, on a root with two executions' saves: the dry run removes
    nothing, gc keeps what Slurm cannot show ceased (the stand-in knows no job), the pin holds."""
    tmp, root, env = job
    for attempt, steps in (("c.6.1000000", (4000, 5000)), ("c.7.2000000", (6000, 7000))):
        for step in steps:
            save = root / "exec" / attempt / f"checkpoint-{step}"
            save.mkdir(parents=True)
            (save / "model.bin").write_bytes(b"w" * 4096)
            store.publish(str(save), root=str(root), epoch=int(attempt.rsplit(".", 1)[1]))
    before = sorted(p.relative_to(root) for p in root.rglob("model.bin"))
    script = block("gc").replace("/scratch/me/run1", str(root)).replace("<attempt>",
                                                                                              "c.6.1000000")
    res = bash(script, env, tmp)
    assert res.returncode == 0, res.stderr
    assert b"would" in res.stdout or b"would" in res.stderr, res
    assert sorted(p.relative_to(root) for p in root.rglob("model.bin")) == before
    assert len(os.listdir(root / "pinned")) == 1


def test_the_install_snippet_installs_without_root(tmp_path):
    """A user's install: a venv of their own and `pip install ./dispatch-slurm` (a copy of
    this checkout's package), then the command works."""
    src = tmp_path / "dispatch-slurm"
    shutil.copytree(REPO / "dispatch_slurm", src / "dispatch_slurm", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(HOME=str(tmp_path), PATH="/usr/bin:/bin")
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", block("install")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "version 0.1.0" in res.stdout


@pytest.mark.parametrize("crash", [False, True], ids=["trains", "crashes"])
def test_the_local_user_path_without_slurm(tmp_path, crash):
    """`eval "$(dispatch-slurm env --local)"` on a machine without Slurm, run twice as the
    Quickstart says, in a checkout (examples/train.py, the real interpreter: no stand-ins):
    the second execution resumes from the first one's save and publishes at a higher
    epoch; a trainer that crashes (here: its resume point is corrupt) fails the script."""
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "train.py", tmp_path / "examples" / "train.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(PATH=f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin", HOME=str(tmp_path))
    first = bash(block("local-user-path"), env, tmp_path)
    assert first.returncode == 0, first.stderr
    assert b"starting at step 0" in first.stdout and b"published step 20" in first.stdout, first.stdout
    root = tmp_path / "dispatch-local"
    assert store.latest(str(root)).path == "exec/local.1.1000000/checkpoint-20"
    saved = root / "exec" / "local.1.1000000" / "checkpoint-20"
    if crash:
        (saved / "state.json").write_text("not json")
    second = bash(block("local-user-path"), env, tmp_path)
    if crash:  # 1 (wait $T), or 2 when it died before the watch started (which then refuses its pid)
        assert second.returncode in (1, 2) and b"Traceback" in second.stderr, second.stderr
        assert store.latest(str(root)).step == 20
        return
    assert second.returncode == 0, second.stderr
    assert f"resumed from step 20 ({held_copy(root, 'local.2.2000000', saved)})".encode() in second.stdout, \
        second.stdout
    latest = store.latest(str(root))
    assert latest.path == "exec/local.2.2000000/checkpoint-40" and latest.epoch == 2_000_000
    shutil.copy(REPO / ".gitignore", tmp_path / ".gitignore")  # the checkout's: the root it made is not its work
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    status = subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert "dispatch-local" not in status, status


def test_the_local_trial_is_the_first_thing_to_try(job):
    """The Quickstart's first block after the install, as written, from the checkout (the
    real interpreter: no stand-ins)."""
    tmp, _, env = job
    env = {**{k: v for k, v in env.items() if not k.startswith(("DISPATCH_", "SLURM_"))},
           "PATH": f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin"}
    script = block("local-trial").replace("cd dispatch-slurm", f"cd {REPO}")
    res = bash(script, env, tmp, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    # columns: scenario mode trials overlap-median max mixed lost wrong-resume replacement-ran
    rows = {r.split()[1]: r.split()[5:8] for r in res.stdout.decode().splitlines() if r.startswith("local ")}
    assert rows["dispatch"] == ["0", "0", "0"], res.stdout  # mixed, lost, wrong resume
    assert rows["naive"][0] != "0", res.stdout  # the naive folder mixed saves


@pytest.mark.parametrize("exit_", [0, 1])
def test_the_s3_job_snippet(job, s3_env, exit_):
    """The S3 section's job lines against moto's S3 server: a fresh start publishes the DCP
    save once its .metadata is written, the next execution resumes from it, and a crashing
    trainer fails the script."""
    tmp, _, env = job
    url = f"s3://{s3_env.bucket()}/runs/run1"  # s3_env: this process talks to moto too
    env = {**env, **s3_env.env, "WAIT_WATCH": "1"}
    env.pop("AWS_PROFILE", None)
    script = block("s3-job").replace("s3://my-bucket/runs/run1", url)
    first = bash(script, {**env, "DISPATCH_SUBMISSION": str(store.allocate_submission(url))}, tmp)
    assert first.returncode == 0, first.stderr
    assert resumed_from(tmp) is None
    n = store.allocate_submission(url)
    second = bash(script, {**env, "DISPATCH_SUBMISSION": str(n), "TRAINER_EXIT": str(exit_)}, tmp)
    assert second.returncode == exit_, second.stderr
    assert resumed_from(tmp) == f"{url}/exec/c.7.1000000/checkpoint-10".encode()
    assert store.latest(url).path == f"exec/c.7.{n * 1_000_000}/checkpoint-20"


def _scratch(tmp, root) -> str:
    """The Troubleshooting blocks' /scratch/me is this test's folder holding the root run1."""
    me = tmp / "scratch" / "me"
    me.mkdir(parents=True)
    root.rename(me / "run1")
    return str(me)


def test_troubleshooting_a_stray_entry_in_pub(job):
    tmp, root, env = job
    save = root / "exec" / "c.6.1000000" / "checkpoint-5"
    save.mkdir(parents=True)
    (save / "model.bin").write_bytes(b"w")
    store.publish(str(save), root=str(root), epoch=1_000_000)
    (root / "pub" / "README.txt").write_text("notes")
    me = _scratch(tmp, root)
    refused = bash(f"dispatch-slurm latest {me}/run1", env, tmp)
    assert refused.returncode == 2 and f"mv {me}/run1/pub/README.txt".encode() in refused.stderr
    res = bash(block("stray-entry-in-pub").replace("/scratch/me", me), env, tmp)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().startswith(f"{me}/run1/exec/c.6.1000000/checkpoint-5\tstep 5")
    assert os.path.exists(f"{me}/README.txt")


def test_troubleshooting_a_vanished_latest_save(job):
    tmp, root, env = job
    for step in (5, 6):
        save = root / "exec" / "c.6.1000000" / f"checkpoint-{step}"
        save.mkdir(parents=True)
        (save / "model.bin").write_bytes(b"w")
        pub = store.publish(str(save), root=str(root), epoch=1_000_000).publication
    shutil.rmtree(root / "exec" / "c.6.1000000" / "checkpoint-6")
    shutil.rmtree(root / "held" / pub.name)  # by hand, or a scratch purge: the save and its held links
    me = _scratch(tmp, root)
    res = bash(block("vanished-latest-save").replace("/scratch/me", me), env, tmp)
    assert res.returncode == 0, res.stderr
    assert b"latest is now step 5" in res.stdout and b"no longer exists" in res.stderr  # ls said it first
    assert store.latest_save(f"{me}/run1").step == 5


def test_troubleshooting_moving_a_root(job):
    """The whole root moved with no job on it: `latest` names the same save under the new path."""
    tmp, root, env = job
    save = root / "exec" / "c.6.1000000" / "checkpoint-5"
    save.mkdir(parents=True)
    (save / "model.bin").write_bytes(b"w")
    store.publish(str(save), root=str(root), epoch=1_000_000)
    me = _scratch(tmp, root)
    res = bash(block("moving-a-root").replace("/scratch/me", me), env, tmp)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().startswith(f"{me}/run1-moved/exec/c.6.1000000/checkpoint-5\tstep 5"), res.stdout
    assert not os.path.exists(f"{me}/run1")
