"""The save an execution resumes from is its own hard-linked copy (store/resume.py): an
older execution still running, whose trainer rotates its saves, cannot remove it between
the choice and the load. On a real filesystem, through the CLI a job script runs; the real
Hugging Face case is tests/test_hf.py's; the campaign found it (seeds 1006, 1122)."""

import os
import shutil
import subprocess
import sys

from support import cli

from dispatch_slurm import retention, store
from dispatch_slurm.contract import names
from dispatch_slurm.retention.policy import Policy
from dispatch_slurm.store import durable, events, unpublished

OLD, NEW = "c.1.1000000", "c.1.1000001"


def save(root, attempt, step, files=("model.bin", "trainer_state.json")):
    d = root / "exec" / attempt / f"checkpoint-{step}"
    (d / "sub").mkdir(parents=True)
    for f in files:
        (d / f).write_bytes(f"{f} of step {step}\n".encode())
    (d / "sub" / "shard-0").write_bytes(b"shard\n")
    store.publish(str(d), step, root=str(root), epoch=names.attempt_epoch(attempt), sync=False)
    return d


def job_env(root, attempt):
    ex = root / "exec" / attempt
    ex.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(DISPATCH_CHECKPOINT=str(root), DISPATCH_EXEC_DIR=str(ex), DISPATCH_ATTEMPT=attempt,
               DISPATCH_EPOCH=str(names.attempt_epoch(attempt)))
    return env


