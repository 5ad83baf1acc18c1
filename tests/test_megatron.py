"""Megatron-Core's dist_checkpointing (CPU, gloo): the tracker hazard of the training loops
built on it, with two overlapping executions sharing one save folder, then the same schedule
through the integration. The page's trainer, SIGTERM through the preemption protocol with
async saves (one process, and one rank of two under torchrun), is tests/test_pages.py's.

What runs here and what cannot. The saves and loads are megatron-core's own
(``dist_checkpointing.save``/``load``, sync and async, real files). The tracker
(``latest_checkpointed_iteration.txt``) and the retention that reads it are not in the
megatron-core wheel: they live in Megatron-LM's ``megatron/training/checkpointing.py`` (a git
checkout, not on PyPI) and in Megatron-Bridge's (on PyPI; ``import
megatron.bridge.training.checkpointing`` fails here with ``ModuleNotFoundError: No module
named 'transformer_engine'``, whose wheels are CUDA builds). So ``MEGATRON_LM`` below is a
transcription of Megatron-LM's ``iter_finalize_fn`` (inside ``save_checkpoint``: read the
previous iteration from the tracker, rewrite the tracker in place, delete the previous
iteration unless it is a multiple of ``--save-retain-interval``) and of its resume
(``read_metadata`` of the tracker, then ``iter_<N>``), run on real megatron-core saves.

On CPU, megatron-core 0.16's save path calls ``torch.cuda.synchronize()`` and
``torch.cuda.current_device()`` unconditionally: the scripts make the first a no-op and the
second answer "cpu" (on a GPU neither is needed); its writer processes need psutil.

The schedule (an old execution that keeps saving after its replacement started): A saves
1000; B starts, resumes and saves 2000; A, still running, saves 1500; C starts."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core")

from dispatch_slurm import store  # noqa: E402
from dispatch_slurm.errors import DispatchError  # noqa: E402
from support import REPO  # noqa: E402
from testbed.ranks import dispatch_env  # noqa: E402

A, B = ("c.42.1000000", 1_000_000), ("c.42.1000001", 1_000_001)

CPU = """
import os, sys, time, torch
import torch.distributed as dist
torch.cuda.synchronize = lambda *a, **k: None   # megatron-core 0.16 calls both on CPU too
torch.cuda.current_device = lambda: "cpu"
"""

MEGATRON_LM = '''
import shutil

def tracker(save_dir):
    return os.path.join(save_dir, "latest_checkpointed_iteration.txt")

def megatron_lm_finalize(save_dir, iteration, retain_interval):
    """Megatron-LM's iter_finalize_fn (megatron/training/checkpointing.py), on rank 0 after a save."""
    prev = 0
    if os.path.exists(tracker(save_dir)):
        with open(tracker(save_dir)) as f:
            prev = int(f.read().strip())
    with open(tracker(save_dir), "w") as f:           # in place: no rename, no fsync
        f.write(str(iteration))
    if prev > 0 and prev != iteration and prev % retain_interval != 0:
        shutil.rmtree(os.path.join(save_dir, f"iter_{prev:07d}"))

def megatron_lm_resume_dir(load_dir):
    """Megatron-LM's resume: read_metadata(tracker), then iter_<N>."""
    with open(tracker(load_dir)) as f:
        return os.path.join(load_dir, f"iter_{int(f.read().strip()):07d}")
'''

SCHEDULE = CPU + MEGATRON_LM + '''
import json
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing import ShardedTensor
from dispatch_slurm.integrations import megatron as dmg
from testbed.ranks import dispatch_env

RETAIN = 5000  # --save-retain-interval: keep every 5000th iteration, delete the others once superseded
EXECUTIONS = {"A": ("c.42.1000000", 1_000_000), "B": ("c.42.1000001", 1_000_001), "C": ("c.42.1000002", 1_000_002)}

def sharded(value, writer):
    return {"weight": ShardedTensor.from_rank_offsets("weight", torch.full((2, 4), float(value))), "writer": writer}

