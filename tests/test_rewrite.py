"""No published save is ever written again, whatever integration saves it.

The defect: a preemption signal that lands on a step whose periodic save is in flight or
published saved that step again, into the same folder (docs/ranks.md's DCP recipe:
``saver.wait(left)`` let the async save complete and be published, then ``ddcp.save``
wrote ``checkpoint-<step>/`` again). A SIGKILL inside that rewrite leaves the latest
publication torn. Each test here runs a real framework under tests/testbed/tripwire.py,
which SIGKILLs the trainer at its first write into a published save (the file left as that
write's open leaves it: the worst moment of such a rewrite), lands the signal on a
periodic-save step, and then checks the latest publication: nothing tripped, every file
older than the publication, and its content loadable and bitwise equal to what the trainer
handed its framework to save. submitit's is in tests/test_submitit.py (its test bed).
"""

import os
import signal
import subprocess
import textwrap

import pytest

from dispatch_slurm import store
from dispatch_slurm.store import events
from support import REPO, assert_intact, output, tripped
from testbed import ranks, wait

TRIPWIRE = REPO / "tests" / "testbed" / "tripwire.py"
SENTINEL = ranks.SENTINEL


# -- torch.distributed.checkpoint: docs/ranks.md's recipe is examples/dist_train.py --------

