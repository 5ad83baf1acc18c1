"""A published save is changed or removed by nothing but gc: not by the trainer's own rotation,
an ``rm`` in the job script, a write through the copy an execution resumed from, nor by the
trainer writing again into what it published; and publishing lasts as long as the trainer
writes, even when the process the watch waits for (the step's srun) ended first.

The real CLI and the README's local job script, real files on this machine's ext4 and on an XFS
image with reflinks, writes made as a user (nobody) and as root."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from support import REPO, cli

from dispatch_slurm import store
from dispatch_slurm.contract import names

OLD, NEW = "c.1.1000000", "c.1.2000000"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
NOBODY = 65534


def job_env(root, attempt):
    ex = Path(root) / "exec" / attempt
    ex.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(DISPATCH_CHECKPOINT=str(root), DISPATCH_EXEC_DIR=str(ex), DISPATCH_ATTEMPT=attempt,
               DISPATCH_EPOCH=str(names.attempt_epoch(attempt)))
    return env


def hf_save(root, attempt, step, body=b"weights"):
    d = Path(root) / "exec" / attempt / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(body)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def publish(env, save):
    return cli("publish", save, env=env, check=True)


def resume(env, **kw):
    return cli("latest", "--resume", env=env, **kw)


@pytest.fixture
def shared():
    """A root the job user (nobody) owns, under a folder it can reach (pytest's tree is root's, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="dispatch-published-"))
    os.chmod(d, 0o755)
    root = d / "root"
    root.mkdir()
    yield root
    shutil.rmtree(d)


def as_nobody(code: str, env: dict, *args) -> subprocess.CompletedProcess:
    """``code`` run by Debian's python3 as nobody, with the package and the venv's site-packages
    (torch) on its path: the venv's own interpreter lives under /root, which nobody cannot reach."""
    py = "/usr/bin/python3"
    if not os.path.exists(py):
        pytest.skip("no /usr/bin/python3 to run as another user")
    path = f"{REPO}:{sysconfig.get_paths()['purelib']}"
    return subprocess.run([py, "-c", textwrap.dedent(code), *map(str, args)],
                          env={**env, "PYTHONPATH": path, "HOME": "/tmp"}, user=NOBODY, group=NOBODY,
                          extra_groups=[], capture_output=True, text=True, timeout=120, cwd="/")


def chown_tree(path):
    for d, dirs, files in os.walk(path):
        for e in [d, *(os.path.join(d, x) for x in dirs + files)]:
            os.chown(e, NOBODY, NOBODY)


# ---- removed by nothing but gc ------------------------------------------------------------------

@pytest.mark.parametrize("how", ["rotation", "rm-of-the-exec-folder"])
def test_the_latest_save_removed_from_its_folder_is_still_resumed_whole(root, how):
    """The old execution's rotation (HF's ``shutil.rmtree``) or an ``rm -rf "$DISPATCH_EXEC_DIR"``
    in its job script takes the latest published save from its folder: the publication's own
    links keep it, and the next execution resumes from all of it. (Before, `latest --resume`
    refused the root: "... which no longer exists: nothing can resume from it".)"""
    old = job_env(root, OLD)
    d = hf_save(root, OLD, 200, b"weights of 200")
    publish(old, d)
    shutil.rmtree(d if how == "rotation" else Path(old["DISPATCH_EXEC_DIR"]))
    got = resume(job_env(root, NEW))
    assert got.returncode == 0, got.stderr
    path = got.stdout.strip()
    assert path.endswith("/checkpoint-200") and "/dispatch-resume/" in path
    assert Path(path, "model.pt").read_bytes() == b"weights of 200"
    pub = store.latest(str(root))
    assert cli("latest", root, "--path", check=True).stdout.strip() == str(root / "held" / pub.name)
    ls = json.loads(cli("ls", root, "--json", check=True).stdout)
    assert [(r["state"], r["exists"]) for r in ls] == [("latest", True)]


