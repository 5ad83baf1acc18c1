"""The preemption protocol: checkpoint within the grace window, then exit.

    install_preemption_handler(save)       # save(time_remaining: float) -> path | None

On SIGTERM (or the signals given, e.g. SIGUSR2 for ``sbatch --signal=USR2@90``) the
handler calls ``save(seconds_left)``. On success it prints ``dispatch-checkpoint-complete``
on stdout, on a line of its own, and exits 0; if ``save`` raises it prints the error on stderr and exits 1,
without the sentinel. ``time_remaining()`` is callable anywhere: seconds until the
deadline (first signal's arrival, as Python sees it, + grace), or the full grace
before any signal.
Grace: the ``grace`` argument, else ``$DISPATCH_GRACE_S`` (which `dispatch-slurm env`
resolves: job option > account default > site default 60 s, capped at 300), else 60.

Where the save runs, and why. CPython never runs Python code in the raw C signal
frame: the C handler only sets a flag and the Python handler runs on the main thread
at the next bytecode boundary. So there is no async-signal-safety problem; the risk
is the state of the *interrupted* code, which is paused wherever it was:
  * a non-reentrant lock it holds (a user's ``threading.Lock``, a queue's) deadlocks
    a save that takes it, until SIGKILL;
  * an update it was halfway through (``optimizer.step()`` walks parameters in a
    Python loop on CPU) makes the save a torn mix of two steps.
A helper thread woken by ``signal.set_wakeup_fd`` fixes neither: the main thread
would keep training while the thread saves (torn state), or be paused holding its
locks (deadlock). Two modes, then:
  * default: the save runs in the Python handler, right away. Right for code whose
    state is consistent at any bytecode (the jobd contract; ``save`` writes a
    snapshot it keeps, or the trainer is idle in I/O).
  * ``defer=True``: the handler only records the signal; the save runs at the next
    ``preemption_point()``, which the training loop calls between steps, where no
    lock is held and the state is one whole step. Recommended for training loops.
Either way the handler waits for the main thread to run bytecode again: Python's own
blocking calls (sleep, I/O, lock waits) are interrupted, a C call that blocks through
the whole grace (a hung collective) is not.
Our own output never goes through Python's buffered streams from the handler (the
sentinel and the error are ``os.write`` calls), and the exit is ``os._exit``: the
interrupted code must not go on (a bare ``except`` could swallow SystemExit and keep
training after the sentinel), and non-daemon threads must not delay the exit past the
grace. atexit handlers do not run: do what must happen inside ``save``. A second
signal during the save is ignored; the deadline stays the first one's.

Several ranks. Slurm signals every task of a step, but not at the same instant, nor
always every task. With torch.distributed initialised (more than one rank) before
``install_preemption_handler``, the save is always deferred and ``preemption_point()``
is a collective: the ranks agree on one stop step, every rank saves and fsyncs its part,
the save is published once after every rank's part is durable, and every rank exits
with the same code (``distributed.py`` has the protocol). Without torch.distributed,
each rank's handler runs its own save. Either way, if ``save`` returns the path of a
save (``.../checkpoint-<step>``, or ``(path, step)``), it is published -- fsynced, at
``$DISPATCH_EPOCH``, in ``$DISPATCH_CHECKPOINT`` -- by the publishing rank only:
``publish=True/False`` says so explicitly; by default rank 0 of torch.distributed, else
``$RANK`` (torchrun), else ``$SLURM_PROCID``. Integrations that save through their
framework's own control flow ask ``stop_requested()`` each step and call ``conclude``.

Slurm: preemption's SIGTERM goes to the job steps, not to the batch shell, unless
``--signal=B:...``; scancel sends SIGCONT, SIGTERM, waits KillWait, then SIGKILL.

Forked children. Slurm (linuxproc tracking; ``dispatch-slurm launch`` under any tracking)
signals every process of the step, and a process forked from the one that installed the
handler (a DataLoader worker, the trainer's own ``multiprocessing`` child) inherits it. Only
the installing process saves, publishes, prints the sentinel and records events. In a child
the signal is the step's if the installing process got one too (a shared byte it sets,
awaited up to CHILD_WAIT_S): the child then ignores it and keeps serving, since a worker that
died would make the DataLoader raise "worker killed by signal" in the trainer (its SIGCHLD
handler, its next batch) before the save is published; the step's end takes the child with it.
Otherwise the signal was the child's alone (``terminate()``, a pool closing): it gets the
disposition the signal had before the handler was installed (SIGTERM: death), CHILD_WAIT_S
late. A DataLoader worker replaces SIGTERM's disposition with torch's own when its loop
starts (``_set_worker_signal_handlers``: die unless the parent sent it); in a child that
function is wrapped so the handler is put back after it. Workers started by ``spawn`` or
``forkserver`` inherit nothing and die of the signal as before.

Requeue after a preemption. Slurm 24.05 and later record a job that ends during its
GraceTime as PREEMPTED and requeue it (PreemptMode=REQUEUE). Slurm 22.05 records it
COMPLETED when it exits 0, and never requeues it: the job is over. ``linger=True``
(or ``$DISPATCH_PREEMPT_LINGER=1``) keeps the process alive after the sentinel until
the scheduler ends it at the end of the grace, so 22.05 too sees a preempted job and
requeues it. The save is done and published either way; lingering only holds the
allocation for the rest of the grace.

submitit. Inside a submitit job (``$SUBMITIT_EXECUTOR`` set) submitit's own handler owns
its preemption signal (``$SUBMITIT_PREEMPT_SIGNAL``, default USR2, sent at the time limit):
it checkpoints and requeues the job. This handler on that signal would replace it, exit 0
and end the job COMPLETED, never requeued, so installing it there is refused, naming the
way that cooperates (``dispatch_slurm.integrations.submitit``) and SIGTERM.
"""

