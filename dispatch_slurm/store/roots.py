"""Which store a root is on: the one place that tells. ``s3://bucket/prefix`` is the
S3 store (s3.py), anything else a path on the POSIX store (posix.py). Both offer the
same entry points (publications, latest, allocate_submission, make_exec_dir) over
the same rules (protocol.py)."""

from . import posix, s3


def is_s3(root) -> bool:
    return isinstance(root, str) and root.startswith("s3://")


def backend(root):
    """The store module of ``root``."""
    return s3 if is_s3(root) else posix


def publications(root):
    return backend(root).publications(root)


def latest(root):
    return backend(root).latest(root)


def allocate_submission(root) -> int:
    return backend(root).allocate_submission(root)


def make_exec_dir(root, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
    return backend(root).make_exec_dir(root, attempt, mode, create_root)

