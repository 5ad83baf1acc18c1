"""What the doctor reads before it sends anything: the job script (its ``--signal``, where
and under which launcher the trainer runs) and Slurm's configuration (KillWait, the
partition's PreemptMode and GraceTime), each overridable by the caller."""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import replace
from typing import Any, Optional, Sequence

from ..contract.signals import job_time_limit, lead_problem
from ..errors import DispatchError
from . import rules


class UsageError(DispatchError):
    """The options cannot work together (the CLI says it as a usage error)."""


def slurm_conf(partition: Optional[str], use_slurm: Optional[bool],
               job_id: Optional[int] = None) -> tuple[rules.SlurmConf, Optional[str]]:
    """SlurmConf from scontrol when Slurm is here (and wanted), else the defaults; the
    partition read: the one given, else the job's, else $SLURM_JOB_PARTITION, else the
    default one."""
    if use_slurm is False or (use_slurm is None and not shutil.which("scontrol")):
        if job_id:
            raise UsageError("--job needs Slurm (scontrol and scancel on PATH)")
        return rules.SlurmConf(), None
    from ..slurm.client import Slurm
    s = Slurm()
    parts = s.partitions()
    name = partition or (s.job(job_id).partition if job_id else None) or os.environ.get("SLURM_JOB_PARTITION")
    if name is None:
        name = next((n for n, p in parts.items() if p.get("Default") == "YES"), None)
    if name is not None and name not in parts:
        raise DispatchError(f"partition {name!r} is not one of this cluster's: {', '.join(sorted(parts))}")
    return rules.parse_conf(s.config(), parts.get(name) if name is not None else None), name


def wiring(script: Optional[str], sig: Optional[rules.Signal], where: Optional[str], launcher: Optional[str],
           wrapped: Optional[bool], processes: Optional[int],
           command: Sequence[str] = ()) -> tuple[Optional[rules.Signal], rules.Stack]:
    """The job's signal and launch stack: the script's (or a rehearsed command's launcher),
    then what the caller says over it."""
    stack = rules.Stack()
    if script is not None:
        try:
            with open(script, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise DispatchError(f"--script {script}: not UTF-8 text (byte {e.start}): name the job's batch "
                                "script") from None
        found, stack = rules.parse_script(text)
        sig = sig or found
    elif command:  # a rehearsed command plays one step: its launcher read from it
        _, guess = rules.parse_script(shlex.join(command).replace("dispatch_slurm launch", "dispatch-slurm launch"))
        stack = replace(guess, where="step")
    given: dict[str, Any] = {k: v for k, v in (("where", where), ("wrapped", wrapped), ("processes", processes))
                             if v is not None}
    if launcher:
        given["launcher"] = None if launcher == "none" else launcher
    return sig, replace(stack, **given)


def signal_at_once(script: Optional[str], sig: Optional[rules.Signal]) -> list[rules.Finding]:
    """The script's --time against its --signal: a lead as long as the limit makes every end
    look stopped (`dispatch-slurm run` refuses it; contract/signals.lead_problem)."""
    if script is None:
        return []
    with open(script, encoding="utf-8", errors="replace") as f:
        problem = lead_problem(sig, job_time_limit([], {}, f.read()))
    return [rules.Finding("signal-at-once", problem, "give #SBATCH --time more than the signal's lead, or a shorter "
                          "--signal time")] if problem else []


def overrides(conf: rules.SlurmConf, kill_wait: Optional[float], grace_time: Optional[float],
              preempt_mode: Optional[str], send_user_signal: Optional[bool]) -> rules.SlurmConf:
    given: dict[str, Any] = {"kill_wait": kill_wait, "grace_time": grace_time,
             "preempt_mode": preempt_mode.upper() if preempt_mode else None, "send_user_signal": send_user_signal}
    return replace(conf, **{k: v for k, v in given.items() if v is not None})
