"""A save that is complete before its name appears, for a trainer that writes its own.

    import torch
    from dispatch_slurm import saving
    with saving(step) as d:                       # d: a folder of this execution's own
        torch.save(model.state_dict(), d / "model.pt")
        torch.save(opt.state_dict(), d / "optimizer.pt")
    # here <exec folder>/checkpoint-<step> exists, whole and durable; watch publishes it

Why: ``watch`` publishes a save once it looks complete, and a hand-written trainer's
write order decides when that is: a marker written before the weights publishes a torn
save, no marker publishes nothing. Here the save is written under a name no save pattern
matches (``.checkpoint-<step>.saving-<pid>``, inside the exec folder, so on the same
filesystem), every file and folder of it fsynced, the marker ``.dispatch-complete``
written and fsynced, and only then renamed to ``checkpoint-<step>`` and the exec folder
fsynced (python-atomicwrites' recipe). The rename is the execution's own business in
its own folder, not part of the publication protocol, which stays rename-free: a save is
published by its O_EXCL entry in ``pub/``, as always. A crash before the rename leaves
only the hidden folder, which nothing takes for a save; an exception in the block
removes it. ``publish=True`` publishes the save at once (on the calling process: one
process, usually rank 0, saves with this helper).
"""

from __future__ import annotations

import os
import pathlib
import secrets
from contextlib import contextmanager
from typing import Iterator

from ..contract import names
from ..contract.env import Execution
from ..errors import DispatchError
from .durable import open_dir, remove_tree, sync_tree
from .publish import publish as publish_save
from .roots import at


def _drop(folder: str, name: str) -> None:
    """Remove an unfinished save (never through a symlink); the caller's error is the one to see."""
    try:
        parent = open_dir(folder)
        try:
            remove_tree(name, parent)
        finally:
            os.close(parent)
    except OSError:
        pass


@contextmanager
def saving(step: int, *, publish: bool = False, exec_dir: str | None = None) -> Iterator[pathlib.Path]:
    """A folder to write the save of ``step`` into; on leaving the block without an
    exception it becomes ``<exec folder>/checkpoint-<step>``, whole and durable (and
    published, with ``publish=True``). A step saved already is refused before the block
    runs: a save, once named, is never rewritten (it may be published)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise DispatchError(f"saving(step={step!r}): the step must be an int >= 0")
    ex = Execution.current(exec_dir=exec_dir)
    folder = ex.need("exec_dir")
    if ex.root and not at(ex.root).local:
        raise DispatchError(f"saving() writes a folder on a POSIX filesystem, not under {ex.root}: on an S3 root "
                            "write the save's objects, then a marker object last (watch --marker NAME)")
    final = os.path.join(folder, f"checkpoint-{step}")
    if os.path.lexists(final):
        raise DispatchError(f"{final} exists already: a save is never rewritten (it may be published); save each "
                            "step once, e.g. skip the save when the step was just saved")
    tmp = os.path.join(folder, names.saving_name(step, os.getpid(), secrets.token_hex(4)))
    os.mkdir(tmp, 0o700)
    try:
        yield pathlib.Path(tmp)
        with open(os.path.join(tmp, names.COMPLETE_MARKER), "x") as f:
            f.write(f"{step}\n")
        parent = open_dir(folder)
        try:
            sync_tree(os.path.basename(tmp), parent)  # every file, every folder, the marker, then the exec folder
            if os.path.lexists(final):
                raise DispatchError(f"{final} appeared while step {step} was being saved (another process saves the "
                                    "same step?): left as it is; this save is dropped")
            os.rename(tmp, final)
            os.fsync(parent)
        finally:
            os.close(parent)
    except BaseException:
        _drop(folder, os.path.basename(tmp))
        raise
    if publish:
        publish_save(final, step, by="saving", sync=False)  # durable already; each file checked whole
