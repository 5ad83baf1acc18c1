"""torchtitan (``pip install 'dispatch-slurm[torchtitan]'``): its own CheckpointManager,
saving into the exec folder, each save published once complete, every rank resuming
from the latest publication.

    from dispatch_slurm.integrations.torchtitan import DispatchCheckpointManager
    config.checkpoint = DispatchCheckpointManager.Config(enable=True, interval=500, keep_latest_k=3)

torchtitan's Trainer builds the manager from ``config.checkpoint`` (``build`` makes the
class that declared the Config), calls ``load`` when training starts and ``save(step)``
after every step; a training loop of your own calls the same two.

What torchtitan (0.3, read in ``components/checkpointer/dcp.py``) does with one shared
``folder``, and what this subclass changes:
  * the latest is the greatest ``step-N`` holding DCP's ``.metadata``, whoever wrote it:
    an old execution still running after its replacement started (a partition, a grace
    window) wins with its later steps, and two executions at one step write into the
    same ``step-N``. Here ``folder`` is always inside ``$DISPATCH_EXEC_DIR``; ``load``
    loads the latest publication (rank 0 chooses, every rank loads the same) through
    torchtitan's own ``load(step)``, never by scanning folders.
  * ``keep_latest_k`` deletes every ``step-*`` of ``folder`` but the k greatest, by
    number, whoever wrote them. Inside the exec folder it only ever sees this
    execution's own saves; across executions, ``dispatch-slurm gc`` decides.
  * a save is complete when DCP's coordinator wrote ``.metadata`` (each rank's files
    fsynced by DCP's writer): a synchronous save is published when ``save`` returns, an
    asynchronous one (``async_mode``) from its upload's completion, never before.
    The last step's save is published like any other (``last_save_model_only`` defaults to
    False here): torchtitan's own default makes it a model-only export, which nothing could
    resume from, so a run extended later would go on from the interval before; set to True,
    that export is saved and not published.
  * SIGTERM: ``load`` installs the preemption handler (deferred); each ``save`` asks
    ``stop_requested()`` first (several ranks: every rank stops at the same step), then
    saves that step synchronously through torchtitan's own ``dcp_save``, and the
    protocol publishes it once and exits 0 on every rank (``conclude``).
"""

import concurrent.futures
import os
from dataclasses import dataclass

try:
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.checkpointer.dcp import AsyncMode
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"dispatch_slurm.integrations.torchtitan needs torchtitan: "
                      f"pip install 'dispatch-slurm[torchtitan]' ({e})") from e

from .. import store
from ..contract.env import Execution
from ..errors import DispatchError
from ..runtime import distributed, preempt

METADATA = ".metadata"  # DCP's FileSystemWriter writes it last, on the coordinator


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder + os.sep)


class DispatchCheckpointManager(CheckpointManager):
    """torchtitan's CheckpointManager in the exec folder, publishing its saves (module doc)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        last_save_model_only: bool = False
        """The last step's save is the full state, published: a run extended later (more steps,
        the same root) goes on from its end. torchtitan's default, True, makes it a model-only
        export that is not published, and the extended run resumes from the interval before."""

    folder: str  # torchtitan's: <base_folder>/<config.folder>

    def __init__(self, config, *, base_folder: str = "", **kwargs):
        # root and epoch read once: every publication of this manager is this execution's
        self._published: concurrent.futures.Future[str] | None = None  # the async save in flight, published
        self._saved: int | None = None  # the step of the last save, the same on every rank
        self.root, exec_dir, self.epoch = Execution.current().need("root", "exec_dir", "epoch")
        if not config.enable:
            raise DispatchError("DispatchCheckpointManager with checkpoint.enable=False saves nothing: "
                                "nothing would be published or resumed (set enable=True)")
        if config.load_step != -1:
            raise DispatchError(f"checkpoint.load_step={config.load_step} is refused: a step number names no "
                                "save across executions; the resume point is the latest publication")
        super().__init__(config, base_folder=exec_dir, **kwargs)  # base_folder: the exec folder, always
        if not _inside(self.folder, exec_dir):
            raise DispatchError(f"checkpoint.folder {config.folder} is not inside this execution's folder {exec_dir}: "
                                "keep_latest_k could delete another execution's saves (use a relative folder)")

    def _load(self, step: int = -1) -> bool:
        preempt.install_preemption_handler(None)  # deferred: each save() asks stop_requested()
        found = distributed.resume_point(self.root)
        if found is None:
            return super()._load(step)  # this exec folder is new: initial_load_path, or a fresh start
        path, step = found
        if os.path.basename(path) != f"step-{step}" or not os.path.isfile(os.path.join(path, METADATA)):
            raise DispatchError(f"the latest publication names {path} (step {step}), which is not a complete "
                                f"torchtitan save step-{step} with {METADATA}")
        mine, self.folder = self.folder, os.path.dirname(path)
        try:
            return super()._load(step)  # torchtitan's own load of exactly that save
        finally:
            self.folder = mine

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        if preempt.stop_requested():
            self._stop(curr_step)
        if self._published is not None and (self._published.done() or self._should_save(curr_step, last_step)):
            self._wait_published()  # its error raised now; a save due waits for it anyway
        saved = super()._save(curr_step, last_step)
        if saved:
            self._saved = curr_step
            if not (last_step and self.last_save_model_only):
                self._publish_when_done(curr_step)
        return saved

    def _publish_when_done(self, step: int) -> None:
        path = self._create_checkpoint_id(step)
        if self.save_future is None:  # synchronous: DCP returned on every rank after .metadata
            self._publish(path, step)
            return
        done: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._published = done

        def completed(future):
            try:
                future.result()
                self._publish(path, step)
                done.set_result(path)
            except BaseException as e:  # noqa: B036 -- raised in the training thread, at the next save
                done.set_exception(e)

        self.save_future.add_done_callback(completed)

    def _publish(self, path: str, step: int) -> None:
        if not preempt.is_publishing_rank():
            return
        if not os.path.isfile(os.path.join(path, METADATA)):
            raise DispatchError(f"refusing to publish {path}: no {METADATA}, the DCP save did not complete")
        store.publish(path, step, root=self.root, epoch=self.epoch, by="torchtitan")

    def _wait_published(self) -> None:
        """The async save in flight written and published; its error raised here."""
        self.maybe_wait_for_saving()
        done, self._published = self._published, None
        if done is not None:
            try:
                done.result()
            except BaseException as e:  # noqa: B036
                raise DispatchError(f"torchtitan's async save failed or was not published: "
                                    f"{type(e).__name__}: {e}") from e

    def _stop(self, step: int) -> None:
        """The preemption save: the save in flight finished, then ``step`` saved now (whatever
        the interval), synchronously, through torchtitan's own dcp_save; never returns."""
        try:
            self._wait_published()
            path = self._create_checkpoint_id(step)
            if self._saved != step:  # not os.path.exists: the ranks must agree
                self.dcp_save(self._flattened_model_states_sd(), checkpoint_id=path, async_mode=AsyncMode.DISABLED)
        except BaseException as e:  # noqa: B036 -- every rank learns it, exit 1
            preempt.conclude(error=e)
        preempt.conclude((path, step))

    def _close(self) -> None:
        try:
            self._wait_published()  # the last async save published before the process ends
        finally:
            super()._close()
