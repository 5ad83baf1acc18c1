"""gc: remove executions' saves the retention policy does not keep, safely.

The rules are contract/retention.py's; this module reads a root into an inventory,
removes what they say, pins saves, and gives the retention state for ``ls`` and the
report. Whether an execution has ceased is an input (``ceased``): the store does not
ask Slurm (supervisor/retention.py does). Each store does its own reading and writing
(``_Posix`` here, through directory fds; s3_retention.py with S3's primitives); the
order below is this module's, the same on both.

How a removal goes, so that a gc killed at any moment leaves every publication either
intact or clearly retired:

1. ``pub/`` is fsynced (every publication the inventory saw, the latest it keeps among
   them, is then durable: a crash cannot bring back an older latest whose save is removed);
   for every save to remove, ``retired/<publication name>`` is created if absent
   (O_EXCL, fsynced with retired/ and the root; on S3 a PUT with If-None-Match: *) for
   each of its publications (for an unpublished leftover: the name it would have had
   at its execution's epoch and step): the publication is retired before a byte of
   its save is touched;
2. pinned/ and pub/ are read again: a save pinned, or published again (adopted),
   since the inventory is kept (an adopter pins the save before it checks retired/, so
   one of the two always sees the other);
3. the save is removed (POSIX: through directory fds, never following a symlink, then
   its folders up to ``exec/<attempt>`` if they are left empty; S3: DeleteObjects of
   every key under it).

gc never retires the latest publication, and pub/ only grows, so a publication below
the latest stays below it: ``latest`` (the max of pub/) never names a retired save.
A person may retire any publication (``retire``: a marker holding who and why); the
latest is then the greatest publication not retired, for gc as for ``latest``, and the
retired save is removed like any other once its execution has ceased."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional

from ..contract import layout, names
from ..contract.retention import (KEEP, REMOVE, Inventory, Policy, Save, Verdict, decide, empty_folders,
                                  known_saves, leftover_step, markers, pinned, retired_by,
                                  retirement_record)
from ..errors import BadPath
from . import events, protocol, s3_retention
from .durable import DirFds, create_new, in_the_way, open_dir, remove_tree, walk
from .posix import check_owner, open_entry, open_root, publications, save_relpath
from .roots import is_s3
from .roots import latest as any_latest
from .roots import publications as any_publications


def _usage(name: str, dir_fd: int) -> tuple[int, float]:
    """(bytes on disk, newest mtime) of an entry and everything under it, never
    following a symlink. FileNotFoundError if the entry itself is gone. The mtimes
    counted are the files' and the empty folders': a folder's own mtime also moves
    when gc removes entries from it, which is not a write."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_blocks * 512, st.st_mtime
    size, newest = st.st_blocks * 512, 0.0
    fd = open_dir(name, dir_fd=dir_fd)
    try:
        entries = os.listdir(fd)
        for e in entries:
            try:
                s, n = _usage(e, fd)
            except FileNotFoundError:
                continue
            size, newest = size + s, max(newest, n)
    finally:
        os.close(fd)
    return size, newest if entries else st.st_mtime


def _listing(root: str, root_fd: int, name: str) -> list[str]:
    fd = open_entry(root, root_fd, name)
    if fd is None:
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def pins(root: str, root_fd: int) -> set[str]:
    where = f"{root}/{layout.PINNED}"
    return {names.parse_path_name(e, where) for e in _listing(root, root_fd, layout.PINNED)}


def _measure(save: Save, root_fd: int) -> None:
    try:
        parent = walk(save.path, root_fd)
    except FileNotFoundError:
        return
    except OSError as e:
        if in_the_way(e):
            save.problem = "a component of its path is a symlink or not a folder: never followed"
            return
        raise
    try:
        save.size, _ = _usage(save.path.rsplit("/", 1)[-1], parent[-1])
        save.exists = True
    except FileNotFoundError:
        pass
    finally:
        for fd in parent[1:]:
            os.close(fd)


