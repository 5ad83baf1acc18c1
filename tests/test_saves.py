"""No save is silently unpublished, and none is published torn: a real torch.save trainer
that is not Hugging Face's (tests/plain_trainer.py) beside the real `dispatch-slurm watch`,
as a job script runs them; the torn-file check on real torch.save and safetensors files;
`dispatch_slurm.saving`, the save that is complete before its name appears."""

import io
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
import torch

from dispatch_slurm import saving, store
from dispatch_slurm.errors import DispatchError, TornSave
from dispatch_slurm.store import events, whole

HERE = pathlib.Path(__file__).resolve().parent
TRAINER = HERE / "plain_trainer.py"
E1 = 1_000_000
A1 = f"c.1.{E1}"


@pytest.fixture
def job(root):
    """One execution's world: its exec folder and the DISPATCH_* variables `env` exports."""
    ex = root / "exec" / A1
    ex.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(DISPATCH_CHECKPOINT=str(root), DISPATCH_EXEC_DIR=str(ex), DISPATCH_EPOCH=str(E1),
               DISPATCH_ATTEMPT=A1, PYTHONUNBUFFERED="1")
    return root, ex, env


def beside(env, *trainer_args, watch_args=(), timeout=180):
    """The documented lines: the trainer in the background, `watch --until-pid`, `wait`."""
    script = (f'"{sys.executable}" {TRAINER} {" ".join(trainer_args)} & T=$!\n'
              f'"{sys.executable}" -m dispatch_slurm watch --until-pid $T {" ".join(watch_args)}\n'
              "wait $T\n")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout)


def latest_resume(env):
    return subprocess.run([sys.executable, "-m", "dispatch_slurm", "latest", "--resume"], env=env,
                          capture_output=True, text=True, timeout=60)


# ---- a trainer that is not Hugging Face's -------------------------------------------------------

def test_a_torch_save_trainer_without_a_marker_fails_the_job_and_names_its_saves(job):
    """torch.save into checkpoint-<step>/ with no marker, the README's watch
    line. Before: watch exit 0, trainer exit 0, nothing published, `latest --resume` printed ""
    and the next execution restarted from step 0 without a word."""
    root, ex, env = job
    res = beside(env, "--steps", "30", "--save-every", "10")
    assert store.latest(str(root)) is None
    assert res.returncode != 0, "watch ended 0 with every save unpublished"
    err = res.stderr
    for step in (10, 20, 30):
        assert f"checkpoint-{step} (no trainer_state.json)" in err, err
    assert "watch --marker NAME" in err and "dispatch_slurm.saving(step)" in err, err
    evs = [e for e in events.read(root) if e["type"] == "warning"]
    assert [e["kind"] for e in evs] == ["never_complete"] and evs[0]["count"] == 3
    nxt = latest_resume(env)  # the next execution: nothing to resume from, said loudly
    assert nxt.returncode == 0 and nxt.stdout == ""
    assert f"exec/{A1}/checkpoint-30" in nxt.stderr and "starts from step 0" in nxt.stderr, nxt.stderr
    assert f"dispatch-slurm publish --root {root} --epoch {E1} {ex}/checkpoint-30" in nxt.stderr


def test_the_same_trainer_with_its_marker_written_last_publishes_everything(job):
    root, ex, env = job
    res = beside(env, "--steps", "30", "--save-every", "10", "--order", "marker-last",
                 watch_args=("--marker", "COMPLETE"))
    assert res.returncode == 0, res.stderr
    assert [p.step for p in store.publications(str(root))] == [10, 20, 30]
    assert "never became publishable" not in res.stderr


def test_an_unfinished_save_below_the_last_publication_is_named_but_not_a_failure(job):
    root, ex, env = job
    (ex / "checkpoint-5").mkdir()  # abandoned: the trainer went on and published 10..30
    res = beside(env, "--steps", "30", "--save-every", "10", "--order", "marker-last",
                 watch_args=("--marker", "COMPLETE"))
    assert res.returncode == 0, res.stderr
    assert "checkpoint-5 (no COMPLETE in it)" in res.stderr and "step 30 was published after them" in res.stderr


