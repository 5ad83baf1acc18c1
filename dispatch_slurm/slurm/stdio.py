"""Where a batch job's stderr goes, and the TaskProlog's refusal appended to it: slurmstepd
writes a TaskProlog's `print` lines to the task's stdout only, so a job with its own stderr
file (submitit's .err) would show only `TaskProlog failed status=1`."""

import os
import stat
import subprocess

SCONTROL_TIMEOUT = 10  # the TaskProlog's one question to slurmctld, on a refusal only


def job_stdio(job_id: str, run=None) -> tuple[str | None, str | None]:
    """(StdErr, StdOut) of a batch job as ``scontrol show job`` prints them (its own
    expansion of %j, %u, %x...; one field a line, so a path with spaces is whole);
    (None, None) when it cannot say (no scontrol, no answer in time, not a batch job)."""
    try:
        proc = (run or subprocess.run)(["scontrol", "show", "job", str(int(job_id))], capture_output=True,
                                       timeout=SCONTROL_TIMEOUT, check=False)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None, None
    if proc.returncode != 0:
        return None, None
    found = {}
    for raw in os.fsdecode(proc.stdout).splitlines():
        key, sep, value = raw.strip().partition("=")
        if sep and key in ("StdErr", "StdOut") and key not in found:
            found[key] = value
    return found.get("StdErr"), found.get("StdOut")


def reason_to_stderr(environ, line: str, run=None) -> bool:
    """Append the TaskProlog's refusal to the batch job's stderr file, when that is not
    its stdout (where Slurm already writes the `print` line): True if written. Only a
    step's task 0 asks, so a refusal costs one RPC per step, not one per task (an srun
    step inside the batch script writes its stderr to the batch job's too, through srun;
    an interactive srun has no such file and is left alone). The file is never created and
    never followed through a symlink: only a regular file of the job's user, opened for
    append (slurmstepd opens it O_APPEND too, so neither write overwrites the other)."""
    if environ.get("SLURM_PROCID", "0") != "0" or not environ.get("SLURM_JOB_ID"):
        return False
    stderr_path, stdout_path = job_stdio(environ["SLURM_JOB_ID"], run)
    if not stderr_path or not stderr_path.startswith("/"):
        return False
    try:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        if stdout_path:
            try:
                out = os.stat(stdout_path)
                if (out.st_dev, out.st_ino) == (st.st_dev, st.st_ino):
                    return False  # one file: the `print` line is in it already
            except OSError:
                pass
        os.write(fd, os.fsencode(line + "\n"))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
