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

Inputs: the plugin's options reach the Prolog and Epilog as
SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_<option>; the TaskProlog sees the
task's own environment (DISPATCH_* from the plugin or from `dispatch-slurm submit`).
"""

import json
import os
import pwd
import signal
import sys
import syslog
import time

from . import env as envmod
from . import events, siteconf, store
from .errors import DispatchError

RUN_DIR = "/run/dispatch-slurm"
LOG = "/var/log/dispatch-slurm.log"
SPANK_OPT = "SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_"
SENTINEL = b"dispatch-checkpoint-complete"
CHILD_TIMEOUT = 60  # a hung filesystem must not hang the hook forever
CESSATION_WAIT = 30  # how long the Epilog waits for the execution's processes to go


def log(msg: str) -> None:
    """slurmd discards hook output: keep a line in syslog and in our own log."""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {os.environ.get('SLURM_SCRIPT_CONTEXT', 'hook')} " \
           f"job {os.environ.get('SLURM_JOB_ID', '?')}: {msg}"
    syslog.syslog(syslog.LOG_NOTICE, line)
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
        os.write(wfd, json.dumps(result).encode())
        os._exit(0)
    os.close(wfd)
    deadline = time.monotonic() + CHILD_TIMEOUT
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
            return {"user_error": f"timed out after {CHILD_TIMEOUT}s (hung filesystem?)"}
        time.sleep(0.01)
    data = b"".join(iter(lambda: os.read(rfd, 65536), b""))
    os.close(rfd)
    return json.loads(data) if data else {"bug": "child died without an answer"}


def _prepare(values: dict, mode: int) -> str:
    """As the job user: the exec folder (and, for a %a root, the task's root)."""
    return store.make_exec_dir(values["DISPATCH_CHECKPOINT"], values["DISPATCH_ATTEMPT"], mode)


def env_file(job_id: str) -> str:
    return f"{RUN_DIR}/{job_id}.env"


def prolog(environ) -> int:
    inputs = spank_inputs(environ)
    if inputs is None:
        return 0
    if "%a" in inputs["DISPATCH_CHECKPOINT"]:
        # Slurm gives the node Prolog no SLURM_ARRAY_TASK_ID, so an array task's root
        # is unknown here; the plugin's user_init / the TaskProlog create it per task.
        return 0
    try:
        site = siteconf.load()
        values = envmod.compute(inputs, site)
    except DispatchError as e:
        log(f"user error, job will fail in its tasks: {e}")
        return 0
    result = as_job_user(environ, _prepare, values, site.exec_mode)
    if "ok" not in result:
        log(f"{'BUG' if 'bug' in result else 'user error'}: {result.get('bug') or result['user_error']}")
        return 0
    try:  # root's own file, in root's own folder
        os.makedirs(RUN_DIR, mode=0o755, exist_ok=True)
        fd = os.open(env_file(environ["SLURM_JOB_ID"]),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(envmod.render(values, "sh"))
    except OSError as e:
        log(f"broken node: cannot write {RUN_DIR}: {e}")
        return 1
    return 0


def task_prolog(environ, out=sys.stdout, err=sys.stderr) -> int:
    """Runs as the job user for every task: print `export K=V` lines (Slurm takes the
    value verbatim, so no shell quoting). An error fails the task with the message
    in the job's stderr."""
    if not environ.get("DISPATCH_CHECKPOINT"):
        return 0
    try:
        site = siteconf.load()
        values = envmod.compute(environ, site)
        if any("\n" in v for v in values.values()):
            raise DispatchError("a DISPATCH_* value contains a newline")
        store.make_exec_dir(values["DISPATCH_CHECKPOINT"], values["DISPATCH_ATTEMPT"], site.exec_mode,
                            create_root="%a" in environ["DISPATCH_CHECKPOINT"])
    except (DispatchError, OSError) as e:
        err.write(f"dispatch-slurm: error: {e}\n")
        return 1
    out.write("".join(f"export {k}={v}\n" for k, v in values.items()))
    return 0


def _processes_with(attempt: str) -> list[int]:
    """Pids on this node whose environment carries this execution's token."""
    needle = f"DISPATCH_ATTEMPT={attempt}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(pid))
            except OSError:
                pass
    return found


def _record_cessation(values: dict, node: str, stdout_path: str | None, sluid: str | None) -> dict:
    """As the job user: the cessation entry (O_EXCL, durable) and, when this run created it,
    the event lines. Slurm may run the Epilog more than once for one execution (TERMINATE_JOB
    retries, before 26.05): a second run changes nothing. ``sluid``: Slurm's own id of this
    run (SLURM_JOB_SLUID, 25.11 on), recorded as evidence beside DISPATCH_ATTEMPT."""
    os.environ.update(values)
    root, attempt = values["DISPATCH_CHECKPOINT"], values["DISPATCH_ATTEMPT"]
    if not store.record_cessation(root, attempt, node):
        return {"sentinel": None, "already": True}
    events.emit("cessation", root, attempt, node=node, source="epilog", **({"sluid": sluid} if sluid else {}))
    sentinel = False
    if stdout_path:
        try:
            with open(stdout_path, "rb") as f:
                sentinel = SENTINEL in f.read()
        except OSError:
            pass
    if sentinel:
        events.emit("checkpoint_complete", root, attempt, source="epilog")
    return {"sentinel": sentinel}


def recorded_execution(job_id: str) -> dict | None:
    """The execution the Prolog started on this node: its own file, root-owned.

    The Epilog cannot recompute it: after a requeue, Slurm hands the old execution's
    Epilog the job's *new* restart count (seen on 22.05 and 24.11), which names the
    next execution; cessation evidence for that one would be a lie."""
    import shlex
    try:
        fd = os.open(env_file(job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != 0 or st.st_mode & 0o022:
            return None  # not ours: never trust it
        values = {}
        for line in f:
            words = shlex.split(line)
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                k, v = words[1].split("=", 1)
                values[k] = v
    return values if {"DISPATCH_CHECKPOINT", "DISPATCH_ATTEMPT"} <= values.keys() else None


def epilog(environ) -> int:
    """After the execution's processes on this node are gone, record it as cessation
    evidence under the root: one entry per execution and node, as the job user."""
    inputs = spank_inputs(environ)
    if inputs is None or "%a" in inputs["DISPATCH_CHECKPOINT"]:
        return 0
    values = recorded_execution(environ["SLURM_JOB_ID"])
    if values is None:
        log("no record of the execution the Prolog started here; no cessation recorded")
        return 0
    attempt = values["DISPATCH_ATTEMPT"]
    deadline = time.monotonic() + CESSATION_WAIT
    while (left := _processes_with(attempt)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        log(f"{attempt}: processes {left[:5]} still alive; no cessation recorded")
        return 0
    node = environ.get("SLURMD_NODENAME") or os.uname().nodename
    result = as_job_user(environ, _record_cessation, values, node, environ.get("SLURM_JOB_STDOUT"),
                         environ.get("SLURM_JOB_SLUID"))
    if "ok" not in result:
        log(f"cessation not recorded: {result.get('bug') or result['user_error']}")
    try:  # a later execution of the job on this node has written its own by now? keep it
        if recorded_execution(environ["SLURM_JOB_ID"]) == values:
            os.unlink(env_file(environ["SLURM_JOB_ID"]))
    except OSError:
        pass
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    hooks = {"prolog": prolog, "task-prolog": task_prolog, "epilog": epilog}
    if len(argv) != 1 or argv[0] not in hooks:
        sys.stderr.write(f"usage: python3 -m dispatch_slurm.hooks {'|'.join(hooks)}\n")
        return 2
    return hooks[argv[0]](os.environ)


if __name__ == "__main__":
    sys.exit(main())
