"""gc on an S3 root: the inventory from listings, and retiring, pinning and removing
with S3's primitives, in the order store/retention.py sets for both stores.

The inventory is one listing each of pub/, retired/, pinned/ and exec/ (paginated to
the end): a save's size is the sum of its objects' sizes, an execution's newest write
the newest LastModified under ``exec/<attempt>/``, and an unpublished leftover an entry
one level under it, named like a save, with objects under it (a folder save). A retired
marker is a zero-byte PUT with If-None-Match: * (durable when it returns), made before
any object of its save is deleted; a save is removed with DeleteObjects, 1000 keys a
request, every key under ``<save>/`` and the object ``<save>`` itself (a file save).
S3 has no folders, so there are no empty ones to remove, and no symlinks to refuse."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

from ..contract import layout, names
from ..contract.retention import Inventory, Save, known_saves, leftover_step, markers, retired_by
from ..errors import BadPath, StoreError
from . import protocol, s3

_BATCH = 1000  # DeleteObjects' limit on keys per request


def _usage(root: str, saves: dict[str, Save], pattern: re.Pattern) -> dict[str, float]:
    """Each execution's newest LastModified; adds sizes (every prefix of every object
    under exec/ sums its sizes) and the unpublished leftovers to ``saves``."""
    newest: dict[str, float] = {}
    size: dict[str, int] = {}
    known = {"/".join(p.split("/")[:3]) for p in saves}  # exec/<attempt>/<entry> holding a known save
    for name, o in s3.walk(root, layout.EXEC):
        parts = name.split("/")
        attempt = parts[0]
        for i in range(2, len(parts) + 1):
            rel = "/".join([layout.EXEC, *parts[:i]])
            size[rel] = size.get(rel, 0) + o["Size"]
        if len(parts) < 2 or names.attempt_epoch(attempt) is None:
            continue  # not an execution's folder: no leftovers there, as on POSIX
        newest[attempt] = max(newest.get(attempt, 0.0), o["LastModified"].timestamp())
        rel, step = f"{layout.EXEC}/{attempt}/{parts[1]}", leftover_step(parts[1], pattern)
        if len(parts) > 2 and step is not None and rel not in known and rel not in saves:
            saves[rel] = Save(rel, attempt, step=step)
    for s in saves.values():
        if s.path in size:
            s.size, s.exists = size[s.path], True
        elif s.attempt is None:  # outside exec/: gc keeps it; measured for --keep-last's count
            s.exists = s3.present(f"{root}/{s.path}")
    return newest


def scan(root: str, pattern: str = names.STEP_PATTERN) -> Inventory:
    """store/retention.scan on an S3 root."""
    pubs = s3.publications(root)
    listed = list(s3.walk(root, layout.RETIRED))
    retired = [name for name, _ in listed]
    saves = known_saves(pubs, retired, f"{root}/{layout.RETIRED}")
    by_person = _by_person(root, listed)
    newest = _usage(root, saves, re.compile(pattern))
    prefix = s3.split(root)[1]
    for s in saves.values():
        new = [p.name for p in s.pubs] if s.pubs or s.retired else markers(s)  # the markers gc may PUT
        if any(len(f"{prefix}{layout.RETIRED}/{m}".encode()) > s3.KEY_MAX for m in new):
            s.problem = f"its {layout.RETIRED}/ key would be over S3's limit of {s3.KEY_MAX} bytes: left alone"
    return Inventory(protocol.latest_of(pubs, set(retired), by_person), saves, newest, set(retired),
                     pins(root), set(), by_person)


def _by_person(root: str, listed: list[tuple[str, dict]]) -> dict[str, dict]:
    """The retired/ markers a person made, with who and why: gc's are empty, so only
    the others are read."""
    return {name: who for name, o in listed if o["Size"]
            for who in [retired_by(s3.read(f"{root}/{layout.RETIRED}/{name}") or b"")] if who is not None}


def markers_state(root: str) -> tuple[set[str], dict[str, dict]]:
    """Every retired/ name, and those a person retired."""
    listed = list(s3.walk(root, layout.RETIRED))
    return {name for name, _ in listed}, _by_person(root, listed)


def person_marker(root: str, name: str, record: bytes) -> bytes | None:
    """store/retention._person_marker on S3: a conditional PUT with the record; over an
    existing empty marker (gc's) a plain PUT (only a person's retire writes content, and
    gc's conditional PUT of an existing marker changes nothing). The existing content of
    a person's marker, or None if this call wrote the record."""
    bucket, prefix = s3.split(root)
    key, url = f"{prefix}{layout.RETIRED}/{name}", f"{root}/{layout.RETIRED}/{name}"
    if s3.create_new(bucket, key, f"{root}/{layout.RETIRED}", body=record):
        return None
    old = s3.read(url)
    if old:
        return old
    with s3.errors(url):
        s3.client().put_object(Bucket=bucket, Key=key, Body=record)
    return None


def pins(root: str) -> set[str]:
    where = f"{root}/{layout.PINNED}"
    return {names.parse_path_name(e, where) for e in s3.list_names(root, layout.PINNED)}


def delete(bucket: str, keys: list[str], where: str) -> None:
    """DeleteObjects, ``_BATCH`` keys a request; a key S3 could not delete is an error."""
    c = s3.client()
    for i in range(0, len(keys), _BATCH):
        with s3.errors(where):
            out = c.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + _BATCH]],
                                                          "Quiet": True})
        if out.get("Errors"):
            e = out["Errors"][0]
            raise StoreError(f"{where}: {len(out['Errors'])} object(s) not deleted, e.g. {e.get('Key')}: "
                             f"{e.get('Code')} ({e.get('Message', '')})")


