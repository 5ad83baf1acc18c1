"""AsyncSaver: staged through buffers kept across saves, one save in flight, each published
from its completion, and a step's save written once; the benchmark's table at a tiny size.
One process, no torch.distributed (DCP saves as a single process)."""

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from dispatch_slurm import store  # noqa: E402
from dispatch_slurm.integrations import dcp as ddcp  # noqa: E402
from dispatch_slurm.store import once  # noqa: E402
from support import REPO, same  # noqa: E402


@pytest.fixture
def execution(root, monkeypatch):
    attempt = "c.50.1000000"
    for k, v in {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EXEC_DIR": store.make_exec_dir(str(root), attempt),
                 "DISPATCH_EPOCH": "1000000", "DISPATCH_ATTEMPT": attempt}.items():
        monkeypatch.setenv(k, v)
    return root


def state():
    torch.manual_seed(0)
    return {"w": torch.rand(1000), "b": torch.rand(10), "step": 0}


def loaded(path):
    into = {"w": torch.empty(1000), "b": torch.empty(10), "step": -1}
    import torch.distributed.checkpoint as dcp
    dcp.load(into, checkpoint_id=path)
    return into


def snapshot(s):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}


def test_saves_through_one_stager_reuse_its_buffers_and_survive_a_close(execution):
    """Three saves through one AsyncSaver, each published and equal to the state at its
    call; the staging buffer of ``w`` is the same memory each time; and a ``close()`` of the
    stager by ``async_save`` between two saves (torch 2.11 did: the next save raised
    KeyError(<class 'type'>)) changes nothing."""
    s, saver = state(), ddcp.AsyncSaver()
    expected, buffers = {}, set()
    for step in (1, 2, 3):
        s["w"] += 1
        s["step"] = step
        expected[step] = snapshot(s)
        saver.save(s, step)
        saver.wait()
        mapping = saver._stager._state_dict_stager._cached_storage_mapping  # DCP's own cache: torch internals
        buffers.add(mapping[s["w"].untyped_storage()].data_ptr())
        if step == 2:
            saver._stager.close()  # what async_save did to a caller's stager in torch 2.11
    saver.close()
    assert [p.step for p in store.publications(str(execution))] == [1, 2, 3]
    for step in (1, 2, 3):
        assert same(loaded(ddcp.checkpoint_dir(step)), expected[step]) == []
    assert len(buffers) == 1


def test_wait_returns_only_once_the_save_is_published(execution, monkeypatch):
    """A future's result() returns before its done-callbacks run: waiting on the upload
    returned while the publication was still being made (close() too, so a process could
    exit before its last save was published)."""
    real = ddcp.publish

    def slow_publish(path, step):
        time.sleep(0.5)
        real(path, step)
    monkeypatch.setattr(ddcp, "publish", slow_publish)
    saver = ddcp.AsyncSaver()
    saver.save(state(), 7)
    saver.wait()
    assert store.latest(str(execution)).step == 7
    saver.close()


def test_a_step_in_flight_or_saved_is_never_written_again(execution, monkeypatch):
    """``save_now`` (the preemption's save) and ``save`` of the step whose save is in flight
    return that save; ``ddcp.save`` of it skips it; nothing writes the folder twice."""
    import torch.distributed.checkpoint as dcp
    writes = []
    for name in ("save", "async_save"):
        real = getattr(dcp, name)
        monkeypatch.setattr(dcp, name, lambda *a, _real=real, **kw: writes.append(kw["checkpoint_id"]) or _real(*a, **kw))
    s, saver = state(), ddcp.AsyncSaver()
    path = saver.save(s, 5)
    assert saver.save(s, 5) == path
    assert saver.save_now(s, 5, timeout=60) == (path, 5)  # in flight: waited for, returned
    with pytest.warns(UserWarning, match="checkpoint-5 not written: it is published; it keeps its first save"):
        assert ddcp.save(s, 5) == path  # a periodic save of a step saved already: said
    assert ddcp.save(s, 5, publish_it=False) == path  # a preemption's (the recipe before save_now): expected
    assert saver.save_now(s, 6, timeout=60) == (ddcp.checkpoint_dir(6), 6)  # a new step: saved, not published
    saver.close()
    assert writes == [path, ddcp.checkpoint_dir(6)]
    assert [p.step for p in store.publications(str(execution))] == [5]
    assert os.path.isfile(os.path.join(ddcp.checkpoint_dir(6), ".metadata"))


