"""What each execution left under the root: its exec folder's saves and times, and the
Epilog's cessation entries. Read-only, never following a symlink."""

from __future__ import annotations

import os
import stat

from ..contract import layout, names
from ..errors import BadPath
from ..store import s3
from ..store.durable import DirFds, open_dir
from ..store.posix import open_entry, open_root
from ..store.roots import is_s3


def _walk_times(fd: int) -> tuple[float | None, float | None]:
    """(oldest, newest) mtime of everything under the folder fd (symlinks not followed)."""
    first = last = None
    for name in os.listdir(fd):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        times = [st.st_mtime]
        if stat.S_ISDIR(st.st_mode):
            sub = open_dir(name, dir_fd=fd)
            try:
                times += [t for t in _walk_times(sub) if t is not None]
            finally:
                os.close(sub)
        first = min([first, *times]) if first is not None else min(times)
        last = max([last, *times]) if last is not None else max(times)
    return first, last


def _saves(fd: int) -> list[dict]:
    return _steps(os.listdir(fd))


def _steps(entries) -> list[dict]:
    out = []
    for name in sorted(entries):
        try:
            step = names.step_of(name)
        except BadPath:
            continue
        out.append({"step": step, "name": name})
    return sorted(out, key=lambda s: s["step"])


def _s3_folders(root: str) -> dict[str, dict]:
    """exec_folders on an S3 root: one listing of exec/ (LastModified for mtimes; the
    saves are the names one level under each attempt) and one of ceased/."""
    out: dict[str, dict] = {}
    for name, obj in s3.walk(root, layout.EXEC):
        attempt, _, rest = name.partition("/")
        if not rest:
            continue  # an object right under exec/: not an execution's folder
        info = out.setdefault(attempt, {"first": None, "last": None, "saves": set(), "ceased": []})
        t = obj["LastModified"].timestamp()
        info["first"], info["last"] = min(info["first"] or t, t), max(info["last"] or t, t)
        info["saves"].add(rest.split("/", 1)[0])
    for info in out.values():
        info["saves"] = _steps(info["saves"])
    for entry in s3.list_names(root, layout.CEASED):
        for attempt, info in out.items():
            if entry.startswith(attempt + "."):
                info["ceased"].append(entry[len(attempt) + 1:])
    return out


def exec_folders(root: str) -> dict[str, dict]:
    """attempt -> {first, last (mtimes), saves [{step, name}], ceased [nodes]}."""
    if is_s3(root):
        return _s3_folders(root)
    out: dict[str, dict] = {}
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        exec_fd = open_entry(root, root_fd, layout.EXEC)
        for attempt in sorted(os.listdir(exec_fd)) if exec_fd is not None else []:
            try:
                fd = open_dir(attempt, dir_fd=exec_fd)
            except OSError:
                continue  # not a folder (or a symlink): not an execution's
            try:
                first, last = _walk_times(fd)
                out[attempt] = {"first": first, "last": last, "saves": _saves(fd), "ceased": []}
            finally:
                os.close(fd)
        if exec_fd is not None:
            os.close(exec_fd)
        ceased_fd = open_entry(root, root_fd, layout.CEASED)
        for entry in os.listdir(ceased_fd) if ceased_fd is not None else []:
            for attempt, info in out.items():
                if entry.startswith(attempt + "."):
                    info["ceased"].append(entry[len(attempt) + 1:])
        if ceased_fd is not None:
            os.close(ceased_fd)
    return out
