"""The rehearsal on a running test job (``doctor --job JOBID``): wait for its handlers, scancel
the way Slurm will signal it, wait for its end (bounded), then read what every rank's
handler recorded (runtime/probe.py) under the job's exec folders."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from ..contract import names
from ..errors import DispatchError
from ..runtime import probe
from ..store import events
from ..slurm.client import Slurm
from . import rules
from .rehearse import Run
from .wiring import UsageError

SETTLE_S = 60.0  # past KillWait: a job's epilogs and the kill of its last processes (COMPLETING)
VISIBLE_S = 10.0  # once no process of the job is left: for the last records to be seen (NFS)

Records = Callable[[], dict]


def _job_probes(root: str, job_id: int) -> list[str]:
    """The probe folders under ROOT's exec folders that hold records of ``job_id``."""
    exec_dir = os.path.join(root, "exec")
    found = []
    for attempt in sorted(os.listdir(exec_dir)) if os.path.isdir(exec_dir) else []:
        where = os.path.join(exec_dir, attempt, probe.DIRNAME)
        if any(str(p.get("installed", {}).get("job")) == str(job_id) for p in probe.read(where).values()):
            found.append(where)
    return found


#: how a save was published or a resume resolved (an event's ``by``) -> the way the job came in
SCRIPT_BY = frozenset({"latest --resume", "watch", "publish"})


def mode(root: str, job_id: int) -> str:
    """Which way the job's executions came in, from their own events under the root: the view
    (the plugin's --dispatch-view: `view prepare` resolved the resume, `view` published), the
    README's job script (`latest --resume`, `watch`), an integration (its name), or unknown."""
    mine = [e for e in events.read(root)
            if (parts := names.attempt_parts(str(e.get("attempt") or ""))) is not None and parts[1] == job_id]
    by = {str(e.get("by")) for e in mine if e.get("type") in ("resumed", "published")}
    if by & {"view prepare", "view"}:
        published = sum(1 for e in mine if e.get("type") == "published" and e.get("by") == "view")
        return (f"view: the plugin bound each execution's folder over the trainer's own (--dispatch-view), "
                f"`view prepare` placed its resume point, the view's publisher published {published} save(s)")
    if by & SCRIPT_BY:
        return "job script: eval \"$(dispatch-slurm env)\", latest --resume, watch (no view)"
    if by:
        return f"integration: {', '.join(sorted(by))} (no view)"
    return "unknown: no event of the job says how it resumed or published"


def rehearse(job_id: int, sig: rules.Signal, conf: rules.SlurmConf, ranks: int, ready_timeout: float, preempt: bool,
           probe_dir: Optional[str], root: Optional[str]) -> tuple[Run, list[rules.Row]]:
    """The rehearsal on a running job: wait for its handlers, scancel as Slurm would, wait
    for its end (bounded), read the records."""
    if probe_dir is None and root is None:
        raise UsageError("--job needs --root (or $DISPATCH_CHECKPOINT) or --probe-dir: where the ranks record")
    s, run = Slurm(), Run()

    def records() -> dict:
        dirs = [probe_dir] if probe_dir else _job_probes(root or "", job_id)
        out = {}
        for d in dirs:
            out.update({k: v for k, v in probe.read(d).items() if str(v.get("installed", {}).get("job")) == str(job_id)})
        return out
    run.ready = _until_ready(s, job_id, records, ranks, time.monotonic() + ready_timeout)
    sent = run.sent_at = time.time()
    end = run.end_at = _send(s, job_id, sig, conf, preempt, sent, run.log)
    job = _until_ended(s, job_id, end - conf.kill_wait)
    if job is None or not job.ended:
        s.cancel(job_id)
        run.log.append((round(time.time() - sent, 2), f"{'GraceTime over' if preempt else 'the limit'}: "
                        "scancel (SIGTERM, KillWait, SIGKILL)"))
        job = _until_ended(s, job_id, time.time() + conf.kill_wait + 30)
    run.exit_code = None if job is None else job.exit_code
    run.log.append((round(time.time() - sent, 2), f"job {job_id} {job.state if job else 'gone'}"))
    _until_settled(s, job_id, job, records, sent, run.log, time.time() + conf.kill_wait + SETTLE_S)
    return run, rules.rows(records(), sent, end)


def _until_settled(s: Slurm, job_id: int, job: Any, records: Records, sent: float, log: list,
                   deadline: float) -> None:
    """After the job ended, before judging: wait until it left COMPLETING (no process of
    it is left to write) and every rank's handler has its exit record, polling both; past
    ``deadline`` (or, once nothing of the job is left, VISIBLE_S more), say in the run's
    log which is missing. A job that "ended" may still be COMPLETING: its ranks may still
    be saving and publishing in KillWait, and a record read then says "published no"."""
    def note(what: str) -> None:
        log.append((round(time.time() - sent, 2), what))
    while job is not None and "COMPLETING" in job.states and time.time() < deadline:
        time.sleep(0.5)
        job = s.find_job(job_id)
    if job is not None and "COMPLETING" in job.states:
        note(f"job {job_id} still COMPLETING after the wait: its ranks may still be writing, and the table "
             "below may miss what they did last")
        return
    settled = min(deadline, time.time() + VISIBLE_S)
    while any("exit" not in p for p in records().values() if "installed" in p) and time.time() < settled:
        time.sleep(0.5)
    missing = [(p["installed"].get("rank"), host, pid) for (host, pid), p in records().items()
               if "installed" in p and "exit" not in p]
    note(f"job {job_id} no longer COMPLETING" + ("; every rank's exit record is there" if not missing else
         "; no exit record from " + ", ".join(f"rank {'?' if r is None else r} ({h} pid {pid})" for r, h, pid in missing)
         + ": killed before it exited (or its record is not visible here yet)"))


def _until_ready(s: Slurm, job_id: int, records: Records, ranks: int, deadline: float) -> int:
    """Poll the probe records until ``ranks`` handlers are installed (or the deadline);
    a job that ends first is an error. Returns how many were."""
    while sum("installed" in p for p in records().values()) < ranks and time.monotonic() < deadline:
        job = s.find_job(job_id)
        if job is None or job.ended:
            raise DispatchError(f"job {job_id} ended before its handlers reported (state {job and job.state})")
        time.sleep(1)
    return sum("installed" in p for p in records().values())


def _send(s: Slurm, job_id: int, sig: rules.Signal, conf: rules.SlurmConf, preempt: bool, sent: float,
          log: list) -> float:
    """scancel as Slurm would signal: a preemption (SIGTERM, or the job's signal with
    send_user_signal), or the time limit's early signal; when the kill comes."""
    if preempt:
        name = sig.name if conf.send_user_signal else "TERM"
        batch = sig.batch and conf.send_user_signal
        end = sent + conf.grace_time + conf.kill_wait
    else:
        name, batch = sig.name, sig.batch
        end = sent + sig.seconds + conf.kill_wait
    s.cancel(job_id, name, batch=batch)
    log.append((0.0, f"scancel --signal={name}{' --batch' if batch else ''} {job_id}"))
    return end


def _until_ended(s: Slurm, job_id: int, t: float) -> Any:
    job = s.find_job(job_id)
    while job is not None and not job.ended and time.time() < t:
        time.sleep(0.5)
        job = s.find_job(job_id)
    return job
