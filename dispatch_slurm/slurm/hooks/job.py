"""The job as Slurm hands it to a hook: the plugin's options, this node, the execution's
nodes, its start and SLUID, and the user to become. The site's settings never come from
here (the job's environment is the user's): the wrappers name the admin's file."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, Optional

from ..hostlist import hostnames
from .node import log

# the plugin's options, as slurmd hands them to the Prolog and the Epilog
SPANK_OPT = "SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_"


def spank_inputs(environ: Mapping[str, str]) -> Optional[dict]:
    """The job's dispatch options as env-style inputs, or None for other jobs."""
    root = environ.get(SPANK_OPT + "checkpoint")
    if root is None:
        return None
    d = {k: v for k, v in environ.items() if not k.startswith("DISPATCH_")}
    d["DISPATCH_CHECKPOINT"] = root
    for opt, key in (("generation", "DISPATCH_GENERATION"), ("submission", "DISPATCH_SUBMISSION"),
                     ("grace", "DISPATCH_GRACE")):
        if environ.get(SPANK_OPT + opt):
            d[key] = environ[SPANK_OPT + opt]
    if SPANK_OPT + "shared_checkpoint" in environ:  # a flag: present means set
        d["DISPATCH_SHARED_CHECKPOINT"] = "1"
    return d


def this_node(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or os.uname().nodename


def nodes(environ: Mapping[str, str], node: str) -> tuple[Optional[list[str]], str]:
    """The execution's nodes (SLURM_JOB_NODELIST from 24.11, SLURM_NODELIST on 22.05,
    expanded), or None and why not: a list that does not name this node and as many nodes
    as SLURM_JOB_NUM_NODES says is refused, since a short list would let the root claim
    cessation while a node missing from it still runs the job."""
    hostlist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not hostlist:
        return None, "Slurm named no nodes"
    try:
        names = hostnames(hostlist)
    except ValueError as e:
        return None, str(e)
    count = environ.get("SLURM_JOB_NUM_NODES", "")
    if node not in names or (count.isdigit() and int(count) != len(names)):
        return None, (f"{hostlist!r} expands to {len(names)} nodes ({', '.join(names[:5])}), Slurm says "
                      f"{count or '?'}, this node is {node}")
    return names, ""


def facts(environ: Mapping[str, str]) -> dict:
    """What Slurm told the Prolog of this execution, for its Epilog and the root: the job
    user, this node, the execution's nodes (nodes(): left out, and logged, unless whole),
    Slurm's start time (24.11 on) and the SLUID (25.11 on), when Slurm gives them."""
    node = this_node(environ)
    out: dict[str, Any] = {"uid": int(environ["SLURM_JOB_UID"]), "gid": int(environ["SLURM_JOB_GID"]),
           "user": environ.get("SLURM_JOB_USER") or None, "node": node, "prolog_t": time.time()}
    found, why = nodes(environ, node)
    if found is not None:
        out.update(nodes=found, nodelist=environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))
    elif why != "Slurm named no nodes":
        log(f"the execution's nodes are not recorded: {why}")
    for key, var in (("start_time", "SLURM_JOB_START_TIME"), ("sluid", "SLURM_JOB_SLUID")):
        value = environ.get(var)
        if value:
            out[key] = int(value) if key == "start_time" and value.isdigit() else value
    if not isinstance(out.get("start_time", 0), int):
        del out["start_time"]
    return out


def job_user(environ: Mapping[str, str], job: dict, rejoined: bool) -> Optional[Mapping[str, str]]:
    """The environment as_job_user() drops to: Slurm's job user, or, when Slurm gave the
    Epilog no job (``rejoined``: SLURM_JOB_UID is then 0, root), the user the Prolog
    recorded. None (logged) when there is no user to be, or Slurm and the record disagree
    (a stale record of another job with this id): root never writes under the root."""
    uid, gid = job.get("uid"), job.get("gid")
    said = environ.get("SLURM_JOB_UID", "")
    if not rejoined:
        if isinstance(uid, int) and said.isdigit() and int(said) != uid:
            log(f"Slurm says job user uid {said}, the Prolog recorded uid {uid}: no cessation recorded")
            return None
        return environ
    if not isinstance(uid, int) or not isinstance(gid, int) or uid == 0:
        log("Slurm gave no job options and the Prolog's record names no job user: no cessation recorded")
        return None
    if said.isdigit() and int(said) not in (0, uid):
        log(f"Slurm says job user uid {said}, the Prolog recorded uid {uid}: no cessation recorded")
        return None
    user = job.get("user") if isinstance(job.get("user"), str) else None
    env = {k: v for k, v in environ.items() if k != "SLURM_JOB_USER"}  # Slurm's is root's name here
    return {**env, "SLURM_JOB_UID": str(uid), "SLURM_JOB_GID": str(gid), **({"SLURM_JOB_USER": user} if user else {})}