# ---- a torn save is never published ---------------------------------------------------------------

def _line(proc, want: str, deadline: float) -> list[str]:
    """stdout lines of ``proc`` until one equals ``want``."""
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line.strip())
        if line.strip() == want:
            return seen
    raise AssertionError(f"no {want!r} from {proc.args}: {seen}")


def test_a_save_whose_marker_comes_before_its_weights_is_not_published_torn(job):
    """A trainer writes COMPLETE, then model.pt, and is killed halfway
    through model.pt. Before: watch published step 20 torn, and the resume failed in torch.load
    ("PytorchStreamReader failed finding central directory", or EINVAL, by where the cut fell),
    as it would at every resubmission."""
    root, ex, env = job
    trainer = subprocess.Popen([sys.executable, str(TRAINER), "--steps", "30", "--save-every", "10",
                                "--order", "marker-first", "--tear-at", "20"], env=env, stdout=subprocess.PIPE,
                               text=True)
    watch = subprocess.Popen([sys.executable, "-m", "dispatch_slurm", "watch", "--marker", "COMPLETE",
                              "--until-pid", str(trainer.pid)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        _line(trainer, "torn 20", deadline)
        # a complete save made now is published by a scan that sees the torn one too
        probe = ex / "checkpoint-1"
        probe.mkdir()
        torch.save({"model": {}, "step": 1}, probe / "model.pt")
        (probe / "COMPLETE").touch()
        lines = _line(watch, "published step 1 exec/c.1.1000000/checkpoint-1", deadline)
        trainer.kill()  # SIGKILL halfway through model.pt
        trainer.wait(30)
        _, err = watch.communicate(timeout=60)
    finally:
        trainer.kill()
        watch.kill()
    resume = latest_resume(env).stdout.strip()
    torch.load(os.path.join(resume, "model.pt"), weights_only=True)  # before: PytorchStreamReader failed
    assert resume == str(ex / "checkpoint-10") and "checkpoint-20" not in "".join(lines)
    assert watch.returncode == 1, err  # the trainer ended; step 20 never became whole, nothing after it
    assert "checkpoint-20 (model.pt is a zip archive without its end of central directory" in err, err


def test_a_torn_save_stays_pending_and_is_published_once_whole(job):
    """The same order, the trainer not killed: the save is published once model.pt is whole."""
    root, ex, env = job
    d = ex / "checkpoint-7"
    d.mkdir()
    (d / "COMPLETE").touch()
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(1000)}, buf)
    data = buf.getvalue()
    (d / "model.pt").write_bytes(data[:-100])
    once = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--marker", "COMPLETE", "--once"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert once.returncode == 0 and store.latest(str(root)) is None, once.stderr
    assert "1 incomplete: checkpoint-7" in once.stderr
    (d / "model.pt").write_bytes(data)
    subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--marker", "COMPLETE", "--once"],
                   env=env, check=True, capture_output=True, timeout=60)
    assert store.latest(str(root)).step == 7


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _problem(path: pathlib.Path) -> str | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return whole.problem(path.name, fd)
    finally:
        os.close(fd)


def test_every_prefix_of_a_torch_save_file_is_torn_and_the_whole_file_is_not(tmp_path):
    """Each cut of a real torch.save file is refused; where torch.load is asked, it agrees."""
    data = _torch_bytes({"model": {"w": torch.arange(300.0), "b": torch.ones(7)}, "step": 3})
    f = tmp_path / "model.pt"
    f.write_bytes(data)
    assert _problem(f) is None
    torch.load(f, weights_only=True)
    for n in range(len(data)):
        f.write_bytes(data[:n])
        assert _problem(f) is not None, f"a cut at {n} of {len(data)} bytes passed"
        if n % 97 == 0 and n > 0:
            with pytest.raises(Exception):
                torch.load(f, weights_only=True)


