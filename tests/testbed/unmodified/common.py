"""What the unmodified trainers here share, none of it dispatch-slurm's (they import nothing of
it and take no flag of it): their command line, the log of what they did (JSON lines the harness
reads: start, resume, step, save, done), the pace of a step (so a harness can stop one between
two steps), and the digest of the final weights, which a run with overlaps must equal bit for
bit. Each trainer is a script a user could have written, run by path."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time


def arguments(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the folder the trainer saves into and resumes from")
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds a step takes at least")
    ap.add_argument("--record", required=True, help="the trainer's own record (JSON lines)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


class Log:
    """JSON lines, one O_APPEND write each; every line says which process wrote it."""

    def __init__(self, path: str, rank: int = 0):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        self.fields = {"pid": os.getpid(), "rank": rank}

    def __call__(self, op: str, **more) -> None:
        os.write(self.fd, (json.dumps({"t": time.time(), **self.fields, "op": op, **more}) + "\n").encode())


class Pace:
    """A step lasts at least ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds, self.t = seconds, time.monotonic()

    def __call__(self) -> None:
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.t)))
        self.t = time.monotonic()


def digest(state: dict) -> str:
    """Every tensor's bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def read(path: str) -> list[dict]:
    """A log as the harness reads it."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
