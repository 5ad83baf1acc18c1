"""The POSIX store: the only code that touches a checkpoint root.

    <root>/exec/<attempt>/   one execution's saves; nothing else writes there
    <root>/pub/<name>        publications: empty, O_EXCL-created, never renamed
    <root>/sub/<NNNNNN>      submission numbers, O_EXCL-allocated

No locks, no pointer file, no rename: locks are unreliable on Lustre, NFS and GPFS,
and check-then-rename loses to a stalled old run. The latest save is found by
listing pub/ and taking the greatest (epoch, step); an entry that does not parse is
an error naming it, never skipped, because a skipped entry could be the latest."""

import errno
import os
import stat

from . import names
from .durable import DirFds, create_exclusive, ensure_dir, fsync_dirs, open_dir
from .errors import AlreadyPublished, BadName, BadPath, DispatchError, StoreError
from .names import Publication


def _open_root(root: str) -> int:
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


_WALK = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _save_relpath(root: str, root_fd: int, save: str) -> str:
    """The save's canonical path under the root, walked from root_fd without
    following any symlink: a save is a real folder or file inside the root."""
    root_abs, save_abs = os.path.abspath(root), os.path.abspath(save)
    if save_abs.startswith(root_abs.rstrip("/") + "/"):
        rel = save_abs[len(root_abs.rstrip("/")) + 1:]
    else:  # named through another alias of the root (e.g. the root's resolved symlink)
        rel = os.path.relpath(os.path.realpath(save), os.path.realpath(root))
        if rel == "." or rel == ".." or rel.startswith("../"):
            raise BadPath(f"save {save} is not inside the checkpoint root {root}")
    names.check_relpath(rel)
    *dirs, leaf = rel.split("/")
    fd = root_fd
    try:
        for part in dirs:
            nfd = os.open(part, _WALK, dir_fd=fd)
            if fd != root_fd:
                os.close(fd)
            fd = nfd
        st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        raise BadPath(f"save {save} does not exist") from None
    except (NotADirectoryError, OSError) as e:
        if isinstance(e, NotADirectoryError) or e.errno == errno.ELOOP:
            raise BadPath(f"save {save}: a component is a symlink or not a folder; "
                          "a save must be a real folder or file inside the root") from None
        raise
    finally:
        if fd != root_fd:
            os.close(fd)
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise BadPath(f"save {save} is a symlink or special file, not a folder or file")
    return rel


def publish(root: str, save: str, step: int, epoch: int) -> Publication:
    """Publish `save` (a path inside `root`) at (epoch, step); durable on return.

    Order: open(O_CREAT|O_EXCL) the entry, fsync pub/, fsync the root. A second
    publish of the same name raises AlreadyPublished; nothing is ever overwritten."""
    with DirFds() as fds:
        root_fd = fds.add(_open_root(root))
        rel = _save_relpath(root, root_fd, save)
        name = names.encode(epoch, step, rel)
        limit = os.fpathconf(root_fd, "PC_NAME_MAX")  # checked before anything is created
        if len(os.fsencode(name)) > limit:
            raise BadPath(
                f"publication name for {rel!r} is {len(name)} bytes, over this filesystem's "
                f"limit of {limit}: use a shorter save path (at most ~{(limit - 42) * 5 // 8} bytes)")
        try:
            pub_fd = fds.add(ensure_dir(names.PUB, root_fd)[0])
        except NotADirectoryError:
            raise StoreError(f"{root}/{names.PUB} is a symlink or not a directory") from None
        try:
            create_exclusive(name, pub_fd)
        except FileExistsError:
            raise AlreadyPublished(f"already published: {name} ({rel} at step {step})") from None
        fsync_dirs(pub_fd, root_fd)
    return Publication(epoch, step, rel, name)


def _list_pub(root: str) -> list[str]:
    with DirFds() as fds:
        root_fd = fds.add(_open_root(root))
        try:
            pub_fd = fds.add(open_dir(names.PUB, dir_fd=root_fd))
        except FileNotFoundError:
            return []
        except OSError:
            raise StoreError(f"{root}/{names.PUB} is a symlink or not a directory") from None
        return os.listdir(pub_fd)


