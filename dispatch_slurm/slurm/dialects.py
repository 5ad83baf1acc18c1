"""The Slurm releases dispatch-slurm reads: one dialect per release family, chosen once
from the version (``choose``), each with the commands that read jobs, nodes and the
accounting database and the parsers (slurm/facts.py) for what they print. What a
caller gets is the same on every release: ``facts.JobInfo`` and ``facts.NodeInfo``.

Why the CLI and not libslurm: the commands are the one interface that is stable enough
across Slurm 22.05 .. 26.05 and available to an unprivileged user. Why JSON where a
release has it: the text formats are made for people and change between releases. The
JSON shapes still differ:

- 22.05 (``Slurm2205``) has no ``scontrol --json``; ``squeue --json`` / ``sinfo --json``
  dump the openapi v0.0.38 shapes: ``job_state`` is one string (a flag such as
  COMPLETING or REQUEUED hides the base state), ``exit_code`` is a raw wait status,
  node ``state`` is a lower-case base state with ``state_flags`` beside. Its ``sacct
  --json`` reports exit code 0 for a failed batch script, so ended jobs are read from
  ``sacct --parsable2`` text there.
- 24.11 and later (``Slurm2411``): ``scontrol show job|nodes --json=v0.0.42`` and
  ``sacct --json=v0.0.42``, the data_parser version pinned (DATA_PARSER): Slurm prints
  each release's newest by default (26.05: v0.0.45), and v0.0.42 is the one both 24.11
  (v0.0.40-42) and 26.05 (v0.0.42-45) have. ``job_state`` and node ``state`` are lists
  (base state + flags), ``exit_code`` is an object ``{status, return_code{set,number},
  signal{id{set,number}, name}}``. A release without the pinned version (23.02-24.05, or
  a future one that dropped it) is refused with a message naming it.

Jobs that slurmctld no longer holds (it forgets an ended job after MinJobAge, 300 s by
default) are read from the accounting database through ``sacct``. A new release family
is one more class here and one line in ``choose``.
"""

from __future__ import annotations

import re
import time
from typing import Any, Collection, Iterable, Optional, Sequence

from .command import Shell, SlurmError
from .facts import JobInfo, NodeInfo, parse_accounted, parse_accounted_text, parse_job, parse_node, raw_job_id

__all__ = ["DATA_PARSER", "Dialect", "Slurm2205", "Slurm2411", "choose"]

#: The data_parser version of every ``--json`` read (24.11 and later): see the module doc.
DATA_PARSER = "v0.0.42"
# The first release with DATA_PARSER, and the first with data_parser at all (before: 22.05).
_PINNED_FROM, _DATA_PARSER_FROM = (24, 11), (23, 2)


class Dialect:
    """What differs between release families. Every method reads through ``sh`` (the
    client: its runner, its hostlist expansion) and returns the release-independent facts;
    a failed command raises SlurmError. ``ids``: job ids; a job neither source knows is
    absent from what is returned."""

    def job(self, sh: Shell, job_id: int) -> Optional[JobInfo]:
        """The job as slurmctld holds it, or None when it holds no such job."""
        raise NotImplementedError

    def jobs(self, sh: Shell, ids: Optional[Collection[int]] = None) -> list[JobInfo]:
        """The jobs slurmctld holds (those of ``ids`` only, when given), in one read of
        every job in its memory."""
        raise NotImplementedError

    def nodes(self, sh: Shell) -> list[NodeInfo]:
        raise NotImplementedError

    def accounted(self, sh: Shell, ids: Collection[int]) -> dict[int, JobInfo]:
        """Each job's last execution as sacct recorded it (one query for all of ``ids``)."""
        raise NotImplementedError

    def accounted_with_comment(self, sh: Shell, comment: str, user: Optional[str], since: float) -> dict[int, JobInfo]:
        """The jobs sacct recorded as submitted since ``since`` (a Unix time) whose comment
        (or, where sacct records it, submit line) names ``comment``."""
        raise NotImplementedError


class Slurm2205(Dialect):
    """Slurm 22.05: squeue/sinfo ``--json`` (openapi v0.0.38 shapes), sacct as text."""

    #: sacct's text columns, printed with SLURM_TIME_FORMAT=%s (Unix times).
    SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Start", "End", "Partition", "User", "JobName",
                    "Cluster", "Comment", "Reason", "Timelimit")

    def job(self, sh: Shell, job_id: int) -> Optional[JobInfo]:
        return next(iter(self.jobs(sh, [job_id])), None)

    def jobs(self, sh: Shell, ids: Optional[Collection[int]] = None) -> list[JobInfo]:
        # 22.05's `squeue --json` ignores filters and dumps every job in memory.
        return _parse_jobs(sh, sh.read_json(["squeue", "--json"]).get("jobs") or [], ids)

    def nodes(self, sh: Shell) -> list[NodeInfo]:
        return [parse_node(n) for n in sh.read_json(["sinfo", "--json"]).get("nodes") or []]

    def accounted(self, sh: Shell, ids: Collection[int]) -> dict[int, JobInfo]:
        wanted = {str(int(i)) for i in ids}
        executions: dict[str, list[dict[str, str]]] = {}
        for row in self._sacct(sh, _sacct_of(ids)):
            if row["JobID"] in wanted:
                executions.setdefault(row["JobID"], []).append(row)
        # Every execution of a requeued job is a row (--duplicates): the last is the current one.
        return {int(k): parse_accounted_text(rows[-1], len(rows) - 1, sh.hostnames) for k, rows in executions.items()}

    def accounted_with_comment(self, sh: Shell, comment: str, user: Optional[str], since: float) -> dict[int, JobInfo]:
        first: dict[int, dict[str, str]] = {}
        for row in self._sacct(sh, _sacct_since(user, since)):
            if row.get("Comment") == comment and row["JobID"].isdigit():
                first.setdefault(int(row["JobID"]), row)
        return {k: parse_accounted_text(row, 0, sh.hostnames) for k, row in first.items()}

    def _sacct(self, sh: Shell, cmd: Sequence[str]) -> list[dict[str, str]]:
        """sacct's allocation rows (``-X``), one dict per line, times as Unix times."""
        out = sh.run([*cmd, "-X", "-n", "--parsable2", f"--format={','.join(self.SACCT_FIELDS)}"],
                     env={"SLURM_TIME_FORMAT": "%s"})
        return [dict(zip(self.SACCT_FIELDS, line.split("|"))) for line in out.splitlines() if line.strip()]


