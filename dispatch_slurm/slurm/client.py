"""The Slurm client of dispatch-slurm: runs Slurm's CLI and returns parsed facts.

Why the CLI and not libslurm: the commands are the one interface that is stable
enough across Slurm 22.05 .. 26.05 and available to an unprivileged user. Why
JSON: the text formats are made for people and change between releases. The JSON
shapes still differ between versions (see ``_parse_job`` / ``_parse_node``):

- 22.05 has no ``scontrol --json``; ``squeue --json`` / ``sinfo --json`` dump the
  openapi v0.0.38 shapes: ``job_state`` is one string (a flag such as
  COMPLETING or REQUEUED hides the base state), ``exit_code`` is a raw wait
  status, node ``state`` is a lower-case base state with ``state_flags`` beside.
  Its ``sacct --json`` reports exit code 0 for a failed batch script, so ended jobs
  are read from ``sacct --parsable2`` text there.
- 24.11 and later: ``scontrol show job|nodes --json=v0.0.42`` and ``sacct
  --json=v0.0.42``, the data_parser version pinned (DATA_PARSER): Slurm prints each
  release's newest by default (26.05: v0.0.45), and v0.0.42 is the one both 24.11
  (v0.0.40-42) and 26.05 (v0.0.42-45) have. ``job_state`` and node ``state`` are
  lists (base state + flags), ``exit_code`` is an object
  ``{status, return_code{set,number}, signal{id{set,number}, name}}``. A release
  without the pinned version (23.02-24.05, or a future one that dropped it) is
  refused with a message naming it.

Jobs that slurmctld no longer holds (it forgets an ended job after MinJobAge, 300 s
by default) are read from the accounting database through ``sacct``.

Commands run through an injectable *runner* so the same client works on a login
node (default: local ``subprocess.run``) and in tests (``docker exec`` into a
container, as a chosen user). Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence

from ..errors import DispatchError
from .facts import (BASE_JOB_STATES, DATA_PARSER, ENDED, JobInfo, NodeInfo, _DATA_PARSER_FROM, _PINNED_FROM,
                    _SACCT_FIELDS, _number, parse_accounted, parse_accounted_text, parse_job, parse_node)

__all__ = [
    "BASE_JOB_STATES",
    "ENDED",
    "CommandResult",
    "JobInfo",
    "NodeInfo",
    "Runner",
    "Slurm",
    "SlurmError",
    "local_runner",
]


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
    """Runs one command: ``runner(argv, env=..., input=...) -> CommandResult``.

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
) -> CommandResult:
    """Run a command on this host (a login or compute node)."""
    full_env = None if env is None else {**os.environ, **env}
    try:
        p = subprocess.run(
            list(argv), capture_output=True, text=True, env=full_env, input=input, timeout=timeout, check=False
        )
    except FileNotFoundError as e:
        raise SlurmError(argv, None, f"{argv[0]} not found: is Slurm's client installed and on PATH? ({e})") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(argv, None, f"no answer within {timeout:g} s", what="timed out") from e
    return CommandResult(p.returncode, p.stdout, p.stderr)