def test_a_root_whose_latest_a_person_removed_with_its_held_links_keeps_the_loud_refusal(root):
    old = job_env(root, OLD)
    d = hf_save(root, OLD, 200)
    publish(old, d)
    pub = store.latest(str(root))
    shutil.rmtree(d)
    shutil.rmtree(root / "held" / pub.name)
    got = resume(job_env(root, NEW))
    assert got.returncode == 2 and "no longer exists: nothing can resume from it" in got.stderr
    assert "dispatch-slurm retire" in got.stderr


def test_only_each_executions_newest_publication_holds_links(root):
    """The trainer's rotation keeps deciding what its folder holds: every publication of an
    execution but its newest lets its links go when the next one is published."""
    old = job_env(root, OLD)
    for step in (10, 20, 30):
        publish(old, hf_save(root, OLD, step))
    new = job_env(root, NEW)
    publish(new, hf_save(root, NEW, 40))
    held = sorted(os.listdir(root / "held"))
    assert [names.parse(h).step for h in held] == [30, 40]
    assert (root / "exec" / OLD / "checkpoint-10").exists()  # the trainer's own saves are its own to remove
    ev = [e for e in store.events.read(str(root)) if e["type"] == "published"]
    assert all(e["held"] for e in ev)


def test_a_published_saves_files_lose_their_write_bits(root):
    d = hf_save(root, OLD, 10)
    publish(job_env(root, OLD), d)
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in d.iterdir()} == \
        {"model.pt": "0o444", "trainer_state.json": "0o444"}
    assert os.stat(d).st_mode & 0o200  # the folder stays the trainer's: its rotation removes it


# ---- changed by nothing --------------------------------------------------------------------------

WRITES = {
    "torch.save": """
        import sys, torch
        torch.save({"w": torch.zeros(3)}, sys.argv[1] + "/model.pt")
    """,
    "r+b": """
        import sys
        with open(sys.argv[1] + "/trainer_state.json", "r+b") as f:
            f.write(b"CORRUPT")
    """,
    "dcp-save": """
        import sys, torch
        import torch.distributed.checkpoint as dcp
        dcp.save({"w": torch.zeros(3)}, checkpoint_id=sys.argv[1])
    """,
}


def dcp_save(root, attempt, step):
    """A DCP save as torch writes it (``.metadata`` and ``__0_0.distcp``), completed by a marker."""
    import torch
    import torch.distributed.checkpoint as dcp
    d = Path(root) / "exec" / attempt / f"checkpoint-{step}"
    dcp.save({"w": torch.arange(1000.0)}, checkpoint_id=str(d))
    (d / "trainer_state.json").write_text("{}")
    return d


def published_tree(root):
    """The latest publication's save, as every later execution loads it."""
    where = root / store.latest(str(root)).path
    return {p.name: p.read_bytes() for p in where.iterdir()}


@needs_root
@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_through_the_resume_copy_as_a_user_fails_and_never_reaches_the_published_save(shared, write):
    """A trainer (run as the job user) that writes where it resumed from: the copy's files are
    links to the published, read-only ones, so the write fails (EACCES) and the published save,
    which every later execution loads, is unchanged. (Before: the write succeeded, through the
    same inode, and the next execution loaded the zeros.)"""
    root = shared
    d = dcp_save(root, OLD, 10) if write == "dcp-save" else hf_save(root, OLD, 10, b"w" * 100)
    chown_tree(root)
    old = job_env(root, OLD)
    assert as_nobody("import dispatch_slurm.store as s, sys; s.publish(sys.argv[1])", old, d).returncode == 0
    before = published_tree(root)
    new = job_env(root, NEW)
    chown_tree(root)
    got = as_nobody("import dispatch_slurm.store as s; print(s.resume_path())", new)
    assert got.returncode == 0, got.stderr
    copy = got.stdout.strip()
    assert "/dispatch-resume/" in copy and os.stat(copy).st_uid == NOBODY
    wrote = as_nobody(WRITES[write], new, copy)
    assert wrote.returncode != 0 and "Permission denied" in wrote.stderr, wrote.stderr[-2000:]
    assert published_tree(root) == before
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


