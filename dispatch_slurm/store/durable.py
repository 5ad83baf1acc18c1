"""fsync discipline in one place (after python-atomicwrites).

A new directory entry is durable only once its *directory* is fsynced; a new
directory only once its parent is. Every write under a checkpoint root goes through
these helpers: they work on directory file descriptors opened with O_NOFOLLOW, so a
symlink planted inside the root is never followed and the names created land exactly
where they were checked. One opener of the root and its protocol folders (``open_root``,
``open_entry``: their errors say what is in the way), one create-new (``create_new``), one
append-and-sync (``append``), one save sync (``sync_tree``), all ending in ``_sync_directory``."""

import errno
import fcntl
import os
import stat
from typing import Callable, Optional, cast

from ..errors import StoreError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def _named(e: OSError, name: str, dir_fd: int | None) -> OSError:
    """An OSError about ``name`` under ``dir_fd`` completed with its full path (the folder's,
    from /proc/self/fd), so "read-only file system" says where: the same exception,
    only its filename completed. A plain function, not a context manager: it is on the
    path of every publication, and a ``with`` costs more than the open it wraps."""
    if dir_fd is not None and e.filename == name and not os.path.isabs(name):
        try:
            e.filename = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)
        except OSError:
            pass
    return e


def _sync_directory(fd: int) -> None:
    """Make the directory's entries durable: the one fsync of a directory."""
    os.fsync(fd)


def open_dir(path: str, dir_fd: int | None = None, follow: bool = False) -> int:
    """Open a directory for *at() calls and fsync. ``follow=False`` refuses a symlink."""
    flags = _DIR_FLAGS | (0 if follow else os.O_NOFOLLOW)
    return os.open(path, flags, dir_fd=dir_fd)


def open_root(root: str) -> int:
    """The root may itself be a symlink (sites alias scratch); it must exist: a
    missing root is a typo or an unmounted filesystem, never something to create."""
    try:
        return open_dir(root, follow=True)
    except FileNotFoundError:
        raise StoreError(f"checkpoint root {root} does not exist (create it first)") from None
    except NotADirectoryError:
        raise StoreError(f"checkpoint root {root} is not a directory") from None
    except PermissionError:
        raise StoreError(f"checkpoint root {root}: permission denied") from None


