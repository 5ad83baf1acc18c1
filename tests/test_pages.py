"""Each framework page's trainer as a newcomer copies it: the page's script, written to a file
unchanged, run with the page's own commands (`env --local`, then `python` or `torchrun`), once
uninterrupted and once interrupted by SIGTERM and resumed by the next execution; the final
published saves are compared tensor by tensor (dtype, shape, every bit).

Where the SIGTERM lands: right after an optimizer's update, before the loop counts the step
(a real SIGTERM, sent by the trainer process to itself from an optimizer step post-hook that
a ``sitecustomize`` on its PYTHONPATH registers): the moment a signal most often finds a
training loop in, and the one at which a save of the live state taken in the signal's frame
mixes two steps. Under torchrun it goes to one rank only; the protocol stops every rank."""

import os
import pathlib
import socket
import subprocess
import sys
from typing import NamedTuple

import pytest

from dispatch_slurm import store
from dispatch_slurm.contract.names import Publication
from dispatch_slurm.store import events
from support import REPO, doc_snippet, same

SENTINEL = "dispatch-checkpoint-complete"

TERM_HOOK = """
import os, signal
_at, _rank = int(os.environ.get("TEST_TERM_AT_OPTIMIZER_STEP", "0")), os.environ.get("TEST_TERM_RANK", "0")
if _at and os.environ.get("RANK", "0") == _rank:  # a launcher or a writer process never steps an optimizer
    from torch.optim.optimizer import register_optimizer_step_post_hook
    _n = [0]

    def _term(*_):
        _n[0] += 1
        if _n[0] == _at:
            os.kill(os.getpid(), signal.SIGTERM)

    register_optimizer_step_post_hook(_term)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Page:
    """A page's trainer (``script``: its snippet) and its commands (``run``: the shell snippet
    whose first line is the `env` line and the others one launch each), in a folder of its own."""

    def __init__(self, tmp_path, page: str, script: str, filename: str, run: str):
        self.dir = tmp_path
        (tmp_path / filename).write_text(doc_snippet(page, script))
        lines = [ln.split("  #", 1)[0].strip() for ln in doc_snippet(page, run).splitlines() if ln.strip()]
        self.enter, self.launches = lines[0], lines[1:]
        hooks = tmp_path / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(TERM_HOOK)
        self.path = f"{hooks}:{REPO}"

    def launch(self, nproc: int, steps: int, root, *, timeout: float = 540, **env) -> tuple[int, str]:
        """One execution: the page's `env` line, then its launch for ``nproc`` ranks, with the
        step count it takes (the page's 1000) set to ``steps``; (exit status, everything printed)."""
        command = next(c for c in self.launches if f"--nproc-per-node {nproc} " in c or
                       (nproc == 1 and not c.startswith("torchrun")))
        command = command.replace(" 1000", f" {steps}")
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_", "RANK", "WORLD_"))}
        clean.update(DISPATCH_CHECKPOINT=str(root), PYTHONPATH=self.path, PET_MASTER_PORT=str(_free_port()),
                     PATH=f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin", **env)
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", f"{self.enter}\n{command}"], cwd=self.dir,
                                env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out = proc.communicate(timeout=timeout)[0]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.communicate()
        return proc.returncode, out


def final_state(root) -> dict:
    """The latest publication's save, every file of it loaded: DCP's shards (``.metadata``)
    gathered into one state dict, every ``.pt`` file torch.load-ed."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    pub = store.latest(str(root))
    path = pathlib.Path(root, pub.path)
    state: dict = {"step": pub.step}
    if (path / ".metadata").exists():
        dcp_to_torch_save(str(path), str(path.parent / "gathered.pt"))
        state["dcp"] = torch.load(path.parent / "gathered.pt", weights_only=False)
        os.unlink(path.parent / "gathered.pt")
    for f in sorted(path.glob("*.pt")):
        state[f.name] = torch.load(f, weights_only=False, map_location="cpu")
    return state


class Runs(NamedTuple):
    whole: dict  # the uninterrupted run's final state
    resumed: dict  # the interrupted and resumed run's
    stop: Publication  # the interrupted execution's SIGTERM save
    published_by: list[str]  # who published each save of the interrupted root, in order


def interrupted_then_resumed(page: Page, tmp_path, nproc: int, steps: int, term_at: int, **env) -> Runs:
    whole, cut = tmp_path / "uninterrupted", tmp_path / "interrupted"
    whole.mkdir()
    cut.mkdir()
    code, out = page.launch(nproc, steps, whole, **env)
    assert code == 0, out[-4000:]
    code, out = page.launch(nproc, steps, cut, TEST_TERM_AT_OPTIMIZER_STEP=str(term_at),
                            TEST_TERM_RANK=str(nproc - 1), **env)
    assert code == 0 and out.count(SENTINEL) == nproc, out[-4000:]
    stop = store.latest(str(cut))
    assert 0 < stop.step < steps, stop
    assert [e["by"] for e in events.read(str(cut)) if e["type"] == "published"][-1] == "preempt"
    code, out = page.launch(nproc, steps, cut, **env)
    assert code == 0, out[-4000:]
    assert store.latest(str(cut)).step == steps and store.latest(str(whole)).step == steps
    by = [e["by"] for e in events.read(str(cut)) if e["type"] == "published"]
    return Runs(final_state(whole), final_state(cut), stop, by)


def assert_bitwise(runs: Runs) -> None:
    diff = same(runs.whole, runs.resumed)
    assert not diff, f"{len(diff)} tensors or values differ from the uninterrupted run: {diff[:8]}"


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_dcp_page_resumes_bitwise(tmp_path, nproc):
    """docs/ranks.md's DCP trainer: SIGTERM lands between an optimizer step and the loop's
    step count; the resumed run ends where the uninterrupted one does, bit for bit."""
    page = Page(tmp_path, "ranks.md", "dcp-train", "train_dcp.py", "dcp-train-run")
    runs = interrupted_then_resumed(page, tmp_path, nproc, 300, 150)
    assert sorted(runs.whole) == ["dcp", "step"] and set(runs.published_by) == {"dcp", "preempt"}
    assert_bitwise(runs)


def test_the_dcp_recipe_without_defer_is_refused_before_training(tmp_path):
    """The page's recipe before it said defer=True: the save in the signal's frame published a
    mix of two steps (every tensor differed after the resume). Refused now, at the install,
    naming the fix; nothing saved, nothing published."""
    page = Page(tmp_path, "ranks.md", "dcp-train", "train_dcp.py", "dcp-train-run")
    script = tmp_path / "train_dcp.py"
    script.write_text(script.read_text().replace("install_preemption_handler(on_preempt, defer=True)",
                                                 "install_preemption_handler(on_preempt)"))
    root = tmp_path / "r"
    root.mkdir()
    code, out = page.launch(1, 300, root)
    assert code == 1 and out.strip().splitlines()[-1].endswith(
        "pass defer=True and call preemption_point() after each step, where the save runs"), out[-3000:]
    assert "without defer=True would run fn in the signal handler" in out
    assert store.latest(str(root)) is None and [p.name for p in (root / "exec").glob("*/*")] == []


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_megatron_page_resumes_bitwise(tmp_path, nproc):
    """docs/megatron.md's trainer, a top-level script as the page gives it (main guard, CPU
    lines): Megatron's async writer processes start, the SIGTERM save goes through
    dist_checkpointing.save and is published once; the resumed run ends bit for bit where the
    uninterrupted one does."""
    pytest.importorskip("megatron.core")
    page = Page(tmp_path, "megatron.md", "megatron-loop", "train_megatron.py", "megatron-run")
    runs = interrupted_then_resumed(page, tmp_path, nproc, 1000, 700)
    files = sorted(os.listdir(tmp_path / "interrupted" / runs.stop.path))  # every rank's shards, then Megatron's
    assert {f for f in files if not f.endswith(".distcp")} == {".metadata", "common.pt", "metadata.json"}, files
    assert {f.split("_")[2] for f in files if f.endswith(".distcp")} == {str(r) for r in range(nproc)}, files
    assert runs.published_by == ["megatron", "preempt", "megatron"], runs.published_by  # 500, the stop, 1000
    assert sorted(runs.whole) == ["common.pt", "dcp", "step"], sorted(runs.whole)
    assert_bitwise(runs)


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_torchtitan_page_resumes_bitwise_and_an_extended_run_goes_on_from_its_end(tmp_path, nproc):
    """docs/torchtitan.md's loop (async saves): the SIGTERM save is published once, the resumed
    run ends bit for bit where the uninterrupted one does, and its last step's save is a
    published resume point: the same run extended by 500 steps starts from it."""
    pytest.importorskip("torchtitan")
    page = Page(tmp_path, "torchtitan.md", "torchtitan-loop", "train_torchtitan.py", "torchtitan-run")
    runs = interrupted_then_resumed(page, tmp_path, nproc, 1000, 1400)  # its container steps, then AdamW: 2 a step
    assert sorted(os.listdir(tmp_path / "interrupted" / runs.stop.path)) == \
        [".metadata"] + [f"__{r}_0.distcp" for r in range(nproc)]
    assert runs.published_by == ["torchtitan", "preempt", "torchtitan"], runs.published_by  # 500, the stop, 1000
    assert_bitwise(runs)
    code, out = page.launch(nproc, 1500, tmp_path / "interrupted")
    assert code == 0 and "started at step 1000" in out, out[-3000:]
    assert store.latest(str(tmp_path / "interrupted")).step == 1500


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_deepspeed_page_resumes_bitwise(tmp_path, nproc):
    """docs/deepspeed.md's trainer under torchrun (one rank too): the SIGTERM save goes through
    engine.save_checkpoint at preemption_point(), every rank's part, one publication; the
    resumed run ends bit for bit where the uninterrupted one does."""
    pytest.importorskip("deepspeed")
    page = Page(tmp_path, "deepspeed.md", "deepspeed-loop", "train_deepspeed.py", "deepspeed-run")
    runs = interrupted_then_resumed(page, tmp_path, nproc, 1000, 700)
    assert sorted(os.listdir(tmp_path / "interrupted" / runs.stop.path)) == ["mp_rank_00_model_states.pt"] + [
        f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(nproc)]
    assert runs.published_by == ["deepspeed", "preempt", "deepspeed"], runs.published_by  # 500, the stop, 1000
    assert_bitwise(runs)


def test_a_deepspeed_save_of_one_rank_is_refused_on_two(tmp_path):
    """The page says so: ZeRO's optimizer state is partitioned by data-parallel size, and
    DeepSpeed refuses to resume a one-rank save on two ranks. The execution fails before its
    first step (never a silent start from step 0), and its latest stays the one-rank save."""
    pytest.importorskip("deepspeed")
    page = Page(tmp_path, "deepspeed.md", "deepspeed-loop", "train_deepspeed.py", "deepspeed-run")
    root = tmp_path / "r"
    root.mkdir()
    code, out = page.launch(1, 500, root)
    assert code == 0, out[-3000:]
    code, out = page.launch(2, 1000, root)
    assert code != 0 and "resumed at step" not in out, out[-3000:]
    assert "The checkpoint being loaded used a DP world size of 1 but the current world size is 2" in out
    assert store.latest(str(root)).step == 500
