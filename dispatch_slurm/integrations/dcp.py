"""torch.distributed.checkpoint (DCP): sharded saves in the exec folder, published when
complete, loaded from the latest publication. Every function is called on every rank.

    from dispatch_slurm.integrations import dcp as ddcp
    step = ddcp.load(state) or 0            # the latest publication, loaded in place
    ddcp.save(state, step)                   # <exec>/checkpoint-<step>/, then published
    saver = ddcp.AsyncSaver()                # or: overlap the writes with training
    saver.save(state, step); ...; saver.close()   # at the end: the last save published

Complete means DCP's own ``.metadata``: ``dcp.save`` returns on a rank only after the
coordinator gathered every rank's write results (each rank's files fsynced on its own
node: ``sync_files``) and wrote ``.metadata`` last; then the publishing rank publishes
(fsyncing the tree and ``pub/``), so the pointer never moves before the data
(torchtitan #930, pytorch #76395). An async save is published from its upload's
completion, never when ``async_save`` returns; a process killed before the completion
leaves an unpublished folder that no resume ever reads. Resume: rank 0 reads the latest
publication and broadcasts it, so every rank loads the same save even while an
overlapping execution publishes.
"""

import os

try:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError(f"dispatch_slurm.integrations.dcp needs torch ({e})") from e

from .. import store
from ..contract.env import Execution
from ..errors import DispatchError
from ..runtime.distributed import settle
from ..runtime.preempt import is_publishing_rank

METADATA = ".metadata"  # DCP's FileSystemWriter writes it last, on the coordinator


def checkpoint_dir(step: int, exec_dir: str | None = None) -> str:
    """``<exec folder>/checkpoint-<step>``: this execution's save of ``step``."""
    return Execution.current(exec_dir=exec_dir).save_path(step)


def publish(path: str, step: int) -> None:
    """Publish a finished DCP save, on the publishing rank; refuses one without
    ``.metadata`` (a save whose coordinator never finished)."""
    if not is_publishing_rank():
        return
    if not os.path.isfile(os.path.join(path, METADATA)):
        raise DispatchError(f"refusing to publish {path}: no {METADATA}, the DCP save did not complete")
    store.publish(path, step, by="dcp")


def save(state_dict, step: int, *, publish_it: bool = True, process_group=None) -> str:
    """A synchronous DCP save of ``step`` into the exec folder, published once complete
    (``publish_it=False``: the caller publishes, e.g. a preemption save)."""
    path = checkpoint_dir(step)
    dcp.save(state_dict, checkpoint_id=path, process_group=process_group)
    if publish_it:
        publish(path, step)
    return path


class AsyncSaver:
    """``dcp.async_save`` into the exec folder, one save in flight, each published from
    its completion. Create it on every rank (it makes a gloo group for the uploads, so
    they never interleave with the training's collectives)."""

    def __init__(self, process_group=None):
        self._own = process_group is None and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if self._own else process_group
        self._future, self._error = None, None

    def save(self, state_dict, step: int) -> str:
        """Wait for the save in flight, then start this one; returns its folder."""
        self.wait()
        path = checkpoint_dir(step)
        response = dcp.async_save(state_dict, checkpoint_id=path, process_group=self.group)
        self._future = getattr(response, "upload_completion", response)
        self._future.add_done_callback(lambda f: self._completed(f, path, step))
        return path

    def _completed(self, future, path: str, step: int) -> None:
        try:
            future.result()
            publish(path, step)
        except BaseException as e:  # noqa: B036 -- kept for wait(), the caller's thread
            self._error = e

    def wait(self, timeout: float | None = None) -> None:
        """Block until the save in flight is written and published; raise its error."""
        future, self._future = self._future, None
        if future is not None:
            future.result(timeout)
        error, self._error = self._error, None
        if error is not None:
            raise DispatchError(f"async DCP save failed: {type(error).__name__}: {error}") from error

    def close(self) -> None:
        """At the end of training, on every rank: wait for the save in flight (``wait``),
        then settle the group this saver made, whose uploads' collectives would otherwise
        be released by gloo's threads as late as the interpreter's exit (``settle`` says
        why that aborts). A group passed in is the caller's to settle."""
        self.wait()
        if self._own:
            settle(self.group)


def load(state_dict, root: str | None = None) -> int | None:
    """Load the latest publication into ``state_dict`` in place (DCP, every rank the same
    save); its step, or None when nothing is published yet."""
    found = [None]
    if not dist.is_initialized() or dist.get_rank() == 0:
        found[0] = store.resume_point(root)  # a vanished save is an error, never None
    if dist.is_initialized():
        dist.broadcast_object_list(found, src=0)
    if found[0] is None:
        return None
    path, step = found[0]
    if not os.path.isfile(os.path.join(path, METADATA)):
        raise DispatchError(f"the latest publication names {path}, which has no {METADATA} (removed?)")
    dcp.load(state_dict, checkpoint_id=path)
    return step