def _checked(root: str) -> list[str]:
    """Every entry of pub/, all validated; the first bad one (in name order) raises."""
    entries = _list_pub(root)
    if not names.all_valid(entries):
        where = f"{root}/{names.PUB}"
        for entry in sorted(entries):
            names.parse(entry, where)
        raise DispatchError(f"{where}: bulk and per-entry validation disagree (a bug; please report)")
    return entries


def publications(root: str) -> list[Publication]:
    """All publications, ordered by (epoch, step), ties broken by name."""
    where = f"{root}/{names.PUB}"
    return [names.parse(e, where) for e in sorted(_checked(root))]


def latest(root: str) -> Publication | None:
    """The publication with the greatest (epoch, step), or None if there is none.

    Every entry is parsed; fixed-width digits make the greatest name the latest."""
    entries = _checked(root)
    return names.parse(max(entries), f"{root}/{names.PUB}") if entries else None


def _check_owner(root: str, root_fd: int) -> None:
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
    where = f"{root}/{names.SUB}"
    with DirFds() as fds:
        root_fd = fds.add(_open_root(root))
        _check_owner(root, root_fd)
        try:
            sub_fd = fds.add(ensure_dir(names.SUB, root_fd)[0])
        except NotADirectoryError:
            raise StoreError(f"{where} is a symlink or not a directory") from None
        taken = [names.parse_submission(e, where) for e in os.listdir(sub_fd)]
        n = max(taken, default=0) + 1
        while True:
            if n > 999_999:
                raise StoreError(f"{where}: no submission number left (N must be <= 999,999)")
            try:
                create_exclusive(names.submission_name(n), sub_fd)
                break
            except FileExistsError:
                n += 1
        fsync_dirs(sub_fd, root_fd)
    return n


def make_exec_dir(root: str, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
    """Create <root>/exec/<attempt>/ (mode 0700 unless a site sets a group mode).

    Runs as the job user. exec/ and the attempt folder are opened with O_NOFOLLOW:
    a symlink planted there is refused, never followed. An existing attempt folder
    is fine (several steps of one execution) if it is a real directory we own.
    `create_root` creates the root's last component (an array task's root under
    the job's root); the parent must exist."""
    if not attempt or "/" in attempt or attempt in (".", ".."):
        raise BadPath(f"attempt token {attempt!r} is not a single path component")
    path = f"{root}/{names.EXEC}/{attempt}"
    with DirFds() as fds:
        try:
            if create_root:
                parent, leaf = os.path.split(root)
                parent_fd = fds.add(_open_root(parent))
                _check_owner(parent, parent_fd)
                root_fd = fds.add(ensure_dir(leaf, parent_fd)[0])
            else:
                root_fd = fds.add(_open_root(root))
            _check_owner(root, root_fd)
            exec_fd = fds.add(ensure_dir(names.EXEC, root_fd)[0])
            att_fd, created = ensure_dir(attempt, exec_fd, mode)
            fds.add(att_fd)
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


def record_cessation(root: str, attempt: str, node: str) -> bool:
    """<root>/ceased/<attempt>.<node>: this execution's processes on `node` are gone.

    Written by the Epilog as the job user, O_EXCL and durable like a publication;
    True if created now, False if it was already recorded."""
    if not attempt or "/" in attempt or not node or "/" in node:
        raise BadPath(f"bad attempt {attempt!r} or node {node!r}")
    with DirFds() as fds:
        root_fd = fds.add(_open_root(root))
        try:
            ceased_fd = fds.add(ensure_dir(names.CEASED, root_fd)[0])
        except NotADirectoryError:
            raise StoreError(f"{root}/{names.CEASED} is a symlink or not a directory") from None
        try:
            create_exclusive(f"{attempt}.{node}", ceased_fd)
        except FileExistsError:
            return False
        fsync_dirs(ceased_fd, root_fd)
    return True


def ceased_nodes(root: str, attempt: str) -> set[str]:
    """The nodes whose Epilog recorded that this execution's processes are gone."""
    prefix = f"{attempt}."
    try:
        entries = os.listdir(os.path.join(root, names.CEASED))
    except FileNotFoundError:
        return set()
    return {e[len(prefix):] for e in entries if e.startswith(prefix)}


__all__ = ["publish", "publications", "latest", "allocate_submission", "make_exec_dir",
           "AlreadyPublished", "BadName", "BadPath", "DispatchError", "StoreError", "Publication"]
