"""How the POSIX store reads what gc and the report see of exec/: an exec folder's times
and entries, a save's size, never following a symlink (the inventory's, store/inventory.py)."""

from __future__ import annotations

import errno
import os
import shlex
from typing import Optional

from ..contract import layout
from ..errors import StoreError
from . import copies, inventory
from .durable import in_the_way, open_dir, times, usage, walk
from .inventory import Save


def folder(fd: int) -> inventory.Folder:
    """An exec folder as the inventory sees it; the copies it resumed from (its resume copies,
    what the view placed there) are no write of it."""
    entries: dict[str, bool] = {}
    placed = _placed(fd)
    first, last, newest = times(fd, entries, unwritten=(layout.RESUMES, layout.VIEW, *placed))
    return inventory.Folder(first, last, newest if newest is not None else os.fstat(fd).st_mtime, entries,
                            set(placed))


def _placed(fd: int) -> tuple[str, ...]:
    """The top-level entries the view's prepare placed in the exec folder (its record names them)."""
    try:
        rfd = os.open(layout.VIEW, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return ()
    try:
        placed, pointer = copies.placed_in(os.read(rfd, 1 << 16))
    finally:
        os.close(rfd)
    return tuple(p for p in (placed, pointer) if p is not None and "/" not in p)  # the inventory sees the top level


def folders(exec_fd: Optional[int], where: str) -> dict[str, inventory.Folder]:
    """Every real folder under exec/ (``exec_fd``; ``where`` its path, for errors); a symlink or
    a file there is nobody's."""
    out: dict[str, inventory.Folder] = {}
    for attempt in sorted(os.listdir(exec_fd)) if exec_fd is not None else []:
        try:
            fd = open_dir(attempt, dir_fd=exec_fd)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                continue  # gone meanwhile (another gc), or not a folder (a file, a symlink)
            raise _unreadable(f"{where}/{attempt}", where, e) from None
        try:
            out[attempt] = folder(fd)
        except OSError as e:
            raise _unreadable(f"{where}/{attempt}", where, e) from None
        finally:
            os.close(fd)
    return out


def _unreadable(path: str, where: str, e: OSError) -> StoreError:
    """An exec folder gc, ls and the report cannot look into: an error, never skipped (its
    saves could be kept or removed only by a gc that sees them)."""
    return StoreError(f"{path} cannot be read ({e.strerror}{f': {e.filename}' if e.filename else ''}): what "
                      "it holds cannot be told, and it is never skipped; make it readable by this user "
                      f"(chmod -R u+rwX {shlex.quote(path)}) or move it out of {where}/")


def measure(save: Save, root_fd: int, seen: set[tuple[int, int]] | None = None) -> None:
    """The save's size and whether it exists (its own path, else its publication's held links),
    or why it cannot be touched (a symlink in the way); ``seen``: hard-linked files already
    counted (usage)."""
    _measure(save, save.path, root_fd, seen)
    if not save.exists and save.held:
        save.held_only = True
        _measure(save, save.location, root_fd, seen)
        save.held_only = save.exists
    elif save.exists:  # the held links' folders are its too (their files are its files)
        for name in save.held:
            try:
                save.size += os.stat(f"{layout.HELD}/{name}", dir_fd=root_fd, follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                pass


def _measure(save: Save, path: str, root_fd: int, seen: set[tuple[int, int]] | None) -> None:
    try:
        parent = walk(path, root_fd)
    except FileNotFoundError:
        return
    except OSError as e:
        if in_the_way(e):
            save.problem = "a component of its path is a symlink or not a folder: never followed"
            return
        raise
    try:
        save.size = usage(path.rsplit("/", 1)[-1], parent[-1], seen)
        save.exists = True
    except FileNotFoundError:
        pass
    finally:
        for fd in parent[1:]:
            os.close(fd)
