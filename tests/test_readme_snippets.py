"""Issue 12: the README's shell snippets run as written, under `bash -euo pipefail`, and
stop or resume correctly when a failure is injected (env fails, latest errors, nothing
published yet). External programs are small stand-ins on PATH: `python` (a trainer that
records its arguments and writes one Hugging Face-style save), `srun`/`sbatch`/`scontrol`
(tests/stubs/slurm-cli); dispatch-slurm itself is the real one."""

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
    "apt-get install gcc make": "an admin's install on the nodes: docker-slurm/Dockerfile runs these steps",
    "dispatch-slurm plan /scratch/me/run1": "the supervisor needs a cluster: tests/cluster/test_supervisor.py",
    "dispatch-slurm release": "the supervisor needs a cluster: tests/cluster/test_supervisor.py",
    "torchrun --nproc-per-node": "examples/dist_train.py under torchrun (tests/test_ranks.py) and srun "
                                 "(tests/cluster/test_multirank.py)",
    "run /scratch/me/run1 --keep-last": "the supervisor's gc over a stand-in Slurm: tests/test_retention.py"
                                        "::test_run_keep_last_collects_after_each_end_when_the_latest_moves_and_once_it_ceased",
    "DISPATCH_CHECKPOINT=s3://": "an S3 root needs an S3 server: tests/test_s3.py runs env, submit, "
                                 "latest --resume and watch --marker against moto's",
}
TRAINER = """#!/bin/sh
# stand-in trainer: `python train.py --output-dir D [--resume-from P]`
printf '%s\\n' "$@" > "$TRAINER_ARGS"
while [ $# -gt 0 ]; do [ "$1" = --output-dir ] && out=$2; shift; done
mkdir -p "$out/checkpoint-10" && echo '{"global_step": 10}' > "$out/checkpoint-10/trainer_state.json"
"""


def block(needle: str) -> str:
    (found,) = [b for b in SH if needle in b and not any(k in b for k in ELSEWHERE)]
    return found


def test_every_sh_block_is_run_here_or_named_with_where_it_runs():
    tested = ("dispatch-slurm --version", "eval \"$(dispatch-slurm env)\"", "dispatch-slurm publish \"$DISPATCH",
              "dispatch-slurm submit /scratch", "& TRAINER=$!", "dispatch-slurm gc /scratch")
    for b in SH:
        assert any(k in b for k in (*tested, *ELSEWHERE)), f"a README snippet nobody runs:\n{b}"


@pytest.fixture
def job(tmp_path):
    """A job's world: a root, stand-in programs on PATH, the variables `submit` exports."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python").write_text(TRAINER)
    (bin_ / "python").chmod(0o755)
    for name in ("srun", "sbatch", "scontrol", "sacct"):
        (bin_ / name).symlink_to(REPO / "tests" / "stubs" / "slurm-cli")
    root = tmp_path / "root"
    root.mkdir()
    allocate(root, 2)  # the submissions that gave this job its N=2
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(PATH=f"{bin_}:{pathlib.Path(sys.executable).parent}:/usr/bin:/bin", HOME=str(tmp_path),
               USER="me", TRAINER_ARGS=str(tmp_path / "trainer.args"), STUB_SLURM_STATE=str(tmp_path / "slurm.json"),
               SLURM_JOB_ID="7", SLURM_CLUSTER_NAME="c", DISPATCH_CHECKPOINT=str(root), DISPATCH_SUBMISSION="2")
    return tmp_path, root, env


def bash(script: str, env: dict, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, cwd=cwd, capture_output=True,
                          timeout=120)


def trainer_args(tmp) -> list[bytes] | None:
    p = tmp / "trainer.args"
    return p.read_bytes().splitlines() if p.exists() else None


def test_the_job_script_starts_fresh_and_publishes(job):
    tmp, root, env = job
    res = bash(block('eval "$(dispatch-slurm env)"'), env, tmp)
    assert res.returncode == 0, res.stderr
    args = trainer_args(tmp)
    assert b"--resume-from" not in args, "nothing was published: the trainer must start fresh"
    assert store.latest(str(root)).path == "exec/c.7.2000000/checkpoint-10"


def test_the_job_script_resumes_from_the_latest_publication_whatever_its_bytes(job):
    tmp, root, env = job
    earlier = os.fsencode(root) + b"/exec/c.6.1000000/checkpoint-5\xff"  # a non-UTF-8 save name
    os.makedirs(earlier)
    store.publish(os.fsdecode(earlier), 5, root=str(root), epoch=1_000_000)
    res = bash(block('eval "$(dispatch-slurm env)"'), env, tmp)
    assert res.returncode == 0, res.stderr
    args = trainer_args(tmp)
    assert args[args.index(b"--resume-from") + 1] == earlier


@pytest.mark.parametrize("fault", ["env fails", "latest errors"])
def test_the_job_script_stops_before_training_on_an_error(job, fault):
    tmp, root, env = job
    if fault == "env fails":
        del env["DISPATCH_SUBMISSION"]
    else:
        (root / "pub").mkdir()
        (root / "pub" / "README.txt").write_text("a stray file: an entry that does not parse")
    res = bash(block('eval "$(dispatch-slurm env)"'), env, tmp)
    assert res.returncode == 2, "the job went on after an error"
    assert trainer_args(tmp) is None, "the trainer ran: it would have started from step 0"
    assert b"dispatch-slurm" in res.stderr and b"Traceback" not in res.stderr


def test_publishing_by_hand(job):
    tmp, root, env = job
    env.update(DISPATCH_EPOCH="2000000", DISPATCH_ATTEMPT="c.7.2000000",
               DISPATCH_EXEC_DIR=str(root / "exec" / "c.7.2000000"))
    missing = bash(block('dispatch-slurm publish "$DISPATCH'), env, tmp)
    assert missing.returncode == 2 and missing.stderr.count(b"\n") == 1 and b"does not exist" in missing.stderr
    (root / "exec" / "c.7.2000000" / "checkpoint-500").mkdir(parents=True)
    ok = bash(block('dispatch-slurm publish "$DISPATCH'), env, tmp)
    assert ok.returncode == 0 and store.latest(str(root)).step == 500


def test_watch_beside_a_trainer(job):
    tmp, root, env = job
    env.update(DISPATCH_EPOCH="2000000", DISPATCH_ATTEMPT="c.7.2000000",
               DISPATCH_EXEC_DIR=str(root / "exec" / "c.7.2000000"))
    (root / "exec" / "c.7.2000000").mkdir(parents=True)
    res = bash(block("& TRAINER=$!"), env, tmp)
    assert res.returncode == 0, res.stderr
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
