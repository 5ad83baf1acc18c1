"""The cessation signal's question: the site's command for a held execution, run as a child.

A step starts it and returns; a later step collects its answer (``Question.answer``). One
fleet process steps many roots, so a command that takes its time (the default one asks
Slurm; a site's may ssh to the nodes) must never hold up the other roots' polls. Exit 0 is
"ceased", 1 "not ceased", anything else, or no exit within the hold's timeout (the child is
then killed), "unknown". Its output goes to files, not pipes: a talkative command never
blocks on a pipe nobody reads until it exits."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import IO, Any, Callable, Optional

from .holds import ask_timeout


def cessation_argv(h: dict, root: str, cluster: Optional[str]) -> list[str]:
    """The hold's ``--cessation-cmd`` with the held execution filled in."""
    values = {"job": h["job"], "restart": h["r"], "root": root, "generation": h.get("g"),
              "submission": h.get("n"), "epoch": h.get("epoch"), "attempt": h.get("attempt"),
              "cluster": cluster, "nodes": ",".join(h.get("nodes") or []),
              "started": h.get("start_time")}
    values = {k: "" if v is None else str(v) for k, v in values.items()}
    argv = [part.format(**values) for part in shlex.split(h["cessation_cmd"])]
    if argv[0] == "dispatch-slurm" and shutil.which("dispatch-slurm") is None:
        argv[:1] = [sys.executable, "-m", "dispatch_slurm"]  # e.g. run from a venv not on PATH
    return argv


class Question:
    """One asking of the cessation signal for hold ``hold``: running (``answer`` is None)
    until it exits or its deadline passes, then answered. ``answered`` makes one whose
    answer is known at once (a test's stand-in for the site's command)."""

    def __init__(self, hold: int, answer: Optional[dict] = None):
        self.hold = hold
        self._answer = answer
        self.proc: Optional[subprocess.Popen] = None
        self._out: Optional[IO[bytes]] = None
        self._err: Optional[IO[bytes]] = None
        self.deadline, self.timeout = 0.0, 0.0

    @classmethod
    def answered(cls, h: dict, answer: dict) -> "Question":
        return cls(h["hold"], answer)

    @classmethod
    def start(cls, h: dict, root: str, cluster: Optional[str], now: float) -> "Question":
        """Start the site's command for hold ``h`` at time ``now``; it is not waited for."""
        q = cls(h["hold"])
        q.timeout = ask_timeout(h)
        q.deadline = now + q.timeout
        argv = cessation_argv(h, root, cluster)
        q._out, q._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        try:
            q.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=q._out, stderr=q._err)
        except OSError as e:  # not found, not executable: an answer at once
            q._close_files()
            q._answer = {"answer": "unknown", "exit": None, "error": f"{argv[0]}: cannot run it ({e})"}
        return q

    def answer(self, now: float) -> Optional[dict]:
        """The answer, or None while the command runs; past the deadline it is killed and
        the answer is "unknown", naming the time it had."""
        if self._answer is not None or self.proc is None:
            return self._answer
        code = self.proc.poll()
        if code is None:
            if now < self.deadline:
                return None
            self.close()
            self._answer = {"answer": "unknown", "exit": None, "error": f"no answer within {self.timeout:g} s"}
            return self._answer
        self._answer = self._read(code)
        return self._answer

    def _read(self, code: int) -> dict:
        out: dict[str, Any] = {"answer": {0: "ceased", 1: "not_ceased"}.get(code, "unknown"), "exit": code}
        stdout, stderr = (self._text(f) for f in (self._out, self._err))
        self._close_files()
        try:
            out["evidence"] = json.loads(stdout)
        except ValueError:
            out["output"] = stdout.strip()[-1000:]
        if stderr.strip():
            out["stderr"] = stderr.strip()[-500:]
        return out

    @staticmethod
    def _text(f: Optional[IO[bytes]]) -> str:
        if f is None:
            return ""
        f.seek(0)
        return f.read().decode("utf-8", "replace")

    def _close_files(self) -> None:
        for f in (self._out, self._err):
            if f is not None:
                f.close()
        self._out = self._err = None

    def close(self) -> None:
        """Kill the command if it still runs (the supervisor stops, or the hold was lifted
        meanwhile), and reap it: no child outlives its supervisor."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_files()


#: how a supervisor asks: a hold -> its question (the default starts the site's command)
Asker = Callable[[dict], Question]
