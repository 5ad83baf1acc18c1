"""Cessation evidence: ``<root>/ceased/<attempt>.<node>``, written by the Epilog (as
the job user) once the execution's processes on that node are gone, read by the
cessation signal (slurm/cessation.py). O_EXCL and durable like a publication, and
idempotent: Slurm may run an Epilog twice for one execution (TERMINATE_JOB retries)."""

import os

from ..contract import layout
from ..errors import BadPath
from . import s3
from .durable import DirFds, create_new
from .posix import open_entry, open_root
from .roots import is_s3


def record(root: str, attempt: str, node: str) -> bool:
    """Record that ``attempt``'s processes on ``node`` are gone; True if recorded now,
    False if it already was (a second Epilog run changes nothing)."""
    if not attempt or "/" in attempt or not node or "/" in node:
        raise BadPath(f"bad attempt {attempt!r} or node {node!r}")
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        ceased_fd = fds.add(open_entry(root, root_fd, layout.CEASED, create=True))
        try:
            create_new(f"{attempt}.{node}", ceased_fd)
        except FileExistsError:
            return False
        os.fsync(root_fd)
    return True


def nodes(root: str, attempt: str) -> set[str]:
    """The nodes whose Epilog recorded that this execution's processes are gone (on an
    S3 root: the objects under ceased/, if anything put them there)."""
    prefix = f"{attempt}."
    if is_s3(root):
        return {e[len(prefix):] for e in s3.list_names(root, layout.CEASED) if e.startswith(prefix)}
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        ceased_fd = open_entry(root, root_fd, layout.CEASED)
        if ceased_fd is None:
            return set()
        fds.add(ceased_fd)
        entries = os.listdir(ceased_fd)
    return {e[len(prefix):] for e in entries if e.startswith(prefix)}
