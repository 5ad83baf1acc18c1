"""A real Lightning Trainer (tiny model, CPU) with DispatchCheckpoint: periodic saves
published, SIGTERM (one process, or one rank of two under torchrun/DDP) saves and
publishes the stop step, a replacement resumes from exactly that step."""


import os
import subprocess

import pytest

pytest.importorskip("lightning")

from dispatch_slurm import store  # noqa: E402
from dispatch_slurm.errors import DispatchError  # noqa: E402
from dispatch_slurm.store import events  # noqa: E402
from support import held_copy, output, preempt_one, run_script  # noqa: E402

SENTINEL = "dispatch-checkpoint-complete"

TRAINER = """
import os, sys, torch
import lightning.pytorch as L
from dispatch_slurm.integrations import lightning as dl
from dispatch_slurm.runtime.distributed import settle

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, i):
        x, y = batch
        if self.global_step == 3:
            open(os.path.join(os.environ["OUT"], f"ready-{os.getpid()}"), "w").close()
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

torch.manual_seed(0)
x = torch.randn(4096, 8)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
nproc = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))  # torchrun, srun
trainer = L.Trainer(max_steps=int(sys.argv[1]), accelerator="cpu", devices=nproc,
                    strategy="ddp" if nproc > 1 else "auto", logger=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=dl.output_dir(), plugins=dl.plugins(),
                    callbacks=[dl.DispatchCheckpoint(every_n_train_steps=int(sys.argv[2]))])
trainer.fit(Tiny(), data, ckpt_path=dl.resume_path())
if trainer.is_global_zero:
    print(f"done at step {trainer.global_step}", flush=True)
settle()  # under lagging gloo threads (tests/testbed/lagging.py) the end without it aborted 1 run in 4, with it 0 in 6
"""



@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_saves_publishes_and_a_replacement_resumes(root, tmp_path, nproc):
    proc, out = run_script(TRAINER, tmp_path, root, "c.20.1000000", 1_000_000, 100000, 2, nproc=nproc)
    text = preempt_one(proc, out, nproc, "Lightning to reach step 3")
    assert proc.returncode == 0 and text.count(SENTINEL) == nproc, text[-3000:]
    pubs = store.publications(root)
    by = [e for e in events.read(str(root)) if e["type"] == "published"]
    assert {e["by"] for e in by[:-1]} == {"lightning"} and by[-1]["by"] == "preempt", by
    step = pubs[-1].step
    assert step >= 3 and [p.step for p in pubs] == list(range(2, step, 2)) + [step]
    assert pubs[-1].path == f"exec/c.20.1000000/checkpoint-{step}.ckpt"

    proc, _ = run_script(TRAINER, tmp_path, root, "c.20.1000001", 1_000_001, step + 3, 1000, nproc=nproc)
    text = output(proc)
    assert proc.returncode == 0 and f"done at step {step + 3}" in text, text[-3000:]
    copy = held_copy(root, "c.20.1000001", root / pubs[-1].path)  # the replacement's copy of the save
    assert f"Restoring states from the checkpoint path at {copy}" in text
    # the supervisor's facts: the first execution saved on a signal, the second finished training
    finished = [(e["attempt"], e["step"]) for e in events.read(str(root)) if e["type"] == "training_finished"]
    assert finished == [("c.20.1000001", step + 3)], finished


def test_save_last_and_a_foreign_dirpath_are_refused(root, monkeypatch, tmp_path):
    from dispatch_slurm.integrations import lightning as dl
    for k, v in {"DISPATCH_EXEC_DIR": store.make_exec_dir(str(root), "c.21.1000000"), "DISPATCH_CHECKPOINT": str(root),
                 "DISPATCH_EPOCH": "1000000", "DISPATCH_ATTEMPT": "c.21.1000000"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DispatchError, match="save_last"):
        dl.DispatchCheckpoint(save_last=True)
    with pytest.raises(DispatchError, match="not inside this execution's folder"):
        dl.DispatchCheckpoint(dirpath=str(tmp_path))
    monkeypatch.delenv("DISPATCH_EXEC_DIR")
    with pytest.raises(DispatchError, match="DISPATCH_EXEC_DIR is not set"):
        dl.DispatchCheckpoint()


VAL_TRAINER = """
import os, signal, sys, time, torch
import lightning.pytorch as L
from dispatch_slurm.integrations import lightning as dl

OUT = os.environ["OUT"]

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def validation_step(self, batch, i):
        if i == 0 and not os.path.exists(os.path.join(OUT, "signalled")):
            open(os.path.join(OUT, "signalled"), "w").write(str(self.global_step))
            os.kill(os.getpid(), signal.SIGTERM)  # the signal arrives in the first validation batch
        time.sleep(0.02)  # a validation longer than a grace would wait for
    def on_validation_end(self):
        open(os.path.join(OUT, "validated"), "w").close()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

torch.manual_seed(0)
x = torch.randn(2048, 8)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
trainer = L.Trainer(max_steps=100, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=dl.output_dir(), plugins=dl.plugins(),
                    num_sanity_val_steps=int(sys.argv[1]), val_check_interval=5, limit_val_batches=256,
                    callbacks=[dl.DispatchCheckpoint(every_n_train_steps=1000)])
trainer.fit(Tiny(), data, data)
print("training ended without a save", flush=True)
"""


