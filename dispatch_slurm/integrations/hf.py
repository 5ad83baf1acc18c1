"""Hugging Face Trainer integration (``pip install dispatch-slurm[hf]``).

    from dispatch_slurm.integrations.hf import DispatchCallback, output_dir, resume_from_checkpoint
    args = TrainingArguments(output_dir=output_dir(), save_total_limit=2, ...)
    trainer = Trainer(model, args, callbacks=[DispatchCallback()], ...)
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())

What the Trainer does, read in transformers' source (5.x ``Trainer._save_checkpoint``
and ``trainer_utils.rotate_checkpoints``; 4.40+ is the same in substance):
  * ``_maybe_log_save_evaluate`` calls ``_save_checkpoint`` and *then* ``on_save``.
    ``_save_checkpoint`` writes ``<run_dir>/checkpoint-<global_step>/`` (weights,
    optimizer, scheduler, RNG, then ``trainer_state.json``) and, still before
    ``on_save``, rotates. So at ``on_save`` the save is complete and rotation has run.
  * Rotation (``save_total_limit``) lists only ``<run_dir>/checkpoint-*`` and never
    deletes the most recent save (by mtime, or by step when mtimes are too close), so
    it cannot delete the save ``on_save`` is about to publish, nor anything outside
    ``run_dir``. ``run_dir`` is ``args.output_dir`` (``output_dir/run-<id>`` only in a
    hyperparameter search, which this callback does not support: it then refuses, naming
    the missing folder). Hence ``output_dir()`` = the exec folder: rotation stays there.
  * One more deletion: at the end of ``train()``, with ``load_best_model_at_end`` and
    ``save_total_limit=1``, every checkpoint except the best one is deleted, the latest
    published one included. Avoid that combination if a replacement must resume.
  * ``on_save`` runs on every rank; ``trainer_state.json`` and rotation only where
    ``args.should_save``. The callback waits at a barrier (when torch.distributed is
    initialized) so every rank's shards are written, then publishes on world process
    zero only.

SIGTERM (preemption, scancel, the time limit with ``--signal``): the callback installs the
preemption handler at ``on_train_begin`` (deferred: it only notes the signal). At each
``on_step_end`` it asks ``stop_requested()`` (under torchrun/DDP a collective, so every
rank stops at the same step) and, once true, sets ``should_save`` and
``should_training_stop`` (and drops an evaluation due at that step): the Trainer saves
``checkpoint-<step>`` through its own control flow, and at ``on_save`` every rank's save
is made durable, published once, and every rank exits 0 with the sentinel (1 without it
if anything failed).

A signal during an evaluation -- ``eval_strategy``'s, or ``eval_on_start``'s before the
first step (warm-up: nothing else runs a callback there) -- is not left waiting for the
evaluation to end, which can outlast the grace (goodfire-ai/spd#741: 0 of 6 preemption saves
landed). At each ``on_prediction_step`` (one evaluation batch) the callback asks
``stop_requested()`` too and, once true, saves there through the Trainer's own
``_save_checkpoint`` (the weights are the last whole step's: an evaluation changes nothing),
then publishes and exits as above. An evaluation that follows its step's save (an epoch's
evaluation after a periodic save of its last step) stops on that save instead: a published
save is never written again (a SIGKILL during the rewrite would tear it). The Trainer is found as the caller of the callback (the
evaluation loop's ``self``); ``_save_checkpoint`` is a private method, read in 5.x. The handler
is installed at ``on_train_begin``, not when the Trainer is built: a script that builds one
and never trains must still die of SIGTERM, not note it forever.

Training that reaches ``max_steps`` without a stop ends with a ``training_finished`` event
(``on_train_end``, world process zero), so ``dispatch-slurm run`` takes that end for done
however close to the time limit it came.

Outside dispatch (no ``$DISPATCH_CHECKPOINT``/``$DISPATCH_EXEC_DIR``/``$DISPATCH_EPOCH``)
``on_train_begin`` fails at once, naming what is missing, instead of at the first save.
``DispatchCallback(local=True)`` (or ``$DISPATCH_LOCAL=1``) says the run is deliberately
outside dispatch-slurm: the callback then does nothing, ``output_dir()`` is
``$DISPATCH_LOCAL_DIR`` (default ``./dispatch-local-run``) and ``resume_from_checkpoint()``
None, so the same script runs as a plain Trainer run. To try dispatch-slurm itself
without Slurm, use ``eval "$(dispatch-slurm env --local)"`` instead: a real root, real
publications.
"""

