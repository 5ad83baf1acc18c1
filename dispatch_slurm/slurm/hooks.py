"""The admin side: Prolog, TaskProlog and Epilog, behind thin shell wrappers in
prolog/ and epilog/ (which exit at once for jobs without dispatch options).

Rules every hook keeps:
* Root never touches a user-controlled path. The Prolog and Epilog run as root but
  fork a child that drops to the job user (setgroups, setgid, setuid) before it
  opens anything under the checkpoint root; root only writes its own files under
  /run/dispatch-slurm/.
* A user's mistake never drains a node. Slurm drains a node whose Prolog exits
  non-zero, so every user error (bad option, missing or foreign root, planted
  symlink...) is logged and the Prolog exits 0; the job then fails in its own
  stderr, by the SPANK plugin's user_init or the TaskProlog, which run the same
  checks as the job user. Non-zero is kept for a broken node (its own /run
  unwritable, no Python).

* Nothing a user controls can make a hook exit non-zero or hang: values with any
  byte (a newline, a non-UTF-8 byte) are written and logged verbatim-but-escaped, the
  child's answer is read while it runs (no pipe deadlock), the job's output is never
  read (Slurm hands its path over unexpanded, e.g. ``slurm-%j.out``, and an appended log
  holds other executions' lines: how an execution ended is the supervisor's to tell, from
  facts tied to that execution), and any unexpected error is logged as a bug and the hook
  exits 0.
* The site's settings come from the admin's file (``--site-conf``, else
  /etc/dispatch-slurm/site.conf), never from the job's environment.

Inputs: the plugin's options reach the Prolog and Epilog as
SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_<option>; the TaskProlog sees the
task's own environment (DISPATCH_* from the plugin or from `dispatch-slurm submit`).
"""

import argparse
import json
import os
import pwd
import select
import signal
import stat
import sys
import syslog
import time
import traceback

from ..contract import env as envmod
from ..contract import epoch as epochmod
from ..contract import names, siteconf
from ..errors import DispatchError
from ..store import ceased, epochs, events, jobs, write_all
from . import cessation, cgroup, sitefile, stdio
from .client import Slurm, SlurmError
from . import hostlist as hostlist_

RUN_DIR = "/run/dispatch-slurm"
LOG = "/var/log/dispatch-slurm.log"
SPANK_OPT = "SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_"
CHILD_TIMEOUT = 60  # a hung filesystem must not hang the hook forever
CESSATION_WAIT = 30  # how long the Epilog waits for the execution's processes to go
ANSWER_MAX = 1 << 20  # the child's answer: more is cut (it is one JSON object)