@pytest.mark.parametrize("sanity", [0, 256], ids=["validation", "sanity-check-warm-up"])
def test_a_signal_during_validation_saves_there(root, tmp_path, sanity):
    proc, out = run_script(VAL_TRAINER, tmp_path, root, "c.21.1000000", 1_000_000, sanity)
    text = output(proc)
    assert proc.returncode == 0 and text.rstrip().endswith(SENTINEL), text[-3000:]
    step = 0 if sanity else 5
    assert (out / "signalled").read_text() == str(step)
    assert [p.step for p in store.publications(root)] == [step]
    assert not (out / "validated").exists()  # saved inside the validation, not after it


@pytest.mark.parametrize("stale", [False, True], ids=["probe-records", "a-checkpoint-file"])
def test_the_exec_folders_own_files_raise_no_not_empty_warning(root, tmp_path, stale):
    """The exec folder is this execution's own, and it holds the handler's probe
    records (dispatch-probe/, written by whichever rank installed its handler first) or
    the logger's files: Lightning's "Checkpoint directory ... exists and is not empty"
    must not fire for those on every run. A checkpoint file already there (which the
    warning is about) still warns."""
    import os
    exec_dir = root / "exec" / "c.22.1000000"
    (exec_dir / "dispatch-probe").mkdir(parents=True)
    (exec_dir / "dispatch-probe" / "n1.1.jsonl").write_text("{}\n")
    if stale:
        (exec_dir / "checkpoint-1.ckpt").write_bytes(b"x")
    proc, _ = run_script(TRAINER, tmp_path, root, "c.22.1000000", 1_000_000, 2, 1)
    text = output(proc)
    assert proc.returncode == 0 and "done at step 2" in text, text[-3000:]
    assert ("exists and is not empty" in text) == stale, text[-3000:]
    assert os.path.isdir(exec_dir / "dispatch-probe")


# the user kept Lightning's own requeue
REQUEUE_TRAINER = TRAINER.replace("plugins=dl.plugins()", "plugins=[SLURMEnvironment(auto_requeue=True)]").replace(
    "import lightning.pytorch as L\n", "import lightning.pytorch as L\n"
    "from lightning.pytorch.plugins.environments import SLURMEnvironment\n")


def test_lightnings_own_requeue_is_said_and_its_hpc_ckpt_named_by_the_next_resume(root, tmp_path):
    """Without Slurm: Lightning's SLURMEnvironment(auto_requeue=True) under
    DispatchCheckpoint, SIGUSR1 through Lightning's own handler (hpc_ckpt_1.ckpt in the exec
    folder, `scontrol requeue`: a stand-in that records it). Before: nothing warned at start,
    and the next execution, in a new empty folder, started from step 0 without a word."""
    import signal
    from testbed import wait
    from testbed.ranks import dispatch_env, launch
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol.log\n")
    (bin_ / "scontrol").chmod(0o755)
    slurm = {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost",
             "PATH": f"{bin_}:{os.environ['PATH']}"}
    script = tmp_path / "train.py"
    assert "SLURMEnvironment(auto_requeue=True)" in REQUEUE_TRAINER
    script.write_text(REQUEUE_TRAINER)
    runs = []
    for attempt, epoch in (("c.77.1000000", 1_000_000), ("c.77.1000001", 1_000_001)):
        out = tmp_path / f"out-{attempt}"
        out.mkdir()
        proc = launch([script, 100000, 1000], env=dispatch_env(str(root), attempt, epoch, OUT=str(out), **slurm),
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            ready = wait.until(lambda: proc.poll() is None and os.listdir(out), timeout=180, what="step 3")
            os.kill(int(ready[0].split("-")[1]), signal.SIGUSR1)  # Slurm's --signal=USR1@90
            wait.until(lambda: (tmp_path / "scontrol.log").exists() and
                       len((tmp_path / "scontrol.log").read_text().splitlines()) == len(runs) + 1,
                       timeout=120, what="Lightning's scontrol requeue")
            os.killpg(proc.pid, signal.SIGKILL)  # the requeue ends this execution
        finally:
            runs.append(output(proc))
    first, second = runs
    assert os.path.exists(root / "exec" / "c.77.1000000" / "hpc_ckpt_1.ckpt")
    assert store.latest(str(root)) is None
    assert "dispatch-slurm: warning: Lightning's SLURMEnvironment(auto_requeue=True) is active" in first, first[-3000:]
    assert "Restoring states" not in second  # what Lightning's requeue gives: step 0, in a new folder
    assert "exec/c.77.1000000/hpc_ckpt_1.ckpt" in second and "starts from step 0" in second, second[-3000:]
    kinds = [(e["attempt"], e["kind"]) for e in events.read(str(root)) if e["type"] == "warning"]
    assert ("c.77.1000000", "lightning_auto_requeue") in kinds and ("c.77.1000001", "unpublished_saves") in kinds


def test_the_auto_requeue_warning_says_what_the_requeue_does():
    """On docker-slurm 22.05, under DispatchCheckpoint, Lightning's `scontrol requeue` ended the
    execution with Slurm's SIGTERM: DispatchCheckpoint saved and published within KillWait, and
    the requeued execution resumed from that save, while the warning said it "starts from step 0".
    It says what the resume depends on, and that the fix needs the job's --signal to be TERM
    (with auto_requeue=False nothing traps USR1, which kills the trainer)."""
    pytest.importorskip("lightning")
    from dispatch_slurm.integrations import lightning as dl
    from dispatch_slurm.store import unpublished
    said = dl.AUTO_REQUEUE
    assert "starts from step 0" not in said and "KillWait" in said and "hpc_ckpt_<N>.ckpt" in said, said
    hpc = unpublished.message("/r", [unpublished.Found("exec/c.1.1000000/hpc_ckpt_1.ckpt", 1_000_000, None)])
    for text in (said, hpc):
        assert "plugins=dl.plugins()" in text and "--signal=TERM@" in text, text