class Slurm:
    """Runs Slurm commands through ``runner`` and parses what they print.

    ``expand_hostlists``: expand ``c[1-3]`` through ``scontrol show hostnames``
    (the only exact expander; Slurm's hostlist grammar has corner cases)."""

    def __init__(self, runner: Optional[Runner] = None, *, expand_hostlists: bool = True):
        self.runner: Runner = runner or local_runner
        self.expand_hostlists = expand_hostlists
        self._version: Optional[tuple[int, int]] = None

    # -- plumbing ---------------------------------------------------------------------------

    def run(
        self, argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, input: Optional[str] = None
    ) -> str:
        """Run one command; its stdout, or SlurmError naming the command and its stderr."""
        res = self.runner(list(argv), env=env, input=input)
        if res.returncode != 0:
            raise SlurmError(argv, res.returncode, res.stderr or res.stdout)
        return res.stdout

    def _json(self, argv: Sequence[str]) -> dict[str, Any]:
        return self._decode(argv, self.run(argv))

    @staticmethod
    def _decode(argv: Sequence[str], out: str) -> dict[str, Any]:
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
            out = self.run(["scontrol", "--version"])
            m = re.search(r"(\d+)\.(\d+)", out)
            if not m:
                raise SlurmError(["scontrol", "--version"], 0, f"no version in {out!r}", what="printed no version")
            self._version = (int(m.group(1)), int(m.group(2)))
        return self._version

    @property
    def _scontrol_json(self) -> bool:
        """True: read with ``--json=DATA_PARSER`` (24.11 on); False: 22.05's squeue/sinfo JSON
        and sacct text. The releases between have data_parser but not the pinned version."""
        v = self.version
        if _DATA_PARSER_FROM <= v < _PINNED_FROM:
            raise SlurmError(["scontrol", "--version"], 0,
                             f"Slurm {v[0]}.{v[1]:02d} cannot print JSON in data_parser {DATA_PARSER}, the version "
                             f"dispatch-slurm reads; it needs Slurm 22.05, or {_PINNED_FROM[0]}.{_PINNED_FROM[1]} "
                             "or later", what="is a release dispatch-slurm cannot read")
        return v >= _PINNED_FROM

    def _pinned_json(self, argv: Sequence[str]) -> dict[str, Any]:
        """``ARGV --json=DATA_PARSER``, refused with a message naming the pin where this Slurm
        lacks that version (it says "unable to find plugin: data_parser/v0.0.42")."""
        cmd = [*argv, f"--json={DATA_PARSER}"]
        res = self.runner(cmd)
        data = None if res.returncode else self._decode(cmd, res.stdout)
        printed = ((data or {}).get("meta") or {}).get("plugin", {}).get("data_parser")
        if f"data_parser/{DATA_PARSER}" in res.stderr or printed not in (None, f"data_parser/{DATA_PARSER}"):
            raise SlurmError(cmd, res.returncode, f"this Slurm has no data_parser {DATA_PARSER}, the JSON version "
                             f"dispatch-slurm reads: {(res.stderr or str(printed)).strip()[-300:]}",
                             what="cannot print the pinned JSON version")
        if data is None:
            raise SlurmError(cmd, res.returncode, res.stderr or res.stdout)
        return data

    def hostnames(self, hostlist: Optional[str]) -> list[str]:
        """``c[1-2],d3`` -> ['c1', 'c2', 'd3']."""
        if not hostlist or hostlist in ("(null)", "None") or hostlist.startswith("None "):  # sacct: "None assigned"
            return []
        if not self.expand_hostlists or not re.search(r"[\[,]", hostlist):
            return [hostlist]
        return self.run(["scontrol", "show", "hostnames", hostlist]).split()

    # -- jobs -------------------------------------------------------------------------------

    def submit(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        *,
        script: Optional[str] = None,
    ) -> int:
        """``sbatch --parsable ARGV`` (with ``script`` on stdin if given); the job id."""
        cmd = ["sbatch", "--parsable", *argv]
        out = self.run(cmd, env=env, input=script).strip()
        m = re.match(r"^(\d+)(;\S+)?$", out.splitlines()[-1] if out else "")
        if not m:
            raise SlurmError(cmd, 0, f"no job id in {out!r}", what="printed no job id")
        return int(m.group(1))

    def job(self, job_id: int) -> JobInfo:
        """The job as slurmctld knows it now or, once slurmctld forgot it (MinJobAge after it
        ended), as the accounting database recorded its last execution (``source='sacct'``)."""
        if self._scontrol_json:
            jobs = self._pinned_json(["scontrol", "show", "job", str(int(job_id))]).get("jobs") or []
        else:
            # 22.05's `squeue --json` ignores filters and dumps every job in memory.
            jobs = self._json(["squeue", "--json"]).get("jobs") or []
        for j in jobs:
            if _number(j.get("job_id")) == int(job_id):
                return parse_job(j, self.hostnames)
        found = self.accounted_job(job_id)
        if found is None:
            raise SlurmError(["scontrol", "show", "job", str(job_id)], None,
                             f"job {job_id} is not known to slurmctld nor to sacct", what="found no such job")
        return found

    def jobs(self) -> list[JobInfo]:
        """Every job slurmctld holds in memory (pending, running, and ended within MinJobAge)."""
        if self._scontrol_json:
            jobs = self._pinned_json(["scontrol", "show", "job"]).get("jobs") or []
        else:
            jobs = self._json(["squeue", "--json"]).get("jobs") or []
        return [parse_job(j, self.hostnames) for j in jobs]

    def accounted_job(self, job_id: int) -> Optional[JobInfo]:
        """The job's last execution as ``sacct`` has it (every execution of a requeued job is
        a record: ``--duplicates``), or None when the accounting database has no record of
        it or the cluster keeps no accounting. slurmdbd not answering raises."""
        cmd = ["sacct", "-j", str(int(job_id)), "--duplicates", "--allusers"]
        try:
            if self._scontrol_json:
                records = [j for j in self._pinned_json(cmd).get("jobs") or [] if _number(j.get("job_id")) == job_id]
                return parse_accounted(records[-1], self.hostnames) if records else None
            out = self.run([*cmd, "-X", "-n", "--parsable2", f"--format={','.join(_SACCT_FIELDS)}"],
                           env={"SLURM_TIME_FORMAT": "%s"})
        except SlurmError as e:
            if _NO_ACCOUNTING.search(str(e)):
                return None
            raise
        rows = [dict(zip(_SACCT_FIELDS, line.split("|"))) for line in out.splitlines() if line.strip()]
        rows = [r for r in rows if r["JobID"] == str(job_id)]
        return parse_accounted_text(rows[-1], len(rows) - 1, self.hostnames) if rows else None

    def test_submit(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
        """``sbatch --test-only ARGV``: Slurm validates the job (options, script, SPANK
        options) without queueing it; SlurmError with sbatch's own message if it would be
        refused. Asked before a submission number is spent on it."""
        self.run(["sbatch", "--test-only", *argv], env=env)

    def plugin_options(self) -> set[str]:
        """The options SPANK plugins add to sbatch here (``--dispatch-checkpoint``...), as
        ``sbatch --help`` lists them: empty when no plugin is installed."""
        _, found, plugins = self.run(["sbatch", "--help"]).partition("Options provided by plugins:")
        return set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", plugins, re.M)) if found else set()

    def cancelled_by(self, job_id: int) -> Optional[int]:
        """The uid that cancelled the job, from Slurm's accounting (``sacct``: "CANCELLED by
        UID"); None when accounting is off here or does not say (slurmctld itself keeps no
        record of who cancelled)."""
        try:
            out = self.run(["sacct", "-j", str(int(job_id)), "-X", "-n", "-P", "-o", "State"])
        except SlurmError:
            return None
        m = re.search(r"CANCELLED by (\d+)", out)
        return int(m.group(1)) if m else None

    def cancel(self, job_id: int, signal: Optional[str] = None, *, batch: bool = False) -> None:
        """``scancel``: without ``signal`` Slurm's cancel (SIGCONT, SIGTERM, KillWait, SIGKILL);
        with it, only that signal (``batch``: to the batch shell alone, not the steps)."""
        cmd = ["scancel"]
        if signal:
            cmd.append(f"--signal={signal}")
        if batch:
            cmd.append("--batch")
        self.run([*cmd, str(int(job_id))])

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue``: back to PENDING, restart count +1 (needs operator rights or ownership)."""
        self.run(["scontrol", "requeue", str(int(job_id))])

    # -- nodes ------------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """Every node with its state set (upper case) and reason."""
        if self._scontrol_json:
            raw = self._pinned_json(["scontrol", "show", "nodes"]).get("nodes") or []
        else:
            raw = self._json(["sinfo", "--json"]).get("nodes") or []
        return [parse_node(n) for n in raw]

    def node(self, name: str) -> NodeInfo:
        for n in self.nodes():
            if n.name == name:
                return n
        raise SlurmError(["scontrol", "show", "node", name], None, f"node {name} is not known", what="found no node")

    def find_job(self, job_id: int) -> Optional[JobInfo]:
        """The job (from slurmctld, else from sacct), or None when neither knows it. Any other
        failure (controller or slurmdbd unreachable, bad output) raises: "unknown" must never
        read as "gone"."""
        try:
            return self.job(job_id)
        except SlurmError as e:
            if _UNKNOWN_JOB.search(str(e)):
                return None
            raise

    def jobs_with_comment(self, comment: str, user: Optional[str] = None,
                          since: Optional[float] = None) -> list[JobInfo]:
        """Jobs whose ``--comment`` is exactly ``comment``: in slurmctld's memory and, with
        ``since`` (a Unix time), those sacct recorded as submitted since then. The accounting
        database keeps a comment only with AccountingStoreFlags=job_comment; from 24.11 on
        sacct also records the submit line, which names it (``--comment=...``)."""
        found = {j.job_id: j for j in self.jobs() if j.comment == comment and (user is None or j.user == user)}
        if since is None:
            return list(found.values())
        cmd = ["sacct", "--allusers", "--duplicates", "-S", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))]
        cmd += ["-u", user] if user else []
        try:
            if self._scontrol_json:
                for j in self._pinned_json(cmd).get("jobs") or []:
                    c = j.get("comment") or {}
                    line = str(j.get("submit_line") or "")
                    named = re.search(rf"--comment[= ]{re.escape(comment)}(\s|$)", line)
                    if (c.get("job") if isinstance(c, dict) else c) == comment or named:
                        found.setdefault(int(_number(j.get("job_id")) or 0), parse_accounted(j, self.hostnames))
            else:
                out = self.run([*cmd, "-X", "-n", "--parsable2", f"--format={','.join(_SACCT_FIELDS)}"],
                               env={"SLURM_TIME_FORMAT": "%s"})
                for line in out.splitlines():
                    row = dict(zip(_SACCT_FIELDS, line.split("|")))
                    if row.get("Comment") == comment and row["JobID"].isdigit():
                        found.setdefault(int(row["JobID"]), parse_accounted_text(row, 0, self.hostnames))
        except SlurmError as e:
            if not _NO_ACCOUNTING.search(str(e)):
                raise
        return list(found.values())

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as {name: value} (the text form: 22.05 has no JSON for it)."""
        out = self.run(["scontrol", "show", "config"])
        return {m.group(1): m.group(2).strip() for m in re.finditer(r"^(\w+)\s*=\s*(.*)$", out, re.M)}

    def cluster_name(self) -> str:
        """ClusterName from ``scontrol show config`` (part of every DISPATCH_ATTEMPT)."""
        name = self.config().get("ClusterName", "")
        if not name:
            raise SlurmError(["scontrol", "show", "config"], 0, "no ClusterName", what="printed no ClusterName")
        return name

    def hold(self, job_id: int) -> None:
        """``scontrol hold``: a pending job stays pending until released (users may hold their own)."""
        self.run(["scontrol", "hold", str(int(job_id))])

    def release(self, job_id: int) -> None:
        """``scontrol release``: undo ``hold``."""
        self.run(["scontrol", "release", str(int(job_id))])


# What 22.05 .. 26.05 say for a job id slurmctld does not hold (purged after MinJobAge).
_UNKNOWN_JOB = re.compile(r"Invalid job id|found no such job|is not known to slurmctld", re.I)
# What sacct says on a cluster that keeps no accounting (AccountingStorageType=none).
_NO_ACCOUNTING = re.compile(r"accounting storage is disabled|not running a supported accounting_storage", re.I)