import mmap
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

from .. import store  # imported now: an import inside the handler could deadlock
from ..contract import layout
from ..contract.env import Execution
from ..contract.names import step_of
from ..contract.signals import SENTINEL
from ..errors import DispatchError
from ..store import events, write_all
from . import distributed, probe



CHILD_WAIT_S = 1.0  # a forked child's wait for the installing process's own signal (module doc)


class _State:
    pid: int | None = None  # the process that installed the handler: the only one that saves
    signals: tuple[signal.Signals, ...] = ()
    before: dict[int, object] = {}  # each signal's disposition before the handler: a child's own signal gets it
    signalled: mmap.mmap | None = None  # one byte shared with forked children: the installing process got a signal
    fn: Callable[[float], object] | None = None
    grace: float | None = None  # resolved at install (or from the env on first use)
    publish: bool | None = None
    defer = False
    linger = False
    arrived: float | None = None  # time.monotonic() of the first signal
    running = False
    stopping = False  # the stop is decided (every rank, at the same point)
    whole_steps: str | None = None  # the integration whose save reads the live state (needs_whole_steps)
    ranks: distributed.Ranks | None = None  # torch.distributed: the protocol's collectives


_s = _State()


def resolve_grace(grace: float | None = None) -> float:
    """The argument, else $DISPATCH_GRACE_S, else the site default; 0..GRACE_CAP (Execution.grace)."""
    return Execution.current(grace=grace).grace


def _grace() -> float:
    return resolve_grace() if _s.grace is None else _s.grace


def time_remaining() -> float:
    """Seconds until the deadline (first signal + grace), never negative; the full
    grace while no signal has arrived."""
    grace = _grace()
    if _s.arrived is None:
        return grace
    return max(0.0, _s.arrived + grace - time.monotonic())


def is_publishing_rank(publish: bool | None = None) -> bool:
    """``publish`` if given, else whether this process is rank 0 (torch.distributed's,
    else $RANK, else $SLURM_PROCID)."""
    if publish is not None:
        return publish
    if distributed.rank() is not None:
        return distributed.rank() == 0
    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key, "") != "":
            return os.environ[key] == "0"
    return True


