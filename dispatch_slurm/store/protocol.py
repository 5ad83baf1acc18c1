"""The protocol over a listing, whichever store listed it: the POSIX store (posix.py)
and the S3 store (s3.py) list ``pub/`` and ``sub/`` their own way and hand the names
here, so the rules (every entry parsed, a bad one an error naming it, the latest the
greatest name and never a retired one, N allocated by create-if-absent, an adopter's
pin before its look at retired/) exist once."""

from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Iterator

from ..contract import layout, names
from ..contract.names import Publication
from ..errors import BadPath, DispatchError, StoreError


def checked(entries: list[str], where: str) -> list[str]:
    """Every entry of ``pub/``, all validated; the first bad one (in name order) raises."""
    if not names.all_valid(entries):
        for entry in sorted(entries):
            names.parse(entry, where)
        raise DispatchError(f"{where}: bulk and per-entry validation disagree (a bug; please report)")
    return entries


def publications(entries: list[str], where: str) -> list[Publication]:
    """All publications, ordered by (epoch, step), ties broken by name."""
    return [names.parse(e, where) for e in sorted(checked(entries, where))]


def latest(entries: list[str], root: str, retired: Callable[[str], bool]) -> Publication | None:
    """The publication with the greatest (epoch, step), or None if there is none.

    Every entry is parsed; fixed-width digits make the greatest name the latest. gc
    never retires the latest publication (store/retention.py); one that is retired
    anyway (``retired(name)``: by hand, or a bug) is an error, never a save to resume from."""
    where = f"{root}/{layout.PUB}"
    entries = checked(entries, where)
    pub = names.parse(max(entries), where) if entries else None
    if pub is not None and retired(pub.name):
        raise StoreError(f"{root}/{layout.RETIRED}/{pub.name}: the latest publication is retired (its save is "
                         "gone or going); gc never retires the latest: this was done by hand or is a bug "
                         "(please report it)")
    return pub


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
            raise BadPath(f"refusing to adopt {rel}: gc retired it ({layout.RETIRED}/{gone[0]}), so its "
                          "files are gone or being removed")
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
