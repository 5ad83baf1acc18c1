"""The store: the only code that writes under a checkpoint root.

``roots`` (which store a root is on: a path, or ``s3://bucket/prefix``), ``protocol``
(the rules over any store's listing), ``durable`` (the fsync discipline every POSIX
write goes through), ``posix`` and ``s3`` (the root, publications, submission numbers,
exec folders, on each store), ``publish`` (the one publish path),
``events`` (what happened, one JSON-lines file per process), ``ceased`` (the Epilog's
cessation evidence), ``resume`` (the latest publication whose save must exist, and its path)."""

from .posix import open_root
from .roots import allocate_submission, latest, make_exec_dir, publications
from .publish import Published, env_epoch, env_root, publish, sync
from .resume import VanishedSave, latest_save, resume_path, resume_point

__all__ = ["publish", "Published", "latest", "publications", "allocate_submission", "make_exec_dir",
           "open_root", "env_root", "env_epoch", "sync", "latest_save", "resume_path", "resume_point",
           "VanishedSave"]
