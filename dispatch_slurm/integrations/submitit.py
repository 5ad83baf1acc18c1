"""submitit integration (``pip install 'dispatch-slurm[submitit]'``).

    from dispatch_slurm.integrations import submitit as ds

    class Train(ds.Checkpointable):
        def __init__(self, steps):
            self.steps, self.step = steps, 0
        def run(self):                        # what __call__ would be in a submitit.helpers.Checkpointable
            path = self.resume_path()         # the latest publication, never the pickled self
            ...                               # load it, train, ds.publish(save) now and then
            self.preemption_point()           # between steps (needed with defer = True)
        def save_checkpoint(self, exec_dir):  # on the signal: write the step, return its path
            path = ds.save_dir(exec_dir, self.step)   # refused if that step is published already
            ...

    executor = submitit.AutoExecutor(folder="logs")
    executor.update_parameters(timeout_min=60, slurm_additional_parameters={"dispatch-checkpoint": ROOT})
    job = executor.submit(Train(200))
    job.result()                              # the newest execution's answer, never an older one's

What submitit does (1.5, read in its source), and what this changes, why:
  * Time limit: Slurm sends ``--signal=USR2@90`` (submitit's own line); submitit's handler
    calls ``checkpoint()``, pickles what it returns into ``<job>_submitted.pkl``, runs
    ``scontrol requeue`` and exits. ``Checkpointable.checkpoint`` saves
    (``save_checkpoint``), publishes at this execution's epoch, and returns a *fresh*
    instance built from the constructor's arguments: the pickle carries no training state,
    so an old execution rewriting it changes nothing, and every execution resumes from
    ``latest``. submitit's requeue is kept: dispatch-slurm's preemption handler is never put
    on submitit's signal (``install_preemption_handler`` refuses it in a submitit job: its
    exit 0 would end the job COMPLETED, never requeued), and a job whose ``--signal`` is not
    submitit's (``slurm_additional_parameters={"signal": "TERM@90"}``) is refused at start.
  * Preemption: Slurm sends SIGTERM, which submitit only logs. The preemption handler takes
    SIGTERM: ``save_checkpoint``, publish, exit 0 (Slurm requeues a preempted job; no
    result is written).
  * ``<job>_<task>_result.pkl`` is rewritten by whichever execution finishes, an old one
    cut off by the network too. The answer is returned wrapped: the file holds the value
    with the execution that computed it, and loading it (``job.result()``) asks the root
    for a newer execution of the same job (a greater claimed epoch) and Slurm for a later
    restart; it returns the newest execution's own answer (each execution also writes
    ``<job>_<task>_result.<epoch>.pkl``, its own) or raises ``StaleResult`` while the newest
    has not answered. An execution that finds a newer one before it answers, raises or
    checkpoints exits 3 writing nothing of submitit's (no result, no pickle, no requeue of
    the newer execution).
  * ``<job>_<task>_log.out/.err`` is one file in append mode for every execution; each
    execution writes a line there naming its own ``<job>_<task>_log.<epoch>.out/.err`` and
    then writes only to those (``execution_logs(job)``).
Save in the signal handler or between steps: submitit calls ``checkpoint()`` inside its
signal handler, wherever the program was (a torn step if it was mid-update). ``defer = True``
makes both signals only recorded; the save runs at the next ``self.preemption_point()``.
One task per job: submitit checkpoints on task 0 only.
"""

import os
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path

try:
    import cloudpickle
    from submitit.core.job_environment import JobEnvironment
    from submitit.core.utils import DelayedSubmission, UncompletedJobError
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"dispatch_slurm.integrations.submitit needs submitit: "
                      f"pip install 'dispatch-slurm[submitit]' ({e})") from e

from .. import store
from ..contract.env import Execution
from ..contract.epoch import decompose
from ..contract.names import attempt_parts, step_of
from ..errors import DispatchError
from ..runtime import preempt
from ..store import epochs, once, write_all

OUTRANKED_EXIT = 3  # an execution that found a newer one of its job: it exits writing nothing


class StaleResult(UncompletedJobError):
    """The result file holds an older execution's answer and the newest has not answered yet."""


def output_dir() -> str:
    """$DISPATCH_EXEC_DIR: this execution's own folder, where its saves go."""
    return Execution.current().need("exec_dir")


def resume_path(root: str | None = None) -> str | None:
    """The latest publication's save (absolute), or None if nothing is published yet."""
    return store.resume_path(root)


def publish(save, step: int | None = None):
    """Publish a save of this execution (``store.publish``; step from ``checkpoint-<step>``)."""
    return store.publish(save, step, by="submitit")


