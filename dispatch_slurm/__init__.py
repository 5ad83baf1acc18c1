"""dispatch-slurm: make overlapping executions of a Slurm job harmless.

Each execution writes into <root>/exec/<DISPATCH_ATTEMPT>/; a save becomes visible
only when published (an empty, O_EXCL-created entry in <root>/pub/); the latest save
is the publication with the greatest (epoch, step).

Layout: ``contract`` (pure rules: epoch, names, layout, env, site config), ``store``
(every write under a root; the one publish path), ``runtime`` (preemption handler,
watch), ``integrations`` (frameworks), ``slurm`` (client, cessation, admin hooks),
``supervisor`` (run/plan/supersede/release), ``cli``. Nothing here depends on Docker
or on the test bed (tests/testbed/)."""

from .contract.epoch import compose as compose_epoch, decompose as decompose_epoch
from .contract.names import Publication
from .errors import BadName, BadPath, DispatchError, EpochError, StoreError
from .runtime.marks import mark_finished, mark_saved
from .runtime.preempt import install_preemption_handler, preemptible, preemption_point, time_remaining
from .store import Published, allocate_submission, latest, publications, publish
from .store.saving import saving

__all__ = ["publish", "Published", "latest", "publications", "allocate_submission", "compose_epoch",
           "decompose_epoch", "Publication", "DispatchError", "BadName", "BadPath", "EpochError",
           "StoreError", "install_preemption_handler", "time_remaining", "preemption_point", "preemptible",
           "saving", "mark_saved", "mark_finished"]
