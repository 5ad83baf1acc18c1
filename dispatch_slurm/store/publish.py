"""The one publish path: CLI ``publish``, ``watch``, the preemption handler and every
integration call ``publish()``; nothing else creates a publication.

One guarantee, whoever calls: when ``publish`` returns, the save's files, its
publication entry, ``pub/`` and the root are fsynced (on S3: the publication's
conditional PUT returned, and S3's PUTs are durable on return), and a ``published``
event is written. A save this process is still writing is refused, and a published one
is never written again by it (once.py). A retry of a publication that already exists fsyncs everything again and
returns ``existed=True``: after a failed fsync (EIO), the retry is how durability is
finally confirmed, never a silent success.

Whose save: a save under ``exec/<attempt>/`` belongs to that execution, and its
attempt token carries its epoch (``<cluster>.<job>.<epoch>``). Publishing it at any
other epoch, or from another execution, would let an old execution's save outrank
its replacement, so it is refused unless the caller adopts it explicitly
(``adopt=True``, recorded in the event). Protocol entries (pub/, sub/, ...) are never
saves. An adopted save is pinned while it is published, and refused if gc retired it.

Whose epoch: ``epochs/<epoch>`` names the one execution that runs at an epoch (epochs.py).
A publication for another execution than the claimant is refused; one at an unclaimed
epoch (a root from before claims, a publish outside the hooks) claims it first."""

import os
from typing import NamedTuple, Optional

from ..contract import layout, names
from ..contract.env import Execution
from ..contract.epoch import decompose
from ..contract.names import Publication
from ..errors import BadPath
from . import epochs, events, once, protocol
from .base import SaveMoved, Store
from .roots import Root, at, name_of


class SaveGone(BadPath):
    """The save was removed while it was being published (its trainer's rotation): nothing to publish."""


class Published(NamedTuple):
    publication: Publication
    existed: bool  # the entry was already there: this call (re)confirmed its durability
    adopted: bool  # the save is not this execution's own (adopt=True)


def env_root(root: str | None = None) -> str:
    """``root``, else this execution's (contract/env.py's view, with its one message when unset)."""
    return Execution.current(root=root).need("root")


def env_epoch(epoch: int | None = None) -> int:
    """``epoch``, else this execution's $DISPATCH_EPOCH (parsed by the view)."""
    return Execution.current(epoch=epoch).need("epoch")


def owner(rel: str, epoch: int, attempt: str | None) -> str | None:
    """Why ``rel`` is not a save of the execution (epoch, attempt), or None if it is."""
    parts = rel.split("/")
    if parts[0] in layout.PROTOCOL:
        return f"{parts[0]} is part of the protocol, not a save"
    if parts[0] != layout.EXEC or len(parts) < 3:
        return f"it is not inside an execution's folder ({layout.EXEC}/<attempt>/...)"
    writer = parts[1]
    their = names.attempt_epoch(writer)
    if their is None:
        return f"{layout.EXEC}/{writer} is not an execution's folder (not an attempt token <cluster>.<job>.<epoch>)"
    if their != epoch:
        return f"it was written by execution {writer} (epoch {their}), not at epoch {epoch}"
    if attempt and attempt != writer:
        return f"it was written by execution {writer}, not by this one ({attempt})"
    return None


def sync(save: str, *, root: Root | None = None) -> None:
    """fsync a save (files, then folders) without publishing it. Each rank of a sharded
    save calls it on what it wrote before the publishing rank publishes: on a shared
    filesystem an fsync flushes only the calling client's own writes. On S3 there is
    nothing to flush: an object is durable when its PUT returns."""
    at(root or env_root()).sync(save)


def _decide(rel: str, save, epoch: int, step: int, attempt: str | None, adopt: bool) -> tuple[str, str | None]:
    """The publication name of ``rel`` and why it is not this execution's own (None if
    it is); refuses what may not be published (see the module doc)."""
    why = owner(rel, epoch, attempt)
    if why and (not adopt or rel.split("/")[0] in layout.PROTOCOL):
        hint = "" if rel.split("/")[0] in layout.PROTOCOL else \
            "; to publish it deliberately as this execution's save, pass --adopt (adopt=True)"
        raise BadPath(f"refusing to publish {save} at epoch {epoch}: {why}{hint}")
    return names.encode(epoch, step, rel), why


