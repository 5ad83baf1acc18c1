"""A save folder is written once: never again once it is published or being written.

A publication says "this folder holds step S"; rewriting the folder afterwards -- a
preemption that saves the step its periodic save just published, a retry into the same
name -- makes it a torn mix for as long as the rewrite lasts, and a SIGKILL inside that
window (a short grace, torchrun's kill) leaves the latest publication torn. So every
integration asks ``claim`` before it writes a save folder and skips the write when the
folder is taken (the save it wants is that one), and ``publish`` refuses a folder this
process is still writing.

Which saves are taken is known first from this process's own record (what it is writing,
what it wrote, what it published): the same on every rank of a job whose ranks save
together, so every rank decides alike. A folder the record does not know is checked in
``pub/`` (another process published it: a watcher, an earlier incarnation of this
execution under an elastic launcher).
"""

import os
import threading
import warnings
from typing import Literal

from ..contract.env import Execution
from ..errors import DispatchError
from .roots import Root, at, name_of

State = Literal["writing", "written", "published"]
_record: dict[str, State] = {}  # this process's saves, by real path
_writer: dict[str, int | None] = {}  # the thread writing a save (None: another thread will finish it)


class AlreadySaved(DispatchError):
    """A write into a save folder that is published or being written: refused; the save
    asked for is that one (``save``)."""

    def __init__(self, save: str, why: str, act: str = "write into"):
        self.save, self.why = save, why
        super().__init__(f"refusing to {act} {save}: {why}; a published save is never rewritten")


def key(save) -> str:
    """The real path of ``save``: one folder has one key, however it is named. Where the
    folder exists, the kernel's own path of it (an O_PATH descriptor's, read back from
    /proc: three system calls); else, or without /proc, ``os.path.realpath`` (a look at
    every component, some 20 times the cost: publish asks on every publication)."""
    path = os.fsdecode(save)
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = ""
    finally:
        os.close(fd)
    return real if real.startswith("/") and not real.endswith(" (deleted)") else os.path.realpath(path)


def state(save) -> State | None:
    """What this process did with ``save``, if anything."""
    return _record.get(key(save))


def published_as(save, root: Root | None = None) -> str | None:
    """The name of a publication of ``save`` in ``pub/``, or None (also for a folder that
    does not exist: nothing published it that could still be read)."""
    if not os.path.lexists(os.fspath(save)):
        return None
    st = at(root or Execution.current(root=name_of(root)).need("root"))
    try:
        rel = st.relpath(os.path.abspath(os.fspath(save)))
    except DispatchError:
        return None  # outside the root: nothing here publishes it
    return next((p.name for p in st.publications() if p.path == rel), None)


def check(save, root: str | None = None) -> None:
    """Raise AlreadySaved if ``save`` is being written, was written or is published. A
    write this very thread started and has not finished is no obstacle: a signal handler
    interrupted it, it will never finish, and nothing published it."""
    mine = state(save)
    if mine == "writing" and _writer.get(key(save)) == threading.get_ident():
        return
    if mine is not None:
        why = {"writing": "this process is writing it", "written": "this process wrote it already",
               "published": "it is published"}[mine]
        raise AlreadySaved(os.fspath(save), why)
    name = published_as(save, root)
    if name is not None:
        raise AlreadySaved(os.fspath(save), f"it is published ({name})")


def claim(save, root: str | None = None, *, here: bool = True) -> str:
    """``check``, then record ``save`` as being written by this process (``here``: by this
    thread; False: a thread of its own finishes it); returns the key that ``release``
    takes when the write ends."""
    check(save, root)
    k = key(save)
    _record[k], _writer[k] = "writing", threading.get_ident() if here else None
    return k


def release(k: str, ok: bool = True) -> None:
    """The write of ``k`` ended: written (ok), or failed, and free to be written again
    (nothing published a folder whose write failed)."""
    _writer.pop(k, None)
    if ok:
        _record[k] = "written"
    else:
        _record.pop(k, None)


def skipped(e: AlreadySaved) -> None:
    """Say that a periodic save was not written (the same step saved twice in one execution,
    e.g. a trainer that rolled back in-process): the folder keeps the first save of it."""
    warnings.warn(f"{e.save} not written: {e.why}; it keeps its first save of that step", stacklevel=3)


def refuse_writing(save) -> None:
    """For ``publish``: a folder this process is still writing is not a save yet (nothing
    to look up while this process writes none)."""
    if _writer and state(save) == "writing":
        raise AlreadySaved(os.fspath(save), "this process is still writing it (it is published when the write "
                                            "completes, not before)", act="publish")


def published(save, real: str | None = None) -> None:
    """For ``publish``: ``save`` is published, never to be written again by this process
    (``real``: its ``key``, when the caller knows it already)."""
    _record[real or key(save)] = "published"
