"""Root's side of the hooks on this node: its log, its own files under /run/dispatch-slurm/,
and the child that drops to the job user before anything touches the checkpoint root.

Root never touches a user-controlled path: the Prolog and Epilog fork a child that drops
to the job user (setgroups, setgid, setuid) before it opens anything under the root; root
only writes its own files here. Nothing a user controls can make a hook hang: the child's
answer is read while it runs (no pipe deadlock), bounded in size and time."""

from __future__ import annotations

import json
import os
import pwd
import select
import signal
import stat
import syslog
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

from ...errors import DispatchError
from ...store import write_all

RUN_DIR = "/run/dispatch-slurm"
LOG = "/var/log/dispatch-slurm.log"  # the wrapper's --log replaces it for the hook's process
CHILD_TIMEOUT = 60  # a hung filesystem must not hang the hook forever
ANSWER_MAX = 1 << 20  # the child's answer and the Prolog's record: more is cut (one JSON object)


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


def as_job_user(environ: Mapping[str, str], fn: Callable[..., Any], *args: Any) -> dict:
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
        answer = _read_answer(rfd, pid, time.monotonic() + CHILD_TIMEOUT)
    finally:
        os.close(rfd)
    if answer is None:
        return {"user_error": f"timed out after {CHILD_TIMEOUT}s (hung filesystem?)"}
    try:
        return json.loads(answer) if answer else {"bug": "child died without an answer"}
    except ValueError:
        return {"bug": f"child's answer is not JSON ({len(answer)} bytes)"}


def _read_answer(rfd: int, pid: int, deadline: float) -> Optional[bytes]:
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


def env_file(job_id: str) -> str:
    """For job scripts to source: `export K='v'` lines (any byte quoted by the shell rules)."""
    return f"{RUN_DIR}/{job_id}.env"


def record_file(job_id: str) -> str:
    """The Epilog's record of the execution the Prolog started: one JSON object,
    ``{"v": 2, "values": {DISPATCH_*}, "job": job.facts()}`` (an older Prolog's: the
    values alone)."""
    return f"{RUN_DIR}/{job_id}.json"


def restart_file(job_id: str) -> str:
    """The job's restart count, ``N\n``, for the SPANK plugin's user_init in the batch step
    (spank_env/remote.c), whose environment lacks SLURM_RESTART_COUNT until its task runs.
    The Prolog writes it, not the plugin: a plugin with a job_prolog makes slurmd take the
    job's options out of the Prolog's and Epilog's environment."""
    return f"{RUN_DIR}/{job_id}.restart"


def write_root_file(path: str, data: bytes) -> None:
    """One of root's own files, in root's own folder (never through a symlink)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def recorded(job_id: str) -> Optional[tuple[dict, dict]]:
    """The execution the Prolog started on this node, from its own file, root-owned:
    (the DISPATCH_* values, what Slurm told the Prolog: job.facts(); {} from an older
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


def recorded_execution(job_id: str) -> Optional[dict]:
    """The DISPATCH_* values of the execution the Prolog started on this node (recorded())."""
    rec = recorded(job_id)
    return None if rec is None else rec[0]


def recorded_ids() -> list[str]:
    """The job ids with a Prolog's record on this node ([] without /run/dispatch-slurm)."""
    try:
        return sorted(n[:-5] for n in os.listdir(RUN_DIR) if n.endswith(".json") and n[:-5].isdigit())
    except OSError:
        return []


def forget(job_id: str) -> None:
    """Remove the Prolog's files of ``job_id`` on this node."""
    for path in (env_file(job_id), record_file(job_id), restart_file(job_id)):
        try:
            os.unlink(path)
        except OSError:
            pass
