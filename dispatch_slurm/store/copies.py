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

An execution resumes from a copy in its own folder (``hold``; the view's prepare: ``place``,
under the name its trainer looks for), made from the held links:
clones (reflinks: a write to one lands in that file alone) where the filesystem makes them
(XFS, btrfs, OCFS2, bcachefs, NFS 4.2 over one of those), else hard links to the held,
read-only files (a write fails, for every user but root).

Each copy is made under a hidden name and renamed into place, so it is whole or absent and
the first of several makers wins; a resume copy is taken again (SaveMoved) when the save's
files changed while they were linked."""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Optional

from ..contract import layout, names
from ..errors import BadName
from .base import SaveMoved
from .durable import DirFds, Linker, create_new, ensure_dir, link_tree, open_dir, remove_tree, tree_names, walk_to


def _tmp(name: str) -> str:
    return f".{name}.{os.getpid()}.{os.urandom(4).hex()}"


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


def place(root_fd: int, rel: str, attempt: str, name: str, where: str) -> tuple[Optional[str], Linker]:
    """Make ``exec/<attempt>/<where>`` a copy of the published save ``rel`` (publication
    ``name``), as ``hold`` makes a resume copy (from the held links while they exist: clones,
    else hard links to the read-only files, for root a copy of the data), for a trainer that
    resumes from its own folder (the view): made under a hidden name beside ``where``, then
    renamed (a folder) or linked (a file) into place, never over what is there, so the first
    of several makers wins and a later one changes nothing. (None when it is in place, or why
    none was made; what the Linker made.) SaveMoved when the save changed while it was linked."""
    source, source_leaf = (f"{layout.HELD}/{name}", name) if held_here(name, root_fd) else (rel, rel.rsplit("/", 1)[-1])
    *folders, leaf = where.split("/")
    how = Linker(clone=True)
    with DirFds() as fds:
        try:
            parent = fds.add(walk_to(f"{layout.EXEC}/{attempt}/-", root_fd))
            for part in folders:  # the trainer's own subfolders (Lightning's dirpath): as it would make them
                parent = fds.add(ensure_dir(part, parent)[0])
            if _present(leaf, parent):
                return None, how
        except OSError as e:
            return f"{layout.EXEC}/{attempt}/{where}: {e.strerror or e}", how
        tmp = _tmp(leaf)
        try:
            _link(source, source_leaf, tmp, root_fd, parent, fds, how)
            if not _into_place(tmp, leaf, parent, replace=False):
                remove_tree(tmp, parent)  # another maker's is in place
            return None, how
        except SaveMoved:
            remove_tree(tmp, parent)
            raise SaveMoved(f"{rel} changed while it was linked into {layout.EXEC}/{attempt}/{where}") from None
        except OSError as e:
            remove_tree(tmp, parent)
            return f"{rel} could not be linked into {layout.EXEC}/{attempt}/{where}: {e.strerror or e}", how


def write_new(root_fd: int, rel: str, data: bytes, mode: int = 0o644) -> bool:
    """A real file ``rel`` under the root holding ``data`` (the view's pointer file, its
    record), whole when it appears (written under a hidden name, then linked into place) and
    never over one that is there: whether this call made it. Never through a symlink."""
    folder, _, name = rel.rpartition("/")
    tmp = _tmp(name)
    with DirFds() as fds:
        parent = fds.add(walk_to(f"{folder}/-", root_fd))
        create_new(tmp, parent, data, mode=mode, sync=False)
        try:
            os.link(tmp, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp, dir_fd=parent)


def view_record(pub: Optional[str], placed: Optional[str], pointer: Optional[str], made: dict) -> bytes:
    """What the view's prepare placed in an execution's folder (``layout.VIEW``): the
    publication (None: nothing published), the path it placed it under (relative to the
    folder), the pointer file it wrote: what its publisher must never publish, and what gc
    and the report count as a copy, not a save of the execution's."""
    return (json.dumps({"v": 1, "publication": pub, "placed": placed, "pointer": pointer, "made": made},
                       separators=(",", ":")) + "\n").encode()


def placed_in(data: bytes) -> tuple[Optional[str], Optional[str]]:
    """(the placed path, the pointer file) a ``view_record`` names; (None, None) for none, or
    for a record that does not parse (nothing placed is then taken for a copy)."""
    try:
        rec = json.loads(data)
    except ValueError:
        return None, None
    if not isinstance(rec, dict):
        return None, None
    placed, pointer = rec.get("placed"), rec.get("pointer")
    return placed if isinstance(placed, str) else None, pointer if isinstance(pointer, str) else None


def _link(source: str, source_leaf: str, leaf: str, root_fd: int, tmp_fd: int, fds: DirFds,
          how: Optional[Linker] = None) -> None:
    try:
        src = fds.add(walk_to(source, root_fd))
        linked = link_tree(source_leaf, src, leaf, tmp_fd, how or Linker(clone=True))
        if tree_names(source_leaf, src) != linked:  # a name gone while they were linked: a rotation's removal
            raise SaveMoved(source)
    except FileNotFoundError:
        raise SaveMoved(source) from None


def _into_place(tmp: str, name: str, dir_fd: int, replace: bool = True) -> bool:
    """Rename ``tmp`` to ``name``; False (``tmp`` removed, unless ``replace=False``, which also
    refuses to rename a file over one: it is linked) when another maker's is in place."""
    try:
        if replace or stat.S_ISDIR(os.stat(tmp, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dir_fd)
        return True
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if replace:
            remove_tree(tmp, dir_fd)  # another maker's copy is in place
        return False


def _present(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
