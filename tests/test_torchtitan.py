"""torchtitan's CheckpointManager (CPU, gloo): what two overlapping executions sharing one
checkpoint folder do to it, then the same schedule through DispatchCheckpointManager. The
page's loop, SIGTERM through the preemption protocol (one process, and one rank of two under
torchrun), is tests/test_pages.py's.

The schedule (an old execution that keeps saving after its replacement started: a
partition, a grace window): A saves 100 and 200; B starts and resumes; B saves 300; A,
still running, saves 300 and 400 and 500; B saves 400; C starts."""

import os
import signal

import pytest

pytest.importorskip("torchtitan")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torchtitan.components.checkpointer import CheckpointManager  # noqa: E402
from torchtitan.components.optimizer import OptimizersContainer  # noqa: E402
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer  # noqa: E402
from torchtitan.components.optimizer.optimizer import ParamGroupConfig  # noqa: E402

from dispatch_slurm import store  # noqa: E402
from dispatch_slurm.errors import DispatchError  # noqa: E402
from dispatch_slurm.integrations.torchtitan import DispatchCheckpointManager  # noqa: E402
from support import REPO  # noqa: E402
from testbed.ranks import dispatch_env  # noqa: E402

A, B, C = ("c.40.1000000", 1_000_000), ("c.40.1000001", 1_000_001), ("c.40.1000002", 1_000_002)


@pytest.fixture
def one_rank():
    """A gloo group of one rank in this process (torchtitan's purge asks dist.get_rank()), and
    SIGTERM's handler restored after (the integration's load installs the protocol's)."""
    before = signal.getsignal(signal.SIGTERM)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no port to collide on
    yield
    dist.destroy_process_group()
    signal.signal(signal.SIGTERM, before)


class Run:
    """One execution's trainer: a tiny model, torchtitan's optimizer and scheduler containers,
    and a train state that records which execution wrote it (the lineage)."""

    def __init__(self, manager, writer: str, folder: str, keep: int = 2):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 2)
        opt = OptimizersContainer.Config(
            param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 0.01})],
            implementation="for-loop").build(model_parts=[self.model])  # "fused", the default, is CUDA only
        lrs = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=opt, training_steps=1000)
        self.writer, self.step = writer, 0
        config = manager.Config(enable=True, folder=folder, interval=100, keep_latest_k=keep)
        self.ckpt = config.build(dataloader=None, model_parts=[self.model], optimizers=opt, lr_schedulers=lrs,
                                 states={"train_state": self}, sd_adapter=None)

    def state_dict(self):
        return {"step": self.step, "writer": self.writer}

    def load_state_dict(self, sd):
        self.step, self.writer = sd["step"], sd["writer"]

    def save(self, step: int) -> None:
        self.step = step
        with torch.no_grad():
            self.model.weight.fill_(step)
        self.ckpt.save(step)

    def saved(self, path: str) -> tuple[str, int] | None:
        """(writer, step) stored in the save at ``path``, or None when it is gone."""
        if not os.path.isdir(path):
            return None
        probe = {"train_state": {"step": 0, "writer": ""}}
        import torch.distributed.checkpoint as dcp
        dcp.load(probe, checkpoint_id=path)
        return probe["train_state"]["writer"], probe["train_state"]["step"]


def test_plain_torchtitan_overlap_resumes_the_old_lineage_and_deletes_the_replacements_saves(tmp_path, one_rank):
    """The hazard, reproduced: one shared folder. A's rotation (keep_latest_k=2, by number,
    whoever wrote it) deletes B's step-300 after A wrote its own step-300 over it; C resumes
    from A's step-500, the old lineage, and B's progress is lost."""
    shared = str(tmp_path / "checkpoint")
    a = Run(CheckpointManager, "A", shared)
    a.save(100), a.save(200)
    b = Run(CheckpointManager, "B", shared)
    assert b.ckpt.load() and (b.writer, b.step) == ("A", 200)
    b.writer = "B"
    b.save(300)
    assert b.saved(f"{shared}/step-300") == ("B", 300)
    a.save(300)  # the same folder, written again by the other execution
    assert b.saved(f"{shared}/step-300") == ("A", 300), "A's step-300 replaced B's in place"
    a.save(400), a.save(500)
    b.save(400)
    for run in (a, b):
        run.ckpt.close()  # the purge thread has deleted what it was given
    assert sorted(os.listdir(shared)) == ["step-400", "step-500"], "A's rotation deleted B's step-300"
    c = Run(CheckpointManager, "C", shared)
    assert c.ckpt.load() and (c.writer, c.step) == ("A", 500), "C resumed from the old execution's lineage"
    c.ckpt.close()