class Gc:
    """The S3 store's side of store/retention.collect."""

    def __init__(self, root: str):
        self.root = root
        self.bucket, self.prefix = s3.split(root)

    def retire(self, marks: list[str]) -> None:
        """PUT every retired/ marker if absent (one an earlier, killed gc made is fine)."""
        for name in marks:
            s3.create_new(self.bucket, f"{self.prefix}{layout.RETIRED}/{name}", f"{self.root}/{layout.RETIRED}")

    def pins(self) -> set[str]:
        return pins(self.root)

    def remove(self, path: str) -> int:
        """Delete every object of the save; the bytes freed."""
        url = f"{self.root}/{path}"
        objs = [o for _, o in s3.walk(self.root, path)] + [o for o in [s3.stat(url)] if o]
        delete(self.bucket, [o["Key"] for o in objs], url)
        return sum(o["Size"] for o in objs)

    def drop_empty(self, attempts: list[str]) -> None:
        """S3 has no folders: an execution's prefix is gone with its last object."""


def pin(root: str, save: str) -> tuple[str, bool]:
    """store/retention.pin on an S3 root."""
    rel = s3.save_relpath(root, save)
    bucket, prefix = s3.split(root)
    return rel, s3.create_new(bucket, f"{prefix}{layout.PINNED}/{names.path_name(rel)}", f"{root}/{layout.PINNED}")


def unpin(root: str, save: str) -> tuple[str, bool]:
    """store/retention.unpin on an S3 root."""
    save = save.rstrip("/")
    if not save.startswith(f"{root}/"):
        raise BadPath(f"{save} is not inside the checkpoint root {root}")
    rel = names.check_relpath(save[len(root) + 1:])
    (bucket, prefix), name = s3.split(root), names.path_name(rel)
    url = f"{root}/{layout.PINNED}/{name}"
    if not s3.object_exists(url):
        return rel, False
    delete(bucket, [f"{prefix}{layout.PINNED}/{name}"], url)
    return rel, True


@contextmanager
def adopting(root: str, rel: str) -> Iterator[None]:
    """Around the publication of another execution's save on S3 (protocol.adopting)."""
    bucket, prefix = s3.split(root)
    key = f"{prefix}{layout.PINNED}/{names.path_name(rel)}"
    with protocol.adopting(rel, lambda: s3.create_new(bucket, key, f"{root}/{layout.PINNED}"),
                           lambda: s3.list_names(root, layout.RETIRED),
                           lambda: delete(bucket, [key], f"{root}/{layout.PINNED}"), f"{root}/{layout.RETIRED}"):
        yield
