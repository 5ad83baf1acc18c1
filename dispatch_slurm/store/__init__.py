"""The store: the only code that writes under a checkpoint root.

``durable`` (the fsync discipline every write goes through), ``posix`` (the root,
publications, submission numbers, exec folders), ``publish`` (the one publish path),
``events`` (what happened, one JSON-lines file per process), ``ceased`` (the Epilog's
cessation evidence)."""

from .posix import allocate_submission, latest, make_exec_dir, open_root, publications
from .publish import Published, env_epoch, env_root, publish, sync

__all__ = ["publish", "Published", "latest", "publications", "allocate_submission", "make_exec_dir",
           "open_root", "env_root", "env_epoch", "sync"]
