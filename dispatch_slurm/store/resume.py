"""The resume point: the latest publication, whose save must still exist.

``latest`` answers from ``pub/`` alone. A publication keeps its own links to its save's
files (copies.py), so the trainer's rotation removing the save from its folder takes
nothing from it; a save gone from both (a person removed the publication's links too, or a
publication older than them) leaves a publication naming nothing. Resuming from "nothing"
would start from step 0 and, at a higher epoch, outrank the real lineage, so a vanished
latest save is an error naming it and the command that moves ``latest`` back on purpose
(``dispatch-slurm retire``)."""

import os
import shlex
import time

from ..contract import layout
from ..contract.env import Execution
from ..contract.names import Publication
from ..errors import StoreError
from . import events, unpublished
from .base import SaveMoved, Store
from .roots import Root, at, name_of


class VanishedSave(StoreError):
    """The latest publication's save no longer exists."""


def save_exists(root: str, rel: str) -> bool:
    return at(root).save_exists(rel)


def latest_save(root: str) -> Publication | None:
    """The latest publication (None: nothing published yet); VanishedSave if its save is gone."""
    return located(root)[0]


def located(root: Root) -> tuple[Publication | None, str | None]:
    """The latest publication and where its save is under the root (its own path, or the
    publication's held links once the trainer removed it); VanishedSave if neither is there."""
    st = at(root)
    root = st.root
    pub = st.latest()
    where = None if pub is None else st.located(pub)
    if pub is not None and where is None:
        raise VanishedSave(
            f"the latest publication {root}/{layout.PUB}/{pub.name} (step {pub.step}) names the save "
            f"{os.path.join(root, pub.path)}, which no longer exists: nothing can resume from it. To resume "
            f"from the previous publication instead: dispatch-slurm retire {shlex.quote(root)} --latest -m "
            "'save vanished' (or restore the save first)")
    return pub, where


TRIES = 5  # copies taken again while the older execution's rotation removes saves under them


def resume_from(root: Root) -> tuple[Publication | None, str | None]:
    """The latest publication and the path to load it from (None, None: nothing published).

    Inside an execution of this root the path is a private copy of the save in its own
    folder (``layout.RESUMES``: clones or links, copies.py): the older execution may still
    run (a requeue or a preemption overlaps them) and its trainer's own rotation
    (``save_total_limit``) remove the very save this one loads, between the choice and
    the load, which then fails. Where the store makes no copy (S3, links refused) the
    path is the save's own (the ``resumed`` event's ``loaded`` says which)."""
    st = at(root)
    root = st.root
    ex = Execution.current()  # this execution's own, when the root is its root
    mine = ex.attempt if ex.attempt and ex.exec_dir and ex.root == root else None
    for _ in range(TRIES):
        pub, where = located(st)  # a vanished save is an error, never None
        if pub is None or where is None or mine is None or (where == pub.path and
                                                            pub.path.startswith(f"{layout.EXEC}/{mine}/")):
            return pub, None if where is None else os.path.join(root, where)  # its own: nobody else removes it
        try:
            held, _ = st.hold(pub.path, mine, pub.name)
        except SaveMoved:
            time.sleep(0.2)  # the rotation's removal runs on: its end, or a newer publication, is near
            continue
        return pub, os.path.join(root, held if held else pub.path)
    raise StoreError(f"the latest save under {root}/{layout.PUB} changed {TRIES} times while it was linked into "
                     f"exec/{mine}/{layout.RESUMES} for this execution to load: an older execution still running "
                     "keeps removing its saves; retry, or stop that execution first")


def resume_point(root: Root | None = None) -> tuple[str, int] | None:
    """(path, step) of the save to resume from: the latest publication's save (its root
    joined to its path: absolute inside a job, whose root is, and there a private copy:
    ``resume_from``) and its step; None when nothing is published yet (said loudly when
    the exec folders hold saves nonetheless: unpublished.py); root $DISPATCH_CHECKPOINT by
    default. Every integration's resume look-up is this one (or resume_path), so inside an
    execution it also refuses, before training starts, an exec folder no save of which
    could be published (execdir.py)."""
    # one store for the whole look-up
    st = root if isinstance(root, Store) else at(Execution.current(root=name_of(root)).need("root"))
    from . import execdir  # here: `latest` never needs it (nor the publish path it imports)
    execdir.check_current(st)
    pub, path = resume_from(st)
    resumed(st, pub, "resume_point", path)
    if pub is None or path is None:
        unpublished.check(st, by="resume")
        return None
    return path, pub.step


def resume_path(root: Root | None = None) -> str | None:
    """The path of resume_point(root): the save to resume from, or None."""
    point = resume_point(root)
    return None if point is None else point[0]


def resumed(root: Root, pub: Publication | None, by: str, path: str | None = None) -> None:
    """Record which publication this execution resumes from (None: from scratch): the
    report dates a resume by it, not by when Slurm started the execution (a save
    published a few seconds after the start may be the one it read). Inside an execution
    only, and once per execution's first rank ($RANK, else $SLURM_PROCID, unset or 0):
    every rank reads the same answer, and thousands of event files are not worth it."""
    ex = Execution.current(root=name_of(root))
    if ex.attempt and ex.rank in (None, 0):
        events.record("resumed", root=root, by=by, **({"step": None, "name": None, "path": None} if pub is None
                                                      else {"step": pub.step, "name": pub.name, "path": pub.path,
                                                            "loaded": path}))