def install_preemption_handler(fn, signals=(signal.SIGTERM,), grace: float | None = None, *,
                               publish: bool | None = None, defer: bool = False,
                               linger: bool | None = None) -> None:
    """Call ``fn(time_remaining)`` when one of ``signals`` arrives, then exit (see the
    module doc; ``linger``: stay until killed instead, for Slurm 22.05's requeue).
    ``fn=None``: the program saves itself (``stop_requested``, ``conclude``).
    Must be called from the main thread, on every rank after init_process_group;
    calling it again replaces fn."""
    if fn is not None and not callable(fn):
        raise TypeError(f"install_preemption_handler needs a callable, got {fn!r}")
    sigs = tuple(signal.Signals(s) for s in ([signals] if isinstance(signals, int) else signals))
    if not sigs or signal.SIGKILL in sigs or signal.SIGSTOP in sigs:
        raise DispatchError(f"signals must be catchable and non-empty, got {signals!r}")
    _refuse_submitits_signal(sigs)
    ex = Execution.current(grace=grace)
    deferred = defer or fn is None or _s.ranks is not None or distributed.rank() is not None
    _refuse_the_signal_frame(fn, deferred)  # before anything changes
    _s.fn, _s.grace, _s.publish = fn, ex.grace, publish
    _s.linger = ex.linger if linger is None else linger
    if _s.ranks is None and distributed.rank() is not None:
        _s.ranks = distributed.Ranks(_s.grace)
    _s.defer = deferred  # collectives never run in a signal frame
    if ex.root:
        store.at(ex.root).warm()  # e.g. boto3 imported now, not inside the handler
    _own(sigs)
    for sig in sigs:
        signal.signal(sig, _on_signal)
    # A signal blocked in the mask this process inherited (a launcher's, a test runner's
    # thread) would stay pending with the handler installed: the save would never run.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
    probe.record("installed", signals=[s.name for s in sigs], grace=_s.grace, defer=_s.defer, launcher=ex.launcher)


def needs_whole_steps(who: str) -> None:
    """An integration whose save reads the live training state (DCP, accelerate, DeepSpeed,
    Megatron) calls this when it is used: a handler that would run that save in the signal's
    frame is refused (here, or at its install), before training goes on. Interrupted there, in
    the middle of a step (an optimizer's update done, the step not yet counted), the save is a
    mix of two steps published as one, and the resume is not the uninterrupted run (measured:
    every tensor of docs/ranks.md's DCP trainer differed). Several ranks always defer."""
    _s.whole_steps = _s.whole_steps or who
    _refuse_the_signal_frame(_s.fn, _s.defer)


def _refuse_the_signal_frame(fn, deferred: bool) -> None:
    if _s.whole_steps is None or fn is None or deferred:
        return
    raise DispatchError(
        f"install_preemption_handler(fn) without defer=True would run fn in the signal handler, in the middle of a "
        f"training step, and {_s.whole_steps}'s save there would publish a mix of two steps (a resume that is not "
        "the uninterrupted run): pass defer=True and call preemption_point() after each step, where the save runs")


def _own(sigs: tuple[signal.Signals, ...]) -> None:
    """Make this process the one that saves: its shared byte, the dispositions a child's own
    signal falls back to, and the fork hook (once per process)."""
    if _s.pid != os.getpid():  # the first install here (a forked child may install its own)
        if _s.pid is None:
            os.register_at_fork(after_in_child=_forked)
        _s.pid, _s.signalled, _s.before = os.getpid(), mmap.mmap(-1, 1), {}
        _s.arrived, _s.stopping, _s.running = None, False, False
    for sig in sigs:
        before = signal.getsignal(sig)
        _s.before.setdefault(sig, signal.SIG_DFL if before in (None, _on_signal) else before)
    _s.signals = sigs


def _forked() -> None:
    """In a child forked from the installing process: DataLoader's worker loop sets torch's own
    SIGTERM handler first thing; put the handler back after it (see the module doc)."""
    loader = sys.modules.get("torch.utils.data._utils.signal_handling")
    torchs = getattr(loader, "_set_worker_signal_handlers", None)  # torch 2.x; gone: nothing to wrap
    if _s.pid is None or torchs is None:
        return

    def then_ours() -> None:
        torchs()
        for sig in _s.signals:
            signal.signal(sig, _on_signal)
    setattr(loader, "_set_worker_signal_handlers", then_ours)


