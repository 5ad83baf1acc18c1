"""Preemption with several ranks (torchrun, srun, DDP, FSDP): every rank stops at one step.

Why a protocol. Slurm signals every task, but not at the same instant, and a signal may
reach only some ranks (torchrun forwards it, a container swallows it). A rank that saves
and exits on its own signal leaves the others blocked in the next all-reduce until
SIGKILL; a sharded save that rank 0 publishes before the other ranks wrote theirs is
torn. So, with torch.distributed initialised and more than one rank, the handler is
always deferred and ``preemption_point()`` is a collective every rank calls each step:

1. agree: each rank contributes the seconds since its own signal (-1: none) to an
   all-reduce MAX. Any value >= 0 stops every rank at the same point, with the deadline
   of the earliest signal. The all-reduce is started at one point and read at the next,
   so it overlaps a step's work; the stop comes one step after the signal was seen.
2. save: every rank calls ``save(time_remaining)`` and fsyncs what it returned (on a
   shared filesystem an fsync flushes only the calling client's own writes).
3. confirm: an all-reduce MIN of "my save is durable"; only if every rank's is, the
   publishing rank publishes, and a last all-reduce tells every rank whether it did.
4. exit: the sentinel and 0 on every rank, or 1 on every rank without it.

The protocol's collectives run on gloo groups of its own (a CPU flag, whatever the
training backend: NCCL too). Agreement keeps torch's default timeout (ranks may drift
apart by more than the grace in normal training, e.g. an eval on rank 0); confirmation
times out with the grace, so a rank that died turns into exit 1 on the others within
the window, never a hang.

At the end of training the program calls ``settle()`` on every rank before
``destroy_process_group()``, so that the interpreter's exit cannot abort (its doc says why).
The protocol's own groups need no settling (``Ranks`` says why).
"""

import datetime
import sys
import time

from .. import store


def rank() -> int | None:
    """This process's rank when torch.distributed is initialised with more than one rank,
    else None (torch is never imported here unless the program already did)."""
    dist = sys.modules.get("torch.distributed")
    if dist and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank()
    return None


def resume_point(root: str | None = None) -> tuple[str, int] | None:
    """The latest publication's (path, step), read on rank 0 and broadcast, so every rank
    loads the same save even while an overlapping execution publishes; None: nothing yet."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return store.resume_point(root)  # a vanished save is an error, never None
    found: list[tuple[str, int] | None] = [store.resume_point(root) if dist.get_rank() == 0 else None]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(found, src=0)
    return found[0]


AGREE_EVERY_S = 0.2  # training time between two agreements: a stop is decided within ~2x this
MAX_STRIDE = 16  # steps between two agreements at most, whatever the step time


class Ranks:
    """The protocol's collectives. Create it on every rank, in the same order as any
    other group (``new_group`` is itself a collective).

    The last point leaves an all-reduce in flight when training ends; that is harmless
    at exit (see ``settle`` for what is not): every all-reduce works on ``_flag``,
    which this object keeps for the life of the process, so a gloo worker releasing a
    finished one never frees a tensor Python has let go of, the one release that takes
    the GIL; the all-reduce in flight is released with this object when the interpreter
    clears the modules, when torch no longer takes the GIL."""

    def __init__(self, grace: float):
        import torch
        import torch.distributed as dist
        self._dist, self._torch = dist, torch
        self._agree = dist.new_group(backend="gloo")
        self._confirm = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=max(grace, 1.0)))
        self._flag = torch.zeros(2, dtype=torch.float64)  # [elapsed, -stride proposed]: one MAX for both
        self._pending = None  # the all-reduce started at an earlier point
        self._started = 0.0  # and when (time.monotonic())
        self._stride, self._left = 1, 0  # points per collective (the same on every rank), points until the next
        self._last: float | None = None  # time.monotonic() at the previous point: this rank's step time

    def agree(self, elapsed: float) -> float | None:
        """Seconds since the earliest signal any rank had seen at the previous point, the
        same decision on every rank; None to go on. ``elapsed`` (-1: no signal) is this
        rank's contribution to the next answer.

        The collective runs every ``stride`` points, not every step: starting one costs
        0.2-0.4 ms (gloo's worker thread takes the CPU from the step on a busy node), 1-5% of a
        7-25 ms step; once per AGREE_EVERY_S (or MAX_STRIDE steps) it is 0.2-0.5%
        (benchmarks/bench_integrations.py). The ranks agree on the stride in the same all-reduce
        (the smallest one proposed: AGREE_EVERY_S of this rank's last step, at most
        MAX_STRIDE), so they all count the same points; a stop waits at most two strides."""
        now = time.monotonic()
        step, self._last = (None if self._last is None else now - self._last), now
        if self._left > 0:
            self._left -= 1
            return None
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            if self._flag[0].item() >= 0:
                return self._flag[0].item() + time.monotonic() - self._started
            self._stride = int(-self._flag[1].item())
        want = 1 if not step else max(1, min(MAX_STRIDE, int(AGREE_EVERY_S / step)))
        self._flag[0], self._flag[1] = elapsed, -want
        self._started = time.monotonic()
        self._pending = self._dist.all_reduce(self._flag, op=self._dist.ReduceOp.MAX,
                                              group=self._agree, async_op=True)
        self._left = self._stride - 1
        return None

    def all_ok(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank; False if a rank is gone or too late."""
        t = self._torch.tensor([1.0 if ok else 0.0])
        try:
            self._dist.all_reduce(t, op=self._dist.ReduceOp.MIN, group=self._confirm)
        except Exception:  # noqa: BLE001 -- a dead peer, a timeout: not every rank is ok
            return False
        return t.item() == 1.0


_SETTLED: list[object] = []  # each settle()'s barrier: released only when the interpreter clears this module


def settle(group=None) -> None:
    """End the program's use of ``group`` (default: the default group) so that the
    interpreter's exit cannot abort. Call it on every rank after the group's last
    collective, before ``destroy_process_group()``; a no-op without torch.distributed.

    Why. A gloo worker thread releases a collective only after it has signalled its
    completion, so the caller may have moved on, even out of the program, by then. If
    that release frees a tensor Python has let go of (the output of an FSDP all-gather,
    of ``full_tensor()``, of an object collective), it takes the GIL, and a thread that
    gets the GIL while the interpreter is finalizing is ended by CPython (pthread_exit),
    whose unwinding through a noexcept destructor aborts the process: "terminate called
    without an active exception", SIGABRT, after the program ended normally (torch's
    gloo, pytorch#190489). Neither ``dist.barrier()`` nor ``destroy_process_group()``
    prevents it: a barrier is one more collective released the same way, and gloo even
    keeps the collectives its workers still held when the barrier started until the
    barrier itself is freed; destroying the group leaves gloo's threads running while
    anything holds it (FSDP does). Here the barrier is kept until the interpreter clears
    this module: the collectives it keeps are freed with it there, where torch no longer
    takes the GIL, and the group's other collectives had been released already."""
    dist = sys.modules.get("torch.distributed")
    if not (dist and dist.is_available() and dist.is_initialized()):
        return
    work = dist.barrier(group=group, async_op=True)
    work.wait()
    _SETTLED.append(work)
