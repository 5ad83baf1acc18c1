"""Lightning integration (``pip install 'dispatch-slurm[lightning]'``).

    from dispatch_slurm.integrations import lightning as dl
    trainer = L.Trainer(callbacks=[dl.DispatchCheckpoint(every_n_train_steps=100)],
                        plugins=dl.plugins(), default_root_dir=dl.output_dir(), ...)
    trainer.fit(model, ckpt_path=dl.resume_path())          # None: nothing published yet

What it replaces in Lightning (2.x, read in its source), and why:
  * ``SLURMEnvironment(auto_requeue=True)`` traps SIGUSR1, saves ``hpc_ckpt_<N>.ckpt`` in
    ``default_root_dir`` and runs ``scontrol requeue`` (absent in many containers, #21404);
    ``fit(ckpt_path=None)`` then resumes from the highest ``hpc_ckpt_<N>`` in that folder,
    whoever wrote it (two jobs sharing a folder resume each other's, #12369). ``plugins()``
    turns auto-requeue off; requeue is Slurm's (``--requeue``, a REQUEUE partition) or
    ``dispatch-slurm run``'s, and the resume point is the latest publication.
  * Lightning's SIGTERM handler broadcasts from inside the signal handler and raises
    ``SIGTERMException`` at the next batch without saving; a signal on one rank only
    leaves the ranks in mismatched collectives. ``DispatchCheckpoint`` installs the
    preemption handler over it at ``on_train_start`` (after Lightning registered its
    own), asks ``stop_requested()`` at every ``on_train_batch_end`` (a collective: every
    rank stops at the same batch), then ``trainer.save_checkpoint`` (every rank: the
    strategy writes and barriers) and ``conclude``: durable, published once, exit 0.
  * ``DispatchCheckpoint`` is a ``ModelCheckpoint`` writing ``checkpoint-<step>.ckpt`` into
    the exec folder and publishing each save once Lightning's save (and its barrier)
    returned. Lightning's "Checkpoint directory ... exists and is not empty" is kept only
    for a folder that already holds a checkpoint file: the exec folder is this execution's
    own, and its handler's probe records (``dispatch-probe/``) and logs are no reason. ``save_last`` is refused: ``last.ckpt`` is rewritten in place, and a
    publication's save is never rewritten. Rotation (``save_top_k``) stays in the exec
    folder.
  * A signal during validation -- ``val_check_interval``'s, or the sanity check's before the
    first step (warm-up) -- saves at the next validation batch (``on_validation_batch_end``),
    not after the whole validation: the weights are the last whole step's. The handler is
    installed at ``on_sanity_check_start`` too (after Lightning's own, before any batch).
    A signal while a batch is being loaded is acted on when that batch ends.
A fit that ends by itself (max_steps, max_epochs, early stopping) ends with a
``training_finished`` event (``on_train_end``, global zero): ``dispatch-slurm run`` takes it
for done.
Resume: every rank calls ``resume_path()`` before ``fit`` (torch.distributed is not up yet);
at ``setup`` the ranks compare their choices and refuse to train on different saves (an
overlapping execution publishing in between), instead of silently diverging.
"""

import os
import sys
import warnings

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.environments import SLURMEnvironment
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"dispatch_slurm.integrations.lightning needs lightning: "
                      f"pip install 'dispatch-slurm[lightning]' ({e})") from e

from .. import store
from ..store import events
from ..contract.env import Execution
from ..errors import DispatchError
from ..runtime import distributed, marks, preempt

_chosen: list = []  # what resume_path() returned in this process, checked across ranks at setup


def output_dir() -> str:
    """$DISPATCH_EXEC_DIR: use it as ``default_root_dir`` (logs, any hpc_ckpt) and for saves."""
    return Execution.current().need("exec_dir")


def plugins() -> list:
    """``[SLURMEnvironment(auto_requeue=False)]`` inside Slurm (no SIGUSR1 trap, no scontrol), else []."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def resume_path(root: str | None = None) -> str | None:
    """The latest publication's checkpoint file, or None if nothing is published yet."""
    path = store.resume_path(root)
    _chosen[:] = [path]
    return path


