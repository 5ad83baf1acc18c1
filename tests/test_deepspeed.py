"""DeepSpeed engines (CPU, gloo, ZeRO-1): what two overlapping executions sharing one
save_dir do to DeepSpeed's ``latest`` and ``global_step<N>`` tags, then the same schedule
through the integration. The page's trainer, SIGTERM through the preemption protocol (one
process, and one rank of two under torchrun), is tests/test_pages.py's.

The schedule (an old execution that keeps saving after its replacement started): A saves
100 and 200; B starts and resumes; B saves 300 and 400; A, still running, saves 300; C starts.

DeepSpeed builds a C++ op the first time it starts on CPU (its shared-memory collectives,
cached under ~/.cache/torch_extensions: ~30 s to 3 min once per machine)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")

from dispatch_slurm import store  # noqa: E402
from dispatch_slurm.errors import DispatchError  # noqa: E402
from dispatch_slurm.integrations import deepspeed as dds  # noqa: E402
from support import REPO  # noqa: E402
from testbed.ranks import dispatch_env  # noqa: E402

A, B = ("c.41.1000000", 1_000_000), ("c.41.1000001", 1_000_001)


SCHEDULE = """
import json, os, sys, torch, deepspeed
from dispatch_slurm.integrations import deepspeed as dds
from testbed.ranks import dispatch_env

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)  # no port
plain, root = sys.argv[1] == "plain", sys.argv[2]
EXECUTIONS = {"A": ("c.41.1000000", 1_000_000), "B": ("c.41.1000001", 1_000_001), "C": ("c.41.1000002", 1_000_002)}
CONFIG = {"train_batch_size": 1, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
engines, seen = {}, {}

def execution(name):
    \"\"\"This process as execution ``name`` from now on (its DISPATCH_* variables).\"\"\"
    attempt, epoch = EXECUTIONS[name]
    env = dispatch_env(root, attempt, epoch)
    os.environ.update({k: env[k] for k in ("DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR", "DISPATCH_EPOCH",
                                            "DISPATCH_ATTEMPT")})
    if name not in engines:
        torch.manual_seed(len(engines))
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        engines[name] = deepspeed.initialize(model=model, optimizer=opt, config=CONFIG)[0]
    return engines[name]

def save(name, step):
    e = execution(name)
    e.global_steps = step
    with torch.no_grad():
        e.module.weight.fill_(step)  # the weights say which step
    if plain:
        e.save_checkpoint(os.path.join(root, "shared"), client_state={"writer": name})
    else:
        dds.save_checkpoint(e, client_state={"writer": name})

def load(name):
    e = execution(name)
    if plain:
        _, state = e.load_checkpoint(os.path.join(root, "shared"))
    else:
        _, state = dds.load_checkpoint(e)
    seen[name] = [state["writer"], e.global_steps, float(e.module.weight[0, 0].detach())]
    if plain:
        seen[name + " latest"] = open(os.path.join(root, "shared", "latest")).read()

save("A", 100); save("A", 200)
load("B"); save("B", 300); save("B", 400)
if plain:
    seen["latest before A's late save"] = open(os.path.join(root, "shared", "latest")).read()
save("A", 300)      # A, still running, saves after its replacement started
load("C")
print(json.dumps(seen))
"""


def schedule(root, kind: str) -> dict:
    """Run the schedule in a process of its own (DeepSpeed keeps its process groups for the
    life of a process); what each load saw."""
    script = root.parent / "schedule.py"
    script.write_text(SCHEDULE)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    proc = subprocess.run([sys.executable, str(script), kind, str(root)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plain_deepspeed_overlap_moves_latest_back_to_the_old_lineage(root):
    """The hazard, reproduced: one shared save_dir. A's late save of step 300 rewrites
    ``latest`` (in place) from B's ``global_step400`` back to ``global_step300``, into the
    folder B wrote at that step: C resumes from A's lineage at 300, and B's newest save,
    400, is never resumed."""
    seen = schedule(root, "plain")
    assert seen["B"] == ["A", 200, 200.0]
    assert seen["latest before A's late save"] == "global_step400"
    assert seen["C latest"] == "global_step300", "A moved latest back"
    assert seen["C"] == ["A", 300, 300.0], "C resumed from the old execution's lineage"


def test_the_same_schedule_through_the_integration_loses_nothing(root):
    """Each execution saves into its own exec folder (its ``latest`` there, never read); A's
    late save of 300 is published at A's epoch; C resumes from B's 400."""
    seen = schedule(root, "dispatch")
    assert seen["B"] == ["A", 200, 200.0]
    assert seen["C"] == ["B", 400, 400.0], "C resumed from the replacement's newest save"
    latest = store.latest(str(root))
    assert (latest.epoch, latest.path) == (B[1], f"exec/{B[0]}/checkpoint-400")
    assert sorted(p.path for p in store.publications(str(root)) if p.epoch == A[1]) == [
        f"exec/{A[0]}/checkpoint-{s}" for s in (100, 200, 300)]
    assert open(root / "exec" / B[0] / "latest").read() == "checkpoint-400"


class Engine:
    """What the refusals read of an engine."""

    def __init__(self, decoupled: bool, node_local: bool):
        self.checkpoint_engine = type("Decoupled" if decoupled else "Torch", (), {"is_decoupled": lambda s: decoupled})()
        self.use_node_local_storage = lambda: node_local
        self.global_steps = 7


@pytest.mark.parametrize("decoupled,node_local,why", [(True, False, "commits a save after save_checkpoint returns"),
                                                       (False, True, "no node holds a complete save")])
def test_an_engine_whose_save_is_not_complete_on_return_is_refused(root, monkeypatch, decoupled, node_local, why):
    env = dispatch_env(str(root), *A)
    for key in ("DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR", "DISPATCH_EPOCH"):
        monkeypatch.setenv(key, env[key])
    with pytest.raises(DispatchError, match=why):
        dds.save_checkpoint(Engine(decoupled, node_local))
    assert not os.listdir(env["DISPATCH_EXEC_DIR"])


def test_the_extra_names_the_tested_deepspeed():
    """pyproject's [deepspeed] extra: the releases tested here, and this venv has one of them."""
    import tomllib
    from importlib.metadata import version
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["deepspeed"]
    assert "deepspeed>=0.19.8,<0.20" in extra, extra
    assert version("deepspeed") == "0.19.8"