def check_owner(root: str, fd: int) -> None:
    """The root ``fd`` is this user's: nothing of another user's is written into."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise StoreError(f"checkpoint root {root} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")


def open_entry(root: str, root_fd: int, name: str, create: bool = False) -> int | None:
    """A protocol folder under the root (pub/, sub/, ceased/...), never through a
    symlink; None when it does not exist and ``create`` is false. The message names
    what is really wrong: a symlink or file in the way, or a permission."""
    where = f"{root}/{name}"
    try:
        if create:
            return ensure_dir(name, root_fd)[0]
        return open_dir(name, dir_fd=root_fd)
    except FileNotFoundError as e:
        if not create:
            return None
        # mkdir's ENOENT (a root removed meanwhile, a filesystem like /proc): never None here,
        # which every *at() call would take for the current directory
        raise StoreError(f"{where}: cannot be created ({e.strerror})") from None
    except PermissionError:
        raise StoreError(f"{where}: permission denied (check its owner and mode)") from None
    except OSError as e:
        if in_the_way(e):
            raise StoreError(f"{where} is a symlink or not a directory; the protocol never "
                             "follows one (remove it)") from None
        raise StoreError(f"{where}: {e.strerror}") from None


def ensure_entry(root: str, root_fd: int, name: str) -> int:
    """``open_entry``, the folder made first when it does not exist (never None)."""
    return cast(int, open_entry(root, root_fd, name, create=True))


def ensure_dir(name: str, parent_fd: int, mode: int = 0o777) -> tuple[int, bool]:
    """Open ``name`` under ``parent_fd``, creating it if missing; (fd, created).

    A creation is made durable (parent fsynced) before the fd is returned, so a
    crash cannot lose a directory something was already written into."""
    created = False
    try:
        fd = open_dir(name, dir_fd=parent_fd)  # the common case: it exists
    except FileNotFoundError:
        try:
            os.mkdir(name, mode, dir_fd=parent_fd)
            created = True
        except FileExistsError:  # a concurrent creator won; fine
            pass
        except OSError as e:
            raise _named(e, name, parent_fd) from None
        fd = _open_existing_dir(name, parent_fd)
    except OSError as e:
        raise _not_a_dir(e, name) from None
    if created:
        _sync_directory(parent_fd)
    return fd, created


def _open_existing_dir(name: str, parent_fd: int) -> int:
    try:
        return open_dir(name, dir_fd=parent_fd)
    except OSError as e:
        raise _not_a_dir(e, name) from None


def in_the_way(e: OSError) -> bool:
    """A symlink (O_NOFOLLOW refuses it: ELOOP) or a file (ENOTDIR) where a folder was
    asked for: the one test every caller makes before saying the protocol follows none."""
    return e.errno in (errno.ELOOP, errno.ENOTDIR)


def _not_a_dir(e: OSError, name: str) -> OSError:
    if in_the_way(e):
        return NotADirectoryError(e.errno, f"{name} is a symlink or not a directory")
    return e


def create_new(name: str, dir_fd: int, data: bytes = b"", mode: int = 0o444, sync: bool = True) -> None:
    """Create a file that must not exist yet (O_CREAT|O_EXCL|O_NOFOLLOW), with ``data``.

    Two writers cannot both succeed (FileExistsError for the loser). The content is
    fsynced before the entry, and the directory after it: once this returns, the
    file and its entry survive a crash (the caller fsyncs the parents it created)."""
    try:
        fd = os.open(name, _NEW_FLAGS, mode, dir_fd=dir_fd)
    except FileExistsError:
        raise  # the loser of a race: its caller's answer, not an error to complete
    except OSError as e:
        raise _named(e, name, dir_fd) from None
    try:
        write_all(fd, data)
        if data and sync:
            os.fsync(fd)
    except BaseException:
        os.unlink(name, dir_fd=dir_fd)  # this call's entry, its content never whole (ENOSPC): not left behind
        raise
    finally:
        os.close(fd)
    if sync:
        _sync_directory(dir_fd)


def append(name: str, dir_fd: int, data: bytes, sync: bool = True, mode: int = 0o644) -> None:
    """Append ``data`` to ``name`` in one write (O_APPEND, never through a symlink),
    then fsync it (and its directory when the file was new)."""
    try:
        fd = os.open(name, _APPEND_FLAGS, mode, dir_fd=dir_fd)
    except OSError as e:
        raise _named(e, name, dir_fd) from None
    try:
        new = sync and os.fstat(fd).st_size == 0
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        _sync_directory(dir_fd)


def open_append(name: str, dir_fd: int, mode: int = 0o644) -> int:
    """An fd to append to ``name`` (O_APPEND, created when missing, never through a symlink),
    for a writer that keeps it across appends."""
    try:
        return os.open(name, _APPEND_FLAGS, mode, dir_fd=dir_fd)
    except OSError as e:
        raise _named(e, name, dir_fd) from None


#: append fds this process keeps: path -> (fd, st_dev, st_ino) of the file it was opened on;
#: a few (its own execution's events). A kept fd is never closed here: another thread, or
#: the code a signal handler interrupted, may be between its check and its write.
_kept: dict[str, tuple[int, int, int]] = {}
KEPT_MAX = 4


def append_kept(path: str, data: bytes, opener: Callable[[], int], keep: bool = True) -> None:
    """Append ``data`` in one write on the fd kept for ``path`` (an events file: one write per
    event, not two opens and a close), once the fd and ``path`` are still one file (not
    removed, not renamed away, as NFS does with an open file removed, and the fd not closed
    and its number reused); else ``opener()`` opens ``path`` again: no line lost, none written
    elsewhere. No lock: signal handlers append too. A write's error is the caller's.
    ``keep=False``: opened, written and closed."""
    kept = _kept.get(path)
    if kept is not None:
        try:
            held, named = os.fstat(kept[0]), os.stat(path, follow_symlinks=False)
            same = (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino) == kept[1:]
        except OSError:
            same = False
        if same:
            write_all(kept[0], data)
            return
        _kept.pop(path, None)  # stale: left open (see above); a reused number is not ours
    fd = opener()
    try:
        st = os.fstat(fd) if keep else None
        write_all(fd, data)
    except BaseException:
        os.close(fd)
        raise
    if st is None or len(_kept) >= KEPT_MAX or _kept.setdefault(path, (fd, st.st_dev, st.st_ino))[0] != fd:
        os.close(fd)  # not kept: enough kept, or another thread kept its own first


def read_upto(fd: int, n: int) -> bytes:
    """``n`` bytes of ``fd`` from where it stands, fewer at its end. os.read may return less
    than asked: read until ``n`` or the end (a caller that knows the size from fstat reads a
    small entry in one call)."""
    chunks = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """os.write may write less than asked (a pipe, a signal): loop until all is written."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def sync_tree(name: str, parent_fd: int, check: Optional[Callable[[str, int], None]] = None,
              fsync: bool = True) -> None:
    """fsync every file and folder of a save (never following a symlink), then the
    folder holding it, so a publication can never outlive its save's data in a crash.
    ``check(path, fd)`` sees each regular file first (``path`` from the save's own name
    down) and raises to refuse the save; ``fsync=False`` only checks.

    Raises FileNotFoundError if the save itself is gone; a file removed while the tree
    is walked (a trainer's rotation racing us) is skipped: it is not part of the save
    any more, and the caller decides whether the save still exists."""
    _sync_entry(name, parent_fd, name, check, fsync)
    if fsync:
        _sync_directory(parent_fd)