def save_dir(exec_dir: str, step: int) -> str:
    """``<exec_dir>/checkpoint-<step>``, made, for ``save_checkpoint`` to write ``step`` into.
    ``store.AlreadySaved`` if that save is already published (or being written): a signal
    on a step this job just saved and published then stops on that save, never a second
    write into the published folder (a SIGKILL during it would tear the latest save)."""
    path = os.path.join(exec_dir, f"checkpoint-{step}")
    once.check(path)
    os.makedirs(path, exist_ok=True)
    return path


def _save_or_saved(job: "Checkpointable"):
    """What ``job.save_checkpoint`` returns, or the save it found already published."""
    try:
        return job.save_checkpoint(output_dir())
    except once.AlreadySaved as e:
        return e.save


def execution_logs(job, kind: str = "out") -> list[Path]:
    """Each execution's own log (``kind``: out or err) of a submitit job, oldest first."""
    paths = job.paths
    found = paths.folder.glob(f"{paths.job_id}_{paths.task_id}_log.*.{kind}")
    return sorted(found, key=lambda p: int(p.name.split(".")[-2]))


class Checkpointable(_Checkpointable):
    """A submitit Checkpointable whose state lives in publications, not in its pickle.

    Subclasses implement ``run(*args, **kwargs)`` (the job's work, its return value the
    answer) and ``save_checkpoint(exec_dir)`` (write the current step under ``exec_dir``,
    into ``save_dir(exec_dir, step)``, return its path ``.../checkpoint-<step>`` or ``(path,
    step)``; None: nothing to save). A save that ``save_dir`` refuses as already published is
    the one a signal stops on.
    ``defer``: save at ``preemption_point()`` instead of inside the signal handler.
    ``own_logs``: each execution writes its own log files (see the module doc)."""

    defer = False
    own_logs = True
    _dispatch_init: tuple[tuple, dict]

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        self._dispatch_init = (args, kwargs)  # checkpoint() resubmits a fresh instance built from these
        return self

    def run(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement run(): the job's work")

    def save_checkpoint(self, exec_dir: str):
        raise NotImplementedError(f"{type(self).__name__} must implement save_checkpoint(exec_dir): "
                                  "write the current step there and return its path")

    def resume_path(self) -> str | None:
        """The latest publication (see the module function); never this object's own state."""
        return resume_path()

    def preemption_point(self) -> None:
        """With ``defer``: run a recorded signal's save now (then requeue or exit)."""
        execution = _Execution.current
        if execution is not None:
            execution.point()

    def __call__(self, *args, **kwargs):
        execution = _Execution.start(self)
        try:
            value = self.run(*args, **kwargs)
        except Exception:
            execution.unless_outranked("raised an exception")
            raise
        return execution.answer(value)

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        """submitit's hook at its signal: save and publish, then resubmit a fresh instance."""
        execution = _Execution.current
        if execution is not None:
            execution.unless_outranked("checkpoint")
        saved = _save_or_saved(self)
        if saved is not None:
            path, step = saved if isinstance(saved, tuple) else (saved, step_of(saved))
            store.publish(path, step, by="submitit")
        init_args, init_kwargs = self._dispatch_init
        return DelayedSubmission(type(self)(*init_args, **init_kwargs), *args, **kwargs)


class _Execution:
    """This process's execution of the job: its identity, signals and files."""

    current = None

    def __init__(self, job: Checkpointable):
        self.job = job
        self.root, self.attempt, _ = Execution.current().need("root", "attempt", "exec_dir")
        parts = attempt_parts(self.attempt)
        if parts is None:
            raise DispatchError(f"DISPATCH_ATTEMPT {self.attempt!r} is not <cluster>.<job id>.<epoch>")
        _, self.raw_job, self.epoch = parts
        env = JobEnvironment()
        self.paths, self.task = env.paths, env.global_rank
        self.pending: int | None = None  # a deferred submitit signal
        self.theirs: object = None  # submitit's handler of its signal (signal.getsignal's)

    @classmethod
    def start(cls, job: Checkpointable) -> "_Execution":
        ex = cls(job)
        usr = _check_signals(ex.paths)
        if job.own_logs:
            ex.own_logs()
        preempt.install_preemption_handler(lambda left: _save_or_saved(job),
                                           signals=(signal.SIGTERM,), defer=job.defer)
        if job.defer:
            ex.theirs = signal.getsignal(usr)
            signal.signal(usr, ex.record)
        cls.current = ex
        return ex

    def record(self, signum, frame) -> None:
        self.pending = signum

    def point(self) -> None:
        if self.pending is not None and callable(self.theirs):
            signum, self.pending = self.pending, None
            self.theirs(signum, None)  # submitit's: checkpoint(), pickle, requeue, exit
        preempt.preemption_point()

    def unless_outranked(self, what: str) -> None:
        """Exit writing nothing if a newer execution of this job exists (module doc)."""
        newest = epochs.newest_of_job(self.root, self.attempt)
        if newest != self.attempt:
            _say(2, f"\ndispatch-slurm: execution {self.attempt} {what} but {newest}, a newer execution of "
                              "the same job, exists: exiting without writing submitit's result, pickle or requeue\n")
            os._exit(OUTRANKED_EXIT)

    def answer(self, value):
        """The value wrapped with its execution; its own copy written first."""
        self.unless_outranked("finished")
        payload = cloudpickle.dumps(value)
        _write_new(own_result(self.paths.result_pickle, self.epoch), payload)
        return _Answer(self.root, self.attempt, str(self.paths.result_pickle), self.raw_job, payload)

    def own_logs(self) -> None:
        for fd, shared in ((1, self.paths.stdout), (2, self.paths.stderr)):
            mine = shared.with_name(f"{shared.name.rsplit('.', 1)[0]}.{self.epoch}.{shared.suffix[1:]}")
            _say(fd, f"dispatch-slurm: execution {self.attempt} writes this stream to {mine}\n")
            new = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            os.dup2(new, fd)
            os.close(new)


def _say(fd: int, text: str) -> None:
    """Straight to the descriptor: from a signal handler too, and before os._exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    write_all(fd, text.encode())


def own_result(result_pickle, epoch: int) -> Path:
    """``<job>_<task>_result.<epoch>.pkl``: one execution's own answer."""
    p = Path(result_pickle)
    return p.with_name(f"{p.stem}.{epoch}{p.suffix}")


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


_SIGNAL_LINE = re.compile(r"^#SBATCH\s+--signal[= ](\S+)", re.M)


def _check_signals(paths) -> int:
    """submitit's signal (refused: TERM, which the preemption handler needs); the job's
    ``--signal`` must be it, sent to the task: otherwise the time limit never reaches
    submitit's requeue (the extra parameters are applied after submitit's own line)."""
    usr = JobEnvironment._usr_sig()
    if usr == signal.SIGTERM:
        raise DispatchError("SUBMITIT_PREEMPT_SIGNAL=TERM: submitit's requeue and the preemption handler would share "
                            "SIGTERM; leave SUBMITIT_PREEMPT_SIGNAL unset (USR2)")
    try:
        text = Path(paths.submission_file).read_text()
    except OSError:
        return usr  # not submitted by submitit's SlurmExecutor (a local run): nothing to check
    m = _SIGNAL_LINE.search(text)
    spec = m[1] if m else ""
    name = spec.split("@")[0].upper().removeprefix("SIG")
    if spec.startswith("B:") or getattr(signal, "SIG" + name, None) != usr:
        raise DispatchError(
            f"this job's --signal is {spec or 'missing'} ({paths.submission_file}), not submitit's {usr.name}@<delay>: "
            "at the time limit submitit would never checkpoint and requeue, and SIGTERM (the preemption handler's) "
            "would end the job COMPLETED. Remove 'signal' from slurm_additional_parameters; set the delay with "
            "slurm_signal_delay_s")
    return usr


class _Answer:
    """What submitit pickles as the answer: the value, who computed it, where its own copy is."""

    def __init__(self, root, attempt, result_pickle, raw_job, payload):
        self.meta = (root, attempt, result_pickle, raw_job)
        self.payload = payload

    def __reduce__(self):
        return _load_answer, (*self.meta, self.payload)


def _load_answer(root: str, attempt: str, result_pickle: str, raw_job: int, payload: bytes):
    """Run by ``job.result()`` as it loads the result file: the newest execution's answer."""
    newest = epochs.newest_of_job(root, attempt)
    restarts = slurm_restarts(raw_job)
    r = decompose(epochs.epoch_of(newest))[2]
    if restarts is not None and restarts > r:
        raise StaleResult(f"this answer is execution {newest}'s (restart {r}), but Slurm has restarted job {raw_job} "
                          f"{restarts} times: the newest execution has not answered yet; ask again later")
    if newest == attempt:
        return pickle.loads(payload)
    try:
        data = own_result(result_pickle, epochs.epoch_of(newest)).read_bytes()
    except FileNotFoundError:
        raise StaleResult(f"{result_pickle} holds the answer of execution {attempt}, but {newest}, a newer execution "
                          "of the same job, has not answered yet: ask again later") from None
    return pickle.loads(data)


def slurm_restarts(job_id: int) -> int | None:
    """Slurm's restart count of the job (``scontrol show job``), None where Slurm cannot say
    (no scontrol here, the job already purged): the root's claims are the evidence then."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\bRestarts=(\d+)", out.stdout)
    return int(m[1]) if out.returncode == 0 and m else None