AUTO_REQUEUE = ("Lightning's SLURMEnvironment(auto_requeue=True) is active: on SIGUSR1 it saves hpc_ckpt_<N>.ckpt into "
                "this execution's folder, which no execution reads (the next one has a new, empty folder, and "
                "nothing publishes that file), and runs `scontrol requeue`; the next execution resumes from "
                "DispatchCheckpoint's save on the requeue's SIGTERM only if that save ends within Slurm's KillWait, "
                "else from the last publication (step 0 if none). Pass plugins=dl.plugins() (auto_requeue=False) "
                "with #SBATCH --signal=TERM@<seconds> (nothing traps USR1 then): DispatchCheckpoint saves and "
                "publishes on SIGTERM, and requeue is Slurm's (--requeue) or dispatch-slurm run's")


def _warn_auto_requeue(trainer) -> None:
    """Say it (stderr, a ``warning`` event) when Lightning's own requeue is on under this
    callback: the cluster environment the Trainer registers its signal handlers from
    (``_accelerator_connector.cluster_environment``, read in Lightning 2.x's signal connector)."""
    env = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
    if isinstance(env, SLURMEnvironment) and env.auto_requeue and trainer.is_global_zero:
        print(f"dispatch-slurm: warning: {AUTO_REQUEUE}", file=sys.stderr, flush=True)
        events.record("warning", kind="lightning_auto_requeue", by="lightning", message=AUTO_REQUEUE)


class DispatchCheckpoint(ModelCheckpoint):
    """ModelCheckpoint into the exec folder, each save published; save + publish on SIGTERM."""

    def __init__(self, **kwargs):
        if kwargs.get("save_last"):
            raise DispatchError("DispatchCheckpoint(save_last=...) is refused: last.ckpt is rewritten in place, "
                                "a published save never is; the latest publication is the last save")
        kwargs.setdefault("dirpath", output_dir())
        kwargs.setdefault("filename", "checkpoint-{step}")
        kwargs.setdefault("auto_insert_metric_name", False)
        super().__init__(**kwargs)
        self._saved = None  # the step of the last save, the same on every rank
        store.execdir.current()  # an exec folder none of whose saves could be published: refused now
        mine, out = os.path.realpath(output_dir()), os.path.realpath(self._dir)
        if out != mine and not out.startswith(mine + os.sep):
            raise DispatchError(f"dirpath {self._dir} is not inside this execution's folder {mine}: "
                                "its rotation could delete another execution's saves")

    @property
    def _dir(self) -> str:
        """``dirpath``, which ModelCheckpoint types as optional: __init__ always sets it."""
        assert self.dirpath is not None
        return os.fspath(self.dirpath)

    def setup(self, trainer, pl_module, stage):
        with warnings.catch_warnings():
            if not self._holds_checkpoints():  # the folder is this execution's: its probes, its logs
                warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)
        _warn_auto_requeue(trainer)
        if _chosen and distributed.rank() is not None:
            import torch.distributed as dist
            choices = [None] * dist.get_world_size()
            dist.all_gather_object(choices, _chosen[0])
            if len(set(choices)) > 1:
                raise DispatchError(f"the ranks chose different saves to resume from ({sorted(set(map(str, choices)))}): "
                                    "an overlapping execution published while this one started; start it again")

    def _holds_checkpoints(self) -> bool:
        """Whether the folder already holds a checkpoint file, which Lightning's "exists and
        is not empty" warning is about (anything else there is this execution's own)."""
        try:
            return any(n.endswith(self.FILE_EXTENSION) for n in os.listdir(self._dir))
        except OSError:
            return False

    def on_train_start(self, trainer, pl_module):
        preempt.install_preemption_handler(None)  # over Lightning's SIGTERM handler

    def on_sanity_check_start(self, trainer, pl_module):
        preempt.install_preemption_handler(None)  # the sanity check is a validation before any step

    def on_train_end(self, trainer, pl_module):
        super().on_train_end(trainer, pl_module)
        if trainer.is_global_zero:  # a stop never gets here: _stop exits in conclude
            marks.mark_finished(step=trainer.global_step)  # fit ended by itself: done, not a time-limit stop

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if preempt.stop_requested():
            self._stop(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.state.fn == "fit" and preempt.stop_requested():
            self._stop(trainer)

    def _stop(self, trainer) -> None:
        path = os.path.join(self._dir, f"checkpoint-{trainer.global_step}{self.FILE_EXTENSION}")
        if self._saved != trainer.global_step:  # not os.path.exists: ranks must agree
            trainer.save_checkpoint(path)
        preempt.conclude((path, trainer.global_step))

    def _save_checkpoint(self, trainer: "pl.Trainer", filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)  # written and, several ranks, past the barrier
        self._saved = trainer.global_step
        if trainer.is_global_zero:
            store.publish(filepath, trainer.global_step, by="lightning")