def _in_child(signum: int, frame) -> None:
    """A save signal in a forked child: the step's (the installing process got it too) is
    ignored; the child's own gets the disposition from before the handler (module doc)."""
    assert _s.signalled is not None
    deadline = time.monotonic() + CHILD_WAIT_S
    while not _s.signalled[0]:
        if time.monotonic() >= deadline:
            before = _s.before.get(signum, signal.SIG_DFL)
            if callable(before):
                before(signum, frame)
            elif before != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)
            return
        time.sleep(0.005)


def _refuse_submitits_signal(sigs) -> None:
    """See the module doc, "submitit": its requeue is not ours to replace."""
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL") or "USR2"
    theirs = getattr(signal, "SIG" + name.upper().removeprefix("SIG"), None)
    if not executor or theirs is None or theirs not in sigs:
        return
    raise DispatchError(
        f"refusing to install the preemption handler on {theirs.name}: it is submitit's preemption signal in this "
        f"job (SUBMITIT_EXECUTOR={executor}), on which submitit checkpoints and requeues the job; this handler would "
        "replace submitit's, save, exit 0 and end the job COMPLETED, never requeued (job.result() then raises "
        "UncompletedJobError). Use dispatch_slurm.integrations.submitit.Checkpointable (its checkpoint() publishes, "
        "submitit requeues), or install this handler on SIGTERM only (signals=[signal.SIGTERM])")


def stop_requested() -> bool:
    """Whether to stop and save now: a signal reached this process (several ranks: any
    rank, decided collectively, so every rank gets True at the same call). Call it at
    the same point of every step on every rank; once True it stays True."""
    if os.getpid() != _s.pid:
        return False  # a forked child: only the installing process stops and saves
    if _s.stopping:
        return True
    if _s.ranks is None:
        _s.stopping = _s.arrived is not None
    else:
        elapsed = _s.ranks.agree(-1.0 if _s.arrived is None else time.monotonic() - _s.arrived)
        if elapsed is not None:
            _s.arrived, _s.stopping = time.monotonic() - elapsed, True  # the earliest signal's deadline
    if _s.stopping:
        probe.record("stop")
    return _s.stopping


def preemption_point() -> None:
    """In deferred mode: run the save now if the stop is decided (then exit); otherwise
    return at once. Call it between training steps, on every rank."""
    if not _s.running and stop_requested() and _s.fn is not None:
        _run(_s.fn)


def preemptible(iterable):
    """``iterable``'s items, with a ``preemption_point()`` before each: wrap the loops that
    are not training steps -- evaluation, warm-up, data loading, a long first pass -- so a
    signal there saves at the next item, not after the loop (the state between two items
    is still the last whole step's). Several ranks: every rank must iterate as many items
    (the point is a collective), as a sharded eval loader does."""
    for item in iterable:
        preemption_point()
        yield item
    preemption_point()


def _on_signal(signum, frame) -> None:
    if os.getpid() != _s.pid:
        return _in_child(signum, frame)
    assert _s.signalled is not None
    _s.signalled[0] = 1  # first: a child signalled at the same moment is waiting for it
    if _s.arrived is not None:
        return  # a second signal (srun forwarding, scancel after --signal): one save only
    _s.arrived = time.monotonic()
    probe.record("signal", signal=signal.Signals(signum).name)
    events.record("preempt_signal", signal=signal.Signals(signum).name, grace=_s.grace,
                  deadline=time.time() + _grace())
    if not _s.defer and _s.fn is not None:  # fn=None always defers
        _run(_s.fn)


def _run(fn: Callable[[float], object]) -> None:
    _s.running = True
    if not _s.stopping:
        _s.stopping = True
        probe.record("stop")  # the save starts in the handler itself
    try:
        result = fn(time_remaining())
    except PermissionError as e:
        try:
            kept = _published_already(e)
        except Exception:  # noqa: BLE001 -- the root unreadable now: the save's own error is told
            kept = None
        if kept is not None:
            _write(2, f"\ndispatch-slurm: step {kept[1]} is already published ({kept[0]}): the save at the "
                      "signal wrote into it again, which its read-only files refuse; nothing more to save\n")
        conclude(kept, error=None if kept else e)
    except BaseException as e:  # noqa: B036 -- anything, even SystemExit, is a failed save
        conclude(error=e)
    conclude(result)


