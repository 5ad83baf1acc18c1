"""The execution's folder made, ``<root>/exec/<attempt>/``: as the job user, never through a
symlink (the store's ``make_exec_dir``; execdir.py checks one that exists)."""

from __future__ import annotations

import os
import stat

from ..contract import layout
from ..errors import BadPath, StoreError
from .durable import DirFds, check_owner, ensure_dir, open_root
from .links import symlink_on_the_way


def make(root: str, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
    """Create <root>/exec/<attempt>/ (mode 0700 unless a site sets a group mode); its path.

    Runs as the job user. exec/ and the attempt folder are opened with O_NOFOLLOW:
    a symlink planted there is refused, never followed. An existing attempt folder
    is fine (several steps of one execution) if it is a real directory we own."""
    path = f"{root}/{layout.exec_relpath(attempt)}"
    with DirFds() as fds:
        try:
            if create_root:
                parent, leaf = os.path.split(root)
                parent_fd = fds.add(open_root(parent))
                check_owner(parent, parent_fd)
                root_fd = fds.add(ensure_dir(leaf, parent_fd)[0])
            else:
                root_fd = fds.add(open_root(root))
            check_owner(root, root_fd)
            exec_fd = fds.add(ensure_dir(layout.EXEC, root_fd)[0])
            att_fd = fds.add(ensure_dir(attempt, exec_fd, mode)[0])
        except NotADirectoryError:
            why = symlink_on_the_way(root, layout.exec_relpath(attempt)) or f"{path}: not a folder"
            raise BadPath(f"{why}; refusing to follow it") from None
        except PermissionError:
            raise StoreError(f"{path}: permission denied") from None
        st = os.fstat(att_fd)
        if st.st_uid != os.geteuid():
            raise BadPath(f"{path} exists and belongs to uid {st.st_uid}, not to this user")
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(att_fd, mode)  # umask may have removed bits a group mode asks for
    return path
