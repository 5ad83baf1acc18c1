"""DeepSpeed (``pip install 'dispatch-slurm[deepspeed]'``): ``engine.save_checkpoint`` into
the exec folder, published once every rank's files are written and durable;
``engine.load_checkpoint`` of the latest publication. Every function is called on every rank.

    from dispatch_slurm import install_preemption_handler, preemption_point
    from dispatch_slurm.integrations import deepspeed as dds
    resumed = dds.load_checkpoint(engine)          # (step, client_state), or None: nothing published
    install_preemption_handler(lambda left: dds.save_checkpoint(engine, publish=False), defer=True)
    for batch in data:
        engine.backward(engine(batch)); engine.step()
        if engine.global_steps % 100 == 0:
            dds.save_checkpoint(engine)             # <exec>/checkpoint-<global_steps>/, then published
        preemption_point()                          # SIGTERM on any rank: every rank saves this step

What DeepSpeed (0.19, read in ``runtime/engine.py``) does with one shared ``save_dir``, and
what changes here:
  * after a save, rank 0 truncates and rewrites ``save_dir/latest`` with the tag (no
    rename, no fsync), and ``load_checkpoint(load_dir)`` without a tag loads whatever it
    names: an old execution still saving after its replacement started moves it back to
    its own lineage. Here ``latest`` is written only inside this execution's folder and
    never read: the resume point is the latest publication, loaded with an explicit tag
    (rank 0 chooses, every rank loads the same).
  * the default tag is ``global_step<N>``: two executions at the same step write the same
    folder. Here the folder is ``<exec folder>/checkpoint-<step>``, one per execution.
  * ``save_checkpoint`` returns on every rank after its last barrier, which follows every
    rank's files and rank 0's ``latest``; each rank then fsyncs what it wrote (on a
    shared filesystem an fsync flushes only the caller's writes), and only after a
    barrier does rank 0 publish. A checkpoint engine that commits later (a decoupled,
    asynchronous one) and node-local storage (a save split across nodes' disks) are
    refused: neither is one complete save when ``save_checkpoint`` returns.
"""

import os

try:
    from deepspeed import DeepSpeedEngine
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"dispatch_slurm.integrations.deepspeed needs deepspeed: "
                      f"pip install 'dispatch-slurm[deepspeed]' ({e})") from e

from .. import store
from ..contract.env import Execution
from ..errors import DispatchError
from ..runtime import distributed
from ..runtime.preempt import is_publishing_rank, needs_whole_steps

WHO = "DeepSpeed's save_checkpoint (dispatch_slurm.integrations.deepspeed)"


def _several() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _refuse_unpublishable(engine: DeepSpeedEngine) -> None:
    engine_kind = getattr(engine, "checkpoint_engine", None)
    if engine_kind is not None and engine_kind.is_decoupled():
        raise DispatchError(f"{type(engine_kind).__name__} commits a save after save_checkpoint returns: "
                            "dispatch-slurm cannot tell when it is complete; use DeepSpeed's default checkpoint engine")
    if engine.use_node_local_storage():
        raise DispatchError("checkpoint.use_node_local_storage splits a save across the nodes' own disks: "
                            "no node holds a complete save to publish; save to the shared checkpoint root")


def save_checkpoint(engine: DeepSpeedEngine, step: int | None = None, *, client_state: dict | None = None,
                    publish: bool = True) -> tuple[str, int]:
    """``engine.save_checkpoint`` of ``step`` (default ``engine.global_steps``) into
    ``<exec folder>/checkpoint-<step>``; published once every rank's part is durable
    (``publish=False``: the caller publishes, e.g. the preemption protocol)."""
    needs_whole_steps(WHO)
    _refuse_unpublishable(engine)
    step = engine.global_steps if step is None else step
    ex = Execution.current()
    root, epoch = ex.need("root", "epoch")
    path = ex.save_path(step)
    engine.save_checkpoint(os.path.dirname(path), tag=os.path.basename(path), client_state=client_state or {})
    if publish:
        if _several():
            store.sync(path, root=root)  # this rank's files, then every rank's before the publication
            dist.barrier()
        if is_publishing_rank():
            store.publish(path, step, root=root, epoch=epoch, by="deepspeed")
    return path, step


def load_checkpoint(engine: DeepSpeedEngine, root: str | None = None, **kwargs) -> tuple[int, dict] | None:
    """``engine.load_checkpoint`` of the latest publication (the same on every rank), with
    ``kwargs`` passed on (``load_optimizer_states``, ...); (its step, the client state), or
    None when nothing is published yet."""
    needs_whole_steps(WHO)
    found = distributed.resume_point(root)
    if found is None:
        return None
    path, step = found
    loaded, client_state = engine.load_checkpoint(os.path.dirname(path), tag=os.path.basename(path), **kwargs)
    if loaded is None:
        raise DispatchError(f"DeepSpeed could not load the latest publication {path} (step {step})")
    return step, client_state
