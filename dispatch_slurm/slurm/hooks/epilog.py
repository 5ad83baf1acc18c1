"""The Epilog (root, on every node of a job): once the execution's processes on this node are
gone (slurm/cessation/node.py), record it as cessation evidence under the root, as the job
user: one entry per execution and node, naming every node of the execution. It never reads
the job's output: Slurm hands its path over unexpanded (``slurm-%j.out``), and an appended
log holds other executions' lines; how an execution ended is the supervisor's to tell.

For an execution the view prepared, the Epilog first runs its publisher once more, as the job
user: what was complete at the end is published before the cessation is recorded.

The sweep: record the cessation of executions on this node that Slurm ran no Epilog for.

A batch script that ends while its node is cut off from slurmctld gets none: its
slurmstepd retries the completion until the node rejoins, slurmctld answers that the job
moved on ("Batch completion ... sent from wrong node") and asks nothing more of the node,
whose next registration no longer lists the job (24.11, proc_req.c). The Prolog's record
stays here. Every later Prolog and Epilog on the node (any job's: the wrappers start Python
when such a record is there) looks at each record but its own job's: one whose execution
has no process, no slurmstepd and no populated job cgroup on this node, and that Slurm says
is over (the rule of ``dispatch-slurm ceased``: requeued, ended and not completing, or
forgotten), is recorded as its Epilog would have, source "sweep", as the job user the
record names. Slurm is asked only for such a record, once: an allocation whose first step
has not started yet has no process either."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Mapping
from typing import Optional

from ...contract import epoch as epochmod
from ...contract import layout, names
from ...errors import DispatchError
from ...store import ceased, events
from ..cessation import answer
from ..cessation import node as evidence
from ..client import Slurm, SlurmError
from . import job, node


def record_cessation(values: Mapping[str, str], where: str, sluid: Optional[str] = None,
                     found: Optional[dict] = None, nodes: Optional[list[str]] = None,
                     source: str = "epilog") -> dict:
    """As the job user: the cessation entry (O_EXCL, durable) and its event, once.

    Slurm may run the Epilog twice for one execution (TERMINATE_JOB retries, before
    26.05): the second run finds the entry and changes nothing. ``sluid``: Slurm's own
    id of this run (SLURM_JOB_SLUID, 25.11 on), recorded as evidence beside
    DISPATCH_ATTEMPT (which stays the same derived token on every release). ``found``:
    how the node knows (the job's cgroup v2 gone or empty, or a process scan), written
    into the entry and the event. ``nodes``: every node of the execution, as the Prolog
    recorded them, so that the root alone shows when all of them have recorded theirs.
    ``source``: "epilog", "epilog (rejoined)" when Slurm gave no job options (a node that
    rejoins after slurmctld forgot the job) and the Prolog's record said it all, or "sweep"."""
    os.environ.update(values)
    root, attempt = values["DISPATCH_CHECKPOINT"], values["DISPATCH_ATTEMPT"]
    if not ceased.record(root, attempt, where, found, nodes=nodes):
        return {"recorded": False}
    events.record("cessation", root=root, attempt=attempt, node=where, source=source,
                  **({"sluid": sluid} if sluid else {}), **({"evidence": found} if found else {}),
                  **({"nodes": nodes} if nodes else {}))
    return {"recorded": True}


def run(environ: Mapping[str, str], site_conf: Optional[str] = None) -> int:
    """Record this execution's cessation on this node (the module doc). Without the job's
    options (a node cut off from slurmctld that rejoins after it forgot the job: slurmd
    kills the orphan and runs the Epilog with the job id alone, SLURM_JOB_UID 0 and this
    node as the node list, on 22.05 to 26.05) the Prolog's root-owned record on this node
    says it all: the root, the attempt, the job user and the nodes. The wrapper runs this
    for such a job only when that record exists. The Epilog reads no site settings."""
    job_id = environ["SLURM_JOB_ID"]
    sweep(environ, skip=job_id)
    inputs = job.spank_inputs(environ)
    if inputs is not None and "%a" in inputs["DISPATCH_CHECKPOINT"]:
        node.forget(job_id)  # the restart count alone (prolog.py)
        return 0
    rec = node.recorded(job_id)
    if rec is None:
        if inputs is not None:
            node.log("no record of the execution the Prolog started here; no cessation recorded")
        node.forget(job_id)
        return 0
    values, facts = rec
    rejoined = inputs is None
    if rejoined:
        node.log(f"Slurm gave no job options (a node that rejoined after slurmctld forgot the job?): recording "
                 f"the cessation of {values['DISPATCH_ATTEMPT']} from the Prolog's record")
    user_env = job.job_user(environ, facts, rejoined)
    if user_env is None:
        return 0
    sluid = environ.get("SLURM_JOB_SLUID") or facts.get("sluid")
    found, why = evidence.wait_ceased(values["DISPATCH_ATTEMPT"], job_id, sluid)
    if found is None:
        node.log(f"{why}; no cessation recorded")
        return 0
    here = job.this_node(environ)
    nodes = facts.get("nodes") if isinstance(facts.get("nodes"), list) else None
    if nodes is None and not rejoined:  # an older Prolog's record: Slurm's list (the whole job's here)
        nodes = job.nodes(environ, here)[0]
    _view(node.as_job_user(user_env, publish_view, values, here))
    result = node.as_job_user(user_env, record_cessation, values, here, sluid, found, nodes,
                              "epilog (rejoined)" if rejoined else "epilog")
    if "ok" not in result:
        node.log(f"cessation not recorded: {result.get('bug') or result['user_error']}")
    if node.recorded(job_id) == rec:  # a later execution's own files (requeued here) stay
        node.forget(job_id)
    return 0


VIEW_TIMEOUT = 50  # within node.CHILD_TIMEOUT: the fsyncs of the saves it publishes


def publish_view(values: Mapping[str, str], here: str) -> dict:
    """As the job user, once the execution's processes on this node are gone and before its
    cessation is recorded: the view's publisher once more (``dispatch-slurm view publish
    --once``, view.py), for what was complete at the end, which the publisher, killed with the
    step, may have had no time for. Only for an execution the view prepared (its record in the
    exec folder); the hooks start the command rather than import it: it is a layer above them."""
    exec_dir = values.get("DISPATCH_EXEC_DIR") or os.path.join(
        values["DISPATCH_CHECKPOINT"], layout.exec_relpath(values["DISPATCH_ATTEMPT"]))  # an older Prolog's record
    if not os.path.lexists(os.path.join(exec_dir, layout.VIEW)):
        return {"view": False}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}, **values,
           "DISPATCH_VIEW": exec_dir, "SLURMD_NODENAME": here}
    try:
        proc = subprocess.run([sys.executable, "-m", "dispatch_slurm", "view", "publish", "--once"], env=env,
                              capture_output=True, text=True, timeout=VIEW_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"view": True, "rc": None, "said": f"view publish --once did not end within {VIEW_TIMEOUT} s"}
    return {"view": True, "rc": proc.returncode, "said": (proc.stdout + proc.stderr)[-4000:]}


