"""The store interface: everything a layer above does with a checkpoint root, as the
methods of one object that ``store.at(root)`` (roots.py, the one chooser) picks from the
root. A store implements the primitives (list, read, create and delete a protocol
folder's entries; check, sync and measure a save; append events; remove a save); the
protocol over them (which publication ``latest`` names, how N is allocated, how gc
retires before it removes, an adopter's pin) is written here once, for every store
(protocol.py holds its pure rules). A new store is one module implementing the
primitives and one line in the chooser.

The POSIX store (posix.py) works through directory file descriptors and fsyncs; the S3
store (s3.py) through conditional PUTs, which are durable when they return."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

from ..contract import layout, names
from ..contract.names import Publication
from ..errors import BadPath, StoreError
from . import inventory, protocol
from .inventory import Folder, Inventory

if TYPE_CHECKING:
    from .durable import Linker


class SaveMoved(StoreError):
    """A save changed (its older execution's rotation removed it) while it was being copied."""


class Store:
    """One checkpoint root on one kind of store. ``kind`` names it in messages (``mv``: its
    command that moves an entry, for the fixes messages name); ``local``:
    the root's files are files of this host (inotify, probe records); ``appendable``: an
    entry can be appended to in place (the supervisor's record needs it)."""

    kind = "?"
    local = False
    appendable = False
    mv = "mv"  # the command that moves an entry out of the way (a stray file in pub/)

    def __init__(self, root: str):
        self.root = root

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

    def where(self, folder: str, name: str | None = None) -> str:
        """``<root>/<folder>[/<name>]``, for messages."""
        return f"{self.root}/{folder}" + (f"/{name}" if name is not None else "")

    @classmethod
    def absolute(cls, value: str, from_env: bool) -> str:
        """A root as a command line or $DISPATCH_CHECKPOINT (``from_env``) names it, in the
        one form every command prints and records."""
        raise NotImplementedError

    # -- primitives: each store implements these ----------------------------------------

    def __enter__(self) -> "Store":
        """A session: the POSIX store holds one fd of the root for every call inside it, so
        a publish checks, syncs and creates under the very folder it looked at."""
        return self

    def __exit__(self, *exc) -> None:
        pass

    def reachable(self) -> None:
        """Ask a remote store once whether the root answers (the bucket exists, the
        credentials work), so that a problem there is said as such, not as a missing entry."""

    def listing(self, folder: str) -> list[str]:
        """Every entry of the protocol folder ``folder`` (pub/, sub/, retired/...); [] when
        it does not exist."""
        raise NotImplementedError

    def read(self, folder: str, name: str, limit: int = 1 << 20) -> Optional[bytes]:
        """The content of ``folder/name`` (at most ``limit`` bytes), None when it does not
        exist; never through a symlink."""
        raise NotImplementedError

    def has(self, folder: str, name: str) -> bool:
        return self.read(folder, name, 0) is not None

    def identity(self, folder: str, name: str) -> tuple[int, ...] | None:
        """What tells this very entry from one made again under its name (POSIX: device,
        inode, ctime), never through a symlink; None when it does not exist or the store
        cannot tell (S3): a caller that remembers an entry by it then reads it again."""
        return None

    def create(self, folder: str, name: str, body: bytes = b"", mode: int = 0o444, sync_root: bool = True) -> bool:
        """Create ``folder/name`` with ``body`` only if it does not exist (O_EXCL; on S3 a PUT
        with If-None-Match: *): True if this call created it. Durable on return; with
        ``sync_root=False`` (many entries in a row) once the caller's ``flush("")`` returns."""
        raise NotImplementedError

    def delete(self, folder: str, name: str) -> bool:
        """Remove ``folder/name``; False when it was not there."""
        raise NotImplementedError

    def fill_empty(self, folder: str, name: str, body: bytes) -> bytes:
        """Write ``body`` into the existing, empty entry ``folder/name`` and return b""; its
        content, unchanged, when it is not empty."""
        raise NotImplementedError

    def too_long(self, folder: str, name: str) -> Optional[str]:
        """Why ``folder/name`` cannot be created (over the store's limit on names), or None."""
        raise NotImplementedError

    def flush(self, folder: str) -> None:
        """Make what ``folder`` lists durable (POSIX: fsync it, "" the root; S3: nothing to do)."""

    def owned(self) -> None:
        """Refuse a root this user does not own (POSIX); S3 has no owner to check."""

    def warm(self) -> None:
        """Load now what the first call would (S3: boto3 and a client), so nothing is
        imported later inside a signal handler."""

    # the saves
    def save_relpath(self, save) -> str:
        """The save's canonical path under the root; BadPath when it is outside the root,
        missing, or (POSIX) reached through a symlink."""
        raise NotImplementedError

    def relpath(self, save) -> str:
        """``save``'s path under the root, lexically (it need not exist)."""
        raise NotImplementedError

    def save_exists(self, rel: str) -> bool:
        raise NotImplementedError

    def realpath(self, rel: str) -> Optional[str]:
        """The real path of the save ``rel`` as this host names it (POSIX: symlinks of the
        root resolved), when the store knows it cheaply; None otherwise."""
        return None

    def hold(self, rel: str, attempt: str, name: str) -> tuple[Optional[str], Optional[str]]:
        """A private copy of the published save ``rel`` (publication ``name``) for execution
        ``attempt`` to load, which no other execution can remove under it (``layout.RESUMES``):
        (its path under the root, None) or (None, why the store makes none: the caller loads
        ``rel`` itself). SaveMoved when the save changed while it was copied."""
        return None, f"a {self.kind} store keeps no copies"

    def place(self, rel: str, attempt: str, name: str, where: str) -> tuple[Optional[str], Optional[Linker]]:
        """``hold``'s copy of the published save ``rel`` for execution ``attempt``, under
        ``exec/<attempt>/<where>`` (the view: where its trainer looks for it): (None when it is
        in place, made now or by another maker, or why none was made; what was made, as a
        Linker counts it). SaveMoved when the save changed while it was copied."""
        return f"a {self.kind} store makes no copies: the view needs a POSIX root", None

    def write_new(self, rel: str, data: bytes) -> bool:
        """A small file ``rel`` in an execution's folder (the view's pointer file, its record),
        whole when it appears, never written over one that is there: whether this call made it."""
        raise StoreError(f"a {self.kind} store has no view: it needs a POSIX root")

    def keep(self, rel: str, name: str) -> tuple[Optional[str], list[str]]:
        """The publication ``name``'s own reference to the files of the save ``rel``
        (``layout.HELD``: copies.py), durable on return, so that nothing but gc can take the
        save a publication names: (None, or why the store keeps none; the files a write can
        still reach, another user's). SaveMoved when the save changed while it was linked."""
        return f"a {self.kind} store keeps no reference of its own to a published save", []

    def release(self, epoch: int, step: int) -> None:
        """Drop the references of the publications at ``epoch`` below ``step``: this newer
        save of the same execution supersedes them."""

    def located(self, pub: Publication) -> Optional[str]:
        """Where the publication's save is under the root: its own path while it exists, else
        the publication's reference to it; None when neither is there."""
        return pub.path if self.save_exists(pub.path) else None

    def sync(self, save) -> None:
        """Make a save's data durable without publishing it (POSIX: fsync its files and
        folders; S3: nothing, its PUTs were durable when they returned)."""

    def sync_save(self, rel: str, save, fsync: bool = True) -> None:
        """``sync``, for a save already checked (``rel``), refusing (TornSave) a save holding a
        file that is not whole (store/whole.py); ``fsync=False``: that check alone. S3: nothing
        to do, an object is whole once it is visible at all."""

    def publication_fits(self, name: str, rel: str) -> None:
        """Refuse a publication name (of the save ``rel``) over the store's limit, naming the
        limit and the fix, before anything is created."""
        raise NotImplementedError

    def create_publication(self, name: str) -> bool:
        """Create ``pub/<name>`` and make it durable; True if created now. An entry that
        already exists is made durable all the same (a retry confirms what a failed fsync
        could not)."""
        raise NotImplementedError

    def published_at(self, name: str) -> Optional[float]:
        """When ``pub/<name>`` was created, where the store keeps that (None: ask the events)."""
        return None

    def make_exec_dir(self, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
        """``<root>/exec/<attempt>``, made for this user (``create_root``: an array task's root
        under the job's root, made too)."""
        raise NotImplementedError

    def root_missing(self) -> bool:
        """The root itself does not exist yet (an array task's, made with its exec folder)."""
        return False

    # events
    def add_event(self, name: str, line: bytes) -> None:
        """Add one event line to this process's events (``name``: its file, without .jsonl)."""
        raise NotImplementedError

    def event_files(self, prefix: str = "") -> list[tuple[str, bytes]]:
        """(name, content) of every events file whose name starts with ``prefix``, in name order."""
        raise NotImplementedError

    # gc
    def inventory(self, pattern: str = names.STEP_PATTERN) -> inventory.Inventory:
        """What is under the root (inventory.py), with sizes: bytes on disk, on S3 bytes stored."""
        raise NotImplementedError

    def remove(self, rel: str, held: tuple[str, ...] = ()) -> int:
        """Remove a save (all of it, never through a symlink) and the references its
        publications ``held`` keep of it; the bytes freed."""
        raise NotImplementedError

    def drop_empty(self, attempts: list[str]) -> None:
        """Remove these executions' exec folders if they are empty (S3: there are no folders)."""

    # an execution's folder, as watch sees it (paths are the store's: a path or a URL)
    def entries(self, folder: str) -> Iterator[tuple[str, bool]]:
        """(name, is a folder) of each entry one level under ``folder``."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        """Whether ``path`` itself exists (a marker file)."""
        raise NotImplementedError

    def read_path(self, path: str) -> Optional[bytes]:
        raise NotImplementedError

    def present(self, path: str) -> bool:
        """Whether a save (a file, or a folder with something in it) is at ``path``."""
        raise NotImplementedError

    # one entry appended to in place (the supervisor's record): appendable stores only
    def read_all(self, name: str) -> bytes:
        """The whole entry ``name`` under the root (b"" when absent: a store that cannot
        append holds no such entry)."""
        return b""

    def append(self, name: str, data: bytes) -> None:
        raise self.not_appendable("appending")

    def truncate(self, name: str, length: int) -> None:
        raise self.not_appendable("truncating")

    def mtime(self, folder: str, name: str) -> Optional[float]:
        """When ``folder/name`` was last touched (a heartbeat); None when it does not exist."""
        raise self.not_appendable("a heartbeat")

    def touch(self, folder: str, name: str) -> None:
        raise self.not_appendable("a heartbeat")

    def not_appendable(self, what: str, why: str = "") -> StoreError:
        return StoreError(f"checkpoint root {self.root}: {what} needs a POSIX root{f' ({why})' if why else ''}; "
                          f"{self.kind} roots serve every command but the supervisor's (run, plan, supersede, "
                          "release, stop)")

    # -- the protocol, written once -----------------------------------------------------

    def publications(self) -> list[Publication]:
        """All publications, ordered by (epoch, step), ties broken by name."""
        return protocol.publications(self.listing(layout.PUB), self.where(layout.PUB), self.mv)

    def latest(self) -> Optional[Publication]:
        """The publication with the greatest (epoch, step) a person has not retired, or
        None; a latest gc retired is an error (protocol.latest)."""
        return protocol.latest(self)

    def allocate_submission(self) -> int:
        """The next submission number N under ``sub/``, lock-free: max+1 created if absent,
        else the next (protocol.allocate); durable before N is used (a lost entry could hand
        one N, hence one epoch, to two submissions). Only under a root the user owns."""
        with self:
            self.owned()
            return protocol.allocate(self)

    def pins(self) -> set[str]:
        where = self.where(layout.PINNED)
        return {names.parse_path_name(e, where) for e in self.listing(layout.PINNED)}

    def pin(self, save) -> tuple[str, bool]:
        """Pin ``save`` (a save or a folder of saves under the root) so gc never removes it;
        (its path under the root, whether the pin is new)."""
        with self:
            rel = self.save_relpath(save)
            return rel, self.create(layout.PINNED, names.path_name(rel))

    def unpin(self, save) -> tuple[str, bool]:
        """Drop the pin of ``save`` (which may be gone); (its path, whether a pin was there)."""
        rel = self.relpath(save)
        return rel, self.delete(layout.PINNED, names.path_name(rel))

    def retire(self, marks: list[str]) -> None:
        """gc's markers, every one (one an earlier, killed gc made is fine), durably; and
        ``pub/`` made durable first: the latest gc kept may be a publication whose publisher
        has not fsynced ``pub/`` yet, and a crash that lost it while gc's removals stayed
        would bring back as the latest an older publication whose save gc removed (found by
        the model, tests/model/protocol.pml)."""
        with self:
            self.flush(layout.PUB)
            for name in marks:
                self.create(layout.RETIRED, name, sync_root=False)
            self.flush("")

    def retired_state(self) -> tuple[set[str], dict[str, dict]]:
        """Every retired/ name, and those a person retired (with who and why)."""
        with self:
            marks = self.listing(layout.RETIRED)
            return set(marks), self.by_person(marks)

    def by_person(self, marks: list[str]) -> dict[str, dict]:
        """The retired/ markers a person made (not empty: gc's are), with who and why."""
        found = ((name, inventory.retired_by(self.read(layout.RETIRED, name, 4096) or b"")) for name in marks)
        return {name: who for name, who in found if who is not None}

    def person_marker(self, name: str, record: bytes) -> Optional[bytes]:
        """Create ``retired/<name>`` holding ``record``, durably; an existing empty marker
        (gc's, or a retire killed before it wrote) is filled instead, a person's left as it
        is. The existing content of a person's marker, None if this call wrote the record."""
        with self:
            self.owned()
            if self.create(layout.RETIRED, name, record):
                return None
            return self.fill_empty(layout.RETIRED, name, record) or None

    def check_problems(self, inv: Inventory) -> None:
        """Saves gc could not retire (their marker's name over the store's limit): left alone."""
        for s in inv.saves.values():
            new = [p.name for p in s.pubs] if s.pubs or s.retired else inventory.markers(s)
            why = next((w for m in new if (w := self.too_long(layout.RETIRED, m))), None)
            if why and not s.problem:
                s.problem = why

    def finish_inventory(self, pubs: list[Publication], marks: list[str], folders: dict[str, Folder],
                         pattern: str, by_person: dict[str, dict], held: Iterable[str] = ()) -> Inventory:
        """The inventory from the listings every store makes: the saves pub/ and retired/
        name (and held/ links), the exec folders' leftovers, the latest, the pins; the caller
        measures sizes."""
        saves = inventory.known_saves(pubs, marks, self.where(layout.RETIRED), held)
        inventory.add_leftovers(saves, folders, re.compile(pattern))
        attempts = {a: f for a, f in folders.items() if names.attempt_epoch(a) is not None}
        retired = {n for s in saves.values() for n in s.retired}
        latest = protocol.vouched(self, protocol.latest_of(pubs, retired, by_person))  # gc keeps what it names
        return inventory.Inventory(latest, saves,
                                   {a: f.newest for a, f in attempts.items()}, retired, self.pins(),
                                   {a for a, f in attempts.items() if not f.entries}, by_person, folders)

    def check_attempt(self, attempt: str) -> None:
        if not attempt or "/" in attempt or attempt in (".", ".."):
            raise BadPath(f"attempt token {attempt!r} is not a single path component")

