"""What Slurm says, parsed: jobs and nodes as the client's callers see them, the same
on every release; the shapes each release prints are told apart here (see dialects.py
for which command prints which). Pure: no command runs here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

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
#: The base states of a job whose execution is over (Slurm's IS_JOB_FINISHED): every
#: caller that asks "has it ended?" uses this one set.
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})
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
    def ended(self) -> bool:
        """The current execution is over (the job may still be COMPLETING)."""
        return self.state in ENDED

    @property
    def states(self) -> frozenset[str]:
        """Base state and flags together, for ``'COMPLETING' in job.states``."""
        return self.flags | {self.state}

    # -- read from ``raw``: the same fields on 22.05 and 24.11 --

    @property
    def start_time(self) -> Optional[int]:
        """Unix time the current execution started (None while it never started)."""
        return unix_time(self.raw, "start_time")

    @property
    def end_time(self) -> Optional[int]:
        """Unix time the current execution ended or, while it runs, the time its time limit
        ends it (slurmctld's expected end); None when Slurm has neither."""
        return unix_time(self.raw, "end_time")

    @property
    def time_limit(self) -> Optional[int]:
        """The job's time limit in seconds (Slurm keeps minutes); None when it has none
        (``unlimited``) or Slurm did not say."""
        minutes = _limit_minutes(self.raw.get("time_limit"))
        return None if minutes in (None, UNLIMITED) else int(minutes) * 60

    @property
    def unlimited(self) -> bool:
        """The job has no time limit (INFINITE)."""
        return _limit_minutes(self.raw.get("time_limit")) == UNLIMITED

    @property
    def preempt_time(self) -> Optional[int]:
        """Unix time Slurm preempted the current execution (slurmctld's record only: sacct
        does not keep it), None when it was not preempted or Slurm does not say."""
        return unix_time(self.raw, "preempt_time")

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
    def boot_time(self) -> Optional[int]:
        """Unix time the node last booted, as its slurmd reported it."""
        return unix_time(self.raw, "boot_time")

    @property
    def responding(self) -> bool:
        """Up and answering slurmctld: not DOWN, NOT_RESPONDING, FUTURE, UNKNOWN or powered down.
        (Responding says nothing about the node's old processes: see dispatch_slurm.slurm.cessation.)"""
        bad = {"DOWN", "NOT_RESPONDING", "FUTURE", "UNKNOWN", "POWERED_DOWN", "POWERING_DOWN",
               "POWER_DOWN", "POWERING_UP", "REBOOT_ISSUED"}
        return not (self.state & bad) and bool(self.state)


def unix_time(raw: dict[str, Any], key: str) -> Optional[int]:
    """The Unix time ``raw[key]`` of a job or node object as any release prints it (or as
    the sacct parsers set it); Slurm's 0 means "not yet", like an unset one."""
    return _number(raw.get(key)) or None


UNLIMITED = "UNLIMITED"


def _limit_minutes(v: Any) -> Any:
    """A time limit as any release prints it -> minutes, UNLIMITED, or None (not said):
    an int (22.05's squeue; INFINITE is 0xFFFFFFFF), data_parser's {set, infinite, number},
    or sacct's text ([days-]hours:minutes:seconds, UNLIMITED, Partition_Limit)."""
    if isinstance(v, dict) and v.get("infinite"):
        return UNLIMITED
    if isinstance(v, str):
        if v.upper() == UNLIMITED:
            return UNLIMITED
        days, _, clock = v.rpartition("-")
        parts = clock.split(":")
        if not (days or "0").isdigit() or not all(p.isdigit() for p in parts) or len(parts) > 3:
            return None
        h, m, sec = ([0] * (3 - len(parts)) + [int(p) for p in parts])
        return int(days or 0) * 1440 + h * 60 + m + (sec + 59) // 60
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0xFFFFFFFF:
        return UNLIMITED
    return _number(v)


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


def raw_job_id(j: dict[str, Any]) -> Optional[int]:
    """The id of a job object as any release prints it (an int, or data_parser's number
    object), before parsing the rest: callers pick their jobs out of a dump with it."""
    return _number(j.get("job_id"))


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


def parse_job(j: dict[str, Any], hostnames: Callable[[Any], list[str]]) -> JobInfo:
    """A job as slurmctld prints it (``scontrol --json`` or 22.05's ``squeue --json``)."""
    state, flags = _split_job_state(j.get("job_state"))
    code, signo = _exit_status(j.get("exit_code"))
    return JobInfo(
        job_id=int(raw_job_id(j) or 0),
        state=state,
        flags=flags,
        reason=str(j.get("state_reason") or ""),
        restart_count=int(_number(j.get("restart_cnt")) or 0),
        nodes=hostnames(j.get("nodes")),
        batch_host=str(j.get("batch_host") or ""),
        exit_code=code,
        exit_signal=signo,
        partition=str(j.get("partition") or ""),
        user=str(j.get("user_name") or ""),
        name=str(j.get("name") or ""),
        raw=j,
    )


def parse_accounted(j: dict[str, Any], hostnames: Callable[[Any], list[str]]) -> JobInfo:
    """A ``sacct --json=v0.0.42`` job record (24.11 on)."""
    state, flags = _split_job_state((j.get("state") or {}).get("current"))
    code, signo = _exit_status(j.get("exit_code"))
    t = j.get("time") or {}
    comment = j.get("comment") or {}
    return JobInfo(
        job_id=int(raw_job_id(j) or 0), state=state, flags=flags,
        reason=str((j.get("state") or {}).get("reason") or ""),
        restart_count=int(_number(j.get("restart_cnt")) or 0),
        nodes=hostnames(j.get("nodes")), batch_host="", exit_code=code, exit_signal=signo,
        partition=str(j.get("partition") or ""), user=str(j.get("user") or ""), name=str(j.get("name") or ""),
        raw={"start_time": t.get("start"), "end_time": t.get("end"), "time_limit": t.get("limit"),
             "cluster": j.get("cluster"), "comment": comment.get("job") if isinstance(comment, dict) else comment,
             "sacct": j},
        source="sacct",
    )


def parse_accounted_text(row: dict[str, str], restarts: int, hostnames: Callable[[Any], list[str]]) -> JobInfo:
    """A ``sacct --parsable2`` row (22.05, whose ``sacct --json`` misreports exit codes)."""
    state, flags = _split_job_state(row["State"].split()[0] if row["State"] else "")
    code, _, sig = row["ExitCode"].partition(":")
    signo = int(sig) if sig.isdigit() and int(sig) else None
    nodes = row["NodeList"]
    return JobInfo(
        job_id=int(row["JobID"]), state=state, flags=flags, reason=row["Reason"], restart_count=restarts,
        nodes=[] if nodes.startswith("None") else hostnames(nodes), batch_host="",
        exit_code=None if signo or not code.isdigit() else int(code), exit_signal=signo,
        partition=row["Partition"], user=row["User"], name=row["JobName"],
        raw={"start_time": _unix(row["Start"]), "end_time": _unix(row["End"]),
             "time_limit": row.get("Timelimit"), "cluster": row["Cluster"], "comment": row["Comment"], "sacct": row},
        source="sacct",
    )


def parse_node(n: dict[str, Any]) -> NodeInfo:
    """A node as ``scontrol show nodes --json`` or 22.05's ``sinfo --json`` prints it."""
    state: set[str] = set()
    st = n.get("state")
    if isinstance(st, list):
        state.update(str(s).upper() for s in st)
    elif st:
        state.add(str(st).upper())
    flags: Iterable[Any] = n.get("state_flags") or []
    state.update(str(f).upper() for f in flags)
    return NodeInfo(name=str(n.get("name") or ""), state=frozenset(state), reason=str(n.get("reason") or ""), raw=n)