def test_a_big_torch_save_file_and_a_zip64_archive_are_whole(tmp_path):
    """torch.save writes zip64 records; a zip of 70000 entries needs them for its count."""
    import zipfile
    f = tmp_path / "big.pt"
    f.write_bytes(_torch_bytes({"w": torch.zeros(3 * 2**20)}))
    assert _problem(f) is None
    z = tmp_path / "many.npz"
    with zipfile.ZipFile(z, "w") as zf:
        for i in range(70000):
            zf.writestr(f"{i}", b"")
    assert _problem(z) is None
    raw = z.read_bytes()
    z.write_bytes(raw[:-30])
    assert "zip" in _problem(z)
    (tmp_path / "w.pt").write_bytes(raw + b"\0" * 10)  # a zip with something after its end
    assert _problem(tmp_path / "w.pt") is not None


def test_a_dcp_shard_of_archives_one_after_another_is_not_judged(tmp_path):
    """DCP's FileSystemWriter writes each tensor of a shard with torch.save, one archive after
    another in one .distcp file: the last archive's end record does not describe the file,
    so a zip check would refuse every DCP save (the archives' own offsets, not the file's)."""
    f = tmp_path / "__0_0.distcp"
    f.write_bytes(_torch_bytes(torch.ones(1000)) + _torch_bytes(torch.zeros(3 * 2**16)))
    assert _problem(f) is None


