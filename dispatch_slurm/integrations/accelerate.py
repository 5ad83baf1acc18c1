"""Hugging Face accelerate: ``save_state``/``load_state`` in the exec folder, published.
Every function is called on every process.

    from dispatch_slurm import install_preemption_handler, mark_finished, preemption_point
    from dispatch_slurm.integrations import accelerate as da
    step = da.load_state(accelerator) or 0        # the latest publication, or None
    install_preemption_handler(lambda left: da.save_state(accelerator, step, publish=False), defer=True)
    for ...:
        ...; step += 1
        if step % 100 == 0:
            da.save_state(accelerator, step)     # <exec>/checkpoint-<step>/, then published
        preemption_point()                       # SIGTERM on any rank: every rank saves this step
    if accelerator.is_main_process:
        mark_finished()                          # the loop reached its end: `run` takes it for done

``accelerator.save_state`` writes the model and optimizer on the main process and each
process's RNG state on that process; every process then waits for the others, and only
then does the main process publish. On SIGTERM the preemption protocol does the same
(every rank's part fsynced, one publication); on a step just saved, it is that save,
never written again. Resume: the main process reads the latest
publication and broadcasts it, so every process loads the same save.
"""

import os

try:
    from accelerate.utils import broadcast_object_list
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"dispatch_slurm.integrations.accelerate needs accelerate: "
                      f"pip install 'dispatch-slurm[hf]' ({e})") from e

from .. import store
from ..store import once
from ..contract.env import Execution
from ..errors import DispatchError
from ..runtime.preempt import needs_whole_steps

WHO = "accelerate's save_state (dispatch_slurm.integrations.accelerate)"


def save_state(accelerator, step: int, *, publish: bool = True) -> tuple[str, int]:
    """``accelerator.save_state`` into ``<exec folder>/checkpoint-<step>``, published once every
    process wrote its part (``publish=False``: the caller publishes, e.g. a preemption). A step
    this process already saved or that is published is that save: never written again (a
    preemption on a periodic-save step returns the periodic save, store/once.py)."""
    needs_whole_steps(WHO)
    path = Execution.current().save_path(step)
    try:
        k = once.claim(path)
    except once.AlreadySaved as e:
        k = None
        if publish:  # a periodic save of a step saved already (a preemption's is expected)
            once.skipped(e)
    if k is not None:
        try:
            accelerator.save_state(path)
            accelerator.wait_for_everyone()
        except BaseException:
            once.release(k, ok=False)
            raise
        once.release(k)
    if publish and accelerator.is_main_process and once.state(path) != "published":
        store.publish(path, step, by="accelerate")
    return path, step


def load_state(accelerator, root: str | None = None) -> int | None:
    """``accelerator.load_state`` of the latest publication (the same on every process);
    its step, or None when nothing is published yet."""
    needs_whole_steps(WHO)
    found: list[tuple[str, int] | None] = [None]
    if accelerator.is_main_process:
        found[0] = store.resume_point(root)  # a vanished save is an error, never None
    if accelerator.num_processes > 1:
        broadcast_object_list(found)
    if found[0] is None:
        return None
    path, step = found[0]
    if not os.path.isdir(path):
        raise DispatchError(f"the latest publication names {path}, which no longer exists")
    accelerator.load_state(path)
    return step
