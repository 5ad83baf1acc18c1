"""Which roots one `run` supervises: the roots named, a job array's task roots, and roots
that appear later in a folder or a list file.

A job array under the supervisor is one root per task (``ROOT`` with ``%a``, as the
plugin expands it) and one Slurm job per task: each task is submitted as ``--array=I``
(so the script still sees ``SLURM_ARRAY_TASK_ID``), has its own record, and is
resubmitted or continued alone, by its own rules; one fleet follows them all."""

from __future__ import annotations

import os
import re
from typing import Iterator, NamedTuple, Optional

from ..errors import DispatchError

_ARRAY_OPT = re.compile(r"^(?:--array=|-a)(.+)$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
MAX_TASKS = 10_000


def array_tasks(spec: str) -> list[int]:
    """The task ids of ``--array=SPEC`` (``0-9``, ``1,3,5-7``, ``0-15:4``)."""
    if "%" in spec:
        raise DispatchError(f"--array={spec}: a throttle (%N) is not kept by the supervisor, which submits "
                            "each task as its own job; drop it (every task then queues at once)")
    ids: list[int] = []
    for part in spec.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise DispatchError(f"--array={spec}: {part!r} is not a task id, A-B or A-B:STEP")
        a, b, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
        if b < a or step < 1:
            raise DispatchError(f"--array={spec}: {part!r} is an empty range")
        ids.extend(range(a, b + 1, step))
        if len(ids) > MAX_TASKS:
            raise DispatchError(f"--array={spec}: more than {MAX_TASKS:,} tasks")
    return sorted(set(ids))


def _array_option(args: list[str]) -> Optional[tuple[int, int, str]]:
    """(index, how many words, spec) of the --array option among sbatch's arguments, before
    the script (sbatch reads its options only there: the first word that names a file)."""
    for i, a in enumerate(args):
        if a == "--" or os.path.isfile(a):
            break
        if a in ("--array", "-a") and i + 1 < len(args):
            return i, 2, args[i + 1]
        m = _ARRAY_OPT.match(a)
        if m:
            return i, 1, m[1]
    return None


class Task(NamedTuple):
    """One supervised root: its sbatch arguments and, for an array task, the ``%a`` root the
    job names (the plugin and `env` require it of an array task, and expand it to ``root``)."""
    root: str
    args: list[str]
    template: Optional[str] = None


def expand(roots: list[str], args: list[str]) -> list[Task]:
    """The supervised roots: a ``%a`` root becomes one root per ``--array`` task (created if
    missing, beside each other), each submitted as ``--array=I``."""
    out: list[Task] = []
    opt = _array_option(args)
    for root in roots:
        if "%" not in root:
            out.append(Task(root, args))
            continue
        if re.search(r"%[^a]", root.replace("%%", "")):
            raise DispatchError(f"checkpoint root {root!r}: only %a (the array task id) is expanded here; "
                                "%A and the others are not known before sbatch runs")
        if opt is None:
            raise DispatchError(f"checkpoint root {root!r} names %a but the sbatch arguments have no --array: "
                                "give the tasks on the command line, e.g. -- --array=0-9 job.sh (an #SBATCH "
                                "--array line inside the script is not seen before sbatch runs)")
        i, width, spec = opt
        for task in array_tasks(spec):
            task_root = root.replace("%a", str(task))
            parent = os.path.dirname(task_root.rstrip("/")) or "."
            if not os.path.isdir(parent):
                raise DispatchError(f"checkpoint root {task_root}: its folder {parent} does not exist (create it)")
            os.makedirs(task_root, mode=0o700, exist_ok=True)
            out.append(Task(task_root, [*args[:i], f"--array={task}", *args[i + width:]], root))
    return out


def listed(source: str) -> Iterator[str]:
    """The roots ``--roots-from`` names now: each folder in a folder, or each line of a
    list file (blank lines and ``#`` comments skipped)."""
    if os.path.isdir(source):
        for name in sorted(os.listdir(source)):
            path = os.path.join(source, name)
            if not name.startswith(".") and os.path.isdir(path):
                yield path
        return
    try:
        with open(source, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else f"not UTF-8 text (byte {e.start})"
        raise DispatchError(f"--roots-from {source}: {why}; name a folder of roots or a file "
                            "with one root per line") from None
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#"):
            yield line if os.path.isabs(line) else os.path.join(os.path.dirname(os.path.abspath(source)), line)
