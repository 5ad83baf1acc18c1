"""Megatron-Core (``pip install 'dispatch-slurm[megatron]'``): ``dist_checkpointing.save`` into
the exec folder, published once Megatron has finalized it (synchronously, or from an async
request's finalization); ``dist_checkpointing.load`` of the latest publication. Every
function is called on every rank.

    from dispatch_slurm.integrations import megatron as dmg
    loaded = dmg.load(model.sharded_state_dict())         # (state_dict, step), or None
    queue = AsyncCallsQueue()                             # or no queue: synchronous saves
    dmg.save(model.sharded_state_dict(), step, async_queue=queue)   # <exec>/iter_<step>/
    queue.maybe_finalize_async_calls()                    # each step, as Megatron's loop does

What the pip package holds, and what it does not. ``megatron-core`` is
``megatron.core`` only: ``dist_checkpointing`` writes a folder (DCP's ``.metadata`` and
shards, ``common.pt``, then ``metadata.json`` on rank 0 and a barrier) and keeps no
pointer. The pointer, ``latest_checkpointed_iteration.txt``, and the retention that reads
it live in the training loops built on it: Megatron-LM's ``megatron/training/
checkpointing.py`` (a git checkout, not on PyPI) and Megatron-Bridge's (on PyPI, needing
Transformer Engine). Both rewrite the tracker in place after each save; with a retain
interval Megatron-LM reads the *previous* iteration from the shared tracker and deletes
it, so an old execution saving 1500 after its replacement saved 2000 moves the tracker
back and deletes ``iter_0002000``; Bridge's ``most_recent_k`` keeps the greatest ``iter_*``
by number, whoever wrote them. Here there is no tracker: each execution's saves are in
its own folder, the latest is the latest publication (rank 0 chooses, every rank loads
the same), and retention across executions is ``dispatch-slurm gc``'s.

Complete means Megatron's own finalization: ``metadata.json`` written after every rank's
shards (fsynced by Megatron's writer) and the coordinator's ``.metadata``, then a barrier.
A synchronous save is published when ``save`` returns; an async one from a finalize
function appended after Megatron's own, which ``maybe_finalize_async_calls`` runs on every
rank once every rank's writer finished. A process killed before that leaves an
unpublished folder no resume reads.
"""

import multiprocessing
import os

try:
    from megatron.core import dist_checkpointing
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"dispatch_slurm.integrations.megatron needs megatron-core: "
                      f"pip install 'dispatch-slurm[megatron]' ({e})") from e

from .. import store
from ..contract.env import Execution
from ..errors import DispatchError
from ..runtime import distributed
from ..runtime.preempt import is_publishing_rank, needs_whole_steps

CONFIG = "metadata.json"  # dist_checkpointing's save_config, written last, on rank 0
WHO = "Megatron's dist_checkpointing (dispatch_slurm.integrations.megatron)"  # a save of the live state


def checkpoint_dir(step: int, exec_dir: str | None = None) -> str:
    """``<exec folder>/iter_<step, 7 digits>``: Megatron's name for this execution's save of ``step``."""
    return os.path.join(Execution.current(exec_dir=exec_dir).need("exec_dir"), f"iter_{step:07d}")


def publish(path: str, step: int, root: str | None = None, epoch: int | None = None) -> None:
    """Publish a finalized save, on the publishing rank; refuses one without ``metadata.json``."""
    if not is_publishing_rank():
        return
    if not os.path.isfile(os.path.join(path, CONFIG)):
        raise DispatchError(f"refusing to publish {path}: no {CONFIG}, Megatron never finalized the save")
    store.publish(path, step, root=root, epoch=epoch, by="megatron")


def save(sharded_state_dict: dict, step: int, *, async_queue=None, publish_it: bool = True,
         exiting: bool = False, **save_kwargs) -> tuple[str, int]:
    """``dist_checkpointing.save`` of ``step`` into the exec folder, published once finalized
    (``async_queue``: an ``AsyncCallsQueue`` the request is scheduled on, published when the
    queue finalizes it; ``publish_it=False``: the caller publishes). ``exiting=True``: the
    preemption save, synchronous and published by the protocol, which then ends the process
    with ``os._exit``: the processes Megatron started for its writes (a multiprocessing
    Manager, which never notices its parent is gone) are ended first, else they would
    outlive the job's trainer and hold its output open. (path, step)."""
    needs_whole_steps(WHO)
    if exiting:
        async_queue, publish_it = None, False
    root, epoch = Execution.current().need("root", "epoch")  # now: refused before anything is written
    path = checkpoint_dir(step)
    os.makedirs(path, exist_ok=True)  # Megatron wants the folder; every rank asks, the first makes it
    if async_queue is None:
        dist_checkpointing.save(sharded_state_dict, path, **save_kwargs)  # returns after its last barrier
        if publish_it:
            publish(path, step, root, epoch)
        if exiting:
            _end_helpers()
        return path, step
    request = dist_checkpointing.save(sharded_state_dict, path, async_sharded_save=True, **save_kwargs)
    if publish_it:
        request.add_finalize_fn(lambda: publish(path, step, root, epoch))  # after Megatron's own finalization
    async_queue.schedule_async_request(request)
    return path, step


def _end_helpers() -> None:
    for child in multiprocessing.active_children():  # this process's own, started by multiprocessing
        child.terminate()
        child.join(5)


def load(sharded_state_dict: dict, root: str | None = None, **load_kwargs) -> tuple[dict, int] | None:
    """``dist_checkpointing.load`` of the latest publication (the same save on every rank):
    (the loaded state dict, its step), or None when nothing is published yet."""
    needs_whole_steps(WHO)
    found = distributed.resume_point(root)
    if found is None:
        return None
    path, step = found
    if not os.path.isfile(os.path.join(path, CONFIG)):
        raise DispatchError(f"the latest publication names {path}, which has no {CONFIG} (not a Megatron save?)")
    return dist_checkpointing.load(sharded_state_dict, path, **load_kwargs), step