def _view(result: dict) -> None:
    """Log what the view's last publishing said (the node's log: the job's output is gone)."""
    answer = result.get("ok") or {}
    if "ok" not in result:
        node.log(f"view publish --once: {result.get('bug') or result.get('user_error')}")
    elif answer.get("view") and (answer.get("rc") != 0 or answer.get("said")):
        node.log(f"view publish --once (exit {answer.get('rc')}): {answer.get('said', '').strip()}")


def sweep(environ: Mapping[str, str], skip: Optional[str] = None) -> None:
    """Look at every Prolog's record on this node but ``skip``'s (the module doc); a record
    that cannot be judged now is left for a later hook, never this hook's failure."""
    for job_id in node.recorded_ids():
        if job_id != skip:
            try:
                _sweep_one(job_id, job.this_node(environ))
            except (OSError, SlurmError, DispatchError) as e:
                node.log(f"sweep of job {job_id}'s record: {type(e).__name__}: {e}; left for a later hook")
            except Exception as e:  # noqa: BLE001 -- another job's leftover never fails this job's hook
                node.log(f"BUG in the sweep of job {job_id}'s record: {type(e).__name__}: {e}: "
                         f"{traceback.format_exc(limit=5)}")


def _sweep_one(job_id: str, here: str) -> None:
    rec = node.recorded(job_id)
    if rec is None:
        return
    values, facts = rec
    attempt = values["DISPATCH_ATTEMPT"]
    parts = names.attempt_parts(attempt)
    if parts is None or str(parts[1]) != job_id or evidence.processes_with(attempt, job_id):
        return
    over, why = answer.slurm_says(Slurm().find_job(int(job_id)), epochmod.decompose(parts[2]).restart)
    if not over:
        return
    user_env = job.job_user({}, facts, rejoined=True)
    if user_env is None:
        return
    sluid = facts.get("sluid")
    found, why_not = evidence.wait_ceased(attempt, job_id, sluid, wait=0)
    if found is None:
        node.log(f"{why_not}; no cessation recorded")
        return
    node.log(f"{attempt}: no Epilog ran for it on this node ({why}): recording its cessation from the Prolog's record")
    nodes = facts.get("nodes") if isinstance(facts.get("nodes"), list) else None
    result = node.as_job_user(user_env, record_cessation, values, here, sluid, {**found, "slurm": why}, nodes,
                              "sweep")
    if "bug" in result:
        node.log(f"{attempt}: cessation not recorded: {result['bug']}")
        return  # left for a later hook, after a fix
    if "ok" not in result:
        # the user's doing (a root removed or made unwritable): asking Slurm again at every later
        # hook cannot change it, and without the record gc asks Slurm itself
        node.log(f"{attempt}: cessation not recorded: {result['user_error']}; the node's record of it is dropped")
    if node.recorded(job_id) == rec:
        node.forget(job_id)
