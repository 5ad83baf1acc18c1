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
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence

from .errors import DispatchError

__all__ = [
    "BASE_JOB_STATES",
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


# Base job states (JOB_STATE_BASE); everything else Slurm reports is a flag.
BASE_JOB_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
# 22.05 prints a set flag *instead of* the base state. These flags imply the base.
_FLAG_IMPLIES_BASE = {
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "SPECIAL_EXIT": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "CONFIGURING": "RUNNING",
    "RESIZING": "RUNNING",
    "SIGNALING": "RUNNING",
    "STOPPED": "RUNNING",
}
_NO_VAL = 0xFFFFFFFE  # Slurm's "not set" for uint32 (NO_VAL); INFINITE is 0xFFFFFFFF.
#: The data_parser version of every ``--json`` read (24.11 and later): see the module doc.
DATA_PARSER = "v0.0.42"
# The first release with DATA_PARSER, and the first with data_parser at all (before: 22.05).
_PINNED_FROM, _DATA_PARSER_FROM = (24, 11), (23, 2)
# sacct's text columns (22.05), printed with SLURM_TIME_FORMAT=%s (Unix times).
_SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Start", "End", "Partition", "User", "JobName",
                 "Cluster", "Comment", "Reason")


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job, the same on 22.05, 24.11 and 26.05.

    ``state`` is the base state (PENDING, RUNNING, CANCELLED, PREEMPTED, ...);
    ``flags`` the state flags (COMPLETING, REQUEUED, ...). On 22.05 a set flag
    hides the base state: then ``state`` is the base the flag implies, or the flag
    itself (e.g. COMPLETING) when it implies none. ``exit_code`` is the batch
    script's exit status and ``exit_signal`` the signal that ended it, each None
    when not set. ``raw`` is the job's JSON object as Slurm printed it. ``source``:
    ``slurmctld`` (the job is in its memory) or ``sacct`` (the accounting record of a
    job slurmctld no longer holds: no flags, no batch host)."""

    job_id: int
    state: str
    flags: frozenset[str]
    reason: str
    restart_count: int
    nodes: list[str]
    batch_host: str
    exit_code: Optional[int]
    exit_signal: Optional[int]
    partition: str
    user: str
    name: str
    raw: dict[str, Any] = field(repr=False, compare=False)
    source: str = "slurmctld"

    @property
    def states(self) -> frozenset[str]:
        """Base state and flags together, for ``'COMPLETING' in job.states``."""
        return self.flags | {self.state}

    # -- read from ``raw``: the same fields on 22.05 and 24.11 --

    @property
    def start_time(self) -> Optional[int]:
        """Unix time the current execution started (None while it never started)."""
        return _time(self.raw, "start_time")

    @property
    def end_time(self) -> Optional[int]:
        return _time(self.raw, "end_time")

    @property
    def comment(self) -> str:
        """``sbatch --comment``: the supervisor tags its submissions with it."""
        c = self.raw.get("comment")
        if isinstance(c, dict):  # some data_parser versions: {"job": ..., "administrator": ...}
            c = c.get("job")
        return str(c or "")

    @property
    def cluster(self) -> str:
        return str(self.raw.get("cluster") or "")


@dataclass(frozen=True)
class NodeInfo:
    """One node: ``state`` holds the base state and flags, upper case
    (e.g. {'IDLE'}, {'DOWN', 'NOT_RESPONDING'}, {'MIXED'})."""

    name: str
    state: frozenset[str]
    reason: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def base_state(self) -> str:
        base = self.state & {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"}
        return next(iter(sorted(base)), "UNKNOWN")

    @property
    def boot_time(self) -> Optional[int]:
        """Unix time the node last booted, as its slurmd reported it."""
        return _time(self.raw, "boot_time")

    @property
    def responding(self) -> bool:
        """Up and answering slurmctld: not DOWN, NOT_RESPONDING, FUTURE, UNKNOWN or powered down.
        (Responding says nothing about the node's old processes: see dispatch_slurm.cessation.)"""
        bad = {"DOWN", "NOT_RESPONDING", "FUTURE", "UNKNOWN", "POWERED_DOWN", "POWERING_DOWN",
               "POWER_DOWN", "POWERING_UP", "REBOOT_ISSUED"}
        return not (self.state & bad) and bool(self.state)


def _time(raw: dict[str, Any], key: str) -> Optional[int]:
    """A Unix time field; Slurm's 0 means "not yet", like an unset one."""
    return _number(raw.get(key)) or None


def _unix(text: str) -> Optional[int]:
    """A sacct time printed with SLURM_TIME_FORMAT=%s ("Unknown", "None" when not set)."""
    return int(text) if text.isdigit() and int(text) else None


def _number(v: Any) -> Optional[int]:
    """An integer from either an int or data_parser's {set, infinite, number}."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    if v is None or isinstance(v, bool):
        return None
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return None if n >= _NO_VAL else n


def _split_job_state(value: Any) -> tuple[str, frozenset[str]]:
    if isinstance(value, str):
        words = [value]
    elif isinstance(value, list):
        words = [str(w) for w in value]
    else:
        words = []
    words = [w.strip().upper() for w in words if str(w).strip()]
    base = [w for w in words if w in BASE_JOB_STATES]
    flags = frozenset(w for w in words if w not in BASE_JOB_STATES)
    if base:
        return base[0], flags
    for f in sorted(flags):
        if f in _FLAG_IMPLIES_BASE:
            return _FLAG_IMPLIES_BASE[f], flags
    if flags:
        return sorted(flags)[0], flags
    return "UNKNOWN", flags


def _exit_status(value: Any) -> tuple[Optional[int], Optional[int]]:
    """(exit code, signal) from a raw wait status (22.05) or an exit-code object."""
    if isinstance(value, dict):
        status = {str(s).upper() for s in value.get("status") or []}
        if "PENDING" in status:
            return None, None
        code = _number(value.get("return_code"))
        sig = value.get("signal") or {}
        signo = _number(sig.get("id")) if isinstance(sig, dict) else None
        return code, (signo or None)
    raw = _number(value)
    if raw is None:
        return None, None
    signo = raw & 0x7F
    if signo:  # WIFSIGNALED: there is no exit code, as 24.11 says with return_code unset
        return None, signo
    return (raw >> 8) & 0xFF, None


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
                return self._parse_job(j)
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
        return [self._parse_job(j) for j in jobs]

    def accounted_job(self, job_id: int) -> Optional[JobInfo]:
        """The job's last execution as ``sacct`` has it (every execution of a requeued job is
        a record: ``--duplicates``), or None when the accounting database has no record of
        it or the cluster keeps no accounting. slurmdbd not answering raises."""
        cmd = ["sacct", "-j", str(int(job_id)), "--duplicates", "--allusers"]
        try:
            if self._scontrol_json:
                records = [j for j in self._pinned_json(cmd).get("jobs") or [] if _number(j.get("job_id")) == job_id]
                return self._parse_accounted(records[-1]) if records else None
            out = self.run([*cmd, "-X", "-n", "--parsable2", f"--format={','.join(_SACCT_FIELDS)}"],
                           env={"SLURM_TIME_FORMAT": "%s"})
        except SlurmError as e:
            if _NO_ACCOUNTING.search(str(e)):
                return None
            raise
        rows = [dict(zip(_SACCT_FIELDS, line.split("|"))) for line in out.splitlines() if line.strip()]
        rows = [r for r in rows if r["JobID"] == str(job_id)]
        return self._parse_accounted_text(rows[-1], restarts=len(rows) - 1) if rows else None

    def _parse_accounted(self, j: dict[str, Any]) -> JobInfo:
        """A ``sacct --json=DATA_PARSER`` job record (24.11 on)."""
        state, flags = _split_job_state((j.get("state") or {}).get("current"))
        code, signo = _exit_status(j.get("exit_code"))
        t = j.get("time") or {}
        comment = j.get("comment") or {}
        return JobInfo(
            job_id=int(_number(j.get("job_id")) or 0), state=state, flags=flags,
            reason=str((j.get("state") or {}).get("reason") or ""),
            restart_count=int(_number(j.get("restart_cnt")) or 0),
            nodes=self.hostnames(j.get("nodes")), batch_host="", exit_code=code, exit_signal=signo,
            partition=str(j.get("partition") or ""), user=str(j.get("user") or ""), name=str(j.get("name") or ""),
            raw={"start_time": t.get("start"), "end_time": t.get("end"), "cluster": j.get("cluster"),
                 "comment": comment.get("job") if isinstance(comment, dict) else comment, "sacct": j},
            source="sacct",
        )

    def _parse_accounted_text(self, row: dict[str, str], restarts: int) -> JobInfo:
        """A ``sacct --parsable2`` row (22.05, whose ``sacct --json`` misreports exit codes)."""
        state, flags = _split_job_state(row["State"].split()[0] if row["State"] else "")
        code, _, sig = row["ExitCode"].partition(":")
        signo = int(sig) if sig.isdigit() and int(sig) else None
        nodes = row["NodeList"]
        return JobInfo(
            job_id=int(row["JobID"]), state=state, flags=flags, reason=row["Reason"], restart_count=restarts,
            nodes=[] if nodes.startswith("None") else self.hostnames(nodes), batch_host="",
            exit_code=None if signo or not code.isdigit() else int(code), exit_signal=signo,
            partition=row["Partition"], user=row["User"], name=row["JobName"],
            raw={"start_time": _unix(row["Start"]), "end_time": _unix(row["End"]), "cluster": row["Cluster"],
                 "comment": row["Comment"], "sacct": row},
            source="sacct",
        )

    def _parse_job(self, j: dict[str, Any]) -> JobInfo:
        state, flags = _split_job_state(j.get("job_state"))
        code, signo = _exit_status(j.get("exit_code"))
        return JobInfo(
            job_id=int(_number(j.get("job_id")) or 0),
            state=state,
            flags=flags,
            reason=str(j.get("state_reason") or ""),
            restart_count=int(_number(j.get("restart_cnt")) or 0),
            nodes=self.hostnames(j.get("nodes")),
            batch_host=str(j.get("batch_host") or ""),
            exit_code=code,
            exit_signal=signo,
            partition=str(j.get("partition") or ""),
            user=str(j.get("user_name") or ""),
            name=str(j.get("name") or ""),
            raw=j,
        )

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
        return [self._parse_node(n) for n in raw]

    def node(self, name: str) -> NodeInfo:
        for n in self.nodes():
            if n.name == name:
                return n
        raise SlurmError(["scontrol", "show", "node", name], None, f"node {name} is not known", what="found no node")

    @staticmethod
    def _parse_node(n: dict[str, Any]) -> NodeInfo:
        state: set[str] = set()
        st = n.get("state")
        if isinstance(st, list):
            state.update(str(s).upper() for s in st)
        elif st:
            state.add(str(st).upper())
        flags: Iterable[Any] = n.get("state_flags") or []
        state.update(str(f).upper() for f in flags)
        return NodeInfo(name=str(n.get("name") or ""), state=frozenset(state), reason=str(n.get("reason") or ""), raw=n)

    # -- lookups and actions the supervisor needs --

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
                        found.setdefault(int(_number(j.get("job_id")) or 0), self._parse_accounted(j))
            else:
                out = self.run([*cmd, "-X", "-n", "--parsable2", f"--format={','.join(_SACCT_FIELDS)}"],
                               env={"SLURM_TIME_FORMAT": "%s"})
                for line in out.splitlines():
                    row = dict(zip(_SACCT_FIELDS, line.split("|")))
                    if row.get("Comment") == comment and row["JobID"].isdigit():
                        found.setdefault(int(row["JobID"]), self._parse_accounted_text(row, restarts=0))
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
