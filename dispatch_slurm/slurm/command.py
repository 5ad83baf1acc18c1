"""Running Slurm's commands: the runner, what it returns, the one error a Slurm failure
raises, and the plumbing every dialect shares (JSON decoding, hostlist expansion, the
release's version).

Commands run through an injectable *runner* so the same client works on a login node
(default: local ``subprocess.run``) and in tests (``docker exec`` into a container, as a
chosen user). Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence

from ..errors import DispatchError
from . import hostlist as hostlist_

__all__ = ["CommandResult", "Runner", "Shell", "SlurmError", "local_runner"]


class SlurmError(DispatchError):
    """A Slurm command failed or said something we cannot parse.

    Carries the command and its stderr, because "sbatch failed" alone never
    tells an operator what to fix."""

    def __init__(self, argv: Sequence[str], returncode: Optional[int], stderr: str, what: str = "failed"):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        rc = "" if returncode is None else f" (exit {returncode})"
        detail = stderr.strip() or "no output on stderr"
        super().__init__(f"`{' '.join(self.argv)}` {what}{rc}: {detail}")


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one command: ``runner(argv, env=..., input=...) -> CommandResult``, and with
    ``cwd=...`` when a caller names the folder to run it in (sbatch: where a job was defined).

    ``env`` is added to the caller's environment (the job inherits it through
    sbatch's default ``--export=ALL``); ``input`` is fed on stdin."""

    def __call__(
        self, argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, input: Optional[str] = None
    ) -> CommandResult: ...


def local_runner(
    argv: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    input: Optional[str] = None,
    timeout: float = 120.0,
    cwd: Optional[str] = None,
) -> CommandResult:
    """Run a command on this host (a login or compute node), in ``cwd`` if given (this
    process's own working directory is never changed: one process follows many roots)."""
    full_env = None if env is None else {**os.environ, **env}
    try:
        p = subprocess.run(
            list(argv), capture_output=True, text=True, env=full_env, input=input, timeout=timeout, check=False,
            cwd=cwd,
        )
    except FileNotFoundError as e:
        raise SlurmError(argv, None, f"{argv[0]} not found: is Slurm's client installed and on PATH? ({e})") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(argv, None, f"no answer within {timeout:g} s", what="timed out") from e
    return CommandResult(p.returncode, p.stdout, p.stderr)


# This host's Slurm client (what local_runner runs), read once per process: a process keeps
# one release's dialect for its life, as a supervisor always did with its one client. An
# injected runner (another host, a stand-in) is read once per client.
_HOST_VERSION: list[tuple[int, int]] = []


class Shell:
    """Runs Slurm commands through ``runner``: what every dialect reads through.

    ``expand_hostlists``: expand ``c[1-3]`` through ``scontrol show hostnames``
    (hostlist.py: the only exact expander; Slurm's hostlist grammar has corner cases)."""

    def __init__(self, runner: Optional[Runner] = None, *, expand_hostlists: bool = True):
        self.runner: Runner = runner or local_runner
        self.expand_hostlists = expand_hostlists
        self._version: Optional[tuple[int, int]] = None

    def run(
        self, argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, input: Optional[str] = None,
        cwd: Optional[str] = None,
    ) -> str:
        """Run one command (in ``cwd`` if given); its stdout, or SlurmError naming the command
        and its stderr."""
        where = {} if cwd is None else {"cwd": cwd}  # a runner asked for no folder need not take one
        res = self.runner(list(argv), env=env, input=input, **where)
        if res.returncode != 0:
            raise SlurmError(argv, res.returncode, res.stderr or res.stdout)
        return res.stdout

    def read_json(self, argv: Sequence[str]) -> dict[str, Any]:
        """Run one command that prints JSON; the object."""
        return self.decode(argv, self.run(argv))

    @staticmethod
    def decode(argv: Sequence[str], out: str) -> dict[str, Any]:
        """``out`` of ``argv`` as JSON; SlurmError if it is not, or if it lists errors."""
        try:
            data = json.loads(out)
        except json.JSONDecodeError as e:
            raise SlurmError(argv, 0, f"output is not JSON ({e}): {out[:200]!r}", what="printed bad JSON") from e
        errors = [e for e in data.get("errors") or [] if e]
        if errors:
            raise SlurmError(argv, 0, json.dumps(errors), what="reported errors")
        return data

    @property
    def version(self) -> tuple[int, int]:
        """(major, minor) of the Slurm client, e.g. (22, 5) or (24, 11)."""
        if self._version is None:
            if self.runner is not local_runner:
                self._version = self._read_version()
            else:
                _HOST_VERSION[:] = _HOST_VERSION or [self._read_version()]
                self._version = _HOST_VERSION[0]
        return self._version

    def _read_version(self) -> tuple[int, int]:
        out = self.run(["scontrol", "--version"])
        m = re.search(r"(\d+)\.(\d+)", out)
        if not m:
            raise SlurmError(["scontrol", "--version"], 0, f"no version in {out!r}", what="printed no version")
        return int(m.group(1)), int(m.group(2))

    def hostnames(self, hostlist: Optional[str]) -> list[str]:
        """``c[1-2],d3`` -> ['c1', 'c2', 'd3'], by hostlist.hostnames through this runner."""
        if not hostlist or hostlist in ("(null)", "None") or hostlist.startswith("None "):  # sacct: "None assigned"
            return []
        if not self.expand_hostlists:
            return [hostlist]
        return hostlist_.hostnames(hostlist, self.run)