def _exec_folders(root: str, root_fd: int, saves: dict[str, Save], pattern: re.Pattern,
                  empty: set[str]) -> dict[str, float]:
    """Each exec folder's newest mtime; adds its unpublished leftovers to ``saves`` and
    the empty folders to ``empty``. A folder that is not an attempt token, or is a
    symlink, is left alone."""
    newest: dict[str, float] = {}
    exec_fd = open_entry(root, root_fd, layout.EXEC)
    if exec_fd is None:
        return newest
    known = {"/".join(p.split("/")[:3]) for p in saves}  # exec/<attempt>/<entry> holding a known save
    limit = os.fpathconf(root_fd, "PC_NAME_MAX")
    try:
        for attempt in os.listdir(exec_fd):
            epoch = names.attempt_epoch(attempt)
            try:
                if epoch is None or not stat.S_ISDIR(os.stat(attempt, dir_fd=exec_fd, follow_symlinks=False).st_mode):
                    continue
                fd = open_dir(attempt, dir_fd=exec_fd)
            except FileNotFoundError:  # removed by another gc meanwhile
                continue
            try:
                newest[attempt] = _usage(".", fd)[1]
                entries = os.listdir(fd)
                if not entries:
                    empty.add(attempt)
                for e in entries:
                    step, rel = leftover_step(e, pattern), f"{layout.EXEC}/{attempt}/{e}"
                    if step is not None and rel not in known and _is_dir(e, fd):
                        s = saves[rel] = Save(rel, attempt, step=step)
                        if len(names.encode(epoch, s.step, rel)) > limit:
                            s.problem = "its retired/ name would be over the filesystem's limit: left alone"
            finally:
                os.close(fd)
    finally:
        os.close(exec_fd)
    return newest


def _is_dir(name: str, dir_fd: int) -> bool:
    """A real folder (not a symlink to one); False when it is gone meanwhile."""
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def scan(root: str, pattern: str = names.STEP_PATTERN) -> Inventory:
    """What is under the root: every publication, retired marker, pin, leftover and
    exec folder, with sizes (bytes on disk; on S3 bytes stored) and the newest mtimes."""
    if is_s3(root):
        return s3_retention.scan(root, pattern)
    pubs = publications(root)
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        marks = _listing(root, root_fd, layout.RETIRED)
        saves = known_saves(pubs, marks, f"{root}/{layout.RETIRED}")
        by_person = _by_person(root, root_fd, marks)
        empty: set[str] = set()
        newest = _exec_folders(root, root_fd, saves, re.compile(pattern), empty)
        for s in saves.values():
            _measure(s, root_fd)
        retired = {n for s in saves.values() for n in s.retired}
        return Inventory(protocol.latest_of(pubs, retired, by_person), saves, newest, retired,
                         pins(root, root_fd), empty, by_person)


def _by_person(root: str, root_fd: int, marks: list[str]) -> dict[str, dict]:
    """The retired/ markers a person made (not empty: gc's are), with who and why."""
    if not marks:
        return {}
    out = {}
    fd = open_entry(root, root_fd, layout.RETIRED)
    try:
        for name in marks:
            try:
                f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                continue
            with os.fdopen(f, "rb") as fh:
                who = retired_by(fh.read(4096))
            if who is not None:
                out[name] = who
    finally:
        os.close(fd)
    return out


def _rmdir(name: str, dir_fd: int) -> bool:
    """Remove an empty folder; False when it is not empty (or already gone)."""
    try:
        os.rmdir(name, dir_fd=dir_fd)
        return True
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            return False
        raise


def _remove(path: str, root_fd: int) -> int:
    """Remove the save, then its folders up to exec/<attempt> while they are empty."""
    parts = path.split("/")
    try:
        fds = walk(path, root_fd)
    except FileNotFoundError:
        return 0
    try:
        freed = remove_tree(parts[-1], fds[-1])
        for i in range(len(parts) - 2, 0, -1):  # parts[i] lives in fds[i]; never exec/ itself
            if not _rmdir(parts[i], fds[i]):
                break
        return freed
    finally:
        for fd in fds[1:]:
            os.close(fd)


class _Posix:
    """gc's reads and writes on a POSIX root, all through the root's fd (never a path a
    symlink could redirect); only under a root the user owns."""

    def __init__(self, root: str, fds: DirFds):
        self.root, self.fds, self.fd = root, fds, fds.add(open_root(root))
        check_owner(root, self.fd)  # removing under a root someone else controls is never ours to do

    def retire(self, marks: list[str]) -> None:
        """Create every retired/ entry (one an earlier, killed gc made is fine), durably;
        and fsync pub/ first: the latest gc kept may be a publication whose publisher has
        not fsynced pub/ yet, and a crash that lost it while gc's removals stayed would
        bring back as the latest an older publication whose save gc removed (found by the
        model, tests/model/protocol.pml)."""
        pub = open_entry(self.root, self.fd, layout.PUB)
        if pub is not None:
            os.fsync(self.fds.add(pub))
        fd = self.fds.add(open_entry(self.root, self.fd, layout.RETIRED, create=True))
        for name in marks:
            try:
                create_new(name, fd)
            except FileExistsError:
                pass
        os.fsync(self.fd)

    def pins(self) -> set[str]:
        return pins(self.root, self.fd)

    def remove(self, path: str) -> int:
        return _remove(path, self.fd)

    def drop_empty(self, attempts: list[str]) -> None:
        if attempts:
            exec_fd = self.fds.add(open_dir(layout.EXEC, dir_fd=self.fd))
            for attempt in attempts:
                _rmdir(attempt, exec_fd)


