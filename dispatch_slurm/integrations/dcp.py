"""torch.distributed.checkpoint (DCP): sharded saves in the exec folder, published when
complete, loaded from the latest publication. Every function is called on every rank.

    from dispatch_slurm.integrations import dcp as ddcp
    step = ddcp.load(state) or 0            # the latest publication, loaded in place
    ddcp.save(state, step)                   # <exec>/checkpoint-<step>/, then published
    saver = ddcp.AsyncSaver()                # or: overlap the writes with training
    saver.save(state, step); ...; saver.close()   # at the end: the last save published
    install_preemption_handler(lambda left: saver.save_now(state, step, left), defer=True)  # at preemption_point()

Complete means DCP's own ``.metadata``: ``dcp.save`` returns on a rank only after the
coordinator gathered every rank's write results (each rank's files fsynced on its own
node: ``sync_files``) and wrote ``.metadata`` last; then the publishing rank publishes
(fsyncing the tree and ``pub/``), so the pointer never moves before the data
(torchtitan #930, pytorch #76395). An async save is published from its upload's
completion, never when ``async_save`` returns; a process killed before the completion
leaves an unpublished folder that no resume ever reads. Resume: rank 0 reads the latest
publication and broadcasts it, so every rank loads the same save even while an
overlapping execution publishes.

A save folder is written once (store/once.py): a preemption at a step whose save is in
flight or published returns that save (``save_now``), and ``save`` skips a folder already
written, so a SIGKILL during the preemption can never tear the latest publication.
"""

import os
import time
from concurrent.futures import Future
from typing import Any, NamedTuple, cast

try:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError(f"dispatch_slurm.integrations.dcp needs torch ({e})") from e

from .. import store
from ..store import once
from ..contract.env import Execution
from ..errors import DispatchError
from ..runtime.distributed import settle
from ..runtime.preempt import is_publishing_rank, needs_whole_steps

METADATA = ".metadata"  # DCP's FileSystemWriter writes it last, on the coordinator
WHO = "DCP (dispatch_slurm.integrations.dcp)"  # whose save reads the live state: never in a signal's frame


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
    (``publish_it=False``: the caller publishes, e.g. a preemption save). A folder already
    saved is never written again (store/once.py): an async save of it in flight is waited
    for, and one written or published is the save asked for."""
    needs_whole_steps(WHO)
    path = checkpoint_dir(step)
    saver = _in_flight.get(once.key(path))
    if saver is not None:
        saver.wait()
    try:
        k = once.claim(path)
    except once.AlreadySaved as e:  # the same step's save: written, or published
        if publish_it:  # a periodic save of a step saved already (a preemption's is expected)
            once.skipped(e)
        return path
    try:
        dcp.save(state_dict, checkpoint_id=path, process_group=process_group)
    except BaseException:
        once.release(k, ok=False)
        raise
    once.release(k)
    if publish_it:
        publish(path, step)
    return path


_in_flight: dict[str, "AsyncSaver"] = {}  # key of a folder -> the AsyncSaver writing it


class _Flight(NamedTuple):
    path: str
    step: int
    key: str
    staging: Future | None  # the copy into the staging buffers (overlap), else None: done in save()
    published: Future  # set once written and published (or failed)


def _stager(overlap: bool) -> Any:
    """A stager whose staging buffers are allocated once and reused by every save: DCP's
    ``DefaultStager``, on a GPU with pinned buffers filled by non-blocking copies (known
    done by a synchronize: of its staging stream with ``overlap``, else of the device); on
    CPU plain buffers (a memcpy into warm pages). None where this torch has no
    ``DefaultStager``: ``async_save``'s own staging, a fresh copy each save.

    Kept open across saves: ``async_save`` of some torch versions closes a caller's stager
    after each save (2.11: the next save through it raised ``KeyError(<class 'type'>)``),
    and the kept buffers are the point; ``release`` frees them."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:  # pragma: no cover - torch < 2.8
        return None
    gpu = torch.cuda.is_available()

    class KeptStager(DefaultStager):
        def close(self) -> None:
            """Kept open; ``release`` closes it."""

        def release(self) -> None:
            DefaultStager.close(self)

    return KeptStager(StagingOptions(use_pinned_memory=gpu, use_shared_memory=False,
                                     use_async_staging=overlap, use_non_blocking_copy=gpu))


