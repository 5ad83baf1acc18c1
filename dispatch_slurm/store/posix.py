"""The POSIX store: a checkpoint root on a POSIX filesystem.

    <root>/exec/<attempt>/   one execution's saves; nothing else writes there
    <root>/pub/<name>        publications: empty, O_EXCL-created, never renamed
    <root>/sub/<NNNNNN>      submission numbers, O_EXCL-allocated

No locks, no pointer file, no rename: locks are unreliable on Lustre, NFS and GPFS,
and check-then-rename loses to a stalled old run. Every call goes through directory
file descriptors opened with O_NOFOLLOW below the root (durable.py): a symlink planted
inside the root is never followed, and what is created lands exactly where it was
checked. Inside a session (``with store:``) every call works under one fd of the root."""

from __future__ import annotations

import errno
import os
import stat
from typing import Iterator, Optional

from ..contract import layout, names
from ..contract.names import Publication
from ..contract.env import Execution
from ..errors import BadPath, StoreError, TornSave
from . import copies, makeexec, scan, whole
from .inventory import Folder, Inventory
from .base import Store
from .durable import (Linker, append, append_kept, check_owner, create_new, ensure_entry, in_the_way, open_append,
                      open_below, open_entry, open_root, read_upto, remove_tree, rmdir_empty, sync_open,
                      sync_tree, truncate, walk, walk_to)

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: root -> its filesystem's NAME_MAX: asked once per process (a publication asks on every call)
_name_max: dict[str, int] = {}


