"""Run a script with gloo's threads lagging behind the main thread: the condition under which
torch aborts a program that ended normally (``dispatch_slurm.runtime.distributed.settle`` says
how), made to happen on every run instead of now and then on a loaded node.

    python -m torch.distributed.run --nproc-per-node 2 tests/testbed/lagging.py SCRIPT ARGS...

The process and every thread it starts share one CPU; the threads a process group starts
(``init_process_group``, ``new_group``) run at nice 19, so they run when the main thread
blocks and hardly otherwise; the GIL's switch interval is 30 s, so the main thread keeps the
GIL while it runs Python; and the last exit handler is three seconds of Python that never
blocks (one second was too short on a loaded machine: other processes took the CPU and the
thread did not get it in time). A gloo thread left with a collective to release when the
program ends gets the CPU in those seconds, asks for the GIL, and gets it only once the interpreter is finalizing: SIGABRT.
"""

import atexit
import os
import runpy
import sys
import time

import torch.distributed as dist

HOLD_S = 3.0


def lag_the_others() -> None:
    """Every thread of this process but the main one to nice 19."""
    for tid in map(int, os.listdir("/proc/self/task")):
        if tid != os.getpid():
            try:
                os.setpriority(os.PRIO_PROCESS, tid, 19)
            except OSError:  # gone meanwhile
                pass


def lagging(make):
    def wrapped(*args, **kwargs):
        try:
            return make(*args, **kwargs)
        finally:
            lag_the_others()
    return wrapped


def hold_the_gil() -> None:
    end = time.monotonic() + HOLD_S
    while time.monotonic() < end:  # Python that never blocks: the GIL stays here
        pass


def main() -> None:
    os.sched_setaffinity(0, {int(os.environ.get("LOCAL_RANK", "0")) % os.cpu_count()})  # threads inherit it
    sys.setswitchinterval(30.0)
    dist.init_process_group = lagging(dist.init_process_group)
    dist.new_group = lagging(dist.new_group)
    atexit.register(hold_the_gil)  # registered first: runs last, right before finalization
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