class Slurm2411(Dialect):
    """Slurm 24.11 and later: scontrol and sacct ``--json=DATA_PARSER``."""

    def job(self, sh: Shell, job_id: int) -> Optional[JobInfo]:
        raw = self.pinned_json(sh, ["scontrol", "show", "job", str(int(job_id))]).get("jobs") or []
        return next(iter(_parse_jobs(sh, raw, [job_id])), None)

    def jobs(self, sh: Shell, ids: Optional[Collection[int]] = None) -> list[JobInfo]:
        return _parse_jobs(sh, self.pinned_json(sh, ["scontrol", "show", "job"]).get("jobs") or [], ids)

    def nodes(self, sh: Shell) -> list[NodeInfo]:
        return [parse_node(n) for n in self.pinned_json(sh, ["scontrol", "show", "nodes"]).get("nodes") or []]

    def accounted(self, sh: Shell, ids: Collection[int]) -> dict[int, JobInfo]:
        wanted = {int(i) for i in ids}
        last: dict[int, dict[str, Any]] = {}
        for j in self.pinned_json(sh, _sacct_of(ids)).get("jobs") or []:
            if raw_job_id(j) in wanted:  # a requeued job's executions in order (--duplicates): the last wins
                last[int(raw_job_id(j) or 0)] = j
        return {k: parse_accounted(j, sh.hostnames) for k, j in last.items()}

    def accounted_with_comment(self, sh: Shell, comment: str, user: Optional[str], since: float) -> dict[int, JobInfo]:
        first: dict[int, dict[str, Any]] = {}
        for j in self.pinned_json(sh, _sacct_since(user, since)).get("jobs") or []:
            if _names_comment(j, comment):
                first.setdefault(int(raw_job_id(j) or 0), j)
        return {k: parse_accounted(j, sh.hostnames) for k, j in first.items()}

    @staticmethod
    def pinned_json(sh: Shell, argv: Sequence[str]) -> dict[str, Any]:
        """``ARGV --json=DATA_PARSER``, refused with a message naming the pin where this Slurm
        lacks that version (it says "unable to find plugin: data_parser/v0.0.42")."""
        cmd = [*argv, f"--json={DATA_PARSER}"]
        res = sh.runner(cmd)
        data = None if res.returncode else sh.decode(cmd, res.stdout)
        printed = ((data or {}).get("meta") or {}).get("plugin", {}).get("data_parser")
        if f"data_parser/{DATA_PARSER}" in res.stderr or printed not in (None, f"data_parser/{DATA_PARSER}"):
            raise SlurmError(cmd, res.returncode, f"this Slurm has no data_parser {DATA_PARSER}, the JSON version "
                             f"dispatch-slurm reads: {(res.stderr or str(printed)).strip()[-300:]}",
                             what="cannot print the pinned JSON version")
        if data is None:
            raise SlurmError(cmd, res.returncode, res.stderr or res.stdout)
        return data


def choose(version: tuple[int, int]) -> Dialect:
    """The dialect of Slurm ``version`` (major, minor); SlurmError for a release between the
    families (data_parser without the pinned version)."""
    if _DATA_PARSER_FROM <= version < _PINNED_FROM:
        raise SlurmError(["scontrol", "--version"], 0,
                         f"Slurm {version[0]}.{version[1]:02d} cannot print JSON in data_parser {DATA_PARSER}, the "
                         f"version dispatch-slurm reads; it needs Slurm 22.05, or {_PINNED_FROM[0]}."
                         f"{_PINNED_FROM[1]} or later", what="is a release dispatch-slurm cannot read")
    return Slurm2411() if version >= _PINNED_FROM else Slurm2205()


def _parse_jobs(sh: Shell, raw: Iterable[dict[str, Any]], ids: Optional[Collection[int]]) -> list[JobInfo]:
    """The jobs of ``raw`` (those of ``ids`` only, when given: parsing expands hostlists)."""
    wanted = None if ids is None else {int(i) for i in ids}
    return [parse_job(j, sh.hostnames) for j in raw if wanted is None or raw_job_id(j) in wanted]


def _sacct_of(ids: Collection[int]) -> list[str]:
    """sacct for these jobs, every execution of each (a requeued job has one record per
    execution: ``--duplicates``), whoever submitted them."""
    return ["sacct", "-j", ",".join(str(int(i)) for i in ids), "--duplicates", "--allusers"]


def _sacct_since(user: Optional[str], since: float) -> list[str]:
    cmd = ["sacct", "--allusers", "--duplicates", "-S", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))]
    return cmd + (["-u", user] if user else [])


def _names_comment(j: dict[str, Any], comment: str) -> bool:
    """The sacct record carries ``comment``: as its comment (kept with
    AccountingStoreFlags=job_comment) or in its submit line (``--comment=...``)."""
    c = j.get("comment") or {}
    if (c.get("job") if isinstance(c, dict) else c) == comment:
        return True
    return bool(re.search(rf"--comment[= ]{re.escape(comment)}(\s|$)", str(j.get("submit_line") or "")))