@needs_root
def test_the_trainer_writing_again_into_a_save_it_published_fails_as_a_user(shared):
    """``torch.save`` into a published save of its own (a retry, a preemption saving the step
    the periodic save just published): refused by the file's mode, not a torn latest."""
    root = shared
    d = hf_save(root, OLD, 10, b"w" * 100)
    chown_tree(root)
    old = job_env(root, OLD)
    assert as_nobody("import dispatch_slurm.store as s, sys; s.publish(sys.argv[1])", old, d).returncode == 0
    wrote = as_nobody(WRITES["torch.save"], old, d)
    assert wrote.returncode != 0 and "Permission denied" in wrote.stderr
    assert (d / "model.pt").read_bytes() == b"w" * 100


#: a loop that saves and publishes step 10, then on the signal saves step 10 again into the
#: same folder; ``between``: a line run between the publication and the signal
RESAVE = """
    import os, signal, sys
    from dispatch_slurm import install_preemption_handler, preemption_point, store
    def save(step):
        d = os.path.join(os.environ["DISPATCH_EXEC_DIR"], f"checkpoint-{{step}}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.pt"), "wb") as f:
            f.write(b"w%d" % step)
        return d
    install_preemption_handler(lambda left: save(10), defer=True)
    store.publish(save(10))
    {between}
    os.kill(os.getpid(), signal.SIGTERM)
    preemption_point()
    sys.exit(3)
"""
NO_PUB = 'os.chmod(os.path.join(os.environ["DISPATCH_CHECKPOINT"], "pub"), 0)'


@needs_root
def test_a_grace_save_of_the_step_just_published_is_a_kept_stop(shared):
    """The loop saves and publishes step 10, the signal comes, and the handler saves step 10
    again into the same folder (``os.makedirs(exist_ok=True)`` then ``open(..., "wb")``, as
    the Trainer and most loops do): its files are read-only, the write fails, and that step
    is published already. The stop is a kept one: exit 0, the sentinel, one publication, the
    ``checkpoint_complete`` event, the published bytes unchanged."""
    root = shared
    (root / "exec" / OLD).mkdir(parents=True)
    chown_tree(root)
    run = as_nobody(RESAVE.format(between=""), job_env(root, OLD))
    assert run.returncode == 0 and "dispatch-checkpoint-complete" in run.stdout, run.stderr
    assert "already published" in run.stderr and "PermissionError" not in run.stderr, run.stderr
    assert len(os.listdir(root / "pub")) == 1
    assert (root / "exec" / OLD / "checkpoint-10" / "model.pt").read_bytes() == b"w10"
    kinds = [json.loads(line)["type"] for p in (root / "events").iterdir() for line in p.read_text().splitlines()]
    assert kinds.count("checkpoint_complete") == 1, kinds


def test_a_grace_save_refused_while_the_root_cannot_be_read_is_a_failed_stop_in_one_line(shared):
    """As above, but the root's pub/ cannot be read when the handler asks whether the refused
    file is a published one: the stop is the failed save it is (exit 1, no sentinel), said in
    the handler's one line, not a traceback out of the handler."""
    root = shared
    (root / "exec" / OLD).mkdir(parents=True)
    chown_tree(root)
    run = as_nobody(RESAVE.format(between=NO_PUB), job_env(root, OLD))
    os.chmod(root / "pub", 0o755)
    assert run.returncode == 1 and "dispatch-checkpoint-complete" not in run.stdout, run
    assert "dispatch-slurm: preemption checkpoint failed: PermissionError" in run.stderr, run.stderr
    assert (root / "exec" / OLD / "checkpoint-10" / "model.pt").read_bytes() == b"w10"