class Executions:
    """Switches this process between executions of one root (their DISPATCH_* variables)."""

    def __init__(self, root, monkeypatch):
        self.root, self.mp = str(root), monkeypatch

    def __call__(self, attempt_epoch):
        attempt, epoch = attempt_epoch
        env = dispatch_env(self.root, attempt, epoch)
        for key in ("DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR", "DISPATCH_EPOCH", "DISPATCH_ATTEMPT"):
            self.mp.setenv(key, env[key])
        return env["DISPATCH_EXEC_DIR"]


def test_the_same_schedule_through_the_integration_loses_nothing(root, tmp_path, one_rank, monkeypatch):
    """Each execution saves into its own exec folder (torchtitan's rotation stays there);
    B resumes from A's publication; A's late saves stay in A's folder at A's epoch; C
    resumes from B's newest save, and every save B made is intact."""
    as_ = Executions(root, monkeypatch)
    a_dir = as_(A)
    a = Run(DispatchCheckpointManager, "A", "checkpoint")
    assert not a.ckpt.load()  # nothing published: a fresh start
    a.save(100), a.save(200)
    b_dir = as_(B)
    b = Run(DispatchCheckpointManager, "B", "checkpoint")
    assert b.ckpt.load() and (b.writer, b.step) == ("A", 200)
    b.writer = "B"
    b.save(300)
    as_(A)
    a.save(300), a.save(400), a.save(500)
    as_(B)
    b.save(400)
    for run in (a, b):
        run.ckpt.close()
    assert sorted(os.listdir(f"{b_dir}/checkpoint")) == ["step-300", "step-400"]
    assert [b.saved(f"{b_dir}/checkpoint/step-{s}") for s in (300, 400)] == [("B", 300), ("B", 400)]
    assert sorted(os.listdir(f"{a_dir}/checkpoint")) == ["step-400", "step-500"], "A's rotation: A's folder only"
    as_(C)
    c = Run(DispatchCheckpointManager, "C", "checkpoint")
    assert c.ckpt.load() and (c.writer, c.step) == ("B", 400), "C resumed from the replacement's newest save"
    assert float(c.model.weight[0, 0].detach()) == 400.0
    c.ckpt.close()
    latest = store.latest(str(root))
    assert (latest.epoch, latest.step, latest.path) == (B[1], 400, f"exec/{B[0]}/checkpoint/step-400")


def test_a_folder_outside_the_exec_folder_and_a_load_step_are_refused(root, tmp_path, one_rank, monkeypatch):
    Executions(root, monkeypatch)(A)
    with pytest.raises(DispatchError, match="not inside this execution's folder"):
        Run(DispatchCheckpointManager, "A", str(tmp_path / "elsewhere"))
    config = DispatchCheckpointManager.Config(enable=True, load_step=100)
    with pytest.raises(DispatchError, match="load_step=100 is refused"):
        config.build(dataloader=None, model_parts=[], optimizers=None, lr_schedulers=None, states={}, sd_adapter=None)
    with pytest.raises(DispatchError, match="enable=False"):
        DispatchCheckpointManager.Config().build(dataloader=None, model_parts=[], optimizers=None, lr_schedulers=None,
                                                 states={}, sd_adapter=None)


def test_the_extra_names_the_tested_torchtitan():
    """pyproject's [torchtitan] extra: the releases tested here, and this venv has one of them."""
    import tomllib
    from importlib.metadata import version
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["torchtitan"]
    assert "torchtitan>=0.3.0,<0.4" in extra, extra
    assert version("torchtitan") == "0.3.0"