def test_safetensors_files_cut_short_or_grown_are_torn(tmp_path):
    from safetensors.torch import save_file
    f = tmp_path / "model.safetensors"
    save_file({"a": torch.ones(100), "b": torch.zeros(3, 5)}, str(f), metadata={"format": "pt"})
    data = f.read_bytes()
    assert _problem(f) is None
    for n in (0, 4, 8, 20, len(data) // 2, len(data) - 1):
        f.write_bytes(data[:n])
        assert _problem(f) is not None, n
    f.write_bytes(data + b"x")
    assert "torn" in _problem(f)
    (tmp_path / "notes.txt").write_bytes(b"")  # an empty file of no checkpoint format: nothing to say
    assert _problem(tmp_path / "notes.txt") is None
    (tmp_path / "optimizer.pt").write_bytes(b"")
    assert "empty" in _problem(tmp_path / "optimizer.pt")


def test_publish_refuses_a_torn_save_and_names_the_file(job):
    root, ex, env = job
    d = ex / "checkpoint-3"
    d.mkdir()
    (d / "model.pt").write_bytes(_torch_bytes({"w": torch.ones(10)})[:-22])
    with pytest.raises(TornSave, match="model.pt is a zip archive without its end of central directory"):
        store.publish(str(d), root=str(root), epoch=E1)
    cli = subprocess.run([sys.executable, "-m", "dispatch_slurm", "publish", str(d), "--no-sync"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "refusing to publish" in cli.stderr and "torn" in cli.stderr
    assert store.latest(str(root)) is None and not (root / "pub").exists()


# ---- dispatch_slurm.saving: complete before its name appears ------------------------------------

def test_a_trainer_saving_with_the_helper_is_published_by_the_default_watch(job):
    """No marker to choose, no order to get right: the README's watch line publishes each save,
    and the next execution resumes from the last one."""
    root, ex, env = job
    res = beside(env, "--steps", "30", "--save-every", "10", "--order", "helper")
    assert res.returncode == 0, res.stderr
    assert [p.step for p in store.publications(str(root))] == [10, 20, 30]
    assert sorted(os.listdir(ex)) == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    resume = latest_resume(env).stdout.strip()
    assert torch.load(os.path.join(resume, "model.pt"), weights_only=True)["step"] == 30


def test_a_trainer_killed_inside_the_helper_leaves_no_save_that_looks_complete(job):
    root, ex, env = job
    trainer = subprocess.Popen([sys.executable, str(TRAINER), "--steps", "30", "--save-every", "10",
                                "--order", "helper", "--tear-at", "20"], env=env, stdout=subprocess.PIPE, text=True)
    watch = subprocess.Popen([sys.executable, "-m", "dispatch_slurm", "watch", "--until-pid", str(trainer.pid)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _line(trainer, "torn 20", time.monotonic() + 120)
        trainer.kill()
        trainer.wait(30)
        out, err = watch.communicate(timeout=60)
    finally:
        trainer.kill()
        watch.kill()
    assert watch.returncode == 0, err
    assert out.splitlines() == ["published step 10 exec/c.1.1000000/checkpoint-10"]
    assert [n for n in os.listdir(ex) if n.startswith("checkpoint-")] == ["checkpoint-10"]
    assert any(n.startswith(".checkpoint-20.saving-") for n in os.listdir(ex))  # never taken for a save


def test_a_save_the_helper_never_finished_is_named_by_report_and_removed_by_gc(job):
    """What a kill inside ``saving()`` leaves is disk nobody would find: the report names it
    as an unfinished save of its execution, and gc removes it once that execution ceased."""
    root, ex, env = job
    trainer = subprocess.Popen([sys.executable, str(TRAINER), "--steps", "30", "--save-every", "10",
                                "--order", "helper", "--tear-at", "20"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        _line(trainer, "torn 20", time.monotonic() + 120)
    finally:
        trainer.kill()
        trainer.wait(30)
    left = [n for n in os.listdir(ex) if n.startswith(".checkpoint-20.saving-")]
    assert len(left) == 1, os.listdir(ex)
    cmd = [sys.executable, "-m", "dispatch_slurm"]
    subprocess.run([*cmd, "publish", str(ex / "checkpoint-10")], env=env, check=True, timeout=60)
    rep = subprocess.run([*cmd, "report", str(root), "--json"], env=env, capture_output=True, text=True, timeout=60)
    saves = {r["path"]: r for r in json.loads(rep.stdout)["retention"]["saves"]}
    assert saves[f"exec/{A1}/{left[0]}"]["step"] == 20 and saves[f"exec/{A1}/{left[0]}"].get("unfinished"), saves
    text = subprocess.run([*cmd, "report", str(root)], env=env, capture_output=True, text=True, timeout=60).stdout
    assert left[0] in text, text
    gc = [*cmd, "gc", str(root), "--keep-last", "1", "--min-age", "0"]
    subprocess.run(gc, env=env, capture_output=True, text=True, timeout=60)
    assert left[0] in os.listdir(ex), "its execution was not shown to have ceased: kept"
    done = subprocess.run([*gc, "--ceased", A1], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert left[0] not in os.listdir(ex) and (ex / "checkpoint-10").exists()


def test_the_helper_refuses_a_step_saved_already_and_drops_a_save_that_failed(job, monkeypatch):
    root, ex, env = job
    for k, v in env.items():
        if k.startswith("DISPATCH_"):
            monkeypatch.setenv(k, v)
    with saving(4, publish=True) as d:
        (d / "model.bin").write_bytes(b"w")
    assert store.latest(str(root)).step == 4 and (ex / "checkpoint-4" / "model.bin").read_bytes() == b"w"
    with pytest.raises(DispatchError, match="exists already: a save is never rewritten"):
        with saving(4):
            raise AssertionError("the block must not run")
    with pytest.raises(ZeroDivisionError):
        with saving(5) as d:
            (d / "model.bin").write_bytes(b"half")
            1 / 0
    assert sorted(os.listdir(ex)) == ["checkpoint-4"]
    with pytest.raises(DispatchError, match="int >= 0"):
        with saving(-1):
            pass


DOC = HERE.parent / "docs" / "user-guide.md"


def test_the_user_guides_saving_snippet_runs_as_written(job, tmp_path):
    """The PyTorch section's block, run as a script in an execution: its save is published."""
    root, ex, env = job
    text = DOC.read_text()
    m = re.search(r"<!-- python: saving[;\w\s/.:]*-->\n```python\n(.*?)```", text, re.S)
    assert m, "docs/user-guide.md has no <!-- python: saving --> block"
    script = tmp_path / "snippet.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), "
                      "lr=0.1)\nstep = 100\n" + m[1])
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120)
    assert sorted(os.listdir(ex / "checkpoint-100")) == [".dispatch-complete", "model.pt", "optimizer.pt"]
    subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once"], env=env, check=True, timeout=60)
    assert store.latest(str(root)).path == f"exec/{A1}/checkpoint-100"
    assert set(torch.load(ex / "checkpoint-100" / "model.pt", weights_only=True)) == {"weight", "bias"}
