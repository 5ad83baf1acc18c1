"""Why a path below a root is not a real folder: the one explanation, for the exec folder
``env`` makes (posix.py) and the one a trainer or a watch starts in (execdir.py).

The protocol never follows a symlink below the root; the usual one is an exec folder
linked to node-local storage, which no later execution, possibly on another node, could
read its saves from. The message says so and how to stage a save instead."""

from __future__ import annotations

import os
import stat

NODE_LOCAL = ("dispatch-slurm refuses an exec folder on node-local storage: the next execution, possibly on "
              "another node, could not read its saves, so none could be resumed from. Save into the real folder "
              "under the root on the shared filesystem (remove the link; `dispatch-slurm env` creates the folder "
              "again), and copy a save staged on local disk into it before it is published")


def symlink_on_the_way(root: str, rel: str) -> str | None:
    """Why a component of ``root``/``rel`` (below the root) is not a real folder: a symlink
    (named with its target), a file, or missing; None when every one is a real folder."""
    path = root.rstrip("/") or "/"
    for part in rel.split("/"):
        path = f"{path}/{part}"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return f"{path} does not exist (`dispatch-slurm env` creates the exec folder)"
        except OSError as e:
            return f"{path}: {e.strerror}"
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            real = os.path.realpath(path)
            where = "" if _inside(real, root) else ", outside the checkpoint root"
            return f"{path} is a symlink to {target}{where}. {NODE_LOCAL}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a folder"
    return None


def _inside(path: str, root: str) -> bool:
    rel = os.path.relpath(path, os.path.realpath(root))
    return not (rel == ".." or rel.startswith("../"))
