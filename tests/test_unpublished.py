"""No silent restart from step 0: when nothing is published but earlier executions left saves
under the root (a framework's own checkpoint, checkpoint-<step> folders watch never
published), `latest --resume`, `env` and every integration's resume call say so (stderr, a
`warning` event, a line in `report`), naming the files and the fix; and the fix works.
The real CLI and real files; each integration's own resume function with its framework."""

import json
import os
import subprocess
import sys

import pytest

from dispatch_slurm import store
from dispatch_slurm.store import events, unpublished
from support import allocate, cli, held_copy

E1, E2 = 1_000_000, 2_000_000
OLD, NEW = f"c.5.{E1}", f"c.6.{E2}"


@pytest.fixture
def left(root):
    """An old execution that saved but published nothing: Lightning's hpc_ckpt (its own
    requeue), a checkpoint-<step> folder watch never took as complete, logs; and the new
    execution's environment."""
    old = root / "exec" / OLD
    (old / "lightning_logs" / "version_0").mkdir(parents=True)
    (old / "lightning_logs" / "version_0" / "hparams.yaml").write_text("{}")
    (old / "hpc_ckpt_1.ckpt").write_bytes(b"x" * 100)
    (old / "checkpoint-900").mkdir()
    (old / "checkpoint-900" / "model.pt").write_bytes(b"w" * 100)
    (old / "dispatch-probe").mkdir()
    new = root / "exec" / NEW
    new.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(DISPATCH_CHECKPOINT=str(root), DISPATCH_EXEC_DIR=str(new), DISPATCH_EPOCH=str(E2),
               DISPATCH_ATTEMPT=NEW)
    return root, old, new, env


def _warned(text: str, root, old) -> None:
    assert "nothing is published" in text and "starts from step 0" in text, text
    assert f"exec/{OLD}/hpc_ckpt_1.ckpt" in text and f"exec/{OLD}/checkpoint-900" in text, text
    assert "hparams.yaml" not in text and "dispatch-probe" not in text, text
    assert f"dispatch-slurm publish --root {root} --epoch {E1} {old}/checkpoint-900" in text, text
    assert "SLURMEnvironment(auto_requeue=True)" in text, text


