"""The protocol over a listing, whichever store listed it: the POSIX store (posix.py)
and the S3 store (s3.py) list ``pub/`` and ``sub/`` their own way and hand the names
here, so the rules (every entry parsed, a bad one an error naming it, the latest the
greatest name, N allocated by create-if-absent) exist once."""

from collections.abc import Callable

from ..contract import names
from ..contract.names import Publication
from ..errors import DispatchError, StoreError


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


def latest(entries: list[str], where: str) -> Publication | None:
    """The publication with the greatest (epoch, step), or None if there is none.

    Every entry is parsed; fixed-width digits make the greatest name the latest."""
    entries = checked(entries, where)
    return names.parse(max(entries), where) if entries else None


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
