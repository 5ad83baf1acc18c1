"""Which store a root is on: the one place that tells. A root that starts with a scheme of
``SCHEMES`` is on that store (``s3://bucket/prefix``: s3.py); anything else is a path on
the POSIX store (posix.py). A caller that has only a root's name asks ``at(root)`` once
for its store object and keeps it: every layer above takes the object, so a root is
opened by whoever holds it, not again by each function it passes through. A new store is
one module and one line here."""

from __future__ import annotations

import os
from typing import Union

from ..contract.names import S3_SCHEME
from .base import Store
from .posix import PosixStore
from .s3 import S3Store

#: (scheme, the store of roots that start with it); anything else: PosixStore
SCHEMES: tuple[tuple[str, type[Store]], ...] = ((S3_SCHEME, S3Store),)

#: a root as callers hold it: its name (a path or a URL) or its store object
Root = Union[str, "os.PathLike[str]", Store]


def backend(root: Root) -> type[Store]:
    """The store class of ``root`` (a path or a URL)."""
    if isinstance(root, Store):
        return type(root)
    text = os.fspath(root)
    return next((cls for scheme, cls in SCHEMES if text.startswith(scheme)), PosixStore)


def at(root: Root) -> Store:
    """The store object of ``root``: ``root`` itself when it is one (whoever holds a store
    passes it on), else a new one (it holds no state between calls but a POSIX session's
    fd, so threads and processes never share one)."""
    if isinstance(root, Store):
        return root
    return backend(root)(os.fspath(root))


def name_of(root: Root | None) -> str | None:
    """The name of ``root`` (a store's own), as Execution.current takes it."""
    if root is None or isinstance(root, Store):
        return None if root is None else root.root
    return os.fspath(root)


# For callers that have only a root's name and ask one thing of it (the package's API,
# the CLI): a layer that asks more keeps ``at(root)`` and asks it.

def publications(root: Root):
    return at(root).publications()


def latest(root: Root):
    return at(root).latest()


def allocate_submission(root: Root) -> int:
    return at(root).allocate_submission()


def make_exec_dir(root: Root, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
    return at(root).make_exec_dir(attempt, mode, create_root)