def _sync_entry(name: str, dir_fd: int, path: str, check, fsync: bool) -> None:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and (fsync or check is not None)):
        fd = open_dir(name, dir_fd=dir_fd) if stat.S_ISDIR(st.st_mode) else \
            os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            sync_open(fd, st.st_mode, path, check, fsync)
        finally:
            os.close(fd)


def sync_open(fd: int, mode: int, path: str, check, fsync: bool) -> None:
    """``sync_tree``'s work on an entry already open (``mode``: its st_mode), the folder holding
    it left to the caller: a publication opens its save once and checks it through that fd."""
    if stat.S_ISDIR(mode):
        for entry in listing(fd):
            try:
                _sync_entry(entry, fd, f"{path}/{entry}", check, fsync)
            except FileNotFoundError:
                continue  # removed while we walked: no longer part of the save
        if fsync:
            _sync_directory(fd)
    elif stat.S_ISREG(mode):
        if check is not None:
            check(path, fd)
        if fsync:
            os.fsync(fd)


def open_below(rel: str, root_fd: int) -> tuple[int, int, str] | None:
    """(fd, st_mode, real path) of the folder or file ``rel`` under ``root_fd``, opened in one
    call from the root, once the kernel's own path of it (/proc/self/fd) is the root's followed
    by ``rel``: no component below the root is a symlink. None where that is not so or not
    told (no /proc, a symlink, a special file, nothing there): the caller walks down instead,
    folder by folder with O_NOFOLLOW, which finds what is wrong and says it."""
    try:
        st = os.stat(rel, dir_fd=root_fd, follow_symlinks=False)
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            return None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if stat.S_ISDIR(st.st_mode) else 0)
        fd = os.open(rel, flags, dir_fd=root_fd)
    except OSError:
        return None
    try:
        root, real = os.readlink(f"/proc/self/fd/{root_fd}"), os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        root = real = ""
    if root.startswith("/") and real == f"{root.rstrip('/')}/{rel}":
        return fd, st.st_mode, real
    os.close(fd)
    return None


def listing(fd: int) -> list[str]:
    """The names in the folder open as ``fd``: read through /proc/self/fd, which opens that very
    folder again (half the system calls of ``os.listdir(fd)``'s dup, fdopendir and rewind);
    from the fd itself where /proc is not there."""
    try:
        return os.listdir(f"/proc/self/fd/{fd}")
    except OSError:
        return os.listdir(fd)


def walk(rel: str, root_fd: int) -> list[int]:
    """[root_fd, an fd of each folder on the way to ``rel``] (a canonical path under the
    root), never through a symlink: the one walk down a root. The caller closes all but
    ``root_fd``; gc keeps them to remove the folders that its removal empties."""
    fds = [root_fd]
    try:
        for part in rel.split("/")[:-1]:
            fds.append(open_dir(part, dir_fd=fds[-1]))
    except BaseException:
        for fd in fds[1:]:
            os.close(fd)
        raise
    return fds


