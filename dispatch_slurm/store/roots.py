"""Which store a root is on: the one place that tells. A root that starts with a scheme of
``SCHEMES`` is on that store (``s3://bucket/prefix``: s3.py); anything else is a path on
the POSIX store (posix.py). Every caller asks ``at(root)`` for the root's store object and
uses the interface (base.py): a new store is one module and one line here."""

from ..contract.names import S3_SCHEME
from .base import Store
from .posix import PosixStore
from .s3 import S3Store

#: (scheme, the store of roots that start with it); anything else: PosixStore
SCHEMES: tuple[tuple[str, type[Store]], ...] = ((S3_SCHEME, S3Store),)


def backend(root) -> type[Store]:
    """The store class of ``root`` (a path or a URL)."""
    text = str(root)
    return next((cls for scheme, cls in SCHEMES if text.startswith(scheme)), PosixStore)


def at(root) -> Store:
    """The store object of ``root``: a new one each call (it holds no state between calls
    but a POSIX session's fd, so threads and processes never share one)."""
    return backend(root)(str(root))


def publications(root):
    return at(root).publications()


def latest(root):
    return at(root).latest()


def allocate_submission(root) -> int:
    return at(root).allocate_submission()


def make_exec_dir(root, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
    return at(root).make_exec_dir(attempt, mode, create_root)
