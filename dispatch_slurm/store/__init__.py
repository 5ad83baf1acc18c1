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
The backends (posix.py, s3.py) and the fsync discipline (durable.py) are the store's own."""

from typing import TYPE_CHECKING

from . import epochs, events, execdir, jobs, once, unpublished, whole
from .base import SaveMoved, Store
from .durable import write_all
from .once import AlreadySaved
from .inventory import Folder, Inventory, Save, markers, retired_by, retirement_record
from .protocol import latest_of
from .publish import Published, SaveGone, env_epoch, env_root, publish, sync
from .resume import VanishedSave, latest_save, located, resume_from, resume_path, resume_point, resumed, save_exists
from .roots import Root, allocate_submission, at, backend, latest, make_exec_dir, publications

__all__ = ["at", "backend", "Store", "SaveMoved", "publish", "Published", "SaveGone", "latest", "publications", "allocate_submission",
           "make_exec_dir", "Root", "env_root", "env_epoch", "sync", "latest_save", "located", "resume_from", "resume_path",
           "resume_point",
           "resumed", "save_exists", "VanishedSave",
           "events", "ceased", "epochs", "jobs", "once", "AlreadySaved", "execdir", "unpublished", "whole",
           "write_all", "Inventory", "Save", "Folder", "markers",
           "retired_by", "retirement_record", "latest_of"]

if TYPE_CHECKING:
    from . import ceased
else:
    def __getattr__(name: str):
        """``store.ceased`` on first use: only the Epilog, gc and the report read cessation
        evidence, and every job's `env` and `publish` start without it. (Hidden from mypy,
        which would take any misspelt ``store.X`` for this.)"""
        if name == "ceased":
            import importlib
            return importlib.import_module(".ceased", __name__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