def test_publish_refuses_a_save_this_process_is_still_writing(execution):
    path = os.path.join(os.environ["DISPATCH_EXEC_DIR"], "checkpoint-3")
    os.makedirs(path)
    open(os.path.join(path, "model.bin"), "wb").write(b"w")  # a save holds a file
    k = once.claim(path)
    with pytest.raises(store.AlreadySaved, match="refusing to publish .*still writing it"):
        store.publish(path)
    assert store.latest(str(execution)) is None
    once.release(k)
    store.publish(path)
    with pytest.raises(store.AlreadySaved, match="refusing to write into .*it is published"):
        once.claim(path)


def test_a_folder_published_by_another_process_is_refused(execution):
    """Not in this process's record (an earlier incarnation of the execution, a watcher):
    ``pub/`` says it is published."""
    path = os.path.join(os.environ["DISPATCH_EXEC_DIR"], "checkpoint-4")
    os.makedirs(path)
    open(os.path.join(path, "model.bin"), "wb").write(b"w")  # a save holds a file
    subprocess.run([sys.executable, "-m", "dispatch_slurm", "publish", path], check=True, env=os.environ,
                   capture_output=True)
    with pytest.raises(store.AlreadySaved, match=r"it is published \(0+1000000-0+4-"):
        once.check(path)
    with pytest.warns(UserWarning, match="not written"):
        assert ddcp.save(state(), 4) == path
    assert os.listdir(path) == ["model.bin"]  # skipped: never written into


def test_overlap_staging_waits_at_the_next_optimizer_step(execution):
    """``overlap=True``: save() returns before the copy is staged; the next optimizer step
    waits for it, so the save holds the parameters as they were at the call (the copy made
    slower than the step: without the wait it would hold the updated ones)."""
    model = torch.nn.Linear(100, 100)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    saver = ddcp.AsyncSaver(overlap=True)
    stager = saver._staging()
    real_stage = stager._stage

    def slow_stage(*a, **kw):  # a copy slower than the step: without the wait it would read the updated weights
        time.sleep(0.5)
        return real_stage(*a, **kw)
    stager._stage = slow_stage
    for step in (1, 2):
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        saver.save({"model": model.state_dict()}, step)
        model(torch.rand(4, 100)).sum().backward()
        opt.step()  # the pre-hook waits for the staging first
        opt.zero_grad()
        saver.wait()
        into = {"model": {k: torch.empty_like(v) for k, v in before.items()}}
        import torch.distributed.checkpoint as dcp
        dcp.load(into, checkpoint_id=ddcp.checkpoint_dir(step))
        assert same(into["model"], before) == []
    saver.close()
    from torch.optim.optimizer import _global_optimizer_pre_hooks
    assert not _global_optimizer_pre_hooks  # the hook went with close()


def test_the_benchmark_prints_its_table_at_a_tiny_size(tmp_path):
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_async_save.py"), "--size", "2MB",
                        "--tensor-size", "1MB", "--repeats", "1", "--dir", str(tmp_path), "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["way"] for r in data["rows"]] == ["floor", "torch.save", "dcp.save", "dcp.async_save", "AsyncSaver"]
    assert all(r["blocking_s"] > 0 for r in data["rows"]) and data["rows"][0]["published_s"] is None
    assert all(r["published_s"] > 0 for r in data["rows"][1:]) and data["size_bytes"] == 2 << 20
    for r in data["rows"]:
        assert r["way"] in p.stdout
    assert "goals: AsyncSaver blocking <= 1.5x floor" in p.stdout
    assert os.listdir(tmp_path) == ["b.json"]  # its root removed