def _create(st: Store, save, epoch: int, step: int, attempt: str | None, adopt: bool,
            sync: bool) -> tuple[str, str, str | None, tuple[bool, Optional[str]]]:
    """Inside the caller's session (one look at the root): the save checked, the epoch's
    claim checked, the save's data made durable, then the publication created and made
    durable (POSIX: O_EXCL-create pub/<name>, fsync pub/ and the root; S3: PUT with
    If-None-Match: *, durable on return). (rel, name, why it is not this execution's own
    save, (created now, why no reference of the save was kept))."""
    rel = st.save_relpath(save)
    name, why = _decide(rel, save, epoch, step, attempt, adopt)
    st.publication_fits(name, rel)
    # one epoch per execution (epochs.py): the publishing execution is DISPATCH_ATTEMPT, else
    # the writer of its own save; an adoption without DISPATCH_ATTEMPT joins the epoch's claimant
    epochs.for_publication(st, epoch, attempt or (None if why else rel.split("/")[1]), save)
    protocol.one_save_per_step(st, name, rel, save)
    st.sync_save(rel, save, fsync=sync)  # every file whole (whole.py), then durable
    if not why:
        return rel, name, why, _held_publication(st, rel, name, save)
    with protocol.adopting(st, rel):  # another execution's save: gc may be removing it
        return rel, name, why, _held_publication(st, rel, name, save)


def _held_publication(st: Store, rel: str, name: str, save) -> tuple[bool, Optional[str]]:
    """The publication's own reference to the save's files (base.Store.keep: nothing but gc
    can then remove or change what it names), then the publication; (created now, why no
    reference was kept: None when one was)."""
    try:
        why_not, writable = st.keep(rel, name)
    except SaveMoved:
        raise SaveGone(f"save {save} does not exist (removed before it could be published)") from None
    if writable:
        why_not = f"{len(writable)} of its files belong to another user, whose write bits stay: {writable[0]}"
    return st.create_publication(name), why_not


def _step(save, step: int | None, pattern: str, adopt: bool) -> int:
    """The step to publish ``save`` at: its name's (``checkpoint-<step>``), or ``step``,
    which must then agree with the name: one save published as two steps would be
    counted twice and could outrank its own later saves. An adoption (a person's
    deliberate act, recorded in its event) may name another step."""
    if step is None:
        return names.step_of(save, pattern)
    if adopt:
        return step
    named = names.named_step(save, pattern)  # None: a name without a step (a file save, another layout)
    if named is not None and named != step:
        raise BadPath(f"refusing to publish {os.fsdecode(save)} as step {step}: its name says step {named} "
                      "(leave the step out, or give the step its name says)")
    return step


def publish(save: str, step: int | None = None, *, root: Root | None = None, epoch: int | None = None,
            by: str = "publish", sync: bool = True, adopt: bool = False,
            pattern: str = names.STEP_PATTERN) -> Published:
    """Publish ``save`` (a folder or file inside the root) at (epoch, step); durable on
    return. Defaults: root $DISPATCH_CHECKPOINT (a caller that keeps the root's store
    passes it: everything, the event too, is done in one session of it), epoch
    $DISPATCH_EPOCH, step from the save's name (``checkpoint-<step>``). See the module doc
    for whose save may be published and what a retry does."""
    ex = Execution.current(root=name_of(root), epoch=epoch)
    where, epoch = ex.need("root", "epoch")
    once.refuse_writing(save)
    decompose(epoch)  # an epoch no (G, N, R) composes is refused before anything else
    step = _step(save, step, pattern, adopt)
    attempt = ex.attempt
    st = at(root or where)
    with st:
        rel, name, why, (created, unheld) = _create(st, save, epoch, step, attempt, adopt, sync)
        st.release(epoch, step)  # this execution's older references: superseded by this save
        once.published(save, st.realpath(rel))
        parts = rel.split("/")
        writer = parts[1] if parts[0] == layout.EXEC and len(parts) > 2 else None
        events.record("published", root=st, attempt=attempt or writer, step=step, path=rel, name=name, by=by,
                      existed=not created, held=unheld is None, **({"unheld": unheld} if unheld else {}),
                      **({"adopted": True, "adopted_from": writer or rel} if why else {}))
    return Published(Publication(epoch, step, rel, name), not created, bool(why))
