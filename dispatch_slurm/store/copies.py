"""The copies of a published save on a POSIX root: the publication's own (``held/``) and the one
an execution resumes from (``exec/<attempt>/dispatch-resume/``). Neither copies data.

A publication names a save in its execution's folder, where nothing but that execution's
trainer writes, and where its own rotation (``save_total_limit``, ``keep_latest_k``) or an
``rm`` in its job script removes saves it no longer wants, published or not. So when it
publishes, the publication takes its own hard links to the save's files (``held/<name>``)
and drops their write bits: the latest publication then names a whole save whatever the
trainer removes afterwards, and a write into a published file (a trainer saving again where
it saved, ``torch.save`` to the path it resumed from) fails instead of changing what every
later execution loads. gc removes the held links with the save; an execution's older held
links go when it publishes a newer save (``release``): the trainer's own rotation keeps
deciding what its folder holds, and only the newest publication of each epoch is held.

An execution resumes from a copy in its own folder (``hold``), made from the held links:
clones (reflinks: a write to one lands in that file alone) where the filesystem makes them
(XFS, btrfs, OCFS2, bcachefs, NFS 4.2 over one of those), else hard links to the held,
read-only files (a write fails, for every user but root).

Each copy is made under a hidden name and renamed into place, so it is whole or absent and
the first of several makers wins; a resume copy is taken again (SaveMoved) when the save's
files changed while they were linked."""

from __future__ import annotations

import errno
import os
import secrets
from typing import Optional

from ..contract import layout, names
from ..errors import BadName
from .base import SaveMoved
from .durable import DirFds, Linker, ensure_dir, link_tree, open_dir, remove_tree, tree_names, walk_to


def _tmp(name: str) -> str:
    return f".{name}.{os.getpid()}.{secrets.token_hex(4)}"


def held_here(name: str, root_fd: int) -> bool:
    """Whether ``held/<name>`` exists."""
    try:
        os.stat(f"{layout.HELD}/{name}", dir_fd=root_fd, follow_symlinks=False)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False


def keep(root_fd: int, rel: str, name: str) -> tuple[Optional[str], list[str]]:
    """Make ``held/<name>`` the publication's own links to the save ``rel``, its files made
    read-only, durable on return: (why none was made, or None; the files whose write bits
    stay, another user's). A save that changed while it was linked raises SaveMoved."""
    leaf = rel.rsplit("/", 1)[-1]
    how = Linker(protect=True, sync=True)
    with DirFds() as fds:
        try:
            held, made = ensure_dir(layout.HELD, root_fd, 0o700)
            fds.add(held)
            if made:
                os.fsync(root_fd)
            if _present(name, held):
                return None, []
            src = fds.add(walk_to(rel, root_fd))
        except FileNotFoundError:
            raise SaveMoved(rel) from None
        except OSError as e:
            return f"{layout.HELD}/{name}: {e.strerror}", []
        tmp = _tmp(name)
        try:
            link_tree(leaf, src, tmp, held, how)  # a file removed before it was linked: FileNotFoundError
            _into_place(tmp, name, held)
            os.fsync(held)
        except (SaveMoved, FileNotFoundError):
            remove_tree(tmp, held)
            raise SaveMoved(f"{rel} changed while it was linked into {layout.HELD}/") from None
        except OSError as e:
            remove_tree(tmp, held)
            if e.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOSPC, errno.EDQUOT, errno.EOPNOTSUPP):
                return f"{rel} could not be linked into {layout.HELD}/: {e.strerror}", []
            raise
    return None, how.unprotected


def release(root_fd: int, epoch: int, step: int) -> None:
    """Drop the held links of the publications at ``epoch`` below ``step``: superseded by this
    newer save of the same execution, none of them can be the latest again but by a person's
    ``retire``. Hidden entries are links still being made (or a killed publisher's, gc's once
    its execution ceased): never touched here."""
    try:
        held = open_dir(layout.HELD, dir_fd=root_fd)
    except FileNotFoundError:
        return
    try:
        for entry in os.listdir(held):
            if entry.startswith("."):
                continue
            try:
                pub = names.parse(entry)
            except BadName:
                continue  # not a publication's: left for a person to see
            if pub.epoch == epoch and pub.step < step:
                remove_tree(entry, held)
    finally:
        os.close(held)


def hold(root_fd: int, rel: str, attempt: str, name: str) -> tuple[Optional[str], Optional[str]]:
    """(the resume copy's path under the root, None), or (None, why none was made: links
    refused, another user's files, EXDEV, ENOSPC...: the caller loads the save itself)."""
    leaf = rel.rsplit("/", 1)[-1]
    copy = f"{layout.EXEC}/{attempt}/{layout.RESUMES}/{name}"
    source, source_leaf = (f"{layout.HELD}/{name}", name) if held_here(name, root_fd) else (rel, leaf)
    tmp = _tmp(name)
    with DirFds() as fds:
        try:
            mine = fds.add(walk_to(f"{layout.EXEC}/{attempt}/-", root_fd))
            res = fds.add(ensure_dir(layout.RESUMES, mine, 0o700)[0])
            if _present(name, res):
                return f"{copy}/{leaf}", None  # another rank of this execution made it
            os.mkdir(tmp, 0o700, dir_fd=res)
        except OSError as e:
            return None, f"{copy}: {e.strerror}"
        try:
            _link(source, source_leaf, leaf, root_fd, fds.add(open_dir(tmp, dir_fd=res)), fds)
            _into_place(tmp, name, res)
            return f"{copy}/{leaf}", None
        except SaveMoved:
            remove_tree(tmp, res)
            raise SaveMoved(f"{rel} changed while it was linked into {copy}") from None
        except OSError as e:
            remove_tree(tmp, res)
            return None, f"{rel} could not be linked into {copy}: {e.strerror or e}"


def _link(source: str, source_leaf: str, leaf: str, root_fd: int, tmp_fd: int, fds: DirFds) -> None:
    try:
        src = fds.add(walk_to(source, root_fd))
        linked = link_tree(source_leaf, src, leaf, tmp_fd, Linker(clone=True))
        if tree_names(source_leaf, src) != linked:  # a name gone while they were linked: a rotation's removal
            raise SaveMoved(source)
    except FileNotFoundError:
        raise SaveMoved(source) from None


def _into_place(tmp: str, name: str, dir_fd: int) -> None:
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        remove_tree(tmp, dir_fd)  # another maker's copy is in place


def _present(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