def printable(text: str) -> str:
    """Any string (undecodable bytes arrive as surrogates) as one printable line."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\n", "\\n")


def log(msg: str) -> None:
    """slurmd discards hook output: keep a line in syslog and in our own log."""
    line = printable(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {os.environ.get('SLURM_SCRIPT_CONTEXT', 'hook')} "
                     f"job {os.environ.get('SLURM_JOB_ID', '?')}: {msg}")
    try:
        syslog.syslog(syslog.LOG_NOTICE, line)
    except (OSError, ValueError):
        pass
    try:
        with open(LOG, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def spank_inputs(environ) -> dict | None:
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


def as_job_user(environ, fn, *args):
    """Run fn(*args) in a child that has dropped to the job user; its return value
    (JSON-able) or its DispatchError message comes back through a pipe."""
    uid, gid = int(environ["SLURM_JOB_UID"]), int(environ["SLURM_JOB_GID"])
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        try:
            user = environ.get("SLURM_JOB_USER") or pwd.getpwuid(uid).pw_name
            os.setgroups(os.getgrouplist(user, gid))
            os.setgid(gid)
            os.setuid(uid)
            os.umask(0o022)
            result = {"ok": fn(*args)}
        except DispatchError as e:
            result = {"user_error": str(e)}
        except OSError as e:
            result = {"user_error": f"{e.filename or ''}: {e.strerror}"}
        except BaseException as e:  # a bug: report, never crash the node's hook
            result = {"bug": f"{type(e).__name__}: {e}"}
        try:
            data = json.dumps(result).encode()  # ASCII: any byte of a path is escaped
            write_all(wfd, data)
        finally:
            os._exit(0)
    os.close(wfd)
    try:
        data = _read_answer(rfd, pid, time.monotonic() + CHILD_TIMEOUT)
    finally:
        os.close(rfd)
    if data is None:
        return {"user_error": f"timed out after {CHILD_TIMEOUT}s (hung filesystem?)"}
    try:
        return json.loads(data) if data else {"bug": "child died without an answer"}
    except ValueError:
        return {"bug": f"child's answer is not JSON ({len(data)} bytes)"}


def _read_answer(rfd: int, pid: int, deadline: float) -> bytes | None:
    """The child's answer, read while it runs (a child blocked on a full pipe would
    otherwise never exit), then its exit reaped; None (child killed) at the deadline."""
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        ready = select.select([rfd], [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        data = os.read(rfd, 65536)
        if not data:
            break
        if size < ANSWER_MAX:
            chunks.append(data[:ANSWER_MAX - size])
        size += len(data)
    while not os.waitpid(pid, os.WNOHANG)[0]:  # it wrote and closed: exiting now
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    return b"".join(chunks)


def _prepare(values: dict, mode: int, pattern: str, job: dict | None = None) -> str:
    """As the job user: N checked against sub/, the epoch claimed, the exec folder made
    (store/epochs.py), then the execution's start recorded under the root (an
    ``execution_started`` event with source "prolog": this node, the nodes Slurm gave the
    execution, Slurm's start time), so `report` and gc know it from the root alone. The
    Prolog never sees a %a root (see prolog())."""
    out = epochs.prepare(values, mode, pattern, label="--dispatch-submission")
    if job is not None:
        os.environ.update(values)  # the event's epoch and attempt (this child only)
        try:  # observability: never the Prolog's failure (events.record warns on I/O errors itself)
            events.record("execution_started", root=values["DISPATCH_CHECKPOINT"],
                          attempt=values["DISPATCH_ATTEMPT"], source="prolog", node=job["node"],
                          **{k: job[k] for k in ("nodes", "nodelist", "start_time", "sluid") if job.get(k) is not None})
        except Exception as e:  # noqa: BLE001
            os.write(2, f"dispatch-slurm: warning: no execution_started event: {type(e).__name__}: {e}\n".encode())
    return out


def job_facts(environ) -> dict:
    """What Slurm told the Prolog of this execution, for its Epilog and the root: the job
    user, this node, the execution's nodes (SLURM_JOB_NODELIST from 24.11, SLURM_NODELIST
    on 22.05, expanded; left out unless it names this node and as many nodes as
    SLURM_JOB_NUM_NODES says: a short list would let the root claim cessation while a node
    missing from it still runs the job), Slurm's start time (24.11 on) and the SLUID (25.11
    on), when Slurm gives them."""
    node = environ.get("SLURMD_NODENAME") or os.uname().nodename
    facts = {"uid": int(environ["SLURM_JOB_UID"]), "gid": int(environ["SLURM_JOB_GID"]),
             "user": environ.get("SLURM_JOB_USER") or None, "node": node, "prolog_t": time.time()}
    hostlist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if hostlist:
        try:
            nodes = hostlist_.hostnames(hostlist)
        except ValueError as e:
            nodes = None
            log(f"the execution's nodes are not recorded: {e}")
        count = environ.get("SLURM_JOB_NUM_NODES", "")
        if nodes is not None and (node not in nodes or (count.isdigit() and int(count) != len(nodes))):
            log(f"the execution's nodes are not recorded: {hostlist!r} expands to {len(nodes)} nodes "
                f"({', '.join(nodes[:5])}), Slurm says {count or '?'}, this node is {node}")
            nodes = None
        if nodes is not None:
            facts.update(nodes=nodes, nodelist=hostlist)
    for key, var in (("start_time", "SLURM_JOB_START_TIME"), ("sluid", "SLURM_JOB_SLUID")):
        value = environ.get(var)
        if value:
            facts[key] = int(value) if key == "start_time" and value.isdigit() else value
    if not isinstance(facts.get("start_time", 0), int):
        del facts["start_time"]
    return facts


def env_file(job_id: str) -> str:
    """For job scripts to source: `export K='v'` lines (any byte quoted by the shell rules)."""
    return f"{RUN_DIR}/{job_id}.env"


def record_file(job_id: str) -> str:
    """The Epilog's record of the execution the Prolog started: one JSON object,
    ``{"v": 2, "values": {DISPATCH_*}, "job": job_facts()}`` (an older Prolog's: the
    values alone)."""
    return f"{RUN_DIR}/{job_id}.json"


def _write_root_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def prolog(environ, site_conf: str | None = None) -> int:
    sweep(environ)  # a record of this job id here too is an earlier execution's: ours comes below
    inputs = spank_inputs(environ)
    if inputs is None:
        return 0
    if "%a" in inputs["DISPATCH_CHECKPOINT"]:
        # Slurm gives the node Prolog no SLURM_ARRAY_TASK_ID, so an array task's root
        # is unknown here; the plugin's user_init / the TaskProlog create it per task.
        return 0
    try:
        site = sitefile.load(site_conf, env=False)
        values = envmod.compute(inputs, site)
    except DispatchError as e:
        log(f"user error, job will fail in its tasks: {e}")
        return 0
    pattern = names.normalize_root(inputs["DISPATCH_CHECKPOINT"])
    job = job_facts(environ)
    result = as_job_user(environ, _prepare, values, site.exec_mode, pattern, job)
    if "ok" not in result:
        # no .env/.json files: the plugin's user_init, which runs the same checks as the job
        # user, fails the job's tasks with this message in its stderr (remote.c)
        log(f"{'BUG' if 'bug' in result else 'user error, job will fail in its tasks'}: "
            f"{result.get('bug') or result['user_error']}")
        return 0
    try:  # root's own files, in root's own folder; bytes as the filesystem has them
        os.makedirs(RUN_DIR, mode=0o755, exist_ok=True)
        _write_root_file(env_file(environ["SLURM_JOB_ID"]), os.fsencode(envmod.render(values, "sh")))
        _write_root_file(record_file(environ["SLURM_JOB_ID"]),
                         json.dumps({"v": 2, "values": values, "job": job}).encode())
    except OSError as e:
        log(f"broken node: cannot write {RUN_DIR}: {e}")
        return 1
    return 0


def task_prolog(environ, out=sys.stdout, err=sys.stderr, site_conf: str | None = None) -> int:
    """Runs as the job user for every task: print `export K=V` lines (Slurm takes the
    value verbatim, so no shell quoting). An error fails the task (exit 1). slurmstepd
    reads a TaskProlog's stdout and stderr through one pipe and keeps only its `print`
    lines, which it writes to the task's *stdout* (task.c, 22.05 to 26.05); the job's
    stderr gets only "TaskProlog failed status=1". So the message goes out as a `print`
    line, and is appended to the batch job's stderr file when that is another file
    (`sbatch -e`, submitit's `.err`): see stdio.reason_to_stderr."""
    if not environ.get("DISPATCH_CHECKPOINT"):
        return 0
    try:
        site = sitefile.load(site_conf, env=False)
        values = envmod.compute(jobs.fill(environ, site), site)
        if any("\n" in v for v in values.values()):
            raise DispatchError("a DISPATCH_* value contains a newline")
        epochs.prepare(values, site.exec_mode, names.normalize_root(environ["DISPATCH_CHECKPOINT"]))
    except (DispatchError, OSError) as e:
        line = printable(f"dispatch-slurm: error: {e}")
        err.write(line + "\n")
        out.write(f"print {line}\n")
        out.flush()
        stdio.reason_to_stderr(environ, line)
        return 1
    lines = "".join(f"export {k}={v}\n" for k, v in values.items())
    if hasattr(out, "buffer"):  # the bytes of a path as the filesystem has them
        out.flush()
        out.buffer.write(os.fsencode(lines))
        out.buffer.flush()
    else:
        out.write(lines)
    return 0


def _processes_with(attempt: str, job: str | None = None) -> list[int]:
    """Pids on this node whose environment carries this execution's token or, given the
    ``job`` id, that are one of its slurmstepds (``slurmstepd: [<job>.<step>]``: one that
    outlives its tasks, retrying the completion towards slurmctld, still holds the job)."""
    needle = f"DISPATCH_ATTEMPT={attempt}".encode()
    stepd = f"slurmstepd: [{job}.".encode() if job else None
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if stepd is not None:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read(len(stepd)) == stepd:
                            found.append(int(pid))
                            continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(pid))
            except OSError:
                pass
    return found


