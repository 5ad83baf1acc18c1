"""Is ``$DISPATCH_EXEC_DIR`` this execution's own folder, where its saves can be published?

Checked when a trainer or a watch starts, so what would refuse every save is refused
before the first step instead of at the first save (``save_steps`` of work lost per
attempt): a folder outside the root, a symlink on the way (an exec folder linked to
node-local storage), another execution's folder, a ``DISPATCH_EPOCH`` changed after
``dispatch-slurm env``.

Node-local exec folders are refused, not supported: a save on one node's local disk
cannot be read by the next execution, which may run on another node, so it could never
be resumed from; and the protocol never follows a symlink under the root (a link
planted there could send a publication's save anywhere). A trainer that stages its
saves on local disk copies each one into the exec folder before it is published."""

from __future__ import annotations

import os

from ..contract import layout
from ..contract.env import Execution
from ..contract.epoch import decompose
from ..errors import DispatchError
from . import epochs
from .links import NODE_LOCAL, symlink_on_the_way
from .publish import owner
from .roots import Root, at, name_of

def _relpath(exec_dir: str, root: str, local: bool) -> str:
    """``exec_dir`` under ``root``: lexically, or (POSIX) through another alias of the root;
    DispatchError when it is neither."""
    root_abs = root.rstrip("/") if not local else os.path.abspath(root).rstrip("/")
    path = exec_dir.rstrip("/") if not local else os.path.abspath(exec_dir)
    if path.startswith(f"{root_abs}/"):
        return path[len(root_abs) + 1:]
    if local:  # named through another alias of the root (e.g. its resolved path): publish takes that too
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
        if rel != "." and not rel.startswith(".."):
            return rel
        if os.path.islink(path):
            raise DispatchError(f"exec folder {exec_dir} is a symlink to {os.readlink(path)}, outside the checkpoint "
                                f"root {root}. {NODE_LOCAL}")
    raise DispatchError(f"exec folder {exec_dir} is not inside the checkpoint root {root}: $DISPATCH_EXEC_DIR must be "
                        f"the folder `dispatch-slurm env` made, {root}/{layout.EXEC}/<attempt>")


def check(exec_dir: str, root: str, epoch: int, attempt: str | None, local: bool = True) -> str:
    """The exec folder's path under the root (``exec/<attempt>``), or DispatchError naming
    what would refuse every save of it, and the fix (``local``: a POSIX root)."""
    rel = _relpath(exec_dir, root, local)
    parts = rel.split("/")
    if len(parts) != 2 or parts[0] != layout.EXEC:
        raise DispatchError(f"exec folder {exec_dir} is not an execution's folder ({root}/{layout.EXEC}/<attempt>): "
                            "$DISPATCH_EXEC_DIR must be the folder `dispatch-slurm env` made")
    if local:
        why = symlink_on_the_way(root, rel)
        if why:
            raise DispatchError(f"exec folder {exec_dir}: {why}")
    decompose(epoch)  # an epoch nothing can be published at fails now, not at the first save
    why = owner(f"{rel}/save", epoch, attempt)
    if why and parts[1] != attempt and attempt:
        raise DispatchError(f"exec folder {exec_dir} belongs to execution {parts[1]}, not to this one "
                            f"($DISPATCH_ATTEMPT={attempt}): use the values `dispatch-slurm env` printed")
    if why:
        raise DispatchError(f"exec folder {exec_dir}: its saves could not be published at epoch {epoch} "
                            f"($DISPATCH_EPOCH): {why.replace('it was', 'they are')}; was $DISPATCH_EPOCH changed "
                            "after `dispatch-slurm env`? Use the values env printed")
    return rel


def check_current(root: Root) -> None:
    """``check`` of this execution's folder when ``root`` is its root (every resume call,
    ``latest --resume``), and its epoch not claimed by another execution (a made-up
    ``DISPATCH_ATTEMPT``), before anything is copied into it or recorded of it."""
    ex = Execution.current()
    name = name_of(root)
    if not (ex.exec_dir and ex.epoch is not None and name == ex.root):
        return
    st = at(root)
    check(ex.exec_dir, st.root, ex.epoch, ex.attempt, local=st.local)
    claimed = epochs.claimant(st, ex.epoch) if ex.attempt else None
    if claimed is not None and claimed != ex.attempt:
        raise DispatchError(f"epoch {ex.epoch} of {root} is claimed by execution {claimed}, not by this one "
                            f"($DISPATCH_ATTEMPT={ex.attempt}): use the values `dispatch-slurm env` printed")


def current(root: str | None = None, epoch: int | None = None) -> tuple[str, str, int]:
    """(root, exec folder, epoch) of this execution (an argument given overrides its
    variable), its exec folder checked (``check``): what a trainer's start hook calls."""
    ex = Execution.current(root=root, epoch=epoch)
    root, exec_dir, epoch = ex.need("root", "exec_dir", "epoch")
    check(exec_dir, root, epoch, ex.attempt, local=at(root).local)
    return root, exec_dir, epoch

