"""The Slurm client of dispatch-slurm: runs Slurm's CLI and returns parsed facts.

``Slurm`` is the one face every caller uses. What differs between releases (which
command prints jobs, nodes and accounting records, and in which shape) is a dialect
(slurm/dialects.py: 22.05's squeue/sinfo JSON and sacct text, 24.11 and later's pinned
``--json=v0.0.42``), chosen once from the version; the release-independent commands
(sbatch, scancel, hold, ``scontrol show config``...) are here. Running a command and
its error are slurm/command.py's; the facts a caller gets (JobInfo, NodeInfo) are
slurm/facts.py's, the same on every release. Standard library only.
"""

from __future__ import annotations

import re
from typing import Callable, Collection, Mapping, Optional, Sequence

from . import dialects
from .command import CommandResult, Runner, Shell, SlurmError, local_runner
from .facts import BASE_JOB_STATES, ENDED, JobInfo, NodeInfo

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


class Slurm(Shell):
    """Runs Slurm commands through ``runner`` and parses what they print (see Shell for
    ``runner`` and ``expand_hostlists``)."""

    def __init__(self, runner: Optional[Runner] = None, *, expand_hostlists: bool = True):
        super().__init__(runner, expand_hostlists=expand_hostlists)
        self._dialect: Optional[dialects.Dialect] = None
        self._cluster: Optional[str] = None

    @property
    def dialect(self) -> dialects.Dialect:
        """How this release prints jobs, nodes and accounting records: chosen once, from
        the version (SlurmError naming it for a release dispatch-slurm cannot read)."""
        if self._dialect is None:
            self._dialect = dialects.choose(self.version)
        return self._dialect

    def _accounting(self, read: Callable[[], dict[int, JobInfo]]) -> dict[int, JobInfo]:
        """What ``read`` got from sacct; {} on a cluster that keeps no accounting.
        slurmdbd not answering raises."""
        try:
            return read()
        except SlurmError as e:
            if _NO_ACCOUNTING.search(str(e)):
                return {}
            raise

    # -- jobs -------------------------------------------------------------------------------

    def submit(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        *,
        script: Optional[str] = None,
        cwd: Optional[str] = None,
    ) -> int:
        """``sbatch --parsable ARGV`` (with ``script`` on stdin if given), run in ``cwd`` if
        given (where sbatch finds the script and where the job starts); the job id."""
        cmd = ["sbatch", "--parsable", *argv]
        out = self.run(cmd, env=env, input=script, cwd=cwd).strip()
        m = re.match(r"^(\d+)(;\S+)?$", out.splitlines()[-1] if out else "")
        if not m:
            raise SlurmError(cmd, 0, f"no job id in {out!r}", what="printed no job id")
        return int(m.group(1))

    def test_submit(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None) -> None:
        """``sbatch --test-only ARGV`` (in ``cwd``, as ``submit``): Slurm validates the job
        (options, script, SPANK options) without queueing it; SlurmError with sbatch's own
        message if it would be refused. Asked before a submission number is spent on it."""
        self.run(["sbatch", "--test-only", *argv], env=env, cwd=cwd)

    def job(self, job_id: int) -> JobInfo:
        """The job as slurmctld knows it now or, once slurmctld forgot it (MinJobAge after it
        ended), as the accounting database recorded its last execution (``source='sacct'``)."""
        found = self.dialect.job(self, job_id) or self.accounted_job(job_id)
        if found is None:
            raise SlurmError(["scontrol", "show", "job", str(job_id)], None,
                             f"job {job_id} is not known to slurmctld nor to sacct", what="found no such job")
        return found

    def jobs(self) -> list[JobInfo]:
        """Every job slurmctld holds in memory (pending, running, and ended within MinJobAge)."""
        return self.dialect.jobs(self)

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

    def find_jobs(self, job_ids: Collection[int]) -> dict[int, JobInfo]:
        """job id -> the job, for many jobs in one read of slurmctld's memory (every job it
        holds, the ids asked for picked out) and, for the ids it forgot, one ``sacct`` query;
        an id neither knows is absent. Any failure raises, as for ``find_job``."""
        wanted = {int(j) for j in job_ids}
        found = {j.job_id: j for j in self.dialect.jobs(self, wanted)} if wanted else {}
        forgotten = sorted(wanted - set(found))
        if forgotten:
            found.update(self._accounting(lambda: self.dialect.accounted(self, forgotten)))
        return found

    def accounted_job(self, job_id: int) -> Optional[JobInfo]:
        """The job's last execution as ``sacct`` has it (every execution of a requeued job is
        a record: ``--duplicates``), or None when the accounting database has no record of
        it or the cluster keeps no accounting. slurmdbd not answering raises."""
        return self._accounting(lambda: self.dialect.accounted(self, [job_id])).get(int(job_id))

    def jobs_with_comment(self, comment: str, user: Optional[str] = None,
                          since: Optional[float] = None) -> list[JobInfo]:
        """Jobs whose ``--comment`` is exactly ``comment``: in slurmctld's memory and, with
        ``since`` (a Unix time), those sacct recorded as submitted since then. The accounting
        database keeps a comment only with AccountingStoreFlags=job_comment; from 24.11 on
        sacct also records the submit line, which names it (``--comment=...``)."""
        found = {j.job_id: j for j in self.jobs() if j.comment == comment and user in (None, j.user)}
        if since is not None:
            recorded = self._accounting(lambda: self.dialect.accounted_with_comment(self, comment, user, since))
            found.update({k: j for k, j in recorded.items() if k not in found})
        return list(found.values())

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

    def cancel(self, job_id: int, signal: Optional[str] = None, *, batch: bool = False, full: bool = False) -> None:
        """``scancel``: without ``signal`` Slurm's cancel (SIGCONT, SIGTERM, KillWait, SIGKILL);
        with it, only that signal (``batch``: to the batch shell alone, not the steps;
        ``full``: to the batch shell, its children and every step)."""
        cmd = ["scancel"]
        if signal:
            cmd.append(f"--signal={signal}")
        if batch:
            cmd.append("--batch")
        if full:
            cmd.append("--full")
        self.run([*cmd, str(int(job_id))])

    def hold(self, job_id: int) -> None:
        """``scontrol hold``: a pending job stays pending until released (users may hold their own)."""
        self.run(["scontrol", "hold", str(int(job_id))])

    def release(self, job_id: int) -> None:
        """``scontrol release``: undo ``hold``."""
        self.run(["scontrol", "release", str(int(job_id))])

    # -- nodes and configuration ------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """Every node with its state set (upper case) and reason."""
        return self.dialect.nodes(self)

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as {name: value} (the text form: 22.05 has no JSON for it)."""
        out = self.run(["scontrol", "show", "config"])
        return {m.group(1): m.group(2).strip() for m in re.finditer(r"^(\w+)\s*=\s*(.*)$", out, re.M)}

    def partitions(self) -> dict[str, dict[str, str]]:
        """``scontrol show partition -o`` as {PartitionName: {name: value}} (GraceTime,
        PreemptMode, Nodes...): the text form, like ``config``, the same on every release."""
        out = self.run(["scontrol", "show", "partition", "-o"])
        fields = (dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines())
        return {f["PartitionName"]: f for f in fields if "PartitionName" in f}

    def cluster_name(self) -> str:
        """ClusterName from ``scontrol show config`` (part of every DISPATCH_ATTEMPT), asked
        once per client: it never changes under a running slurmctld, and a supervisor of
        many roots would otherwise ask it (two RPCs) once per root."""
        if self._cluster is None:
            name = self.config().get("ClusterName", "")
            if not name:
                raise SlurmError(["scontrol", "show", "config"], 0, "no ClusterName", what="printed no ClusterName")
            self._cluster = name
        return self._cluster


# What 22.05 .. 26.05 say for a job id slurmctld does not hold (purged after MinJobAge).
_UNKNOWN_JOB = re.compile(r"Invalid job id|found no such job|is not known to slurmctld", re.I)
# What sacct says on a cluster that keeps no accounting (AccountingStorageType=none).
_NO_ACCOUNTING = re.compile(r"accounting storage is disabled|not running a supported accounting_storage", re.I)
