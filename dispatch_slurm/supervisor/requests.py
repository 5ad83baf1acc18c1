"""Requests from people to the supervisor: ``<root>/requests/<verb>.<k>`` (release.<hold>,
supersede.<G>, stop.<G>), O_EXCL-created and durable. A request is an entry, not a
signal or a socket, so it works whether or not a supervisor runs right now, from any
host that sees the root; the supervisor records it as a fact when it acts on it."""

from __future__ import annotations

import json
import os
import pwd
import socket
import time

from .. import store
from ..contract.layout import REQUESTS


def path(root: store.Root, name: str) -> str:
    return os.path.join(store.at(root).root, REQUESTS, name)


def make(root: store.Root, name: str, body: dict) -> str:
    """O_EXCL-create ``<root>/requests/<name>`` (durable); FileExistsError if already made.
    ``root``: its name, or the store a supervisor keeps."""
    st = store.at(root)
    if not st.create(REQUESTS, name, json.dumps(body).encode(), mode=0o644):
        raise FileExistsError(path(st, name))
    return path(st, name)


def read(root: store.Root, name: str) -> dict | None:
    """The request's body (``entry``: its path), or None if nobody made it."""
    data = store.at(root).read(REQUESTS, name)
    if data is None:
        return None
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        body = {}
    return {"entry": path(root, name), **(body if isinstance(body, dict) else {})}


def who() -> dict:
    """Who asks: kept in the record with the request."""
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return {"user": user, "uid": os.geteuid(), "host": socket.gethostname(), "pid": os.getpid(),
            "t": round(time.time(), 3)}
