"""Cessation evidence: ``<root>/ceased/<attempt>.<node>``, written by the Epilog (as
the job user) once the execution's processes on that node are gone, read by the
cessation signal (slurm/cessation.py). O_EXCL and durable like a publication, and
idempotent: Slurm may run an Epilog twice for one execution (TERMINATE_JOB retries).

The entry holds how the Epilog knows, as one JSON object (``{"by": "cgroup v2",
"cgroup": ..., "state": "gone"}`` or ``{"by": "process scan"}``); an entry of an older
Epilog is empty, and says only that it was recorded."""

import json
import os

from ..contract import layout
from ..errors import BadPath
from . import s3
from .durable import DirFds, create_new
from .posix import open_entry, open_root
from .roots import is_s3


def record(root: str, attempt: str, node: str, evidence: dict | None = None) -> bool:
    """Record that ``attempt``'s processes on ``node`` are gone (``evidence``: how that is
    known); True if recorded now, False if it already was (a second Epilog run changes
    nothing)."""
    if not attempt or "/" in attempt or not node or "/" in node:
        raise BadPath(f"bad attempt {attempt!r} or node {node!r}")
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        ceased_fd = fds.add(open_entry(root, root_fd, layout.CEASED, create=True))
        try:
            create_new(f"{attempt}.{node}", ceased_fd, json.dumps(evidence, sort_keys=True).encode()
                       if evidence else b"")
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


MAX_EVIDENCE = 4096  # an entry is one small JSON object: more is not the Epilog's


def entries(root: str, attempt: str) -> dict[str, dict]:
    """node -> the evidence its Epilog recorded for this execution (``{}``: an empty
    entry, or one that is not a JSON object, or an S3 root's object, whose body is not read)."""
    found = nodes(root, attempt)
    if is_s3(root) or not found:
        return {n: {} for n in found}
    out: dict[str, dict] = {}
    with DirFds() as fds:
        root_fd = fds.add(open_root(root))
        ceased_fd = open_entry(root, root_fd, layout.CEASED)
        if ceased_fd is None:
            return {n: {} for n in found}
        fds.add(ceased_fd)
        for n in found:
            try:
                fd = os.open(f"{attempt}.{n}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=ceased_fd)
            except OSError:
                out[n] = {}
                continue
            try:
                data = os.read(fd, MAX_EVIDENCE)
            except OSError:
                data = b""
            finally:
                os.close(fd)
            try:
                ev = json.loads(data) if data else {}
            except ValueError:
                ev = {}
            out[n] = ev if isinstance(ev, dict) else {}
    return out