def latest_resume(env):
    return subprocess.run([sys.executable, "-m", "dispatch_slurm", "latest", "--resume"], env=env,
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def tree(path):
    return {os.path.relpath(os.path.join(d, f), path): open(os.path.join(d, f), "rb").read()
            for d, _, fs in os.walk(path) for f in fs}


def test_latest_resume_gives_a_copy_the_old_executions_rotation_cannot_remove(root):
    old = save(root, OLD, 20)
    want = tree(old)
    path = latest_resume(job_env(root, NEW))
    pub = store.latest(str(root))
    assert path == str(root / "exec" / NEW / "dispatch-resume" / pub.name / "checkpoint-20")
    # a user's copy is links (to read-only files); root's, whom a file's mode does not stop, the data
    assert os.path.samefile(os.path.join(path, "model.bin"), old / "model.bin") == (os.geteuid() != 0)
    shutil.rmtree(old)  # the old execution's rotation (HF's save_total_limit: shutil.rmtree)
    assert tree(path) == want
    assert store.latest(str(root)).path == f"exec/{OLD}/checkpoint-20"  # pub/ untouched
    ev = [e for e in events.read(str(root)) if e["type"] == "resumed"]
    assert [(e["path"], e["loaded"], e["by"]) for e in ev] == [(pub.path, path, "latest --resume")]


def test_a_second_rank_takes_the_copy_already_made_and_outside_an_execution_the_save_itself(root):
    old = save(root, OLD, 20)
    env = job_env(root, NEW)
    first, second = latest_resume(env), latest_resume(env)
    assert first == second and sorted(os.listdir(root / "exec" / NEW / "dispatch-resume")) == \
        [store.latest(str(root)).name]
    outside = {k: v for k, v in env.items() if k not in ("DISPATCH_EXEC_DIR", "DISPATCH_ATTEMPT", "DISPATCH_EPOCH")}
    assert latest_resume(outside) == str(old)


def test_another_root_named_inside_a_job_gives_its_save_itself(root, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    theirs = save(other, OLD, 30)
    env = job_env(root, NEW)
    got = subprocess.run([sys.executable, "-m", "dispatch_slurm", "latest", str(other), "--resume"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert got == str(theirs) and not (other / "exec" / NEW).exists() and not (root / "exec" / NEW).joinpath(
        "dispatch-resume").exists()


def test_the_rotation_removing_the_original_while_the_copy_is_made_takes_nothing_from_it(root, monkeypatch):
    """The older execution's rmtree of the save runs while the copy is linked: the copy is made
    from the publication's held links, which the rotation never reaches, so it is whole."""
    old = save(root, OLD, 20)
    (old / "model.bin").write_bytes(b"weights")
    for k, v in job_env(root, NEW).items():
        if k.startswith("DISPATCH_"):
            monkeypatch.setenv(k, v)
    real = durable.link_tree

    def rotated_meanwhile(name, fd, new, new_fd, how=None):
        shutil.rmtree(old, ignore_errors=True)  # the old execution's save_total_limit
        return real(name, fd, new, new_fd, how)

    monkeypatch.setattr("dispatch_slurm.store.copies.link_tree", rotated_meanwhile)
    path, step = store.resume_point()
    assert step == 20 and "/dispatch-resume/" in path and not old.exists()
    assert open(os.path.join(path, "model.bin"), "rb").read() == b"weights"


def test_a_held_save_gc_removes_while_it_is_linked_is_taken_again_from_the_newer_publication(root, monkeypatch):
    """gc removes the held links of a superseded publication whose execution ceased: a copy being
    made from them then misses files. It is taken again, from the publication latest by then."""
    save(root, OLD, 20)
    for k, v in job_env(root, NEW).items():
        if k.startswith("DISPATCH_"):
            monkeypatch.setenv(k, v)
    real, calls = durable.link_tree, []

    def gc_meanwhile(name, fd, new, new_fd, how=None):
        linked = real(name, fd, new, new_fd, how)
        if not calls and new == "checkpoint-20":  # the first copy: 40 is published, gc takes 20's links
            calls.append(name)
            with monkeypatch.context() as m:
                for k, v in job_env(root, OLD).items():
                    m.setenv(k, v)
                save(root, OLD, 40)
            first = store.publications(str(root))[0].name
            os.unlink(root / "held" / first / "model.bin")
        return linked

    monkeypatch.setattr("dispatch_slurm.store.copies.link_tree", gc_meanwhile)
    path, step = store.resume_point()
    assert step == 40 and path.endswith("/checkpoint-40") and "/dispatch-resume/" in path
    assert os.listdir(root / "exec" / NEW / "dispatch-resume") == [store.latest(str(root)).name]  # no half copy


def test_the_copies_are_no_save_no_write_and_gc_removes_them_once_the_execution_ceased(root):
    (save(root, OLD, 20) / "model.bin").write_bytes(os.urandom(1 << 20))
    env = job_env(root, NEW)
    latest_resume(env)
    copies = f"exec/{NEW}/dispatch-resume"
    assert [f.path for f in unpublished.find(str(root))] == [f"exec/{OLD}/checkpoint-20"]  # no save of NEW
    folder = store.at(str(root)).inventory().folders[NEW]
    assert folder.first is None and folder.last is None  # its old files' times are no write of NEW

    live = retention.gc(str(root), Policy(keep_last=1, min_age=0), said=[])
    assert [(v.save.path, v.action) for v in live if v.save.path == copies] == [(copies, "keep")]
    assert os.path.isdir(root / copies)
    gone = retention.gc(str(root), Policy(keep_last=1, min_age=0), said=[NEW])
    v = next(v for v in gone if v.save.path == copies)
    assert v.action == "remove" and "the copies execution c.1.1000001 resumed from" in v.why
    if os.geteuid() != 0:  # a user's copy is links: its folders' blocks only, the original still holds the files
        assert v.freed < 1 << 20
    assert not os.path.exists(root / copies)
    assert os.path.isfile(root / "exec" / OLD / "checkpoint-20" / "model.bin")  # the original untouched
    assert not os.path.exists(root / "retired")  # nothing names a copy: nothing retired


def test_gc_dry_run_shows_the_copies(root):
    save(root, OLD, 20)
    latest_resume(job_env(root, NEW))
    out = cli("gc", root, "--keep-last", "1", "--dry-run", "--ceased", NEW, check=True).stdout
    assert f"exec/{NEW}/dispatch-resume" in out


def test_where_no_link_can_be_made_the_save_itself_is_the_resume_point(root, monkeypatch):
    old = save(root, OLD, 20)

    def refused(*a, **k):
        raise PermissionError(1, "Operation not permitted")  # fs.protected_hardlinks, another owner

    monkeypatch.setattr("dispatch_slurm.store.copies.link_tree", refused)
    for k, v in job_env(root, NEW).items():
        if k.startswith("DISPATCH_"):
            monkeypatch.setenv(k, v)
    assert store.resume_point() == (str(old), 20)
    assert os.listdir(root / "exec" / NEW / "dispatch-resume") == []  # no half copy left
