"""The copy of a save an execution resumes from, on a POSIX root (``Store.hold``).

An older execution may still run while its replacement starts (a requeue or preemption
overlaps them), and its trainer's own rotation (``save_total_limit``) may remove the very
save the replacement chose, between the choice and the load. The replacement loads a copy
in its own folder instead: hard links, so no data is copied and the original's removal
takes nothing from it. It is made under a hidden name and renamed into place, so a copy
is whole or absent and the first of several ranks making it wins; it is taken again
(SaveMoved) when the save's files changed while they were linked."""

from __future__ import annotations

import errno
import os
import secrets
from typing import Optional

from ..contract import layout
from .base import SaveMoved
from .durable import DirFds, ensure_dir, link_tree, open_dir, remove_tree, tree_names, walk_to


def hold(root_fd: int, rel: str, attempt: str, name: str) -> tuple[Optional[str], Optional[str]]:
    """(the copy's path under the root, None), or (None, why none was made: links refused,
    another user's files, EXDEV, ENOSPC...: the caller loads ``rel`` itself)."""
    leaf = rel.rsplit("/", 1)[-1]
    held = f"{layout.EXEC}/{attempt}/{layout.RESUMES}/{name}"
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
    with DirFds() as fds:
        try:
            mine = fds.add(walk_to(f"{layout.EXEC}/{attempt}/-", root_fd))
            res = fds.add(ensure_dir(layout.RESUMES, mine, 0o700)[0])
            if _present(name, res):
                return f"{held}/{leaf}", None  # another rank of this execution made it
            os.mkdir(tmp, 0o700, dir_fd=res)
        except OSError as e:
            return None, f"{held}: {e.strerror}"
        try:
            _link(rel, leaf, root_fd, open_dir(tmp, dir_fd=res), fds)
            _into_place(tmp, name, res)
            return f"{held}/{leaf}", None
        except SaveMoved:
            remove_tree(tmp, res)
            raise SaveMoved(f"{rel} changed while it was linked into {held}") from None
        except OSError as e:
            remove_tree(tmp, res)
            return None, f"{rel} could not be linked into {held}: {e.strerror or e}"


def _link(rel: str, leaf: str, root_fd: int, tmp_fd: int, fds: DirFds) -> None:
    fds.add(tmp_fd)
    try:
        src = fds.add(walk_to(rel, root_fd))
        linked = link_tree(leaf, src, leaf, tmp_fd)
        if tree_names(leaf, src) != linked:  # a name gone while they were linked: a rotation's removal
            raise SaveMoved(rel)
    except FileNotFoundError:
        raise SaveMoved(rel) from None


def _into_place(tmp: str, name: str, dir_fd: int) -> None:
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        remove_tree(tmp, dir_fd)  # another rank's copy is in place


def _present(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
