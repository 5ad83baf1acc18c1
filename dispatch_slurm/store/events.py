"""Execution events: one JSON-lines schema for everything that happens to an execution.

Layout: ``<root>/events/<attempt>.<host>.<pid>.jsonl``. On an S3 root, which cannot
append, each event is its own object ``events/<attempt>.<host>.<pid>.<ns>.jsonl`` (one
PUT, no lock, no read-modify-write; ``read`` merges them the same way): the events stay
with the root, where every node's and the report's readers find them, and a publish
costs one more PUT. Every process writes only its own file, so writers on different nodes (or ranks on one node) never share a file and
nothing relies on O_APPEND being atomic across NFS clients; each line is still one
``write()`` on an O_APPEND descriptor. ``read(root)`` merges all files by time.
Events are observability, not protocol: they are not fsynced (a handler in its grace
window must not wait on a slow filesystem for them), and no decision in the
publication protocol ever reads them. The supervisor reads an ended execution's own
(preempt_signal, checkpoint_complete, training_finished) to tell how it ended.

Schema version 1, one JSON object per line. Common fields:
    v        1                          t       Unix time, seconds (float)
    type     one of TYPES               job     $SLURM_JOB_ID or null
    attempt  $DISPATCH_ATTEMPT          epoch   $DISPATCH_EPOCH (int) or null
    host     hostname                   pid     process id
Type-specific fields:
    execution_started    argv (list), from the trainer; or source "prolog" from the Prolog on
                         each node: node, nodes (the execution's), nodelist, start_time
                         (Slurm's, 24.11 on), sluid
    preempt_signal       signal (name, e.g. "SIGTERM"), grace (s), deadline (Unix time)
    checkpoint_complete  elapsed (s since the signal), time_remaining (s) from the handler; or
                         source "mark" (`dispatch-slurm mark saved`, a user's own handler); an
                         older Epilog's, source "epilog" (it scanned the job's output), is no
                         fact of the execution and the supervisor ignores it
    training_finished    the execution reached the end of training (the integrations, `mark
                         finished`): a COMPLETED end is then done
    published            step, path (relative to the root), name (the pub/ entry), by
                         (who published: "watch", "hf", "preempt", "publish", ...), existed
                         (a retry that re-confirmed durability); held (the publication kept
                         its own links to the save's files), unheld (why not); adopted,
                         adopted_from when the save was not this execution's own
    removed              path: a published save gone from its execution's folder (its trainer's
                         rotation, an rm), as the watch saw it; its held links still keep it
    execution_ended      exit (exit code)
    resumed              step, name, path of the publication the execution resumes from (all
                         null: from scratch), by ("latest --resume", "resume_point"): its
                         first rank, when the package resolves the resume (store/resume.py)
    cessation, hold, release   for the admin side (Epilog: source "epilog", or "epilog
                         (rejoined)" without the job's options; node, nodes, evidence; recovery); a
                         person's word to gc (gc --ceased) is a cessation with source "person"
    gc                   removed (paths: removed, or retired when already gone), freed (bytes on
                         disk), keep_last, keep_every
    warning              kind ("unpublished_saves": a resume found nothing published but saves in
                         the exec folders; "never_complete": watch ended with saves it could not
                         publish; "lightning_auto_requeue"; "refused": `latest --resume` refused
                         the root), by, message, paths, count
"""

import json
import os
import re
import time
from functools import lru_cache
from typing import Callable

from ..contract.env import Execution
from ..contract.layout import EVENTS
from ..errors import DispatchError
from .roots import Root, at, name_of

SCHEMA = 1
TYPES = frozenset({"execution_started", "preempt_signal", "checkpoint_complete", "training_finished", "published",
                   "execution_ended", "cessation", "hold", "release", "gc", "retired", "resumed", "warning",
                   "removed"})
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _encoder() -> Callable[[dict], str]:
    """``json.dumps(rec, separators=(",", ":"))``, with one C encoder kept for every line
    (``dumps`` makes a new one per call: a third of an event's cost on each publication)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(separators=(",", ":")).encode
    enc = make(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False,
               True)
    return lambda rec: "".join(enc(rec, 0))


_LINE = _encoder()


@lru_cache(maxsize=4)
def _host(pid: int) -> str:
    """gethostname()'s answer (without importing socket at every start), asked once per process."""
    return os.uname().nodename


@lru_cache(maxsize=16)
def _file(attempt: str, host: str, pid: int) -> str:
    """The events file of a process: ``<attempt>.<host>.<pid>`` (each part made safe)."""
    return f"{_UNSAFE.sub('_', attempt)}.{_UNSAFE.sub('_', host)}.{pid}"


def emit(type_: str, root: Root | None = None, attempt: str | None = None, **fields) -> dict | None:
    """Append one event for this process; returns it, or None when no root is known
    (no $DISPATCH_CHECKPOINT: the program runs outside dispatch, so there is nowhere to
    write). ``root``: its name, or the store a caller holds (written through it, in its
    session if one is open). Uses only os-level calls, so it is safe inside a signal handler."""
    if type_ not in TYPES:
        raise ValueError(f"unknown event type {type_!r} (one of {', '.join(sorted(TYPES))})")
    ex = Execution.current(root=name_of(root))
    if not ex.root:
        return None
    attempt = attempt or ex.attempt or "unknown"
    try:
        epoch = ex.epoch
    except DispatchError:
        epoch = None  # observability: a bad epoch is the caller's error to report, not this event's
    pid = os.getpid()
    host = _host(pid)
    rec = {"v": SCHEMA, "t": time.time(), "type": type_, "job": ex.job,
           "attempt": attempt, "epoch": epoch,
           "host": host, "pid": pid, **fields}
    line = (_LINE(rec) + "\n").encode()
    at(root or ex.root).add_event(_file(attempt, host, rec["pid"]), line)
    return rec


def record(type_: str, **kwargs) -> dict | None:
    """emit(), for callers whose real work already succeeded (a publication, a
    checkpoint): failing to record it is a warning on stderr, never their failure."""
    try:
        return emit(type_, **kwargs)
    except (OSError, DispatchError) as e:
        os.write(2, f"dispatch-slurm: warning: could not record a {type_} event: {e}\n".encode())
        return None


def _files(root: Root, attempt: str | None = None):
    """(name, content) of every events file (on S3: object) under ``root``, in name order;
    only ``attempt``'s when given (its files are named ``<attempt>.<host>.<pid>...``)."""
    yield from at(root).event_files(f"{_UNSAFE.sub('_', attempt)}." if attempt else "")


def read(root: Root, attempt: str | None = None, strict: bool = True) -> list[dict]:
    """Every event under ``root`` (only ``attempt``'s when given), ordered by time; a line
    that is not an event (not a JSON object with a time) is an error naming its file and
    line: a torn line means a writer broke the contract. ``strict=False`` leaves such a
    line out instead, for readers that weigh evidence (the supervisor) and must not stop
    on a writer killed in mid-line."""
    st = at(root)
    folder = os.path.join(st.root, EVENTS)
    out = []
    for name, data in _files(st, attempt):
        for no, line in enumerate(data.splitlines(), 1):
            try:
                ev = json.loads(line)
                if not isinstance(ev, dict) or not isinstance(ev.get("t"), (int, float)) or \
                        not isinstance(ev.get("type"), str):
                    raise ValueError("not an object with a type and a time t")
            except ValueError as e:
                if not strict:
                    continue
                raise DispatchError(f"{folder}/{name}:{no}: not an event ({e})") from None
            out.append(ev)
    return sorted(out, key=lambda r: r["t"])