def _record_cessation(values: dict, node: str, sluid: str | None = None, evidence: dict | None = None,
                      nodes: list[str] | None = None, source: str = "epilog") -> dict:
    """As the job user: the cessation entry (O_EXCL, durable) and its event, once.

    Slurm may run the Epilog twice for one execution (TERMINATE_JOB retries, before
    26.05): the second run finds the entry and changes nothing. ``sluid``: Slurm's own
    id of this run (SLURM_JOB_SLUID, 25.11 on), recorded as evidence beside
    DISPATCH_ATTEMPT (which stays the same derived token on every release). ``evidence``:
    how the Epilog knows (the job's cgroup v2 gone or empty, or a process scan), written
    into the entry and the event. ``nodes``: every node of the execution, as the Prolog
    recorded them, so that the root alone shows when all of them have recorded theirs.
    ``source``: "epilog", or "epilog (rejoined)" when Slurm gave no job options (a node
    that rejoins after slurmctld forgot the job) and the Prolog's record said it all."""
    os.environ.update(values)
    root, attempt = values["DISPATCH_CHECKPOINT"], values["DISPATCH_ATTEMPT"]
    if not ceased.record(root, attempt, node, evidence, nodes=nodes):
        return {"recorded": False}
    events.record("cessation", root=root, attempt=attempt, node=node, source=source,
                  **({"sluid": sluid} if sluid else {}), **({"evidence": evidence} if evidence else {}),
                  **({"nodes": nodes} if nodes else {}))
    return {"recorded": True}


