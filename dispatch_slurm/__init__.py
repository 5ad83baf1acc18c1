"""dispatch-slurm: make overlapping executions of a Slurm job harmless.

Each execution writes into <root>/exec/<DISPATCH_ATTEMPT>/; a save becomes visible
only when published (an empty, O_EXCL-created entry in <root>/pub/); the latest save
is the publication with the greatest (epoch, step)."""

from .epoch import compose as compose_epoch, decompose as decompose_epoch
from .errors import AlreadyPublished, BadName, BadPath, DispatchError, EpochError, StoreError
from .names import Publication
from .preempt import install_preemption_handler, preemption_point, time_remaining
from .store import allocate_submission, latest, publications, publish

__all__ = ["publish", "latest", "publications", "allocate_submission", "compose_epoch",
           "decompose_epoch", "Publication", "DispatchError", "AlreadyPublished", "BadName",
           "BadPath", "EpochError", "StoreError", "install_preemption_handler", "time_remaining",
           "preemption_point"]