RECORDER = textwrap.dedent("""
    # Records what each DCP save call is handed, as it is at the call: OUT/saved-<rank>-<folder>.pt
    import os, runpy, sys, torch
    import torch.distributed.checkpoint as dcp

    def recording(real):
        def save(state_dict, *args, checkpoint_id=None, **kwargs):
            name = os.path.join(os.environ["OUT"], f"saved-{os.environ.get('RANK', '0')}-"
                                                   f"{os.path.basename(os.fspath(checkpoint_id))}.pt")
            if not os.path.exists(name):  # the first save into that folder: what a publication may hold
                plain = {k: v.state_dict() if hasattr(v, "state_dict") else v for k, v in state_dict.items()}
                torch.save(plain, name)
            return real(state_dict, *args, checkpoint_id=checkpoint_id, **kwargs)
        return save

    dcp.save, dcp.async_save = recording(dcp.save), recording(dcp.async_save)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def load_dcp(path):
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.NamedTemporaryFile(suffix=".pt") as f:
        dcp_to_torch_save(path, f.name)
        return torch.load(f.name, weights_only=False)


@pytest.mark.parametrize("nproc, mode", [(1, "async"), (2, "async"), (1, "sync")])
def test_dcp_preemption_on_a_save_step_never_rewrites_the_publication(root, tmp_path, nproc, mode):
    """examples/dist_train.py saves every step (so the signal lands on a periodic-save
    step whatever its timing: with --async-save that step's save is in flight or just
    published); SIGTERM to one rank. Before the fix the handler saved that step again into
    the published folder (DCP: "Detected an existing checkpoint ..., overwriting") and the
    tripwire killed it there, leaving the latest publication torn."""
    pytest.importorskip("torch")
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "recorder.py").write_text(RECORDER)
    attempt = "c.40.1000000"
    env = ranks.dispatch_env(str(root), attempt, 1_000_000, OUT=str(out), TRIPWIRE_LOG=str(tmp_path / "trips"))
    flags = ["--async-save"] if mode == "async" else []
    proc = ranks.launch([TRIPWIRE, tmp_path / "recorder.py", ranks.EXAMPLE, "--max-steps", "100000",
                         "--save-every", "1", "--step-time", "0.01", *flags], nproc=nproc, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        pids = wait.until(lambda: proc.poll() is None and ranks.workers(str(root), attempt, nproc)
                          and [p.step for p in store.publications(str(root)) if p.step >= 2]
                          and ranks.workers(str(root), attempt, nproc),
                          timeout=120, what="every rank training, step 2 published")
        os.kill(pids[nproc - 1], signal.SIGTERM)  # one rank (the last): the others learn it from the protocol
    finally:
        text = output(proc)
    pub = assert_intact(root, tripped(tmp_path / "trips"), load=load_dcp,
                        saved=lambda pub: torch_load(out / f"saved-0-checkpoint-{pub.step}.pt"))
    assert proc.returncode == 0 and text.count(SENTINEL) == nproc, text[-3000:]
    assert "overwriting" not in text, text[-3000:]
    by = [e["by"] for e in events.read(str(root)) if e["type"] == "published" and e["step"] == pub.step]
    assert by[-1] == "preempt", by


def torch_load(path):
    import torch
    return torch.load(path, weights_only=False)


def run_tripwired(tmp_path, root, script: str, attempt: str, *args, nproc: int = 1, timeout: float = 300):
    """The script as one execution under the tripwire; (exit code, output, OUT, trips)."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "script.py").write_text(script)
    env = ranks.dispatch_env(str(root), attempt, 1_000_000, OUT=str(out), TRIPWIRE_LOG=str(tmp_path / "trips"),
                             PYTHONPATH=f"{REPO}:{REPO / 'tests'}")
    proc = ranks.launch([TRIPWIRE, tmp_path / "script.py", *args], nproc=nproc, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    text = output(proc, timeout)
    return proc.returncode, text, out, tripped(tmp_path / "trips")


# -- accelerate: the user guide's recipe, saving every step ---------------------------------

ACCELERATE = """
import os, signal, sys, torch
from accelerate import Accelerator
from dispatch_slurm import install_preemption_handler, preemption_point
from dispatch_slurm.integrations import accelerate as da
from dispatch_slurm.runtime.distributed import settle

real_save_state = Accelerator.save_state
def recording(self, path, *args, **kwargs):  # what each save is handed, as it is at the call
    name = os.path.join(os.environ["OUT"], f"saved-{self.process_index}-{os.path.basename(path)}.pt")
    if not os.path.exists(name):
        torch.save({"model": self.unwrap_model(self._models[0]).state_dict(),
                    "optimizer": self._optimizers[0].state_dict()}, name)
    return real_save_state(self, path, *args, **kwargs)
Accelerator.save_state = recording

acc = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model, opt = acc.prepare(model, opt)
step = 0
install_preemption_handler(lambda left: da.save_state(acc, step, publish=False), defer=True)
while step < 1000:
    g = torch.Generator().manual_seed(step * 10 + acc.process_index)
    x = torch.randn(8, 8, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    acc.backward(loss)
    opt.step()
    step += 1
    da.save_state(acc, step)  # every step: the signal lands on a periodic-save step
    if step == 3 and acc.process_index == acc.num_processes - 1:
        os.kill(os.getpid(), signal.SIGTERM)  # right after that step's save was published
    preemption_point()
print("training ended without a signal", flush=True)
settle()
"""


def load_accelerate(path):
    import torch
    from safetensors.torch import load_file
    return {"model": load_file(os.path.join(path, "model.safetensors")),
            "optimizer": torch.load(os.path.join(path, "optimizer.bin"), weights_only=False)}


@pytest.mark.parametrize("nproc", [1, 2])
def test_accelerate_preemption_on_a_save_step_never_rewrites_the_publication(root, tmp_path, nproc):
    """The signal arrives right after ``da.save_state(acc, 3)`` published step 3 (one
    process: the handler saves at once; two: at the step the ranks agree on, whose save is
    done too). Before the fix the handler's ``save_state`` wrote that folder again."""
    pytest.importorskip("accelerate")
    rc, text, out, trips = run_tripwired(tmp_path, root, ACCELERATE, "c.41.1000000", nproc=nproc)
    pub = assert_intact(root, trips, load=load_accelerate,
                        saved=lambda pub: torch_load(out / f"saved-0-checkpoint-{pub.step}.pt"))
    assert rc == 0 and text.count(SENTINEL) == nproc, text[-3000:]
    assert pub.step >= 3


# -- Hugging Face: the signal in the save of an epoch's last step, an evaluation follows -------

HF = """
import os, signal, sys, torch
from test_hf import dataset, tiny_model
from transformers import Trainer, TrainerCallback, TrainingArguments
from dispatch_slurm.integrations import hf

class SignalOnSave(TrainerCallback):  # after DispatchCallback: the save is published
    def on_save(self, args, state, control, model=None, **kw):
        torch.save(model.state_dict(), os.path.join(os.environ["OUT"], f"saved-checkpoint-{state.global_step}.pt"))
        os.kill(os.getpid(), signal.SIGTERM)

args = TrainingArguments(output_dir=hf.output_dir(), max_steps=100, save_strategy="steps", save_steps=4,
                         eval_strategy="epoch", per_device_train_batch_size=4, per_device_eval_batch_size=4,
                         logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
                         dataloader_num_workers=0)
Trainer(model=tiny_model(), args=args, train_dataset=dataset()[:16], eval_dataset=dataset()[:8],
        callbacks=[hf.DispatchCallback(), SignalOnSave()]).train()
print("training ended without a signal", flush=True)
"""


def test_hf_a_signal_at_a_periodic_save_then_an_evaluation_never_rewrites_the_publication(root, tmp_path):
    """save_steps = the steps of an epoch, eval_strategy="epoch": step 4 is saved and
    published, the signal arrives, then the epoch's evaluation starts, where the callback
    saves at its first batch. Before the fix it saved step 4 again (``_save_checkpoint``
    into the published ``checkpoint-4``); now that save is the one it stops on."""
    pytest.importorskip("transformers")

    def load(path):
        from safetensors.torch import load_file
        return load_file(os.path.join(path, "model.safetensors"))

    def saved(pub):
        state = torch_load(out / f"saved-checkpoint-{pub.step}.pt")
        return {k: state[k] for k in load(os.path.join(root, pub.path))}  # the tied lm_head is saved once

    rc, text, out, trips = run_tripwired(tmp_path, root, HF, "c.42.1000000")
    pub = assert_intact(root, trips, load=load, saved=saved)
    assert rc == 0 and text.rstrip().endswith(SENTINEL), text[-3000:]
    assert pub.step == 4 and [p.step for p in store.publications(str(root))] == [4]


# -- Lightning: the signal in the batch whose end saves ---------------------------------------

LIGHTNING = """
import os, signal, sys, torch
import lightning.pytorch as L
from dispatch_slurm.integrations import lightning as dl

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def validation_step(self, batch, i):
        pass
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

class SignalOnSaveStep(L.Callback):  # Lightning runs checkpoint callbacks last: the save follows
    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        if trainer.global_step == 4:
            torch.save(module.state_dict(), os.path.join(os.environ["OUT"], "saved-checkpoint-4.pt"))
            os.kill(os.getpid(), signal.SIGTERM)

torch.manual_seed(0)
x = torch.randn(256, 8)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
trainer = L.Trainer(max_steps=100, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=dl.output_dir(), plugins=dl.plugins(),
                    val_check_interval=4, num_sanity_val_steps=0,
                    callbacks=[SignalOnSaveStep(), dl.DispatchCheckpoint(every_n_train_steps=2)])
trainer.fit(Tiny(), data, data)
print("training ended without a signal", flush=True)
"""


def test_lightning_preemption_on_a_save_step_never_rewrites_the_publication(root, tmp_path):
    """The signal arrives in the batch at whose end ``DispatchCheckpoint`` saves step 4
    (and a validation is due): the stop is that save, never a second one."""
    pytest.importorskip("lightning")

    def load(path):
        return torch_load(path)["state_dict"]

    rc, text, out, trips = run_tripwired(tmp_path, root, LIGHTNING, "c.43.1000000")
    pub = assert_intact(root, trips, load=load, saved=lambda pub: torch_load(out / f"saved-checkpoint-{pub.step}.pt"))
    assert rc == 0 and text.rstrip().endswith(SENTINEL), text[-3000:]
    assert [p.step for p in store.publications(str(root))] == [2, 4] and pub.path.endswith("checkpoint-4.ckpt")
