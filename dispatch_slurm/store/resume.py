"""The resume point: the latest publication, whose save must still exist.

``latest`` answers from ``pub/`` alone; a save removed since it was published (by
hand, or a rotation that deleted more than it should) leaves a publication naming
nothing. Resuming from "nothing" would start from step 0 and, at a higher epoch,
outrank the real lineage, so a vanished latest save is an error naming it and the
command that moves ``latest`` back on purpose (``dispatch-slurm retire``)."""

import os
import shlex

from ..contract import layout
from ..contract.names import Publication
from ..errors import StoreError
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
