"""The store: the only code that writes under a checkpoint root, and the one way to it.

Every layer above reaches a root through this face: ``at(root)`` gives the root's store
object (roots.py chooses it: a path is on the POSIX store, ``s3://bucket/prefix`` on the
S3 store), whose methods are the interface (base.py: entries of the protocol's folders,
publications, the inventory gc and the report read, events, removal); the functions below
are the protocol's operations built on it: ``publish`` (the one publish path),
``latest``/``latest_save``, ``resume_point``/``resume_path`` (the resume point), ``allocate_submission``, ``events``
(what happened, one JSON-lines file per process), ``ceased`` (the Epilog's cessation
evidence), ``epochs`` (one epoch per execution), ``jobs`` (a plain sbatch job's N), ``once``
(a save folder is written once: never again once published or being written).
The backends (posix.py, s3.py) and the fsync discipline (durable.py) are the store's own.

Every name is imported on first use (PEP 562): each command's module imports this package,
and a command that reaches no root (`epoch`, `launch`, `check-site`) loads none of it."""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import ceased, epochs, events, execdir, jobs, once, unpublished, whole
    from .base import SaveMoved, Store
    from .durable import write_all
    from .inventory import Folder, Inventory, Save, markers, retired_by, retirement_record
    from .once import AlreadySaved
    from .protocol import latest_of
    from .publish import Published, SaveGone, env_epoch, env_root, publish, sync
    from .resume import VanishedSave, latest_save, located, resume_from, resume_path, resume_point, resumed, save_exists
    from .roots import Root, allocate_submission, at, backend, latest, make_exec_dir, publications

# public name -> the module that defines it
_NAMES = {
    "SaveMoved": "base", "Store": "base", "write_all": "durable", "AlreadySaved": "once", "latest_of": "protocol",
    **dict.fromkeys(("Folder", "Inventory", "Save", "markers", "retired_by", "retirement_record"), "inventory"),
    **dict.fromkeys(("Published", "SaveGone", "env_epoch", "env_root", "publish", "sync"), "publish"),
    **dict.fromkeys(("VanishedSave", "latest_save", "located", "resume_from", "resume_path", "resume_point", "resumed",
                     "save_exists"), "resume"),
    **dict.fromkeys(("Root", "allocate_submission", "at", "backend", "latest", "make_exec_dir", "publications"),
                    "roots"),
}
_MODULES = ("ceased", "epochs", "events", "execdir", "jobs", "once", "unpublished", "whole")

__all__ = ["at", "backend", "Store", "SaveMoved",
           "publish", "Published", "SaveGone", "latest", "publications", "allocate_submission",
           "make_exec_dir", "Root", "env_root", "env_epoch", "sync", "latest_save", "located", "resume_from", "resume_path",
           "resume_point",
           "resumed", "save_exists", "VanishedSave",
           "events", "ceased", "epochs", "jobs", "once", "AlreadySaved", "execdir", "unpublished", "whole",
           "write_all", "Inventory", "Save", "Folder", "markers",
           "retired_by", "retirement_record", "latest_of"]


if not TYPE_CHECKING:  # hidden from mypy, which would take any misspelt ``store.X`` for this
    def __getattr__(name: str) -> Any:
        """A public name, or one of the store's modules, imported when first asked for."""
        if name in _NAMES:
            value = getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
        elif name in _MODULES:
            value = importlib.import_module(f".{name}", __name__)
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value
        return value


class _Face(types.ModuleType):
    """``store.publish`` is the function, as when this package imported it eagerly: importing
    the module of the same name (publish.py, which other modules of the store import) would
    otherwise bind the module to that attribute."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _NAMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Face