class AsyncSaver:
    """``dcp.async_save`` into the exec folder, one save in flight, each published from
    its completion. Create it on every rank (it makes a gloo group for the uploads, so
    they never interleave with the training's collectives).

    The state is staged through buffers kept across saves (``_stager``): ``save`` blocks
    for about one device-to-host copy of the state (a host memcpy on CPU), not for
    allocating and filling a fresh copy each time. The buffers cost one copy of the state
    in host memory, held until ``close``. ``overlap=True`` (an accelerator's staging
    stream) returns before the copy is done: the copy then runs beside the next step's
    forward and backward, and the next ``optimizer.step()`` (any optimizer's: a global
    pre-hook), ``staged()``, ``save`` or ``save_now`` waits for it; only parameters and
    optimizer state may change before then (not buffers a forward pass updates, such as
    BatchNorm's running statistics)."""

    def __init__(self, process_group=None, *, overlap: bool = False):
        needs_whole_steps(WHO)
        self._own = process_group is None and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if self._own else process_group
        self.overlap = overlap
        self._stager: Any = None
        self._hook: Any = None
        self._flight: _Flight | None = None

    def save(self, state_dict, step: int) -> str:
        """Wait for the save in flight, then start this one; returns its folder. A step
        whose save is in flight, written or published is that save: never written again."""
        path = checkpoint_dir(step)
        if self._flight is not None and self._flight.path == path:
            return path
        self.wait()
        try:
            self._start(state_dict, step, path, publish_it=True)
        except once.AlreadySaved as e:
            once.skipped(e)
        return path

    def save_now(self, state_dict, step: int, timeout: float | None = None) -> tuple[str, int]:
        """The save of ``step`` for a preemption: written and durable when it returns,
        published by the caller (the preemption protocol publishes ``(path, step)``). The
        step's own save if it is in flight (waited for) or already written or published:
        never a second write into that folder; else a save through the same staging."""
        deadline = None if timeout is None else time.monotonic() + timeout
        path = checkpoint_dir(step)
        self.wait(timeout)
        try:
            self._start(state_dict, step, path, publish_it=False)
        except once.AlreadySaved:
            return path, step
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return path, step

    def _start(self, state_dict, step: int, path: str, publish_it: bool) -> None:
        k = once.claim(path, here=False)  # AlreadySaved: this step's save exists
        published: Future = Future()
        try:
            response = dcp.async_save(state_dict, checkpoint_id=path, process_group=self.group,
                                      async_stager=self._staging())
        except BaseException:
            once.release(k, ok=False)
            raise
        upload = cast(Future, getattr(response, "upload_completion", response))
        self._flight = _Flight(path, step, k, getattr(response, "staging_completion", None), published)
        _in_flight[k] = self
        upload.add_done_callback(lambda f: self._completed(f, path, step, k, publish_it, published))

    def _staging(self):
        """The stager, made at the first save (an accelerator's staging stream must be made
        after the training used its default stream); with ``overlap``, the pre-hook that
        makes every optimizer step wait for the staging in flight."""
        if self._stager is None:
            self._stager = _stager(self.overlap)
            if self.overlap and self._hook is None:
                from torch.optim.optimizer import register_optimizer_step_pre_hook
                self._hook = register_optimizer_step_pre_hook(lambda *_: self.staged())
        return self._stager

    def _completed(self, upload: Future, path: str, step: int, k: str, publish_it: bool,
                   published: Future) -> None:
        """In the upload's thread: publish once DCP's ``.metadata`` is written, then tell
        ``wait`` (a future of its own: the upload's returns before its callbacks ran)."""
        try:
            upload.result()
            once.release(k)
            if publish_it:
                publish(path, step)
        except BaseException as e:  # noqa: B036 -- for wait(), the caller's thread
            once.release(k, ok=upload.exception() is None)
            published.set_exception(e)
            return
        finally:
            _in_flight.pop(k, None)
        published.set_result(path)

    def staged(self) -> None:
        """Block until the save in flight no longer reads the live state (its copy is
        staged): the state may change from then on."""
        if self._flight is not None and self._flight.staging is not None:
            self._flight.staging.result()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the save in flight is written and published; raise its error."""
        if self._flight is None:
            return
        published = self._flight.published
        try:
            published.result(timeout)  # TimeoutError: still in flight, still ours to wait for
        except BaseException as e:
            if not published.done():
                raise
            self._flight = None
            raise DispatchError(f"async DCP save failed: {type(e).__name__}: {e}") from e
        self._flight = None

    def close(self) -> None:
        """At the end of training, on every rank: wait for the save in flight (``wait``),
        free the staging buffers, then settle the group this saver made, whose uploads'
        collectives would otherwise be released by gloo's threads as late as the
        interpreter's exit (``settle`` says why that aborts). A group passed in is the
        caller's to settle."""
        self.wait()
        if self._stager is not None and hasattr(self._stager, "release"):
            self._stager.release()
        self._stager = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._own:
            settle(self.group)


def load(state_dict, root: str | None = None) -> int | None:
    """Load the latest publication into ``state_dict`` in place (DCP, every rank the same
    save); its step, or None when nothing is published yet."""
    needs_whole_steps(WHO)
    found: list[tuple[str, int] | None] = [None]
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