def recorded(job_id: str) -> tuple[dict, dict] | None:
    """The execution the Prolog started on this node, from its own file, root-owned:
    (the DISPATCH_* values, what Slurm told the Prolog: job_facts(); {} from an older
    Prolog's record).

    The Epilog cannot recompute it: after a requeue, Slurm hands the old execution's
    Epilog the job's *new* restart count (seen on 22.05 and 24.11), which names the
    next execution; cessation evidence for that one would be a lie."""
    try:
        fd = os.open(record_file(job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != 0 or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
            return None  # not ours: never trust it
        try:
            rec = json.loads(f.read(ANSWER_MAX))
        except ValueError:
            return None
    if isinstance(rec, dict) and rec.get("v") == 2:
        values, job = rec.get("values"), rec.get("job")
    else:
        values, job = rec, {}
    if not isinstance(values, dict) or not isinstance(job, dict) or \
            not all(isinstance(v, str) for v in values.values()) or \
            not all(isinstance(values.get(k), str) for k in ("DISPATCH_CHECKPOINT", "DISPATCH_ATTEMPT")):
        return None
    return values, job


def recorded_execution(job_id: str) -> dict | None:
    """The DISPATCH_* values of the execution the Prolog started on this node (recorded())."""
    rec = recorded(job_id)
    return None if rec is None else rec[0]


def _job_user(environ, job: dict, rejoined: bool) -> dict | None:
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


def _wait_ceased(attempt: str, job: str, sluid: str | None, wait: float | None = None) -> dict | None:
    """Wait (CESSATION_WAIT at most) until no process carries the execution's token and,
    where Slurm tracks the job by cgroup v2 on this node, its job cgroup is empty or gone
    (a process that dropped its environment stays in the cgroup); the evidence, or None
    (logged) if something is still there."""
    paths = cgroup.job_cgroups(job, sluid)
    deadline = time.monotonic() + (CESSATION_WAIT if wait is None else wait)
    while True:
        left = _processes_with(attempt)
        cg, there = cgroup.state(paths) if paths is not None else (None, [])
        if not left and cg != cgroup.POPULATED:
            break
        if time.monotonic() >= deadline:
            if cg == cgroup.POPULATED:
                left = sorted(set(left) | set(cgroup.pids(there)))
                log(f"{attempt}: job cgroup {', '.join(there)} still holds processes {left[:5]}; "
                    "no cessation recorded")
            else:
                log(f"{attempt}: processes {left[:5]} still alive; no cessation recorded")
            return None
        time.sleep(0.2)
    if cg is None:
        return {"by": "process scan"}
    return {"by": "cgroup v2", "cgroup": " or ".join(there or paths), "state": cg}


def epilog(environ) -> int:
    """After the execution's processes on this node are gone, record it as cessation
    evidence under the root: one entry per execution and node, as the job user, naming
    every node of the execution.

    Without the job's options (a node cut off from slurmctld that rejoins after it
    forgot the job: slurmd kills the orphan and runs the Epilog with the job id alone,
    SLURM_JOB_UID 0 and this node as the node list, on 22.05 to 26.05) the Prolog's
    root-owned record on this node says it all: the root, the attempt, the job user
    and the nodes. The wrapper runs this for such a job only when that record exists."""
    job = environ["SLURM_JOB_ID"]
    sweep(environ, skip=job)
    inputs = spank_inputs(environ)
    if inputs is not None and "%a" in inputs["DISPATCH_CHECKPOINT"]:
        return 0
    rec = recorded(job)
    if rec is None:
        if inputs is not None:
            log("no record of the execution the Prolog started here; no cessation recorded")
        return 0
    values, facts = rec
    rejoined = inputs is None
    if rejoined:
        log(f"Slurm gave no job options (a node that rejoined after slurmctld forgot the job?): recording "
            f"the cessation of {values['DISPATCH_ATTEMPT']} from the Prolog's record")
    user_env = _job_user(environ, facts, rejoined)
    if user_env is None:
        return 0
    attempt = values["DISPATCH_ATTEMPT"]
    sluid = environ.get("SLURM_JOB_SLUID") or facts.get("sluid")
    evidence = _wait_ceased(attempt, job, sluid)
    if evidence is None:
        return 0
    node = environ.get("SLURMD_NODENAME") or os.uname().nodename
    nodes = facts.get("nodes") if isinstance(facts.get("nodes"), list) else None
    if nodes is None and not rejoined:  # an older Prolog's record: Slurm's list (the whole job's here)
        nodes = _env_nodes(environ, node)
    result = as_job_user(user_env, _record_cessation, values, node, sluid, evidence, nodes,
                         "epilog (rejoined)" if rejoined else "epilog")
    if "ok" not in result:
        log(f"cessation not recorded: {result.get('bug') or result['user_error']}")
    if recorded(job) == rec:  # a later execution's own files (requeued here) stay
        _forget(job)
    return 0


def sweep(environ, skip: str | None = None) -> None:
    """Record the cessation of executions on this node that Slurm ran no Epilog for.

    A batch script that ends while its node is cut off from slurmctld gets none: its
    slurmstepd retries the completion until the node rejoins, slurmctld answers that the
    job moved on ("Batch completion ... sent from wrong node") and asks nothing more of
    the node, whose next registration no longer lists the job (24.11, proc_req.c). The
    Prolog's record stays here. Every later Prolog and Epilog on the node (any job's: the
    wrappers start Python when such a record is there) looks at each record but ``skip``'s:
    one whose execution has no process, no slurmstepd and no populated job cgroup on this
    node, and that Slurm says is over (the rule of ``dispatch-slurm ceased``: requeued,
    ended and not completing, or forgotten), is recorded as its Epilog would have, source
    "sweep", as the job user the record names. Slurm is asked only for such a record, once:
    an allocation whose first step has not started yet has no process either."""
    try:
        ids = sorted(n[:-5] for n in os.listdir(RUN_DIR) if n.endswith(".json") and n[:-5].isdigit())
    except OSError:
        return
    for job in ids:
        if job != skip:
            try:
                _sweep_one(job, environ.get("SLURMD_NODENAME") or os.uname().nodename)
            except (OSError, SlurmError, DispatchError) as e:
                log(f"sweep of job {job}'s record: {type(e).__name__}: {e}; left for a later hook")
            except Exception as e:  # noqa: BLE001 -- another job's leftover never fails this job's hook
                log(f"BUG in the sweep of job {job}'s record: {type(e).__name__}: {e}: {traceback.format_exc(limit=5)}")


def _sweep_one(job: str, node: str) -> None:
    rec = recorded(job)
    if rec is None:
        return
    values, facts = rec
    attempt = values["DISPATCH_ATTEMPT"]
    parts = names.attempt_parts(attempt)
    if parts is None or str(parts[1]) != job or _processes_with(attempt, job):
        return
    restart = epochmod.decompose(parts[2]).restart
    over, why = cessation.slurm_says(Slurm().find_job(int(job)), restart)
    if not over:
        return
    user_env = _job_user({}, facts, rejoined=True)
    sluid = facts.get("sluid")
    evidence = _wait_ceased(attempt, job, sluid, wait=0) if user_env is not None else None
    if evidence is None:
        return
    log(f"{attempt}: no Epilog ran for it on this node ({why}): recording its cessation from the Prolog's record")
    nodes = facts.get("nodes") if isinstance(facts.get("nodes"), list) else None
    result = as_job_user(user_env, _record_cessation, values, node, sluid, {**evidence, "slurm": why}, nodes,
                         "sweep")
    if "ok" not in result:
        log(f"cessation not recorded: {result.get('bug') or result['user_error']}")
    elif recorded(job) == rec:
        _forget(job)


def _forget(job: str) -> None:
    """Remove the Prolog's files of ``job`` on this node."""
    for path in (env_file(job), record_file(job)):
        try:
            os.unlink(path)
        except OSError:
            pass


def _env_nodes(environ, node: str) -> list[str] | None:
    """The execution's nodes from the Epilog's own environment (job_facts' checks)."""
    hostlist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not hostlist:
        return None
    try:
        nodes = hostlist_.hostnames(hostlist)
    except ValueError:
        return None
    count = environ.get("SLURM_JOB_NUM_NODES", "")
    return nodes if node in nodes and (not count.isdigit() or int(count) == len(nodes)) else None


def main(argv=None) -> int:
    """Run one hook. Exit 0 unless the node itself is broken: a user's input, even one
    that trips a bug here, must never make Slurm drain the node (a TaskProlog's
    non-zero fails only the task)."""
    global LOG
    ap = argparse.ArgumentParser(prog="python3 -m dispatch_slurm.slurm.hooks")
    ap.add_argument("hook", choices=["prolog", "task-prolog", "epilog"])
    ap.add_argument("--site-conf", help=f"the site's settings [default: {siteconf.DEFAULT_PATH}]; "
                    "never taken from the job's environment")
    ap.add_argument("--log", help=f"the hooks' own log [default: {LOG}] (LOG= in /etc/default/dispatch-slurm)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if a.log:
        LOG = a.log  # one hook per process: the wrapper's choice holds for all of it
    try:
        if a.hook == "task-prolog":
            return task_prolog(os.environ, site_conf=a.site_conf)
        if a.hook == "prolog":
            return prolog(os.environ, site_conf=a.site_conf)
        return epilog(os.environ)
    except Exception as e:  # noqa: BLE001 -- a bug must not drain the node
        log(f"BUG in the {a.hook}: {type(e).__name__}: {e}: {traceback.format_exc(limit=5)}")
        return 1 if a.hook == "task-prolog" else 0


if __name__ == "__main__":
    sys.exit(main())