import os
import sys
from types import FrameType

try:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"dispatch_slurm.integrations.hf needs transformers: pip install 'dispatch-slurm[hf]' ({e})") from e

from .. import store
from ..contract.env import Execution
from ..errors import DispatchError
from ..runtime import marks, preempt

LOCAL_DIR = "dispatch-local-run"  # output_dir() of a plain run (DISPATCH_LOCAL=1), under the working directory


def output_dir() -> str:
    """This execution's own folder, $DISPATCH_EXEC_DIR: use it as ``output_dir`` so the
    Trainer's rotation can only ever delete this execution's saves. With DISPATCH_LOCAL=1
    and no exec folder (a plain run, dispatch-slurm out of the way): $DISPATCH_LOCAL_DIR,
    by default ./dispatch-local-run (absolute)."""
    ex = Execution.current()
    if not ex.exec_dir and ex.local:
        return os.path.abspath(ex.local_dir or LOCAL_DIR)
    return ex.need("exec_dir")


def resume_from_checkpoint(root: str | None = None) -> str | None:
    """The save to resume from: the latest publication's folder, or None if nothing is
    published yet. A latest publication whose save is gone is an error, never a silent
    fall-back to an older one (that would quietly drop the progress since)."""
    ex = Execution.current(root=root)
    if not ex.root and ex.local:
        return None  # a run outside dispatch-slurm: nothing published to resume from
    return store.resume_path(ex.root)


def _barrier() -> None:
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _calling_trainer():
    """The Trainer whose evaluation loop called this callback (up the stack)."""
    from transformers import Trainer
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Trainer):
            return frame.f_locals["self"]
        frame = frame.f_back
    raise DispatchError("DispatchCallback.on_prediction_step: no Trainer up the stack to save through "
                        "(call it only from a Trainer)")


class DispatchCallback(TrainerCallback):
    """Publish each save as the Trainer finishes it, and save + publish on SIGTERM
    (root, epoch: from the env; ``local=True``: a run outside Slurm, nothing to do)."""

    def __init__(self, root: str | None = None, epoch: int | None = None, sync: bool = True,
                 local: bool | None = None):
        self.root, self.epoch, self.sync = root, epoch, sync
        self.local = Execution.current().local if local is None else local
        self.stopping = False
        self.training = False
        self.saved: int | None = None  # the step of the last save, the same on every rank

    def on_train_begin(self, args, state, control, **kwargs):
        if self.local:
            return
        # at once, not at the first save; root and epoch kept for every publication of this run
        self.root, exec_dir, self.epoch = store.execdir.current(self.root, self.epoch)  # saves it could publish
        out, mine = os.path.realpath(args.output_dir), os.path.realpath(exec_dir)
        if out != mine and not out.startswith(mine + os.sep):
            raise DispatchError(f"output_dir {args.output_dir} is not inside this execution's folder "
                                f"{exec_dir}: the Trainer's rotation could delete another execution's saves")
        preempt.install_preemption_handler(None)  # the Trainer saves (on_step_end -> on_save)
        self.training = True

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False
        if not self.local and not self.stopping and state.max_steps and state.global_step >= state.max_steps \
                and state.is_world_process_zero:
            marks.mark_finished(step=state.global_step)  # the supervisor: done, not a time-limit stop

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.local or not self.training or self.stopping or not preempt.stop_requested():
            return
        self.stopping = True
        if self.saved != state.global_step:  # an evaluation after this step's save: that save, never a second
            trainer = _calling_trainer()
            trainer._save_checkpoint(trainer.model_wrapped, trial=None)  # the one path train() saves through
        self.on_save(args, state, control)  # durable, published once, exit

    def on_step_end(self, args, state, control, **kwargs):
        if not self.local and preempt.stop_requested():
            self.stopping = True
            control.should_save, control.should_training_stop, control.should_evaluate = True, True, False

    def on_save(self, args, state, control, **kwargs):
        if self.local:
            return
        save = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if self.stopping:
            preempt.conclude((save, state.global_step))  # every rank: durable, published once, exit
        _barrier()
        self.saved = state.global_step
        if state.is_world_process_zero:
            store.publish(save, state.global_step, root=self.root, epoch=self.epoch, by="hf", sync=self.sync)