@contextmanager
def _store(root: str) -> Iterator:
    """The store's gc operations on ``root`` (retire, pins, remove, drop_empty)."""
    if is_s3(root):
        yield s3_retention.Gc(root)
        return
    with DirFds() as fds:
        yield _Posix(root, fds)


def collect(root: str, policy: Policy, ceased: Mapping[str, tuple[bool, str]], *, dry_run: bool = False,
            now: Optional[float] = None) -> list[Verdict]:
    """Apply the policy to the root: every save's verdict, and what was freed. ``ceased``:
    attempt -> (ceased?, evidence); ``dry_run``: decide only."""
    now = time.time() if now is None else now
    inv = scan(root, policy.pattern)
    verdicts = decide(inv, policy, ceased, now)
    doomed = [v for v in verdicts if v.action == REMOVE]
    if dry_run:
        return verdicts
    with _store(root) as st:
        if doomed:
            st.retire([name for v in doomed for name in markers(v.save)])
            now_pinned, now_pubs = st.pins(), any_publications(root)
        for v in doomed:
            again = [p.name for p in now_pubs if p.path == v.save.path and p not in v.save.pubs]
            if pinned(v.save.path, now_pinned) or again:
                v.action = KEEP
                v.why = (f"published again meanwhile ({again[0]}): kept, its older publications retired"
                         if again else "pinned meanwhile: kept, its publications retired")
                continue
            v.freed = st.remove(v.save.path)
        st.drop_empty(empty_folders(inv, policy, ceased, now))
    return verdicts


def state(root: str, policy: Optional[Policy] = None, ceased: Optional[Mapping[str, tuple[bool, str]]] = None,
          now: Optional[float] = None) -> list[dict]:
    """The retention state of every save gc knows of, as JSON-able rows: ``state`` kept,
    reclaimable (a gc with this policy would remove it now) or retired (removed), with
    ``size`` (bytes on disk; on S3 bytes stored), ``why``, its publications and retired
    markers. Without a policy every published save counts as kept; without ``ceased``
    only what gc retired before is known to have ceased."""
    return scan_state(root, policy, ceased, now)[1]


def scan_state(root: str, policy: Optional[Policy] = None, ceased: Optional[Mapping[str, tuple[bool, str]]] = None,
               now: Optional[float] = None) -> tuple[Inventory, list[dict]]:
    """``state``, with the inventory it was decided from (``ls``: the latest, who retired what)."""
    policy = policy or Policy(min_age=0)
    inv = scan(root, policy.pattern)
    verdicts = decide(inv, policy, ceased or {}, time.time() if now is None else now)
    return inv, [v.as_dict(inv.latest) for v in verdicts]


def _person_marker(root: str, name: str, record: bytes) -> bytes | None:
    """Create ``retired/<name>`` holding ``record``, durably (O_EXCL, then the file,
    retired/ and the root fsynced); an existing empty marker (gc's, or a retire killed
    before it wrote) is filled instead, a person's left as it is. Returns the existing
    content of a person's marker, None if this call wrote the record."""
    if is_s3(root):
        return s3_retention.person_marker(root, name, record)
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        check_owner(root, root_fd)
        fd = fds.add(open_entry(root, root_fd, layout.RETIRED, create=True))
        try:
            create_new(name, fd, record)
        except FileExistsError:
            old = _fill(name, fd, record)
            if old:
                return old
        os.fsync(root_fd)
    return None


