"""The protocol's rules, written once for every store: the POSIX store (posix.py) and the
S3 store (s3.py) list, read and create the entries of ``pub/``, ``sub/``, ``retired/`` and
``pinned/`` their own way (base.py's primitives), and these functions, given the store,
apply the rules over them: every entry parsed, a bad one an error naming it and the fix,
the latest the greatest name not retired (a person's retirement skipped on purpose, gc's
an error), N allocated by create-if-absent, an adopter's pin before its look at
retired/."""

import re
import shlex
from collections.abc import Callable, Container
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from ..contract import layout, names
from ..contract.names import Publication
from ..errors import BadName, BadPath, DispatchError, StoreError
from . import inventory

if TYPE_CHECKING:  # the store calls these rules with itself
    from .base import Store


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


def latest(st: "Store") -> Publication | None:
    """The publication with the greatest (epoch, step) that a person has not retired,
    or None if there is none.

    Every entry is parsed; fixed-width digits make the greatest name the latest, so
    the common case costs one look at ``retired/`` (the greatest name's marker). gc never
    retires the latest publication (retention/removal.py); one that is retired anyway by
    gc (an empty marker: a bug, or made by hand) is an error, never a save to resume from.
    A person's marker (it holds who and why) makes ``latest`` skip to the previous
    publication not retired (all of ``retired/`` listed), on purpose (see ``live_latest``)."""
    root, where = st.root, st.where(layout.PUB)
    entries = checked(st.listing(layout.PUB), where, st.mv)
    if not entries:
        return None
    top = max(entries)
    content = st.read(layout.RETIRED, top)
    if content is None:
        return vouched(st, names.parse(top, where))
    name, by_gc = live_latest(sorted(entries), set(st.listing(layout.RETIRED)), lambda n: n == top and bool(content))
    if by_gc:
        raise StoreError(f"{root}/{layout.RETIRED}/{top}: the latest publication is retired by gc (its save is "
                         "gone or going); gc never retires the latest, so this marker was made by hand or by a "
                         "bug (please report it); to resume from the previous publication on purpose: "
                         f"dispatch-slurm retire {root} --latest -m REASON")
    return None if name is None else vouched(st, names.parse(name, where))


def vouched(st: "Store", pub: Publication | None) -> Publication | None:
    """``pub`` (the latest publication), or BadName naming its entry when ``publish`` could
    not have made it: its epoch unclaimed (every publication claims its epoch first,
    store/epochs.py), or, for an execution's own save, claimed by another execution or at
    another step than the save's name says. Such an entry (forged, or made by hand) is never
    the latest and never skipped: nothing reads the root until it is moved out of ``pub/``.
    An adopted save (its writer of another epoch) may carry another step."""
    if pub is None:
        return None
    claim = st.where(layout.EPOCHS, names.claim_name(pub.epoch))
    data = st.read(layout.EPOCHS, names.claim_name(pub.epoch), names.CLAIM_MAX)
    owner = None if data is None else names.parse_claim(data, pub.epoch, st.where(layout.EPOCHS))
    writer = inventory.attempt_of(pub.path)
    own = writer is not None and names.attempt_epoch(writer) == pub.epoch
    named = names.named_step(pub.path) if own else None
    if data is None:
        why = (f"no execution claimed its epoch {pub.epoch} ({claim} does not exist), and every publication "
               "claims its epoch first")
    elif own and owner is not None and owner != writer:  # None: a claim still being written
        why = f"its save was written by {writer}, but epoch {pub.epoch} is claimed by {owner} ({claim})"
    elif named is not None and named != pub.step:
        why = f"it says step {pub.step}, but its save's name ({pub.path.rsplit('/', 1)[-1]}) says step {named}"
    else:
        return pub
    hint = (f" (a root from before epoch claims: publish its save again, which claims the epoch for its writer: "
            f"dispatch-slurm publish --root {st.root} --epoch {pub.epoch} --step {pub.step} {st.root}/{pub.path})"
            if data is None and own else "")
    raise BadName(pub.name, f"{why}: dispatch-slurm never made this entry, and it would be the latest. Move it "
                  f"out of {layout.PUB}/ ({st.mv} {_quoted(st.where(layout.PUB, pub.name))} <a folder outside "
                  f"{layout.PUB}/>), then run the command again{hint}", st.where(layout.PUB))


def one_save_per_step(st: "Store", name: str, rel: str, save) -> None:
    """Refuse another spelling of a save's step already published at its epoch
    (``checkpoint-0010``, ``checkpoint-010`` and ``checkpoint-10`` are one step): ``latest``
    would pick one of them by the name's order. The other spellings are looked up by name
    (20 at most), never by listing ``pub/`` (a publication must not cost a walk of every other)."""
    folder, _, leaf = rel.rpartition("/")
    m = re.fullmatch(r"(.*?)([0-9]+)", leaf)
    epoch, step = int(name[:20]), int(name[21:41])
    if m is None or int(m[2]) != step:
        return
    for width in range(len(str(step)), 21):
        other = f"{folder}/{m[1]}{step:0{width}d}".lstrip("/")
        if other != rel and st.has(layout.PUB, first := names.encode(epoch, step, other)):
            raise BadPath(f"refusing to publish {save} as step {step} at epoch {epoch}: {other} is already "
                          f"published at that epoch and step ({st.where(layout.PUB, first)}), and one step has one "
                          "save (`latest` could name either): save each step under one name")


@contextmanager
def adopting(st: "Store", rel: str) -> Iterator[None]:
    """Around the publication of another execution's save: pin it (``pinned/``), refuse it
    if gc has retired it, unpin it once published if the pin was this call's. A gc retires
    before it reads the pins, and this pins before it reads retired/, so a save is never
    both adopted and removed."""
    pin, where = names.path_name(rel), st.where(layout.RETIRED)
    mine = st.create(layout.PINNED, pin)
    try:
        gone = [e for e in st.listing(layout.RETIRED) if names.parse(e, where).path == rel]
        if gone:
            raise BadPath(f"refusing to adopt {rel}: it is retired ({layout.RETIRED}/{gone[0]}): gc retired it "
                          "(its files are gone or being removed) or a person did, on purpose")
        yield
    finally:
        if mine:
            st.delete(layout.PINNED, pin)


def allocate(st: "Store") -> int:
    """The next submission number: max+1 of ``sub/`` (every entry parsed), created if
    absent; when another submitter won that number, the next. No lock: the create decides."""
    where = st.where(layout.SUB)
    n = max((names.parse_submission(e, where) for e in st.listing(layout.SUB)), default=0) + 1
    while True:
        if n > 999_999:
            raise StoreError(f"{where}: no submission number left (N must be <= 999,999)")
        if st.create(layout.SUB, names.submission_name(n)):
            return n
        n += 1