class PosixStore(Store):
    kind = "POSIX"
    local = True
    appendable = True

    def __init__(self, root: str):
        super().__init__(root)
        self._root_fd = -1  # the root's fd, inside a session
        self._depth = 0
        self._folders_open: dict[str, int] = {}  # folders under the root opened in this session
        self._saves: dict[str, tuple[int, int, Optional[str]]] = {}  # rel -> (fd, st_mode, real path): checked saves

    @classmethod
    def absolute(cls, value: str, from_env: bool) -> str:
        """Named on a command line: made absolute (lexically: symlinks are kept); from
        $DISPATCH_CHECKPOINT: refused when relative (every node and task reads the same path)."""
        if from_env:
            if not value.startswith("/"):
                raise StoreError(f"$DISPATCH_CHECKPOINT={value!r} is relative: a job's root must be absolute "
                                 "(every node and task reads the same path); set it to an absolute path, or "
                                 "name the root on the command line")
            return value.rstrip("/") or "/"
        return os.path.abspath(value)

    # -- the session: one fd of the root -------------------------------------------------

    def __enter__(self) -> "PosixStore":
        if self._depth == 0:
            self._root_fd = open_root(self.root)
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            for fd in self._folders_open.values():
                os.close(fd)
            self._folders_open.clear()
            for fd, _, _ in self._saves.values():
                if fd >= 0:
                    os.close(fd)
            self._saves.clear()
            os.close(self._root_fd)
            self._root_fd = -1

    def _dir(self, folder: str) -> Optional[int]:
        """An fd of ``<root>/<folder>`` (None when it does not exist), for the caller's session
        (the caller holds one), kept until it ends: gc reads every marker of retired/ through
        one fd, a publication reaches pub/, epochs/ and events/ once."""
        fd = self._folders_open.get(folder)
        if fd is None:
            fd = open_entry(self.root, self._root_fd, folder)
            if fd is not None:
                self._folders_open[folder] = fd
        return fd

    def _made(self, folder: str) -> int:
        """``_dir``, the folder made first when it does not exist."""
        if folder not in self._folders_open:
            self._folders_open[folder] = ensure_entry(self.root, self._root_fd, folder)
        return self._folders_open[folder]

    def _parent(self, rel: str) -> int:
        """An fd of the folder holding ``rel`` (a canonical path under the root), walked down
        from the root's fd without following a symlink (durable.walk_to's errors), for the
        caller's session and kept until it ends: a publication checks the save, syncs it
        and checks each file whole through the folders it walked once."""
        head = rel.rpartition("/")[0]
        if not head:
            return self._root_fd
        fd = self._folders_open.get(head)
        if fd is None:
            fd = self._folders_open[head] = walk_to(rel, self._root_fd)
        return fd

    def _limit(self) -> int:
        """The root filesystem's limit on a name (asked once per process and root)."""
        limit = _name_max.get(self.root)
        if limit is None:
            with self:
                limit = _name_max[self.root] = os.fpathconf(self._root_fd, "PC_NAME_MAX")
        return limit

    def reachable(self) -> None:
        """Every call opens the root and says what is wrong with it: nothing to ask first."""

    def root_missing(self) -> bool:
        return not os.path.lexists(self.root)

    def owned(self) -> None:
        """Exec folders, submission numbers and gc's removals only under a root the user owns:
        a root someone else controls could be rearranged under the job's feet."""
        with self:
            fd = self._root_fd
            check_owner(self.root, fd)

    # -- entries of protocol folders ----------------------------------------------------

    def listing(self, folder: str) -> list[str]:
        with self:
            fd = self._dir(folder)
            return [] if fd is None else os.listdir(fd)

    def read(self, folder: str, name: str, limit: Optional[int] = 1 << 20) -> Optional[bytes]:
        where = self.where(folder, name)
        with self:
            fd = self._dir(folder)
            if fd is None:
                return None
            try:
                f = os.open(name, _READ, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as e:
                hint = "; it is a symlink, which the protocol never follows (remove it)" if e.errno == errno.ELOOP else ""
                raise StoreError(f"{where}: {e.strerror}{hint}") from None
            try:
                st = os.fstat(f)
                if not stat.S_ISREG(st.st_mode):
                    raise StoreError(f"{where} is not a regular file (remove it)")
                return read_upto(f, st.st_size if limit is None else min(limit, st.st_size))
            finally:
                os.close(f)

    def identity(self, folder: str, name: str) -> tuple[int, ...] | None:
        with self:
            fd = self._dir(folder)
            if fd is None:
                return None
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            return st.st_dev, st.st_ino, st.st_ctime_ns

    def has(self, folder: str, name: str) -> bool:
        return self.identity(folder, name) is not None

    def create(self, folder: str, name: str, body: bytes = b"", mode: int = 0o444, sync_root: bool = True) -> bool:
        """O_EXCL-create, the content fsynced, then the folder and the root."""
        with self:
            fd = self._made(folder)
            root_fd = self._root_fd
            try:
                create_new(name, fd, body, mode)
            except FileExistsError:
                return False
            if sync_root:
                os.fsync(root_fd)
            return True

    def delete(self, folder: str, name: str) -> bool:
        with self:
            fd = self._dir(folder)
            if fd is None:
                return False
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                return False
            os.fsync(fd)
            return True

    def fill_empty(self, folder: str, name: str, body: bytes) -> bytes:
        """gc makes its markers read-only: made writable for the write, read-only again after."""
        with self:
            dir_fd = self._dir(folder)
            if dir_fd is None:
                raise StoreError(f"{self.where(folder)} does not exist: nothing to fill")
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise BadPath(f"{folder}/{name} is not a regular file (remove it)")
                old = os.read(fd, 4096)
                if old:
                    return old
                os.fchmod(fd, st.st_mode | stat.S_IWUSR)
                w = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                try:
                    os.write(w, body)
                    os.fsync(w)
                finally:
                    os.close(w)
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
            finally:
                os.close(fd)
            os.fsync(dir_fd)
        return b""

    def too_long(self, folder: str, name: str) -> Optional[str]:
        if len(os.fsencode(name)) > self._limit():
            return f"its {folder}/ name would be over the filesystem's limit: left alone"
        return None

    def flush(self, folder: str) -> None:
        if not folder:
            with self:
                os.fsync(self._root_fd)
            return
        with self:
            fd = self._dir(folder)
            if fd is not None:
                os.fsync(fd)

    # -- saves and publications ---------------------------------------------------------

    def save_relpath(self, save) -> str:
        """Checked from the root's fd without following any symlink: a save is a real
        folder or file inside the root."""
        root = self.root
        root_abs, save_abs = os.path.abspath(root).rstrip("/"), os.path.abspath(save)
        if save_abs.startswith(root_abs + "/"):
            rel = save_abs[len(root_abs) + 1:]
        else:  # named through another alias of the root (e.g. the root's resolved symlink)
            rel = os.path.relpath(os.path.realpath(save), os.path.realpath(root))
            if rel == "." or rel == ".." or rel.startswith("../"):
                raise BadPath(f"save {save} is not inside the checkpoint root {root}")
        names.check_relpath(rel)
        with self:
            if self._open_save(rel):
                return rel
        try:
            with self:
                parent = self._parent(rel)
                st = os.stat(rel.rsplit("/", 1)[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            raise BadPath(f"save {save} does not exist") from None
        except OSError as e:
            if in_the_way(e):
                raise BadPath(f"save {save}: a component is a symlink or not a folder; "
                              "a save must be a real folder or file inside the root") from None
            raise
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise BadPath(f"save {save} is a symlink or special file, not a folder or file")
        return rel

    def _open_save(self, rel: str) -> bool:
        """The save opened from the root's fd and kept for the session (durable.open_below): its
        check, sync and real path use that fd. False where that is refused: the walk down,
        folder by folder, then finds what is wrong and says it."""
        if rel not in self._saves:
            opened = open_below(rel, self._root_fd)
            if opened is None:
                return False
            self._saves[rel] = opened
        return True

    def relpath(self, save) -> str:
        root_abs, save_abs = os.path.abspath(self.root).rstrip("/"), os.path.abspath(save)
        if not save_abs.startswith(root_abs + "/"):
            raise BadPath(f"{save} is not inside the checkpoint root {self.root}")
        return names.check_relpath(save_abs[len(root_abs) + 1:])

    def save_exists(self, rel: str) -> bool:
        return os.path.lexists(os.path.join(self.root, rel))

    def realpath(self, rel: str) -> Optional[str]:
        """The real path of a save checked in this session (``save_relpath``: no symlink
        below the root), told by the kernel from the fd of its folder the check walked (one
        readlink, no walk); None where /proc does not tell it."""
        with self:
            if rel in self._saves:
                return self._saves[rel][2]
            parent = self._parent(rel)
            try:
                folder = os.readlink(f"/proc/self/fd/{parent}")
            except OSError:
                return None
        if not folder.startswith("/") or folder.endswith(" (deleted)"):
            return None
        return f"{folder.rstrip('/')}/{rel.rsplit('/', 1)[-1]}"

    def hold(self, rel: str, attempt: str, name: str) -> tuple[Optional[str], Optional[str]]:
        """Clones or hard links, never a copy of the data: copies.py says how and why."""
        with self:
            return copies.hold(self._root_fd, rel, attempt, name)

    def place(self, rel: str, attempt: str, name: str, where: str) -> tuple[Optional[str], Optional[Linker]]:
        """The resume copy's way (copies.py), under the path the trainer looks for: the view's
        prepare places the latest publication there, where a trainer that was not changed
        resumes from it by its own rule (its highest checkpoint-<step>, its `latest`)."""
        with self:
            return copies.place(self._root_fd, rel, attempt, name, where)

    def write_new(self, rel: str, data: bytes) -> bool:
        """Written under a hidden name, then linked into place (copies.py): a reader on any
        node sees the whole file or none, never a torn pointer or record, and a second
        writer (another node's prepare) finds the first one's and changes nothing."""
        with self:
            return copies.write_new(self._root_fd, rel, data)

    def keep(self, rel: str, name: str) -> tuple[Optional[str], list[str]]:
        with self:
            return copies.keep(self._root_fd, rel, name)

    def release(self, epoch: int, step: int) -> None:
        with self:
            copies.release(self._root_fd, epoch, step)

    def located(self, pub: Publication) -> Optional[str]:
        if self.save_exists(pub.path):
            return pub.path
        with self:
            return f"{layout.HELD}/{pub.name}" if copies.held_here(pub.name, self._root_fd) else None

    def sync(self, save) -> None:
        """fsync only: a rank syncing its own part while another rank still writes its own
        must not be refused for that rank's file."""
        with self:
            self._sync(self.save_relpath(save), save, None, True)

    def sync_save(self, rel: str, save, fsync: bool = True) -> None:
        leaf, files = rel.rsplit("/", 1)[-1], []

        def whole_file(path: str, fd: int) -> None:
            files.append(path)
            why = whole.problem(path, fd)
            if why:
                raise TornSave(save, f"{path[len(leaf) + 1:] if path != leaf else 'it'} is {why}")
        self._sync(rel, save, whole_file, fsync)
        if not files:  # a folder made, nothing saved into it yet (or a save removed, its folders left)
            raise BadPath(f"refusing to publish {save}: it holds no file, nothing a resume could load; publish "
                          "the save once the trainer has written it")

    def _sync(self, rel: str, save, check, fsync: bool) -> None:
        try:
            with self:
                opened = self._saves.get(rel)
                if opened is None:
                    sync_tree(rel.rsplit("/", 1)[-1], self._parent(rel), check, fsync)
                    return
                fd, mode, _ = opened
                sync_open(fd, mode, rel.rsplit("/", 1)[-1], check, fsync)
                if fsync:  # the folder holding the save: its entry made durable too
                    os.fsync(self._parent(rel))
        except FileNotFoundError:
            raise BadPath(f"save {save} does not exist (removed before it could be published)") from None

    def publication_fits(self, name: str, rel: str) -> None:
        """Refuse a publication name over the filesystem's limit before anything is created."""
        limit = self._limit()
        if len(os.fsencode(name)) > limit:
            raise BadPath(f"publication name for {rel!r} is {len(name)} bytes, over this filesystem's "
                          f"limit of {limit}: use a shorter save path (at most ~{(limit - 42) * 5 // 8} bytes)")

    def create_publication(self, name: str) -> bool:
        """O_EXCL-create pub/<name>, then fsync pub/ and the root."""
        with self:
            pub_fd = self._made(layout.PUB)
            root_fd = self._root_fd
            try:
                create_new(name, pub_fd, sync=False)
                created = True
            except FileExistsError:
                created = False
            os.fsync(pub_fd)
            os.fsync(root_fd)
        return created

    def published_at(self, name: str) -> Optional[float]:
        try:
            return os.stat(os.path.join(self.root, layout.PUB, name)).st_mtime
        except OSError:
            return None

    def make_exec_dir(self, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
        """Create <root>/exec/<attempt>/ (makeexec.make: never through a symlink)."""
        self.check_attempt(attempt)
        return makeexec.make(self.root, attempt, mode, create_root)

    # -- events: one file per process, appended without fsync ---------------------------

    def add_event(self, name: str, line: bytes) -> None:
        """The file of the process's own execution's root (written at every save) is kept
        open between lines; others (a supervisor follows many roots) are opened per line."""
        def opener() -> int:
            with self:
                return open_append(f"{name}.jsonl", self._made(layout.EVENTS))
        append_kept(f"{self.root}/{layout.EVENTS}/{name}.jsonl", line, opener,
                    keep=Execution.current().root == self.root)

    def event_files(self, prefix: str = "") -> list[tuple[str, bytes]]:
        """Read whole, in one session: a reader that stops at a bad line leaves no fd open."""
        if self.root_missing():
            return []  # nothing has happened there yet
        with self:
            return [(name, self.read(layout.EVENTS, name, None) or b"")
                    for name in sorted(self.listing(layout.EVENTS)) if name.startswith(prefix)]

    # -- gc ------------------------------------------------------------------------------

    def inventory(self, pattern: str = names.STEP_PATTERN) -> Inventory:
        pubs = self.publications()
        with self:
            root_fd = self._root_fd
            marks = self.listing(layout.RETIRED)
            inv = self.finish_inventory(pubs, marks, self._folders(), pattern, self.by_person(marks),
                                        self.listing(layout.HELD))
            seen: set[tuple[int, int]] = set()  # the copies last: their linked bytes are their saves'
            for s in sorted(inv.saves.values(), key=lambda s: s.copy):
                scan.measure(s, root_fd, seen)
            self.check_problems(inv)
        return inv

    def _folders(self) -> dict[str, Folder]:
        with self:
            return scan.folders(self._dir(layout.EXEC), self.where(layout.EXEC))

    def remove(self, rel: str, held: tuple[str, ...] = ()) -> int:
        """Remove the save, then its folders up to exec/<attempt> while they are empty, then
        its publications' held links (the save's last names: where its bytes are freed)."""
        parts = rel.split("/")
        with self:
            root_fd = self._root_fd
            try:
                fds = walk(rel, root_fd)
            except FileNotFoundError:
                fds = []
            freed = 0
            try:
                if fds:
                    freed = remove_tree(parts[-1], fds[-1])
                    for i in range(len(parts) - 2, 0, -1):  # parts[i] lives in fds[i]; never exec/ itself
                        if not rmdir_empty(parts[i], fds[i]):
                            break
            finally:
                for fd in fds[1:]:
                    os.close(fd)
            kept = self._dir(layout.HELD) if held else None
            return freed + sum(remove_tree(name, kept) for name in held) if kept is not None else freed

    def drop_empty(self, attempts: list[str]) -> None:
        if attempts:
            with self:
                exec_fd = self._dir(layout.EXEC)
                if exec_fd is not None:
                    for attempt in attempts:
                        rmdir_empty(attempt, exec_fd)

    # -- an execution's folder, as watch reads it ----------------------------------------

    def entries(self, folder: str) -> Iterator[tuple[str, bool]]:
        with os.scandir(folder) as it:
            for e in it:
                yield e.name, e.is_dir(follow_symlinks=False)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    present = exists

    def read_path(self, path: str) -> Optional[bytes]:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    # -- the supervisor's record and claims -----------------------------------------------

    def read_all(self, name: str) -> bytes:
        with self:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._root_fd)
            except FileNotFoundError:
                return b""
        try:
            return read_upto(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def append(self, name: str, data: bytes) -> None:
        with self:
            root_fd = self._root_fd
            append(name, root_fd, data)

    def truncate(self, name: str, length: int) -> None:
        with self:
            root_fd = self._root_fd
            truncate(name, root_fd, length)

    def mtime(self, folder: str, name: str) -> Optional[float]:
        with self:
            fd = self._dir(folder)
            try:
                return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime if fd is not None else None
            except FileNotFoundError:
                return None

    def touch(self, folder: str, name: str) -> None:
        with self:
            fd = self._dir(folder)
            if fd is not None:
                os.utime(name, dir_fd=fd, follow_symlinks=False)