def test_latest_resume_says_what_was_left_and_records_it(left):
    """Before, `latest --resume` printed "" (exit 0) and said nothing."""
    root, old, new, env = left
    proc = subprocess.run([sys.executable, "-m", "dispatch_slurm", "latest", "--resume"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == ""
    _warned(proc.stderr, root, old)
    (w,) = [e for e in events.read(root) if e["type"] == "warning"]
    assert w["kind"] == "unpublished_saves" and w["attempt"] == NEW and w["by"] == "latest" and w["count"] == 2
    report = cli("report", root, check=True).stdout
    assert f"{NEW}: started from step 0 while earlier executions had left saves nothing published" in report, report
    assert "hpc_ckpt_1.ckpt" in report


def test_report_names_the_saves_left_when_no_execution_said_it(left):
    """A trainer that calls no resume of dispatch-slurm (plain Lightning: ``fit(ckpt_path=None)``
    with SLURMEnvironment(auto_requeue=True)) warns of nothing itself; `report` sees the saves
    in the exec folders while nothing is published, and says so with the fix. Before, it said
    only "resumed from scratch"."""
    root, old, new, env = left
    saves = f"exec/{OLD}/checkpoint-900, exec/{OLD}/hpc_ckpt_1.ckpt"
    fix = f"dispatch-slurm publish --root {root} --epoch {E1} {old}/checkpoint-900"
    report = cli("report", root, check=True).stdout
    warnings = report.partition("\nwarnings:\n")[2]
    assert warnings.startswith(f"  {NEW}: started from step 0 while earlier executions had left saves nothing "
                               f"published: {saves}\n    to resume from one: {fix}\n"), report
    new.rmdir()  # the old execution is the last one: the next one is still to start
    report = cli("report", root, check=True).stdout
    assert f"  next execution: starts from step 0 unless one is published: {saves}\n    to resume from one: {fix}" \
        in report, report
    (w,) = json.loads(cli("report", "--json", root, check=True).stdout)["warnings"]
    assert w["by"] == "report" and w["kind"] == "unpublished_saves" and w["attempt"] is None, w
    assert events.read(root) == [], "report only reads the root"


def test_the_printed_fix_publishes_the_old_save_and_the_next_resume_uses_it(left):
    root, old, new, env = left
    proc = subprocess.run([sys.executable, "-m", "dispatch_slurm", "latest", "--resume"], env=env,
                          capture_output=True, text=True, timeout=60)
    fix = proc.stderr.split("then start the job again: ")[1].split(" (--epoch")[0]
    login = {k: v for k, v in env.items() if not k.startswith("DISPATCH_")}  # a login node: outside the job
    login["PATH"] = f"{os.path.dirname(sys.executable)}:{login['PATH']}"
    subprocess.run(fix, shell=True, env=login, check=True, capture_output=True, timeout=60)
    again = subprocess.run([sys.executable, "-m", "dispatch_slurm", "latest", "--resume"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.stdout.strip() == held_copy(root, new.name, old / "checkpoint-900") and again.stderr == ""


def test_env_says_it_before_the_job_trains(left):
    root, old, new, env = left
    allocate(root, 7)
    proc = cli("env", env={**{k: v for k, v in env.items() if not k.startswith("DISPATCH_")},
                           "DISPATCH_CHECKPOINT": str(root), "DISPATCH_SUBMISSION": "7", "SLURM_JOB_ID": "8",
                           "SLURM_CLUSTER_NAME": "c", "DISPATCH_SITE_CONF": ""}, check=True)
    _warned(proc.stderr, root, old)
    assert "export DISPATCH_ATTEMPT=c.8.7000000" in proc.stdout
    assert [e["attempt"] for e in events.read(root) if e["type"] == "warning"] == ["c.8.7000000"]


def test_nothing_is_said_on_a_fresh_root_or_once_something_is_published(root):
    (root / "exec" / NEW).mkdir(parents=True)  # a first execution: nothing left by anyone
    assert unpublished.find(str(root)) == []
    proc = cli("latest", root, "--resume", check=True)
    assert proc.stderr == "" and proc.stdout == ""
    save = root / "exec" / OLD / "checkpoint-3"
    save.mkdir(parents=True)
    (save / "model.bin").write_bytes(b"w")  # a save holds a file
    (root / "exec" / OLD / "checkpoint-4").mkdir()
    store.publish(str(save), root=str(root), epoch=E1)
    proc = cli("latest", root, "--resume", check=True)
    assert proc.stderr == "" and proc.stdout.strip() == str(save)


def _resume_hf():
    pytest.importorskip("transformers")
    from dispatch_slurm.integrations import hf
    return hf.resume_from_checkpoint()


def _resume_lightning():
    pytest.importorskip("lightning")
    from dispatch_slurm.integrations import lightning as dl
    return dl.resume_path()


def _resume_accelerate():
    pytest.importorskip("accelerate")
    from accelerate import Accelerator
    from dispatch_slurm.integrations import accelerate as da
    return da.load_state(Accelerator(cpu=True))


def _resume_dcp():
    from dispatch_slurm.integrations import dcp
    return dcp.load({})


def _resume_submitit():
    pytest.importorskip("submitit")
    from dispatch_slurm.integrations import submitit
    return submitit.resume_path()


@pytest.mark.parametrize("resume", [_resume_hf, _resume_lightning, _resume_accelerate, _resume_dcp,
                                    _resume_submitit], ids=lambda f: f.__name__[len("_resume_"):])
def test_every_integrations_resume_call_says_it(left, monkeypatch, capsys, resume):
    root, old, new, env = left
    for k, v in env.items():
        if k.startswith("DISPATCH_"):
            monkeypatch.setenv(k, v)
    assert resume() is None
    _warned(capsys.readouterr().err, root, old)
    assert [e["by"] for e in events.read(root) if e["type"] == "warning"] == ["resume"]


def test_an_integrations_resume_refuses_an_exec_folder_linked_to_node_local_storage(left, monkeypatch, tmp_path):
    """For the integrations without a start hook of their own (DCP,
    accelerate): their resume call is the start."""
    root, old, new, env = left
    for k, v in env.items():
        if k.startswith("DISPATCH_"):
            monkeypatch.setenv(k, v)
    local = tmp_path / "local"
    local.mkdir()
    new.rmdir()
    new.symlink_to(local)
    from dispatch_slurm.errors import DispatchError
    with pytest.raises(DispatchError, match=f"{new} is a symlink to {local}, outside the checkpoint root"):
        store.resume_point()


def test_on_an_s3_root_the_saves_left_are_named_too(s3_env, s3_root):
    """The same look on an S3 root: its exec folders are prefixes, listed by the store."""
    from dispatch_slurm.contract import names
    bucket, key = names.split_s3(f"{s3_root}/exec/{OLD}/checkpoint-40/model.bin")
    s3_env.client().put_object(Bucket=bucket, Key=key, Body=b"w")
    proc = cli("latest", s3_root, "--resume", check=True)
    assert proc.stdout == "" and f"exec/{OLD}/checkpoint-40" in proc.stderr, proc.stderr
    assert f"--epoch {E1} {s3_root}/exec/{OLD}/checkpoint-40" in proc.stderr


def test_a_folder_save_is_named_as_the_folder_and_its_command_publishes_it(root):
    """A save that is a folder of files (DCP's shards and .metadata in torchtitan's
    step-500, Megatron's iter_0000500 with common.pt) is named as that folder with its step,
    never as one of its files: following the warning then resumes from the whole save."""
    torch = pytest.importorskip("torch")
    import shlex
    import torch.distributed.checkpoint as dcp
    old = root / "exec" / OLD
    titan = old / "checkpoint" / "step-500"
    dcp.save({"w": torch.arange(4.0)}, checkpoint_id=str(titan))  # .metadata, __0_0.distcp
    megatron = old / "iter_0000400"
    megatron.mkdir()
    for name in (".metadata", "__0_0.distcp", "common.pt", "metadata.json"):  # what dist_checkpointing writes
        (megatron / name).write_bytes(b"x")
    (root / "exec" / NEW).mkdir()
    text = cli("latest", root).stderr
    assert f"exec/{OLD}/checkpoint/step-500, exec/{OLD}/iter_0000400." in text, text
    assert ".distcp" not in text and "common.pt" not in text and "checkpoint-<step> saves" not in text, text
    command = text.split("then start the job again: ", 1)[1].split(" (--epoch", 1)[0]
    assert command == f"dispatch-slurm publish --root {root} --epoch {E1} --step 500 {titan}", command
    assert cli(*shlex.split(command)[1:], check=True).returncode == 0
    loaded = {"w": torch.zeros(4)}
    dcp.load(loaded, checkpoint_id=cli("latest", root, "--path", check=True).stdout.strip())
    assert torch.equal(loaded["w"], torch.arange(4.0))