def _published_already(e: PermissionError) -> tuple[str, int] | None:
    """The save of a step this execution has just published, written again into the same
    folder (the loop's periodic save, then the signal's, at one step): the published files
    are read-only, so the write fails, but that step is kept. Its newest publication,
    when the refused file is one of its save's, is then the stop's save."""
    ex = Execution.current()
    if not isinstance(e.filename, str) or not ex.root or not ex.attempt:
        return None
    pub = store.at(ex.root).latest()
    if pub is None or pub.path.split("/")[:2] != [layout.EXEC, ex.attempt]:
        return None
    save = os.path.join(ex.root, pub.path)
    return (save, pub.step) if os.path.commonpath([os.path.abspath(e.filename), save]) == save else None


def conclude(result=None, error: BaseException | None = None):
    """End the preemption: ``result`` is what the save returned (a path, ``(path, step)``
    or None), ``error`` what it raised. Every rank's save made durable, published once by
    the publishing rank, then every rank exits 0 with the sentinel or 1 without it."""
    _s.running = True
    if error is None and result is not None:
        error = _attempt(_durable, result)
    probe.record("saved", ok=error is None, error=None if error is None else f"{type(error).__name__}: {error}")
    ok = _everywhere(error is None)
    if ok and result is not None and is_publishing_rank(_s.publish):
        error = _attempt(_publish, result)
        if error is None:
            probe.record("published", path=_saved(result)[0], step=_saved(result)[1])
    ok = ok and _everywhere(error is None)
    if error is not None:
        trace = "".join(traceback.format_exception(error))
        _write(2, f"\n{trace}dispatch-slurm: preemption checkpoint failed: {type(error).__name__}: {error}\n")
    elif not ok:
        _write(2, "\ndispatch-slurm: preemption checkpoint failed on another rank: nothing published\n")
    if not ok:
        probe.record("exit", code=1)
        os._exit(1)
    probe.record("exit", code=0)
    # a program that saves itself may conclude() without a signal: no elapsed then
    elapsed = {} if _s.arrived is None else {"elapsed": time.monotonic() - _s.arrived}
    events.record("checkpoint_complete", **elapsed, time_remaining=time_remaining())
    _write(1, "\n" + SENTINEL + "\n")  # on its own line: the program may have been mid-line
    while _s.linger:  # until the scheduler's SIGKILL (see "Requeue after a preemption")
        time.sleep(3600)
    os._exit(0)


def _saved(result) -> tuple[str, int]:
    path, step = result if isinstance(result, tuple) else (result, step_of(result))
    return os.fspath(path), step


def _publish(result) -> None:
    """Publish the save at this execution's root and epoch, each refused, when unset, with
    the message every reader of the execution gives (contract/env.py)."""
    root, epoch = Execution.current().need("root", "epoch")
    store.publish(*_saved(result), root=root, epoch=epoch, by="preempt")


def _durable(result) -> None:
    """Several ranks: this rank's writes fsynced (one rank alone: publishing fsyncs)."""
    path, _ = _saved(result)
    if _s.ranks is not None:
        store.sync(path)


def _everywhere(ok: bool) -> bool:
    return ok if _s.ranks is None else _s.ranks.all_ok(ok)


def _attempt(fn, *args) -> BaseException | None:
    try:
        fn(*args)
    except BaseException as e:  # noqa: B036 -- anything, even SystemExit, is a failed save
        return e
    return None


def _write(fd: int, text: str) -> None:
    """Flush what the program already buffered (best effort: the interrupted code may
    be inside that very stream), then write straight to the descriptor."""
    stream = sys.stdout if fd == 1 else sys.stderr
    try:
        if stream is not None:
            stream.flush()
    except Exception:  # noqa: BLE001 -- reentrant call or closed stream
        pass
    try:
        write_all(fd, text.encode())  # os.write itself retries on EINTR (PEP 475)
    except OSError:
        return
