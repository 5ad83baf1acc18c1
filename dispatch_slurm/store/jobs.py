"""A job's submission number without ``dispatch-slurm submit``: ``<root>/jobs/<cluster>.<job id>``.

A client that calls sbatch itself (submitit, a site's portal) on a site without the
plugin has no submitter that allocates N. So the job's first process (``env``, the
TaskProlog) allocates it, with the allocator ``submit`` uses (O_EXCL under ``sub/``), and
records it under the job's id: ``jobs/<cluster>.<job id>`` holding N as six digits and a
newline, created O_EXCL and fsynced. Every later process of the job (another node, task,
step, and every requeue: the same job id, R+1) finds that entry and the same N, so the
epoch G*10^12 + N*10^6 + R rises with each requeue as it does for a submitted job.

Racers (the first processes of one execution on several nodes) may each allocate an N;
the create of ``jobs/<job>`` decides, the losers read the winner's N and theirs stays
unused (a number skipped, never one handed out twice). Two jobs never share an N: an
entry names only an N that a process of that very job allocated. An array job has one
entry (its array job id), as a submitted array has one N for all its tasks.

A job id Slurm hands out again under one root (its state wiped, MaxJobId wrapped) would
find the first job's entry: ``for_job`` cannot tell, so such a root should get a new
folder, as docs/troubleshooting.md says. On S3 the entry is one conditional PUT with its
body (never seen half-written)."""

import re
import time
from collections.abc import Mapping

from ..contract import env as envmod
from ..contract import layout, names
from ..contract.siteconf import Site
from ..errors import BadName, EnvError, StoreError
from .base import Store

SETTLE_S = 5.0  # an entry read empty or without its newline: its writer is between create and write
_ENTRY = re.compile(rb"([0-9]{6})\n")
_sleep = time.sleep


def entry_name(cluster: str, job_id: str) -> str:
    """``<cluster as attempt tokens spell it>.<job id>``: one name per job, per cluster."""
    if not job_id.isascii() or not job_id.isdigit() or len(job_id) > 20:
        raise EnvError(f"Slurm job id {job_id!r} must be decimal digits")
    return f"{names.cluster_token(cluster)}.{int(job_id)}"


def job_key(environ) -> tuple[str, str]:
    """(cluster, job id) the job's entry is named by: an array task's array job id, so
    every task of the array shares one N (as `submit` gives an array one N)."""
    for key in ("SLURM_JOB_ID", "SLURM_CLUSTER_NAME"):
        if not environ.get(key):
            raise EnvError(f"{key} is not set: not inside a Slurm job, so no submission number can be "
                           "allocated for it (outside Slurm: `dispatch-slurm env --local`)")
    return environ["SLURM_CLUSTER_NAME"], environ.get("SLURM_ARRAY_JOB_ID") or environ["SLURM_JOB_ID"]


def _parse(data: bytes, where: str) -> int | None:
    if not data.endswith(b"\n"):
        return None
    m = _ENTRY.fullmatch(data)
    if m is None or int(m[1]) < 1:
        raise BadName(where.rpartition("/")[2], f"not a submission number (six digits and a newline): "
                      f"{data[:40]!r}", where.rpartition("/")[0])
    return int(m[1])


def lookup(st: Store, cluster: str, job_id: str) -> int | None:
    """The N recorded for the job under ``st``'s root, or None; an incomplete entry is read
    again until SETTLE_S, then refused naming the file."""
    name = entry_name(cluster, job_id)
    where = st.where(layout.JOBS, name)
    deadline, pause = time.monotonic() + SETTLE_S, 0.01
    while True:
        data = st.read(layout.JOBS, name, 64)
        if data is None:
            return None
        n = _parse(data, where)
        if n is not None:
            return n
        if time.monotonic() >= deadline:
            raise StoreError(f"{where} is still {'empty' if not data else 'without its newline'} after "
                             f"{SETTLE_S:g} s: the process that created it died before writing it; if job "
                             f"{job_id} runs nowhere, remove that file (its next execution allocates again)")
        _sleep(pause)
        pause = min(pause * 2, 0.2)


def for_job(st: Store, cluster: str, job_id: str) -> int:
    """The job's submission number under ``st``'s root (where N is allocated: the parent of
    an array's %a roots): the recorded one, else one allocated now and recorded."""
    name = entry_name(cluster, job_id)
    for _ in range(3):
        n = lookup(st, cluster, job_id)
        if n is not None:
            return n
        n = st.allocate_submission()
        if st.create(layout.JOBS, name, f"{names.submission_name(n)}\n".encode()):
            return n
    raise StoreError(f"{st.where(layout.JOBS, name)} keeps vanishing: something removes it (dispatch-slurm never does)")


def fill(st: Store, environ: Mapping[str, str], site: Site | None = None, create: bool = True) -> Mapping[str, str]:
    """``environ`` with DISPATCH_SUBMISSION set to the job's number when it is unset (a
    plain sbatch job); unchanged when it is set (`submit`, the plugin: checked against
    sub/ later) or when DISPATCH_CHECKPOINT is not. ``st``: the store of the root where N
    is allocated (epochs.job_store). The other inputs are checked first, so a bad one
    spends no number. ``create=False`` (env --no-mkdir) only looks the number up and
    refuses when none is recorded yet."""
    if environ.get("DISPATCH_SUBMISSION") or not environ.get("DISPATCH_CHECKPOINT"):
        return environ
    envmod.check_inputs(environ, site or Site(), need_submission=False)
    cluster, job_id = job_key(environ)
    if create:
        n = for_job(st, cluster, job_id)
    else:
        found = lookup(st, cluster, job_id)
        if found is None:
            root = st.root
            raise EnvError(f"job {job_id} has no submission number under {root} yet "
                           f"(no {root}/{layout.JOBS}/{entry_name(cluster, job_id)}): the job's first "
                           "`dispatch-slurm env` (without --no-mkdir) or the TaskProlog allocates it")
        n = found
    return {**environ, "DISPATCH_SUBMISSION": str(n)}
