"""Issue 12: the README's shell snippets run as written, under `bash -euo pipefail`, and
stop or resume correctly when a failure is injected (env fails, latest errors, nothing
published yet, a vanished save). Issue 20: every snippet that starts a trainer in the
background ends with the trainer's exit status, so a crash fails the job. External programs
are small stand-ins on PATH: `python`/`torchrun` (a trainer that records its arguments,
writes one Hugging Face-style save or a DCP-style one on S3, and exits 0 or, asked to, 1),
`srun`/`sbatch`/`scontrol` (tests/stubs/slurm-cli); dispatch-slurm itself is the real one."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from dispatch_slurm import store
from support import allocate

REPO = pathlib.Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
SH = [m[1] for m in re.finditer(r"```sh\n(.*?)```", README, re.S)]
# blocks run elsewhere, for real, instead of here with stand-ins
ELSEWHERE = {
    "make demo": "the two developer commands: CI runs `make test` itself (.ci/run)",
    "apt-get install gcc make": "an admin's install from source: tests/test_package.py runs `make install` "
                                "(into a DESTDIR and a PREFIX), tests/cluster/test_package.py the symlink step",
    "make deb LINTIAN=:": "the Debian recipe: docker-slurm/Dockerfile builds and installs the .deb for every "
                          "release, tests/cluster/test_package.py enables, purges and upgrades it",
    "make rpm": "the RPM recipe: tests/test_package.py builds it with rpmbuild and checks `rpm -qlp` "
                "(no RHEL cluster here: dnf is not run)",
    "dispatch-slurm plan /scratch/me/run1": "the supervisor needs a cluster: tests/cluster/test_supervisor.py",
    "dispatch-slurm release": "the supervisor needs a cluster: tests/cluster/test_supervisor.py",
    "continues to the end": "the long run over time limits: tests/cluster/test_continuations.py runs the "
                            "Quickstart's job script under `run` across several time limits",
    "torchrun --nproc-per-node": "examples/dist_train.py under torchrun (tests/test_ranks.py) and srun "
                                 "(tests/cluster/test_multirank.py)",
    "run /scratch/me/run1 --keep-last": "the supervisor's gc over a stand-in Slurm: tests/test_retention.py"
                                        "::test_run_keep_last_collects_after_each_end_when_the_latest_moves_and_once_it_ceased",
}
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


def block(needle: str) -> str:
    (found,) = [b for b in SH if needle in b and not any(k in b for k in ELSEWHERE)]
    return found


# each snippet, by a needle only it holds, and the test that runs it
RUN_HERE = {
    "dispatch-slurm --version": "test_the_install_snippet_installs_without_root",
    "testbed trial --scenario local": "test_the_local_trial_is_the_first_thing_to_try",
    "env --local": "test_the_local_user_path_without_slurm",
    "#!/bin/bash": "test_the_job_script_*",
    'dispatch-slurm publish "$DISPATCH': "test_publishing_by_hand",
    "dispatch-slurm submit /scratch": "test_submit_supervise_once_and_report",
    "& TRAINER=$!": "test_watch_beside_a_trainer",
    "DISPATCH_CHECKPOINT=s3://": "test_the_s3_job_snippet",
    "dispatch-slurm gc /scratch": "test_gc_dry_run_then_gc_then_pin",
    "pub/README.txt": "test_troubleshooting_a_stray_entry_in_pub",
    "retire /scratch/me/run1 --latest": "test_troubleshooting_a_vanished_latest_save",
}


def test_every_sh_block_is_run_here_or_named_with_where_it_runs():
    for b in SH:
        assert any(k in b for k in (*RUN_HERE, *ELSEWHERE)), f"a README snippet nobody runs:\n{b}"
    for needle in RUN_HERE:
        block(needle)  # exactly one block each


def test_every_background_trainer_ends_the_script_with_its_exit_status():
    """A trainer started with `&` must be waited for by its pid (`wait $T`): a bare `wait`
    returns 0 whatever the trainer did."""
    for b in SH:
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


JOB = "#!/bin/bash"  # the Quickstart's job script


def test_the_job_script_starts_fresh_and_publishes(job):
    tmp, root, env = job
    res = bash(block(JOB), {**env, "WAIT_WATCH": "1"}, tmp)
    assert res.returncode == 0, res.stderr
    assert resumed_from(tmp) is None, "nothing was published: the trainer must start fresh"
    assert store.latest(str(root)).path == "exec/c.7.2000000/checkpoint-10"


def test_the_job_script_fails_when_the_trainer_crashes(job):
    """Issue 20: the trainer exits 1 (after a save): the script exits 1, so the job ends
    FAILED, not COMPLETED; the save it made is still published by the watch's final scan."""
    tmp, root, env = job
    res = bash(block(JOB), {**env, "WAIT_WATCH": "1", "TRAINER_EXIT": "1"}, tmp)
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert store.latest(str(root)).step == 10


def test_the_job_script_resumes_from_the_latest_publication_whatever_its_bytes(job):
    tmp, root, env = job
    earlier = os.fsencode(root) + b"/exec/c.6.1000000/checkpoint-5\xff"  # a non-UTF-8 save name
    os.makedirs(earlier)
    store.publish(os.fsdecode(earlier), 5, root=str(root), epoch=1_000_000)
    res = bash(block(JOB), {**env, "WAIT_WATCH": "1"}, tmp)
    assert res.returncode == 0, res.stderr
    assert resumed_from(tmp) == earlier
    assert store.latest(str(root)).path == "exec/c.7.2000000/checkpoint-15"