def main():
    plain, root = sys.argv[1] == "plain", sys.argv[2]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    shared, seen = os.path.join(root, "shared"), {}

    def execution(name):
        attempt, epoch = EXECUTIONS[name]
        env = dispatch_env(root, attempt, epoch)
        os.environ.update({k: env[k] for k in ("DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR", "DISPATCH_EPOCH",
                                                "DISPATCH_ATTEMPT")})
        return env["DISPATCH_EXEC_DIR"]

    def save(name, step):
        exec_dir = execution(name)
        if plain:
            path = os.path.join(shared, f"iter_{step:07d}")
            os.makedirs(path, exist_ok=True)
            dist_checkpointing.save(sharded(step, name), path)
            megatron_lm_finalize(shared, step, RETAIN)
        else:
            dmg.save(sharded(step, name), step)
            megatron_lm_finalize(exec_dir, step, RETAIN)  # the training loop's own, with --save in the exec folder

    def load(name):
        execution(name)
        if plain:
            state = dist_checkpointing.load(sharded(0, ""), megatron_lm_resume_dir(shared))
        else:
            state, _ = dmg.load(sharded(0, ""))
        seen[name] = [state["writer"], float(state["weight"][0, 0])]

    os.makedirs(shared)
    save("A", 1000)
    load("B"); save("B", 2000)
    save("A", 1500)   # A, still running, saves after its replacement started
    load("C")
    if plain:
        with open(tracker(shared)) as f:
            seen["tracker"] = f.read()
        seen["iters"] = sorted(n for n in os.listdir(shared) if n.startswith("iter_"))
    print(json.dumps(seen))

if __name__ == "__main__":
    main()
'''


def schedule(root, kind: str) -> dict:
    """The schedule in a process of its own (megatron-core's writers are spawned processes,
    which re-run the main module: a script with a main guard, not pytest's process)."""
    script = root.parent / "schedule.py"
    script.write_text(SCHEDULE)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    proc = subprocess.run([sys.executable, str(script), kind, str(root)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plain_megatron_overlap_moves_the_tracker_back_and_deletes_the_newer_save(root):
    """The hazard, reproduced: A's late save of 1500 reads 2000 (B's) from the shared
    tracker as its previous iteration, rewrites the tracker to 1500 and deletes
    iter_0002000; C resumes from A's lineage and B's progress is gone."""
    seen = schedule(root, "plain")
    assert seen["B"] == ["A", 1000.0]
    assert seen["tracker"] == "1500", "A moved the tracker back"
    assert seen["iters"] == ["iter_0001500"], "A's retention deleted B's iter_0002000 (and B's deleted A's 1000)"
    assert seen["C"] == ["A", 1500.0], "C resumed from the old execution's lineage"


def test_the_same_schedule_through_the_integration_loses_nothing(root):
    """Each execution saves into its own folder (the loop's tracker and retention there
    too): A's late save is published at A's epoch; C resumes from B's 2000, which exists."""
    seen = schedule(root, "dispatch")
    assert seen["B"] == ["A", 1000.0]
    assert seen["C"] == ["B", 2000.0], "C resumed from the replacement's newest save"
    latest = store.latest(str(root))
    assert (latest.epoch, latest.step, latest.path) == (B[1], 2000, f"exec/{B[0]}/iter_0002000")
    assert os.path.isfile(root / latest.path / "metadata.json")
    assert sorted(os.listdir(root / "exec" / A[0])) == ["iter_0001500", "latest_checkpointed_iteration.txt"]


def test_publishing_a_save_megatron_never_finalized_is_refused(root, monkeypatch):
    from dispatch_slurm.integrations import megatron as dmg
    env = dispatch_env(str(root), *A)
    for key in ("DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR", "DISPATCH_EPOCH"):
        monkeypatch.setenv(key, env[key])
    path = dmg.checkpoint_dir(100)
    os.makedirs(path)
    open(os.path.join(path, "common.pt"), "w").close()  # what a writer killed before finalization leaves
    with pytest.raises(DispatchError, match="no metadata.json, Megatron never finalized the save"):
        dmg.publish(path, 100)
    assert store.latest(str(root)) is None


def test_the_extra_names_the_tested_megatron_core():
    """pyproject's [megatron] extra: the releases tested here, and this venv has one of them."""
    import tomllib
    from importlib.metadata import version
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["megatron"]
    assert "megatron-core>=0.16.1,<0.17" in extra, extra
    assert version("megatron-core") == "0.16.1"
