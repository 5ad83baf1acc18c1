"""dispatch-slurm: make overlapping executions of a Slurm job harmless.

Each execution writes into <root>/exec/<DISPATCH_ATTEMPT>/; a save becomes visible
only when published (an empty, O_EXCL-created entry in <root>/pub/); the latest save
is the publication with the greatest (epoch, step).

Layout: ``contract`` (pure rules: epoch, names, layout, env, site config), ``store``
(every write under a root; the one publish path), ``runtime`` (preemption handler,
watch), ``integrations`` (frameworks), ``slurm`` (client, cessation, admin hooks),
``supervisor`` (run/plan/supersede/release), ``cli``. Nothing here depends on Docker
or on the test bed (tests/testbed/).

The names below are imported on first use (PEP 562): every `dispatch-slurm` command
imports this package first, and the ones a job starts with (`env`, `latest`) need
none of the preemption handler's modules."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .contract.epoch import compose as compose_epoch, decompose as decompose_epoch
    from .contract.names import Publication
    from .errors import BadName, BadPath, DispatchError, EpochError, StoreError
    from .runtime.marks import mark_finished, mark_saved
    from .runtime.preempt import install_preemption_handler, preemptible, preemption_point, time_remaining
    from .store import Published, allocate_submission, latest, publications, publish
    from .store.saving import saving

# public name -> (module, its name there)
_PUBLIC = {
    "publish": ("store", "publish"), "Published": ("store", "Published"), "latest": ("store", "latest"),
    "publications": ("store", "publications"), "allocate_submission": ("store", "allocate_submission"),
    "compose_epoch": ("contract.epoch", "compose"), "decompose_epoch": ("contract.epoch", "decompose"),
    "Publication": ("contract.names", "Publication"), "DispatchError": ("errors", "DispatchError"),
    "BadName": ("errors", "BadName"), "BadPath": ("errors", "BadPath"), "EpochError": ("errors", "EpochError"),
    "StoreError": ("errors", "StoreError"),
    "install_preemption_handler": ("runtime.preempt", "install_preemption_handler"),
    "time_remaining": ("runtime.preempt", "time_remaining"), "preemption_point": ("runtime.preempt", "preemption_point"),
    "preemptible": ("runtime.preempt", "preemptible"), "saving": ("store.saving", "saving"),
    "mark_saved": ("runtime.marks", "mark_saved"), "mark_finished": ("runtime.marks", "mark_finished"),
}
__all__ = ["publish", "Published", "latest", "publications", "allocate_submission", "compose_epoch",
           "decompose_epoch", "Publication", "DispatchError", "BadName", "BadPath", "EpochError",
           "StoreError", "install_preemption_handler", "time_remaining", "preemption_point", "preemptible",
           "saving", "mark_saved", "mark_finished"]  # _PUBLIC's names (tests/test_architecture.py)


def __getattr__(name: str) -> Any:
    """A public name, or a subpackage (``dispatch_slurm.store``), imported when first asked for."""
    if name in _PUBLIC:
        module, attr = _PUBLIC[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the subpackage exists; something it imports does not
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