@pytest.mark.parametrize("fault", ["env fails", "latest errors", "the latest save vanished"])
def test_the_job_script_stops_before_training_on_an_error(job, fault):
    tmp, root, env = job
    if fault == "env fails":
        del env["DISPATCH_SUBMISSION"]
    elif fault == "latest errors":
        (root / "pub").mkdir()
        (root / "pub" / "README.txt").write_text("a stray file: an entry that does not parse")
    else:
        save = root / "exec" / "c.6.1000000" / "checkpoint-5"
        save.mkdir(parents=True)
        store.publish(str(save), root=str(root), epoch=1_000_000)
        save.rmdir()
    res = bash(block(JOB), env, tmp)
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
    missing = bash(block('dispatch-slurm publish "$DISPATCH'), env, tmp)
    assert missing.returncode == 2 and missing.stderr.count(b"\n") == 1 and b"does not exist" in missing.stderr
    (root / "exec" / "c.7.2000000" / "checkpoint-500").mkdir(parents=True)
    ok = bash(block('dispatch-slurm publish "$DISPATCH'), env, tmp)
    assert ok.returncode == 0 and store.latest(str(root)).step == 500


@pytest.mark.parametrize("exit_", [0, 1])
def test_watch_beside_a_trainer(job, exit_):
    tmp, root, env = job
    env.update(DISPATCH_EPOCH="2000000", DISPATCH_ATTEMPT="c.7.2000000", WAIT_WATCH="1", TRAINER_EXIT=str(exit_),
               DISPATCH_EXEC_DIR=str(root / "exec" / "c.7.2000000"))
    (root / "exec" / "c.7.2000000").mkdir(parents=True)
    res = bash(block("& TRAINER=$!"), env, tmp)
    assert res.returncode == exit_, res.stderr
    assert store.latest(str(root)).step == 10


def test_submit_supervise_once_and_report(job):
    tmp, root, env = job
    script = block("dispatch-slurm submit /scratch").replace("/scratch/$USER", str(tmp / "scratch"))
    res = bash(script, env, tmp)
    assert res.returncode == 0, res.stderr
    log = (tmp / "slurm.json.log").read_text()
    assert '"--export=ALL,DISPATCH_CHECKPOINT,DISPATCH_GENERATION,DISPATCH_SUBMISSION"' in log
    assert "--test-only" in log and (tmp / "scratch" / "run1" / "record.jsonl").exists()
    assert (tmp / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    typo = bash(block("dispatch-slurm submit /scratch").replace("/scratch/$USER", str(tmp / "typo"))
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
    script = block("dispatch-slurm gc /scratch").replace("/scratch/me/run1", str(root)).replace("<attempt>",
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
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", block("dispatch-slurm --version")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "version 0.1.0" in res.stdout


@pytest.mark.parametrize("exit_", [0, 1])
def test_the_local_user_path_without_slurm(job, exit_):
    """`eval "$(dispatch-slurm env --local)"` on a machine without Slurm, run twice as the
    Quickstart says: the second execution resumes from the first one's save and publishes at a
    higher epoch; a crashing trainer fails the script."""
    tmp, _, env = job
    env = {k: v for k, v in env.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(WAIT_WATCH="1")
    first = bash(block("env --local"), env, tmp)
    assert first.returncode == 0, first.stderr
    root = tmp / "dispatch-local"
    assert resumed_from(tmp) is None and store.latest(str(root)).path == "exec/local.1.1000000/checkpoint-10"
    second = bash(block("env --local"), {**env, "TRAINER_EXIT": str(exit_)}, tmp)
    assert second.returncode == exit_, second.stderr
    assert resumed_from(tmp) == os.fsencode(root / "exec" / "local.1.1000000" / "checkpoint-10")
    latest = store.latest(str(root))
    assert latest.path == "exec/local.2.2000000/checkpoint-20" and latest.epoch == 2_000_000


def test_the_local_trial_is_the_first_thing_to_try(job):
    """The Quickstart's first block after the install, as written, from the checkout (the
    real interpreter: no stand-ins)."""
    tmp, _, env = job
    env = {**{k: v for k, v in env.items() if not k.startswith(("DISPATCH_", "SLURM_"))},
           "PATH": f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin"}
    script = block("testbed trial --scenario local").replace("cd dispatch-slurm", f"cd {REPO}")
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
    script = block("DISPATCH_CHECKPOINT=s3://").replace("s3://my-bucket/runs/run1", url)
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
    store.publish(str(save), root=str(root), epoch=1_000_000)
    (root / "pub" / "README.txt").write_text("notes")
    me = _scratch(tmp, root)
    refused = bash(f"dispatch-slurm latest {me}/run1", env, tmp)
    assert refused.returncode == 2 and f"mv {me}/run1/pub/README.txt".encode() in refused.stderr
    res = bash(block("pub/README.txt").replace("/scratch/me", me), env, tmp)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().startswith(f"{me}/run1/exec/c.6.1000000/checkpoint-5\tstep 5")
    assert os.path.exists(f"{me}/README.txt")


def test_troubleshooting_a_vanished_latest_save(job):
    tmp, root, env = job
    for step in (5, 6):
        save = root / "exec" / "c.6.1000000" / f"checkpoint-{step}"
        save.mkdir(parents=True)
        store.publish(str(save), root=str(root), epoch=1_000_000)
    (root / "exec" / "c.6.1000000" / "checkpoint-6").rmdir()
    me = _scratch(tmp, root)
    res = bash(block("retire /scratch/me/run1 --latest").replace("/scratch/me", me), env, tmp)
    assert res.returncode == 0, res.stderr
    assert b"latest is now step 5" in res.stdout and b"no longer exists" in res.stderr  # ls said it first
    assert store.latest_save(f"{me}/run1").step == 5