def _fill(name: str, dir_fd: int, record: bytes) -> bytes:
    """Write ``record`` into the empty marker ``name`` (gc makes them read-only: made
    writable for the write, read-only again after); its content if it was not empty."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadPath(f"{layout.RETIRED}/{name} is not a regular file (remove it)")
        old = os.read(fd, 4096)
        if old:
            return old
        os.fchmod(fd, st.st_mode | stat.S_IWUSR)
        w = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.write(w, record)
            os.fsync(w)
        finally:
            os.close(w)
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
    finally:
        os.close(fd)
    os.fsync(dir_fd)
    return b""


def _publication(root: str, target: str) -> str:
    """The publication name ``target`` names: the name, pub/<name>, or <root>/pub/<name>."""
    for prefix in (f"{root.rstrip('/')}/{layout.PUB}/", f"{layout.PUB}/"):
        if target.startswith(prefix):
            return target[len(prefix):]
    return target


def retire(root: str, target: str | None, reason: str, by: str, host: str) -> dict:
    """A person's retirement of one publication (``target``, or with None the one
    ``latest`` names, or a latest gc retired): ``retired/<name>`` holding who and why,
    so that ``latest`` skips it on purpose and gc removes its save once its execution has
    ceased; recorded as a ``retired`` event. pub/ is never touched. Returns what was
    retired, whether it already was (by whom), and the latest publication now."""
    pubs = any_publications(root)  # every entry parsed: a bad one is the first error
    names_ = {p.name: p for p in pubs}
    retired, by_person = retired_state(root)
    if target is None:
        name, _ = protocol.live_latest([p.name for p in pubs], retired, lambda n: n in by_person)
        if name is None:
            raise BadPath(f"nothing to retire: no publication under {root}/{layout.PUB} is left that "
                          "`dispatch-slurm latest` would name")
    else:
        name = _publication(root, target)
        if name not in names_:
            raise BadPath(f"{name!r} is not a publication of {root} (the names are in "
                          f"`dispatch-slurm ls {root} --json`; or retire the latest: --latest)")
    pub = names_[name]
    if name in by_person:
        old = by_person[name]
        return {"name": name, "step": pub.step, "path": pub.path, "already": old, "latest": any_latest(root)}
    old = _person_marker(root, name, retirement_record(by, reason, host))
    if old is not None:  # a person retired it meanwhile
        return {"name": name, "step": pub.step, "path": pub.path, "already": retired_by(old),
                "latest": any_latest(root)}
    events.record("retired", root=root, attempt="retire", name=name, step=pub.step, path=pub.path, by=by,
                  reason=reason, on=host, was_retired_by_gc=name in retired)
    return {"name": name, "step": pub.step, "path": pub.path, "already": None, "latest": any_latest(root)}


def retired_state(root: str) -> tuple[set[str], dict[str, dict]]:
    """Every retired/ name, and those a person retired (with who and why)."""
    if is_s3(root):
        return s3_retention.markers_state(root)
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        marks = _listing(root, root_fd, layout.RETIRED)
        return set(marks), _by_person(root, root_fd, marks)


def pin(root: str, save: str) -> tuple[str, bool]:
    """Pin ``save`` (a save or a folder of saves under the root) so gc never removes it;
    (its path under the root, whether the pin is new)."""
    if is_s3(root):
        return s3_retention.pin(root, save)
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        rel = save_relpath(root, root_fd, save)
        fd = fds.add(open_entry(root, root_fd, layout.PINNED, create=True))
        try:
            create_new(names.path_name(rel), fd)
        except FileExistsError:
            return rel, False
        os.fsync(root_fd)
    return rel, True


def unpin(root: str, save: str) -> tuple[str, bool]:
    """Drop the pin of ``save`` (which may be gone); (its path, whether a pin was there)."""
    if is_s3(root):
        return s3_retention.unpin(root, save)
    root_abs, save_abs = os.path.abspath(root).rstrip("/"), os.path.abspath(save)
    if not save_abs.startswith(root_abs + "/"):
        raise BadPath(f"{save} is not inside the checkpoint root {root}")
    rel = names.check_relpath(save_abs[len(root_abs) + 1:])
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        fd = open_entry(root, root_fd, layout.PINNED)
        if fd is None:
            return rel, False
        fds.add(fd)
        try:
            os.unlink(names.path_name(rel), dir_fd=fd)
        except FileNotFoundError:
            return rel, False
        os.fsync(fd)
    return rel, True


@contextmanager
def adopting(root: str, root_fd: int, rel: str) -> Iterator[None]:
    """Around the publication of another execution's save: pin it, refuse it if gc has
    retired it, unpin it once published (protocol.adopting)."""
    name = names.path_name(rel)
    fd = open_entry(root, root_fd, layout.PINNED, create=True)

    def pin() -> bool:
        try:
            create_new(name, fd)
            return True
        except FileExistsError:
            return False  # pinned by a person: it stays pinned
    try:
        with protocol.adopting(rel, pin, lambda: _listing(root, root_fd, layout.RETIRED),
                               lambda: os.unlink(name, dir_fd=fd), f"{root}/{layout.RETIRED}"):
            yield
    finally:
        os.close(fd)


__all__ = ["Policy", "scan", "collect", "state", "pin", "unpin", "adopting", "pins", "retire", "retired_state"]
