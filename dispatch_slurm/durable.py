"""fsync discipline in one place (after python-atomicwrites).

A new directory entry is durable only once its *directory* is fsynced; a new
directory only once its parent is. Every helper works on directory file
descriptors opened with O_NOFOLLOW, so a symlink planted inside the root is never
followed and the names we create land exactly where we checked."""

import errno
import os

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_dir(path: str, dir_fd: int | None = None, follow: bool = False) -> int:
    """Open a directory for *at() calls and fsync. `follow=False` refuses a symlink."""
    flags = _DIR_FLAGS | (0 if follow else os.O_NOFOLLOW)
    return os.open(path, flags, dir_fd=dir_fd)


def ensure_dir(name: str, parent_fd: int, mode: int = 0o777) -> tuple[int, bool]:
    """Open `name` under `parent_fd`, creating it if missing; (fd, created).

    A creation is made durable (parent fsynced) before the fd is returned, so a
    crash cannot lose a directory something was already published into."""
    created = False
    try:
        fd = open_dir(name, dir_fd=parent_fd)  # the common case: it exists
    except FileNotFoundError:
        try:
            os.mkdir(name, mode, dir_fd=parent_fd)
            created = True
        except FileExistsError:  # a concurrent creator won; fine
            pass
        fd = open_dir(name, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotADirectoryError(e.errno, f"{name} is a symlink or not a directory") from None
        raise
    if created:
        os.fsync(parent_fd)
    return fd, created


def create_exclusive(name: str, dir_fd: int, mode: int = 0o444) -> None:
    """Create an empty file that must not exist yet (O_CREAT|O_EXCL|O_NOFOLLOW).

    Two writers cannot both succeed; an empty file has no content to be torn."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    os.close(fd)


def fsync_dirs(*fds: int) -> None:
    """fsync directories in the order given (child first, then its parent)."""
    for fd in fds:
        os.fsync(fd)


class DirFds:
    """Close a set of directory fds on exit, whatever happened."""

    def __init__(self):
        self.fds: list[int] = []

    def add(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for fd in reversed(self.fds):
            os.close(fd)
