"""The POSIX store: a checkpoint root on a POSIX filesystem.

    <root>/exec/<attempt>/   one execution's saves; nothing else writes there
    <root>/pub/<name>        publications: empty, O_EXCL-created, never renamed
    <root>/sub/<NNNNNN>      submission numbers, O_EXCL-allocated

No locks, no pointer file, no rename: locks are unreliable on Lustre, NFS and GPFS,
and check-then-rename loses to a stalled old run. The latest save is found by
listing pub/ and taking the greatest (epoch, step); an entry that does not parse is
an error naming it, never skipped, because a skipped entry could be the latest.
Publishing itself (with its checks, the save's fsync and the event) is
``store.publish``: the one publish path."""

import os
import stat
from contextlib import contextmanager
from typing import Iterator

from ..contract import layout, names
from ..contract.names import Publication
from ..errors import BadPath, StoreError
from . import protocol
from .durable import DirFds, create_new, ensure_dir, in_the_way, open_dir, walk_to


def open_root(root: str) -> int:
    """The root may itself be a symlink (sites alias scratch); it must exist: a
    missing root is a typo or an unmounted filesystem, never something to create."""
    try:
        return open_dir(root, follow=True)
    except FileNotFoundError:
        if str(root).startswith("s3://"):  # only the error path pays for the question
            raise StoreError(f"checkpoint root {root}: this command needs a POSIX root; s3:// roots serve "
                             "publish, latest, ls, watch, env, submit, report and gc") from None
        raise StoreError(f"checkpoint root {root} does not exist (create it first)") from None
    except NotADirectoryError:
        raise StoreError(f"checkpoint root {root} is not a directory") from None
    except PermissionError:
        raise StoreError(f"checkpoint root {root}: permission denied") from None


