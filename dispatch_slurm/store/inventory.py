"""What a root holds, as gc and the report see it: every save gc knows of (published,
retired, or an unpublished leftover of an exec folder) with its size, every exec folder
with its times and entries, the retired/ markers (and who made them), the pins. Each
store builds it its own way (``Store.inventory``); these types and the rules that name
things in it are shared, so the retention policy (dispatch_slurm/retention/) and the
report read one inventory whatever the store.

A retired/ marker's content says who retired the publication: gc's are empty; a person's
(``dispatch-slurm retire``) hold one JSON line saying who and why."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..contract import names
from ..contract.layout import EXEC, HELD, RESUMES
from ..contract.names import Publication


def retirement_record(user: str, reason: str, host: str, t: float | None = None) -> bytes:
    """The content of a person's ``retired/<name>`` marker: one JSON line."""
    rec = {"v": 1, "by": user, "reason": reason, "host": host, "t": time.time() if t is None else t}
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def retired_by(content: bytes) -> dict | None:
    """Who retired a publication, from its marker's content: None for gc (an empty
    marker), else the person's record (``by``, ``reason``, ``t``; a marker whose line
    does not parse is still a person's: gc never writes a byte)."""
    if not content:
        return None
    try:
        rec = json.loads(content.splitlines()[0])
    except (ValueError, IndexError):
        rec = None
    if not isinstance(rec, dict):
        return {"by": "a person", "reason": "(its record does not parse)", "t": None}
    return {"by": str(rec.get("by") or "a person"), "reason": str(rec.get("reason") or ""), "t": rec.get("t")}


@dataclass
class Save:
    """A save gc knows of: published (``pubs``), retired (``retired``: marker names) or an
    unpublished leftover (neither; ``step`` from the save pattern)."""

    path: str
    attempt: Optional[str]
    pubs: list[Publication] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    size: int = 0
    exists: bool = False
    step: Optional[int] = None
    problem: Optional[str] = None  # why it cannot be touched (a symlink in the way)
    unfinished: bool = False  # a save ``saving()`` never finished (names.SAVING_PATTERN)
    copy: bool = False  # the execution's copies of the saves it resumed from (layout.RESUMES), or held/ links no
    # publication names (a publish killed before its publication)
    held: list[str] = field(default_factory=list)  # its publications whose held/ links exist (layout.HELD)
    held_only: bool = False  # its own path is gone, its publication's held links are there (``exists``)

    @property
    def location(self) -> str:
        """Where its bytes are: its own path while it exists, else its publication's held links."""
        return f"{HELD}/{self.held[0]}" if self.held_only else self.path


@dataclass
class Folder:
    """One folder under exec/ (an execution's, when named by an attempt token): ``first`` and
    ``last``, the oldest and newest time of anything in it (folders' own times too: the
    report's "last write"); ``newest``, the newest time of its files and empty folders (a
    folder's own time also moves when gc removes from it, which is not a write: gc's "still
    being written"); ``entries``, its top-level names -> whether each is a folder (on S3:
    has objects under it)."""

    first: Optional[float] = None
    last: Optional[float] = None
    newest: float = 0.0
    entries: dict[str, bool] = field(default_factory=dict)
    placed: set[str] = field(default_factory=set)  # what the view's prepare placed there (a copy, layout.VIEW)


@dataclass
class Inventory:
    latest: Optional[Publication]
    saves: dict[str, Save]
    newest: dict[str, float]  # attempt -> newest mtime in its exec folder
    retired: set[str]         # every name in retired/
    pins: set[str]            # every pinned path
    empty: set[str] = field(default_factory=set)  # attempts whose exec folder is empty
    by_person: dict[str, dict] = field(default_factory=dict)  # retired/ names a person retired -> retired_by()
    folders: dict[str, Folder] = field(default_factory=dict)  # every folder under exec/ (the report's executions)


def attempt_of(path: str) -> Optional[str]:
    """The execution whose folder holds ``path`` (exec/<attempt>/...), or None."""
    parts = path.split("/")
    return parts[1] if parts[0] == EXEC and len(parts) > 2 else None


def known_saves(pubs: Iterable[Publication], retired: Iterable[str], where: str,
                held: Iterable[str] = ()) -> dict[str, Save]:
    """The saves pub/ and retired/ name (a store's listings of both, and of held/), before
    the store adds its leftovers and measures them. held/ links no publication names (a
    publish killed between the two) are a copy of their execution's, gc's once it ceased."""
    saves: dict[str, Save] = {}
    held = set(held)
    for p in pubs:
        s = saves.setdefault(p.path, Save(p.path, attempt_of(p.path)))
        s.pubs.append(p)
        if p.name in held:
            s.held.append(p.name)
    named = {p.name for p in pubs}
    for entry in sorted(held):
        name = entry.lstrip(".").split(".", 1)[0]
        if entry not in named and (pub := _parsed(name)) is not None:
            saves[f"{HELD}/{entry}"] = Save(f"{HELD}/{entry}", attempt_of(pub.path), copy=True)
    for name in sorted(retired):
        r = names.parse(name, where)
        saves.setdefault(r.path, Save(r.path, attempt_of(r.path), step=r.step)).retired.append(name)
    return saves


def _parsed(name: str) -> Optional[Publication]:
    try:
        return names.parse(name)
    except ValueError:
        return None  # not a publication's name: not ours to remove


_SAVING = re.compile(names.SAVING_PATTERN)


def leftover_step(entry: str, pattern: re.Pattern) -> Optional[int]:
    """The step of an exec folder's entry named like a save (``pattern``'s group), or None."""
    m = pattern.fullmatch(entry)
    return int(m[1]) if m and m[1].isdigit() else None


def add_leftovers(saves: dict[str, Save], folders: dict[str, Folder], pattern: re.Pattern) -> None:
    """The unpublished leftovers: entries of an execution's folder named like a save, or
    like a save ``saving()`` never finished, that are folders (a file is no save to collect)
    and hold no known save; and its copies of what it resumed from (its folder of resume
    copies, the save the view placed)."""
    known = {"/".join(p.split("/")[:3]) for p in saves}  # exec/<attempt>/<entry> holding a known save
    for attempt, f in folders.items():
        if names.attempt_epoch(attempt) is None:
            continue  # not an execution's folder: left alone
        for entry, is_dir in f.entries.items():
            rel = f"{EXEC}/{attempt}/{entry}"
            if not is_dir or rel in known:
                continue
            step = leftover_step(entry, pattern)
            if entry == RESUMES or entry in f.placed:
                saves[rel] = Save(rel, attempt, copy=True)
            elif step is not None:
                saves[rel] = Save(rel, attempt, step=step)
            elif (m := _SAVING.fullmatch(entry)) is not None:
                saves[rel] = Save(rel, attempt, step=int(m[1]), unfinished=True)


def markers(s: Save) -> list[str]:
    """The retired/ names that retire save ``s``: its publications', or for a leftover
    the name it would have had (its execution's epoch, its step)."""
    if s.pubs:
        return [p.name for p in s.pubs]
    if s.copy:
        return []  # nothing names a copy: nothing to retire before it goes
    epoch = names.attempt_epoch(s.attempt) if s.attempt is not None else None
    if epoch is None or s.step is None:  # only leftovers are unpublished, and they have both
        raise ValueError(f"{s.path}: neither published nor an execution's leftover save")
    return [names.encode(epoch, s.step, s.path)]
