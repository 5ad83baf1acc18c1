"""The TaskProlog (the job user, every task; for sites without the plugin's injection): enter
the execution (store/epochs.enter) and print ``export K=V`` lines, which slurmstepd puts into
the task's environment verbatim (no shell quoting).

An error fails the task (exit 1). slurmstepd reads a TaskProlog's stdout and stderr through
one pipe and keeps only its ``print`` lines, which it writes to the task's *stdout* (task.c,
22.05 to 26.05); the job's stderr gets only "TaskProlog failed status=1". So the message goes
out as a ``print`` line, and is appended to the batch job's stderr file when that is another
file (``sbatch -e``, submitit's ``.err``): see stdio.reason_to_stderr."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Optional, TextIO

from ...contract import env as envmod
from ...errors import DispatchError
from ...store import epochs
from .. import sitefile, stdio
from .node import printable


def run(environ: Mapping[str, str], out: TextIO = sys.stdout, err: TextIO = sys.stderr,
        site_conf: Optional[str] = None) -> int:
    if not environ.get("DISPATCH_CHECKPOINT"):
        return 0
    try:
        site = sitefile.load(site_conf, env=False)
        if "\n" in envmod.named_root(environ):  # an `export` line ends at the newline
            raise DispatchError("a DISPATCH_* value contains a newline")
        values = epochs.enter(epochs.job_store(environ), environ, site)
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
