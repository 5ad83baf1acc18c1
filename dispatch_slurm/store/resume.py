"""The resume point: the latest publication, whose save must still exist.

``latest`` answers from ``pub/`` alone; a save removed since it was published (by
hand, or a rotation that deleted more than it should) leaves a publication naming
nothing. Resuming from "nothing" would start from step 0 and, at a higher epoch,
outrank the real lineage, so a vanished latest save is an error naming it and the
command that moves ``latest`` back on purpose (``dispatch-slurm retire``)."""

import os
import shlex

from ..contract import layout
from ..contract.env import Execution
from ..contract.names import Publication
from ..errors import StoreError
from . import events
from .roots import at


class VanishedSave(StoreError):
    """The latest publication's save no longer exists."""


def save_exists(root: str, rel: str) -> bool:
    return at(root).save_exists(rel)


def latest_save(root: str) -> Publication | None:
    """The latest publication (None: nothing published yet); VanishedSave if its save is gone."""
    st = at(root)
    pub = st.latest()
    if pub is not None and not st.save_exists(pub.path):
        raise VanishedSave(
            f"the latest publication {root}/{layout.PUB}/{pub.name} (step {pub.step}) names the save "
            f"{os.path.join(root, pub.path)}, which no longer exists: nothing can resume from it. To resume "
            f"from the previous publication instead: dispatch-slurm retire {shlex.quote(root)} --latest -m "
            "'save vanished' (or restore the save first)")
    return pub


def resume_point(root: str | None = None) -> tuple[str, int] | None:
    """(path, step) of the save to resume from: the latest publication's save (its root
    joined to its path: absolute inside a job, whose root is) and its step; None when
    nothing is published yet; root $DISPATCH_CHECKPOINT by default. Every integration's
    resume look-up is this one (or resume_path)."""
    root = Execution.current(root=root).need("root")
    pub = latest_save(root)  # a vanished save is an error, never None
    resumed(root, pub, "resume_point")
    return None if pub is None else (os.path.join(root, pub.path), pub.step)


def resume_path(root: str | None = None) -> str | None:
    """The path of resume_point(root): the save to resume from, or None."""
    point = resume_point(root)
    return None if point is None else point[0]


def resumed(root: str, pub: Publication | None, by: str) -> None:
    """Record which publication this execution resumes from (None: from scratch): the
    report dates a resume by it, not by when Slurm started the execution (a save
    published a few seconds after the start may be the one it read). Inside an execution
    only, and once per execution's first rank ($RANK, else $SLURM_PROCID, unset or 0):
    every rank reads the same answer, and thousands of event files are not worth it."""
    ex = Execution.current(root=root)
    if ex.attempt and ex.rank in (None, 0):
        events.record("resumed", root=root, by=by, **({"step": None, "name": None, "path": None} if pub is None
                                                      else {"step": pub.step, "name": pub.name, "path": pub.path}))
