"""The protocol over a listing, whichever store listed it: the POSIX store (posix.py)
and the S3 store (s3.py) list ``pub/`` and ``sub/`` their own way and hand the names
here, so the rules (every entry parsed, a bad one an error naming it and the fix, the
latest the greatest name not retired (a person's retirement skipped on purpose, gc's
an error), N allocated by create-if-absent, an adopter's pin before its look at
retired/) exist once."""

import shlex
from collections.abc import Callable, Container, Iterable
from contextlib import contextmanager
from typing import Iterator

from ..contract import layout, names
from ..contract.names import Publication
from ..errors import BadName, BadPath, DispatchError, StoreError


def checked(entries: list[str], where: str, mv: str = "mv") -> list[str]:
    """Every entry of ``pub/``, all validated; the first bad one (in name order) raises,
    naming the entry and the fix (a stray file: move it out of pub/ with ``mv``, the store's
    command that moves an entry)."""
    if not names.all_valid(entries):
        for entry in sorted(entries):
            try:
                names.parse(entry, where)
            except BadName as e:
                raise BadName(e.name, f"{e.reason}. {layout.PUB}/ holds only publications and nothing reads this "
                              f"root while it holds another entry: move the entry out of {layout.PUB}/ "
                              f"({mv} {_quoted(f'{where}/{entry}')} <a folder outside {layout.PUB}/>), then run the "
                              "command again", where) from None
        raise DispatchError(f"{where}: bulk and per-entry validation disagree (a bug; please report)")
    return entries


def _quoted(path: str) -> str:
    """``path``, printable and quoted for a shell."""
    return shlex.quote(path.encode('utf-8', 'backslashreplace').decode())


def publications(entries: list[str], where: str, mv: str = "mv") -> list[Publication]:
    """All publications, ordered by (epoch, step), ties broken by name."""
    return [names.parse(e, where) for e in sorted(checked(entries, where, mv))]


def live_latest(ordered: list[str], retired: Container[str], by_person: Callable[[str], bool]) -> tuple[str | None, bool]:
    """The name ``latest`` gives, over publication names in order, and whether it is a
    latest gc retired (an error for ``latest``; gc keeps its save). The greatest name,
    unless retired: retired by a person (``dispatch-slurm retire``: ``by_person``), it is
    skipped on purpose, and so is every retired one below it, down to the greatest that
    is not retired (None if none is left); retired by gc, it is returned as is, flagged."""
    if not ordered:
        return None, False
    top = ordered[-1]
    if top not in retired:
        return top, False
    if not by_person(top):
        return top, True
    return next((n for n in reversed(ordered) if n not in retired), None), False


def latest_of(pubs: list[Publication], retired: Container[str], by_person: Container[str]) -> Publication | None:
    """``live_latest`` over parsed publications in order (gc's inventory, ``ls``): the
    publication ``latest`` names, or a latest gc retired (whose save gc keeps)."""
    name, _ = live_latest([p.name for p in pubs], retired, lambda n: n in by_person)
    return next((p for p in reversed(pubs) if p.name == name), None)


def latest(entries: list[str], root: str, marker: Callable[[str], bytes | None],
           retired: Callable[[], Iterable[str]], mv: str = "mv") -> Publication | None:
    """The publication with the greatest (epoch, step) that a person has not retired,
    or None if there is none.

    Every entry is parsed; fixed-width digits make the greatest name the latest, so
    the common case costs one look at ``retired/`` (``marker``: the content of
    ``retired/<name>``, None if absent). gc never retires the latest publication
    (retention/removal.py); one that is retired anyway by gc (an empty marker: a bug, or
    made by hand) is an error, never a save to resume from. A person's marker (it holds
    who and why) makes ``latest`` skip to the previous publication not retired (listed
    from ``retired``), on purpose (see ``live_latest``)."""
    where = f"{root}/{layout.PUB}"
    entries = checked(entries, where, mv)
    if not entries:
        return None
    top = max(entries)
    content = marker(top)
    if content is None:
        return names.parse(top, where)
    name, by_gc = live_latest(sorted(entries), set(retired()), lambda n: n == top and bool(content))
    if by_gc:
        raise StoreError(f"{root}/{layout.RETIRED}/{top}: the latest publication is retired by gc (its save is "
                         "gone or going); gc never retires the latest, so this marker was made by hand or by a "
                         "bug (please report it); to resume from the previous publication on purpose: "
                         f"dispatch-slurm retire {root} --latest -m REASON")
    return None if name is None else names.parse(name, where)


@contextmanager
def adopting(rel: str, pin: Callable[[], bool], retired: Callable[[], Iterable[str]], unpin: Callable[[], None],
             where: str) -> Iterator[None]:
    """Around the publication of another execution's save: ``pin`` it (True if this
    call pinned it), refuse it if gc has ``retired`` it (the names under ``where``,
    retired/), ``unpin`` it once published if the pin was ours. A gc retires before it
    reads the pins, and this pins before it reads retired/, so a save is never both
    adopted and removed."""
    mine = pin()
    try:
        gone = [e for e in retired() if names.parse(e, where).path == rel]
        if gone:
            raise BadPath(f"refusing to adopt {rel}: it is retired ({layout.RETIRED}/{gone[0]}): gc retired it "
                          "(its files are gone or being removed) or a person did, on purpose")
        yield
    finally:
        if mine:
            unpin()


def allocate(entries: list[str], create: Callable[[str], bool], where: str) -> int:
    """The next submission number: max+1 of ``entries`` (``sub/``, every one parsed),
    then ``create`` it (create-if-absent: True if this call created it); when another
    submitter won that number, try the next. No lock: the create decides."""
    n = max((names.parse_submission(e, where) for e in entries), default=0) + 1
    while True:
        if n > 999_999:
            raise StoreError(f"{where}: no submission number left (N must be <= 999,999)")
        if create(names.submission_name(n)):
            return n
        n += 1