def walk_to(rel: str, root_fd: int) -> int:
    """Open the folder holding ``rel`` (``walk``'s last fd, the others closed); the caller
    closes the returned fd (``root_fd`` itself is returned, not a copy, when ``rel`` has
    one component)."""
    fds = walk(rel, root_fd)
    for fd in fds[1:-1]:
        os.close(fd)
    return fds[-1]


def remove_tree(name: str, parent_fd: int) -> int:
    """Remove ``name`` (a file or a folder and everything in it) under ``parent_fd``;
    the bytes that freed on disk (a file another hard link still holds frees none).
    Never follows a symlink: folders are entered by fd with O_NOFOLLOW (a folder swapped
    for a symlink is refused, ELOOP), and a symlink inside is unlinked itself, its target
    untouched. Entries already gone (another gc) are skipped. Not ``shutil.rmtree``: a path can be swapped under it, an fd cannot."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent_fd)
            return st.st_blocks * 512 if st.st_nlink == 1 else 0  # another name (a copy) still holds it
        fd = open_dir(name, dir_fd=parent_fd)
        try:
            freed = st.st_blocks * 512 + sum(remove_tree(e, fd) for e in os.listdir(fd))
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent_fd)
        return freed
    except FileNotFoundError:
        return 0


FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
#: what FICLONE answers where the filesystem (or this pair of files) makes no clone: link instead
_NO_CLONE = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF,
                       errno.EPERM, errno.ETXTBSY})


class Linker:
    """How ``link_tree`` makes each file of a copy. ``clone``: a clone (FICLONE, a reflink: a
    new file sharing the data copy-on-write, so a write to it never reaches the original) as
    long as the filesystem makes them, else a hard link, or for root (whom a file's mode does
    not stop: a write through a link would reach the original) a copy of the data;
    ``protect``: a linked file's write bits are dropped (its inode is a published save's,
    which nothing may write again); ``sync``: every folder made is fsynced. Counts what it
    made; ``unprotected`` names the files whose mode it could not change (another user's)."""

    def __init__(self, clone: bool = False, protect: bool = False, sync: bool = False):
        self.clone, self.protect, self.sync = clone, protect, sync
        self.copy = clone and os.geteuid() == 0
        self.cloned = self.linked = self.copied = 0
        self.unprotected: list[str] = []

    def file(self, name: str, parent_fd: int, new: str, new_parent_fd: int, st: os.stat_result) -> None:
        if self.clone and self._cloned(name, parent_fd, new, new_parent_fd, st):
            return
        if self.copy:
            self._copied(name, parent_fd, new, new_parent_fd, st)
            return
        os.link(name, new, src_dir_fd=parent_fd, dst_dir_fd=new_parent_fd, follow_symlinks=False)
        self.linked += 1
        if self.protect and st.st_mode & 0o222:
            made = os.stat(new, dir_fd=new_parent_fd, follow_symlinks=False)
            if (made.st_dev, made.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(made.st_mode):
                raise FileNotFoundError(errno.ENOENT, "replaced while it was linked", name)
            try:
                os.chmod(new, stat.S_IMODE(st.st_mode) & ~0o222, dir_fd=new_parent_fd)
            except PermissionError:
                self.unprotected.append(name)

    def _cloned(self, name: str, parent_fd: int, new: str, new_parent_fd: int, st: os.stat_result) -> bool:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            dst = os.open(new, _NEW_FLAGS, stat.S_IMODE(st.st_mode), dir_fd=new_parent_fd)
            try:
                fcntl.ioctl(dst, FICLONE, src)
            except OSError as e:
                os.unlink(new, dir_fd=new_parent_fd)
                if e.errno not in _NO_CLONE:
                    raise
                self.clone = False  # this filesystem makes none: link the rest
                return False
            finally:
                os.close(dst)
        finally:
            os.close(src)
        self.cloned += 1
        return True

    def _copied(self, name: str, parent_fd: int, new: str, new_parent_fd: int, st: os.stat_result) -> None:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            dst = os.open(new, _NEW_FLAGS, stat.S_IMODE(st.st_mode), dir_fd=new_parent_fd)
            try:
                _copy_data(src, dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        self.copied += st.st_size


def _copy_data(src: int, dst: int) -> None:
    """The whole of ``src`` into ``dst``, in the kernel where it can (copy_file_range)."""
    try:
        while os.copy_file_range(src, dst, 1 << 30):
            pass
        return
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    os.lseek(src, 0, os.SEEK_SET)
    os.lseek(dst, 0, os.SEEK_SET)
    os.ftruncate(dst, 0)
    while chunk := os.read(src, 1 << 20):
        write_all(dst, chunk)


def link_tree(name: str, parent_fd: int, new: str, new_parent_fd: int, how: Optional[Linker] = None) -> set[str]:
    """Copy ``name`` (a file, or a folder and everything in it) under ``parent_fd`` as ``new``
    under ``new_parent_fd`` without copying data: folders made afresh, files linked or cloned
    (``how``, a Linker; default: hard links), symlinks copied as links (never followed); what
    was copied, as ``tree_names`` lists it. The copy shares the files' data, so a process
    removing the original's names cannot take it from a reader of the copy."""
    how = how or Linker()
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=parent_fd), new, dir_fd=new_parent_fd)
        return {""}
    if not stat.S_ISDIR(st.st_mode):
        how.file(name, parent_fd, new, new_parent_fd, st)
        return {""}
    os.mkdir(new, 0o700, dir_fd=new_parent_fd)
    fd, new_fd = open_dir(name, dir_fd=parent_fd), open_dir(new, dir_fd=new_parent_fd)
    try:
        made = {""} | {f"/{e}{p}" for e in os.listdir(fd) for p in link_tree(e, fd, e, new_fd, how)}
        if how.sync:
            _sync_directory(new_fd)
        return made
    finally:
        os.close(fd)
        os.close(new_fd)


def tree_names(name: str, parent_fd: int) -> set[str]:
    """The paths of everything under ``name`` relative to it ("" itself, "/a/b" below),
    never following a symlink; FileNotFoundError if it is gone."""
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        return {""}
    fd = open_dir(name, dir_fd=parent_fd)
    try:
        return {""} | {f"/{e}{p}" for e in os.listdir(fd) for p in tree_names(e, fd)}
    finally:
        os.close(fd)


def rmdir_empty(name: str, dir_fd: int) -> bool:
    """Remove an empty folder; False when it is not empty (or already gone)."""
    try:
        os.rmdir(name, dir_fd=dir_fd)
        return True
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            return False
        raise


def usage(name: str, dir_fd: int, seen: Optional[set[tuple[int, int]]] = None) -> int:
    """Bytes on disk of an entry and everything under it, never following a symlink;
    FileNotFoundError if the entry itself is gone. ``seen``: the (device, inode) of the
    hard-linked files measured so far, each counted once (a resume's copy links a save's files)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        if seen is not None and st.st_nlink > 1:
            if (st.st_dev, st.st_ino) in seen:
                return 0
            seen.add((st.st_dev, st.st_ino))
        return st.st_blocks * 512
    size = st.st_blocks * 512
    fd = open_dir(name, dir_fd=dir_fd)
    try:
        for e in os.listdir(fd):
            try:
                size += usage(e, fd, seen)
            except FileNotFoundError:
                continue
    finally:
        os.close(fd)
    return size


def times(fd: int, top: Optional[dict] = None, unwritten: tuple[str, ...] = ()) -> \
        tuple[Optional[float], Optional[float], Optional[float]]:
    """(oldest, newest) mtime of everything under the folder fd, its folders' own too, and
    the newest of its files and empty folders only (None: it holds nothing); ``top`` gets
    each entry's name -> whether it is a folder; entries named in ``unwritten`` count in
    ``top`` only (copies whose files keep their original's times). Symlinks are not followed."""
    first = last = newest = None
    for name in os.listdir(fd):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if name in unwritten:
            if top is not None:
                top[name] = stat.S_ISDIR(st.st_mode)
            continue
        t = own = st.st_mtime
        first, last = min(first if first is not None else t, t), max(last if last is not None else t, t)
        if top is not None:
            top[name] = stat.S_ISDIR(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = open_dir(name, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed meanwhile; an unreadable one is the caller's error, never skipped
            try:
                f, l, n = times(sub)
            finally:
                os.close(sub)
            first, last = min(first, f if f is not None else t), max(last, l if l is not None else t)
            own = n if n is not None else t
        newest = own if newest is None else max(newest, own)
    return first, last, newest


def truncate(name: str, dir_fd: int, length: int) -> None:
    """Cut ``name`` to ``length`` bytes (never through a symlink) and fsync it: how a
    writer drops a torn, never-acknowledged tail before appending again."""
    fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


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