def open_entry(root: str, root_fd: int, name: str, create: bool = False) -> int | None:
    """A protocol folder under the root (pub/, sub/, ceased/...), never through a
    symlink; None when it does not exist and ``create`` is false. The message names
    what is really wrong: a symlink or file in the way, or a permission."""
    where = f"{root}/{name}"
    try:
        if create:
            return ensure_dir(name, root_fd)[0]
        return open_dir(name, dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise StoreError(f"{where}: permission denied (check its owner and mode)") from None
    except OSError as e:
        if in_the_way(e):
            raise StoreError(f"{where} is a symlink or not a directory; the protocol never "
                             "follows one (remove it)") from None
        raise StoreError(f"{where}: {e.strerror}") from None


@contextmanager
def folder(root: str, name: str, create: bool = False) -> Iterator[int | None]:
    """An fd of the protocol folder ``<root>/<name>`` for *at() calls, closed on exit;
    None when it does not exist and ``create`` is false."""
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        fd = open_entry(root, root_fd, name, create)
        yield fd if fd is None else fds.add(fd)


def read_entry(root: str, name: str, entry: str) -> bytes | None:
    """The content of ``<root>/<name>/<entry>`` (never through a symlink), or None if
    either does not exist."""
    with folder(root, name) as fd:
        if fd is None:
            return None
        try:
            f = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            return None
        with os.fdopen(f, "rb") as fh:
            return fh.read()


def save_relpath(root: str, root_fd: int, save: str) -> str:
    """The save's canonical path under the root, checked from root_fd without
    following any symlink: a save is a real folder or file inside the root."""
    root_abs, save_abs = os.path.abspath(root).rstrip("/"), os.path.abspath(save)
    if save_abs.startswith(root_abs + "/"):
        rel = save_abs[len(root_abs) + 1:]
    else:  # named through another alias of the root (e.g. the root's resolved symlink)
        rel = os.path.relpath(os.path.realpath(save), os.path.realpath(root))
        if rel == "." or rel == ".." or rel.startswith("../"):
            raise BadPath(f"save {save} is not inside the checkpoint root {root}")
    names.check_relpath(rel)
    try:
        parent = walk_to(rel, root_fd)
    except FileNotFoundError:
        raise BadPath(f"save {save} does not exist") from None
    except OSError as e:
        if in_the_way(e):
            raise BadPath(f"save {save}: a component is a symlink or not a folder; "
                          "a save must be a real folder or file inside the root") from None
        raise
    try:
        st = os.stat(rel.rsplit("/", 1)[-1], dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        raise BadPath(f"save {save} does not exist") from None
    finally:
        if parent != root_fd:
            os.close(parent)
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise BadPath(f"save {save} is a symlink or special file, not a folder or file")
    return rel


def check_name_fits(root_fd: int, name: str, rel: str) -> None:
    """Refuse a publication name over the filesystem's limit before anything is created."""
    limit = os.fpathconf(root_fd, "PC_NAME_MAX")
    if len(os.fsencode(name)) > limit:
        raise BadPath(f"publication name for {rel!r} is {len(name)} bytes, over this filesystem's "
                      f"limit of {limit}: use a shorter save path (at most ~{(limit - 42) * 5 // 8} bytes)")


def create_publication(root: str, root_fd: int, name: str) -> bool:
    """O_EXCL-create pub/<name>, then fsync pub/ and the root; True if created now.

    An entry that already exists is fsynced all the same: a retry after a failed
    fsync completes the durability the first call could not confirm."""
    with DirFds() as fds:
        pub_fd = fds.add(open_entry(root, root_fd, layout.PUB, create=True))
        try:
            create_new(name, pub_fd, sync=False)
            created = True
        except FileExistsError:
            created = False
        os.fsync(pub_fd)
        os.fsync(root_fd)
    return created


def list_entries(root: str, name: str) -> list[str]:
    """The entries of the protocol folder ``<root>/<name>`` ([] if it does not exist)."""
    with folder(root, name) as fd:
        return [] if fd is None else os.listdir(fd)


def _list_pub(root: str) -> list[str]:
    return list_entries(root, layout.PUB)


def publications(root: str) -> list[Publication]:
    """All publications, ordered by (epoch, step), ties broken by name."""
    return protocol.publications(_list_pub(root), f"{root}/{layout.PUB}")


def latest(root: str) -> Publication | None:
    """The publication with the greatest (epoch, step) a person has not retired, or
    None; a latest gc retired is an error (protocol.latest)."""
    return protocol.latest(_list_pub(root), root, lambda name: read_entry(root, layout.RETIRED, name),
                           lambda: list_entries(root, layout.RETIRED))


def check_owner(root: str, root_fd: int) -> None:
    """Exec folders and submission numbers go only under a root the user owns: a
    root someone else controls could be rearranged under the job's feet."""
    st = os.fstat(root_fd)
    if st.st_uid != os.geteuid():
        raise StoreError(f"checkpoint root {root} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")


def allocate_submission(root: str) -> int:
    """The next submission number N under <root>/sub/, lock-free.

    Take max+1 and O_EXCL-create it; on EEXIST another submitter won that number,
    so try the next. Durable (sub/ and root fsynced) before N is used: a lost entry
    could hand the same N, hence the same epoch, to two submissions."""
    where = f"{root}/{layout.SUB}"
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        check_owner(root, root_fd)
        sub_fd = fds.add(open_entry(root, root_fd, layout.SUB, create=True))

        def create(name: str) -> bool:
            try:
                create_new(name, sub_fd)
                return True
            except FileExistsError:
                return False
        n = protocol.allocate(os.listdir(sub_fd), create, where)
        os.fsync(root_fd)
    return n


def make_exec_dir(root: str, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
    """Create <root>/exec/<attempt>/ (mode 0700 unless a site sets a group mode).

    Runs as the job user. exec/ and the attempt folder are opened with O_NOFOLLOW:
    a symlink planted there is refused, never followed. An existing attempt folder
    is fine (several steps of one execution) if it is a real directory we own.
    ``create_root`` creates the root's last component (an array task's root under
    the job's root); the parent must exist."""
    if not attempt or "/" in attempt or attempt in (".", ".."):
        raise BadPath(f"attempt token {attempt!r} is not a single path component")
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
            raise BadPath(f"{path}: a symlink or non-directory is in the way; refusing to follow it") from None
        except PermissionError:
            raise StoreError(f"{path}: permission denied") from None
        st = os.fstat(att_fd)
        if st.st_uid != os.geteuid():
            raise BadPath(f"{path} exists and belongs to uid {st.st_uid}, not to this user")
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(att_fd, mode)  # umask may have removed bits a group mode asks for
    return path