@pytest.mark.parametrize("write", sorted(WRITES))
def test_as_root_the_resume_copy_is_the_data_so_a_write_lands_in_it_alone(root, write):
    """Root ignores a file's mode: where the filesystem makes no clone (ext4), root's resume copy
    is a copy of the data, and its writes change that copy only."""
    if os.geteuid() != 0:
        pytest.skip("root's case")
    d = dcp_save(root, OLD, 10) if write == "dcp-save" else hf_save(root, OLD, 10, b"w" * 100)
    publish(job_env(root, OLD), d)
    before = published_tree(root)
    new = job_env(root, NEW)
    copy = resume(new, check=True).stdout.strip()
    subprocess.run([sys.executable, "-c", textwrap.dedent(WRITES[write]), copy], check=True, timeout=120)
    assert published_tree(root) == before
    assert {p.name: p.read_bytes() for p in Path(copy).iterdir()} != before


@pytest.fixture
def xfs(tmp_path):
    """An XFS filesystem with reflinks, on a loop device (this host's kernel has XFS)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.xfs"):
        pytest.skip("needs root and mkfs.xfs")
    img, mnt = tmp_path / "xfs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(400 << 20)
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(img)], check=True)
    if subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a loop device here")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_on_a_filesystem_with_reflinks_the_resume_copy_is_a_clone(xfs):
    """XFS: the copy shares the published save's blocks but not its inodes, so a write to it (as
    root too) lands in the copy alone; no data is copied."""
    root = xfs / "root"
    root.mkdir()
    d = hf_save(root, OLD, 10, os.urandom(64 << 20))
    publish(job_env(root, OLD), d)
    before = published_tree(root)
    free = shutil.disk_usage(root).free
    copy = Path(resume(job_env(root, NEW), check=True).stdout.strip())
    assert free - shutil.disk_usage(root).free < 8 << 20, "a clone shares the blocks"
    assert os.stat(copy / "model.pt").st_ino != os.stat(d / "model.pt").st_ino
    subprocess.run([sys.executable, "-c", textwrap.dedent(WRITES["torch.save"]), str(copy)], check=True, timeout=120)
    assert published_tree(root) == before and (copy / "model.pt").read_bytes() != before["model.pt"]


# ---- publishing lasts as long as the trainer writes ----------------------------------------------

JOB = """\
eval "$(dispatch-slurm env --local)"
python "$TRAINER" "$DISPATCH_EXEC_DIR" --steps 12 --save-every 2 --keep 1 --step-time 0.3 --detach "$OUT/ready" & T=$!
dispatch-slurm watch --until-pid $T
wait $T
"""


def test_the_watch_publishes_while_the_steps_tasks_run_on_after_its_srun_ended(root, tmp_path):
    """The README's local job script, whose "srun" ends after the first save while the trainer
    trains on in its own session, saving and rotating (a frozen slurmd: the controller took the
    node for dead, nothing killed the tasks). The watch publishes every save until the trainer is
    gone, and the next execution resumes from its last. (Before: the watch ended with the srun,
    the later saves were never published, and the trainer's rotation removed the one that was:
    every later execution failed at `latest --resume`.)"""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "dispatch-slurm").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dispatch_slurm "$@"\n')
    (bin_ / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for p in bin_.iterdir():
        p.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(PATH=f"{bin_}:/usr/bin:/bin", DISPATCH_CHECKPOINT=str(root), OUT=str(tmp_path),
               TRAINER=str(REPO / "tests" / "rotating_trainer.py"), PYTHONPATH=os.pathsep.join(sys.path))
    job = subprocess.run(["bash", "-c", JOB], env=env, capture_output=True, text=True, timeout=180)
    assert job.returncode == 1, job.stderr  # srun's status, as `wait $T` gives it
    steps = [int(line.split()[2]) for line in job.stdout.splitlines() if line.startswith("published step")]
    assert steps[-1] == 12 and len(steps) >= 3 and steps == sorted(set(steps)), (job.stdout, job.stderr)
    assert "run on on this node: publishing until they are gone" in job.stderr
    assert store.latest(str(root)).step == 12
    exec_dir = next((root / "exec").iterdir())
    deadline = time.monotonic() + 30  # the trainer's last rotation, after its last save
    while len(list(exec_dir.glob("checkpoint-*"))) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    new = job_env(root, NEW)
    got = resume(new)
    assert got.returncode == 0 and got.stdout.strip().endswith("/checkpoint-12"), got.stderr
