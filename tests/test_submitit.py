"""The submitit integration with real submitit: each execution of job 101 is submitit's own
job-side code (``python -m submitit.core._submit FOLDER``, what its sbatch script runs) with
Slurm's variables set by hand, and a stand-in ``scontrol`` that records ``requeue`` and answers
``show job`` with a restart count the test sets (or fails, as on a host without Slurm). The
client is submitit's ``SlurmJob(folder, "101").result()``. Overlaps are made by running two
executions of the job at once; which one answers last is decided by a gate file."""

import json
import os
import signal
import subprocess
import sys

import pytest

submitit = pytest.importorskip("submitit")

from submitit.core.utils import DelayedSubmission, FailedJobError  # noqa: E402
from submitit.slurm.slurm import _make_sbatch_string  # noqa: E402

from dispatch_slurm import store  # noqa: E402
from dispatch_slurm.errors import DispatchError  # noqa: E402
from dispatch_slurm.integrations import submitit as ds  # noqa: E402
from support import REPO, assert_intact, claim, tripped  # noqa: E402
from testbed import wait  # noqa: E402
from testbed.ranks import dispatch_env  # noqa: E402
from testbed.submitit_train import Count  # noqa: E402

JOB = "101"
SCONTROL = """#!/bin/sh
echo "$@" >> "$STANDIN/scontrol.log"
case "$1" in
  requeue) exit 0 ;;
  show) [ -f "$STANDIN/restarts" ] || { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
        echo "JobId=$4 JobName=submitit JobState=RUNNING Restarts=$(cat "$STANDIN/restarts") BatchFlag=1" ;;
esac
"""


@pytest.fixture
def bed(tmp_path, root, monkeypatch):
    """submitit's folder with job 101 submitted (pickle and sbatch script as submitit writes
    them), the stand-in scontrol first on PATH (for the jobs and for job.result())."""
    folder, standin = tmp_path / "logs", tmp_path / "standin"
    folder.mkdir()
    standin.mkdir()
    (standin / "scontrol").write_text(SCONTROL)
    (standin / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{standin}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN", str(standin))
    b = Bed(folder, standin, root)
    yield b
    for proc in b.procs:  # a failed test's executions must not outlive it
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Bed:
    def __init__(self, folder, standin, root):
        self.folder, self.standin, self.root = folder, standin, root
        self.procs = []

    def submit(self, fn, signal_spec=None):
        delayed = DelayedSubmission(fn)
        delayed.set_timeout(60, 3)
        delayed.dump(self.folder / f"{JOB}_submitted.pkl")
        extra = {"signal": signal_spec} if signal_spec else None
        (self.folder / f"{JOB}_submission.sh").write_text(
            _make_sbatch_string(command="python -u -m submitit.core._submit", folder=self.folder,
                                additional_parameters=extra))

    def start(self, r: int, wrap=(), **env) -> subprocess.Popen:
        """Execution R of job 101: claims its epoch (as the plugin's hooks do), then runs
        (``wrap``: a script that runs the module, e.g. tests/testbed/tripwire.py)."""
        attempt, epoch = f"c.{JOB}.{1_000_000 + r}", 1_000_000 + r
        claim(self.root, attempt)
        env = {"PYTHONPATH": f"{REPO}:{REPO}/tests", **env}
        base = dispatch_env(str(self.root), attempt, epoch, SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID=JOB,
                            SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1",
                            PATH=os.environ["PATH"], STANDIN=str(self.standin), **env)
        log = open(self.folder / f"{JOB}_0_log.out", "a")  # srun --output, open-mode append
        proc = subprocess.Popen([sys.executable, "-u", *map(str, wrap), "-m", "submitit.core._submit", str(self.folder)],
                                env=base,
                                stdout=log, stderr=log, start_new_session=True)
        self.procs.append(proc)
        return proc

    def restarts(self, r: int | None) -> None:
        """What the stand-in scontrol says the job's restart count is (None: it fails)."""
        path = self.standin / "restarts"
        path.unlink(missing_ok=True)
        if r is not None:
            path.write_text(str(r))

    def result_file(self):
        return self.folder / f"{JOB}_0_result.pkl"

    def job(self):
        return submitit.SlurmJob(folder=self.folder, job_id=JOB)

    def records(self, r: int) -> list[dict]:
        path = self.folder / f"{JOB}_0_log.{1_000_000 + r}.out"
        if not path.exists():
            return []  # the execution has not started yet
        return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def ended(proc, timeout=120) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def published_step(root, at_least: int) -> int:
    return wait.until(lambda: [p.step for p in store.publications(str(root)) if p.step >= at_least],
                      timeout=60, what=f"a publication at step >= {at_least}")[-1]


def test_time_limit_publishes_lets_submitit_requeue_and_the_next_execution_resumes_from_latest(bed):
    bed.submit(Count(40, 5, 0.05))
    old = bed.start(0)
    published_step(bed.root, 10)
    os.kill(old.pid, signal.SIGUSR2)  # the time limit: submitit's --signal=USR2@90
    assert ended(old) == 255  # submitit's sys.exit(-1) after its requeue
    assert f"requeue {JOB}" in (bed.standin / "scontrol.log").read_text()
    assert not bed.result_file().exists()
    saved = [r for r in bed.records(0) if r["event"] == "saved"][-1]["step"]
    assert store.latest(str(bed.root)).step == saved
    pickled = DelayedSubmission.load(bed.folder / f"{JOB}_submitted.pkl").function
    assert "step" not in vars(pickled)  # a fresh instance: the pickle never holds the state
    bed.restarts(1)
    assert ended(bed.start(1)) == 0
    start = bed.records(1)[0]
    assert start["resumed"] == saved and start["pickled_step"] is None
    assert bed.job().result() == {"answer": 40, "attempt": f"c.{JOB}.1000001", "resumed": saved}


def test_preemption_sigterm_publishes_exits_0_without_a_result_and_the_next_resumes(bed):
    bed.submit(Count(40, 5, 0.05))
    old = bed.start(0)
    published_step(bed.root, 5)
    os.kill(old.pid, signal.SIGTERM)  # preemption: submitit only logs SIGTERM
    assert ended(old) == 0
    assert not bed.result_file().exists() and not (bed.standin / "scontrol.log").exists()
    saved = [r for r in bed.records(0) if r["event"] == "saved"][-1]["step"]
    assert store.latest(str(bed.root)).step == saved
    assert ended(bed.start(1)) == 0
    assert bed.records(1)[0]["resumed"] == saved
    assert bed.job().result()["attempt"] == f"c.{JOB}.1000001"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2], ids=["preemption", "time-limit"])
def test_a_signal_on_a_save_step_never_rewrites_the_publication(bed, tmp_path, sig):
    """Count publishes every step, so the signal (Slurm's preemption SIGTERM, or submitit's
    time-limit USR2: ``checkpoint()``) lands on a step whose save is published; under
    tests/testbed/tripwire.py a write into it is SIGKILLed at its first byte. The
    ``save_checkpoint`` of the docs' trainer wrote that folder again; with ``ds.save_dir``
    it is refused and the signal stops on the published save."""
    bed.submit(Count(100000, 1, 0.02))
    log = tmp_path / "trips"
    old = bed.start(0, wrap=[REPO / "tests" / "testbed" / "tripwire.py"], TRIPWIRE_LOG=str(log))
    published_step(bed.root, 3)
    os.kill(old.pid, sig)
    rc = ended(old)

    def load(path):
        with open(os.path.join(path, "state.json")) as f:
            return json.load(f)
    pub = assert_intact(bed.root, tripped(log), load=load, saved=lambda pub: {"step": pub.step})
    assert rc == (0 if sig == signal.SIGTERM else 255), (bed.folder / f"{JOB}_0_log.1000000.err").read_text()[-3000:]
    assert [r["step"] for r in bed.records(0) if r["event"] == "saved"][-1] == pub.step


def test_an_old_execution_that_finishes_after_the_new_one_writes_nothing(bed, tmp_path):
    bed.submit(Count(10, 5, 0.02))
    gate = tmp_path / "gate-old"
    old = bed.start(0, COUNT_GATE=str(gate))
    wait.until(lambda: [r for r in bed.records(0) if r["event"] == "published" and r["step"] == 10],
               timeout=60, what="the old execution to reach its gate")
    assert ended(bed.start(1)) == 0  # the network cut: Slurm requeued, the old one still runs
    first = bed.result_file().read_bytes()
    assert bed.job().result()["attempt"] == f"c.{JOB}.1000001"
    gate.touch()
    assert ended(old) == ds.OUTRANKED_EXIT
    assert bed.result_file().read_bytes() == first
    log = (bed.folder / f"{JOB}_0_log.1000000.err").read_text()
    assert f"c.{JOB}.1000001, a newer execution of the same job, exists" in log


def test_an_old_answer_written_after_its_check_is_never_returned(bed, tmp_path):
    """The race the exit check cannot close: the old execution checked, then its answer lands
    late. Its very bytes are put back at each moment of the overlap."""
    bed.submit(Count(10, 5, 0.02))
    assert ended(bed.start(0)) == 0  # answered before the new execution claimed its epoch
    old_answer = bed.result_file().read_bytes()
    assert bed.job().result()["attempt"] == f"c.{JOB}.1000000"  # no newer execution: its answer
    bed.restarts(1)  # Slurm requeued the job; R=1 is pending
    with pytest.raises(ds.StaleResult, match="Slurm has restarted job 101 1 times"):
        bed.job().result()
    gate = tmp_path / "gate-new"
    new = bed.start(1, COUNT_GATE=str(gate))
    wait.until(lambda: [r for r in bed.records(1) if r["event"] == "start"], timeout=60,
               what="the new execution to start (it resumes at step 10: at its gate)")
    bed.restarts(None)  # Slurm forgot the job: the root's claims alone must tell
    with pytest.raises(ds.StaleResult, match="c.101.1000001, a newer execution of the same job, has not answered"):
        bed.job().result()
    gate.touch()
    assert ended(new) == 0
    assert bed.job().result()["attempt"] == f"c.{JOB}.1000001"
    bed.result_file().write_bytes(old_answer)  # the old execution's late rename
    assert bed.job().result() == {"answer": 10, "attempt": f"c.{JOB}.1000001", "resumed": 10}


def test_each_execution_writes_its_own_log(bed):
    bed.submit(Count(10, 5, 0.02))
    assert ended(bed.start(0)) == 0
    assert ended(bed.start(1)) == 0
    shared = (bed.folder / f"{JOB}_0_log.out").read_text()
    for attempt in (f"c.{JOB}.1000000", f"c.{JOB}.1000001"):  # stdout's line and stderr's
        assert shared.count(f"execution {attempt} writes this stream to") == 2
    assert '"event"' not in shared
    logs = ds.execution_logs(bed.job())
    assert [p.name for p in logs] == [f"{JOB}_0_log.1000000.out", f"{JOB}_0_log.1000001.out"]
    assert {r["attempt"] for r in bed.records(1)} == {f"c.{JOB}.1000001"}


def test_a_signal_line_that_is_not_submitits_is_refused_at_start(bed):
    bed.submit(Count(10, 5, 0.02), signal_spec="TERM@90")
    assert ended(bed.start(0)) != 0
    with pytest.raises(FailedJobError, match="Remove 'signal' from slurm_additional_parameters"):
        bed.job().result()
    assert store.publications(str(bed.root)) == []


def test_a_job_without_dispatch_slurm_is_refused_naming_the_parameter(bed, tmp_path):
    bed.submit(Count(10, 5, 0.02))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID=JOB, PYTHONPATH=f"{REPO}:{REPO}/tests")
    proc = subprocess.run([sys.executable, "-m", "submitit.core._submit", str(bed.folder)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    with pytest.raises(FailedJobError, match="slurm_additional_parameters=\\{'dispatch-checkpoint': ROOT\\}"):
        bed.job().result()


def test_the_preemption_handler_on_submitits_signal_is_refused(monkeypatch):
    from dispatch_slurm import install_preemption_handler
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    before = signal.getsignal(signal.SIGUSR2)
    with pytest.raises(DispatchError, match="submitit's preemption signal.*never requeued"):
        install_preemption_handler(lambda left: None, signals=[signal.SIGUSR2, signal.SIGTERM])
    assert signal.getsignal(signal.SIGUSR2) is before
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    with pytest.raises(DispatchError, match="SIGUSR1"):
        install_preemption_handler(lambda left: None, signals=[signal.SIGUSR1])


def test_without_submitit_the_usr2_handler_is_still_allowed(monkeypatch):
    """The refusal is for submitit jobs only: a plain job with --signal=USR2@90 keeps it."""
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    script = ("import signal; from dispatch_slurm import install_preemption_handler; "
              "install_preemption_handler(lambda left: None, signals=[signal.SIGUSR2]); print('ok')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.strip() == "ok", proc.stderr



def snippet(name: str) -> str:
    """The code block under ``<!-- snippet: NAME ... -->`` in docs/submitit.md."""
    import re
    text = (REPO / "docs" / "submitit.md").read_text()
    m = re.search(rf"<!-- snippet: {name}[;\s].*?-->\n```\w*\n(.*?)^```", text, re.S | re.M)
    assert m, f"docs/submitit.md has no snippet {name}"
    return m[1]


def test_the_docs_trainer_goes_through_a_time_limit(bed, tmp_path, monkeypatch):
    """The page's trainer as written (its train_one_step() a 10 ms step), through submitit's
    time limit and the next execution, which resumes from the latest publication."""
    (tmp_path / "doc_train.py").write_text("import time\n\ndef train_one_step():\n    time.sleep(0.01)\n\n\n"
                                           + snippet("submitit-trainer"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import doc_train
    bed.submit(doc_train.Train(1000))
    extra = {"PYTHONPATH": f"{REPO}:{REPO}/tests:{tmp_path}"}
    old = bed.start(0, **extra)
    saved = published_step(bed.root, 100)
    os.kill(old.pid, signal.SIGUSR2)
    assert ended(old) == 255 and f"requeue {JOB}" in (bed.standin / "scontrol.log").read_text()
    at_signal = store.latest(str(bed.root)).step
    assert saved <= at_signal < 1000  # saved where the signal found it, between two steps
    assert ended(bed.start(1, **extra)) == 0
    assert bed.job().result() == 1000
    firsts = sorted(p.step for p in store.publications(str(bed.root)) if p.path.startswith(f"exec/c.{JOB}.1000001/"))
    assert firsts[0] == (at_signal // 100 + 1) * 100  # R=1 went on from the signal's step, not from 0


def test_the_docs_submission_is_the_cluster_tests():
    text = snippet("submitit-submit")
    compile(text, "docs/submitit.md", "exec")
    client = (REPO / "tests" / "testbed" / "submitit_client.py").read_text()
    for part in ('cluster="slurm", slurm_max_num_timeout=10', 'slurm_additional_parameters={"dispatch-checkpoint": root}',
                 "slurm_partition=\"normal\""):
        assert part in text and part in client, part
    no_plugin = snippet("submitit-no-plugin")
    compile(no_plugin, "docs/submitit.md", "exec")
    for part in ('f"export DISPATCH_CHECKPOINT={root}"', 'slurm_partition="normal"'):
        assert part in no_plugin and part in client, part


def test_the_submitit_extra_names_submitit():
    import tomllib
    from importlib.metadata import version
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["submitit"]
    assert extra == ["submitit>=1.5,<2"]
    assert version("submitit").split(".")[0] == "1" and int(version("submitit").split(".")[1]) >= 5


def test_the_docs_job_result_line_says_submitit_blocks(bed):
    """submitit's job.result() waits (Job.wait: a second's poll) until the result
    file exists or Slurm says the job is over; StaleResult can come only then. The docs'
    comment says so, instead of suggesting StaleResult at once while the job runs."""
    line = next(ln for ln in snippet("submitit-submit").splitlines() if "job.result()" in ln)
    assert "blocks until" in line and "StaleResult" in line, line
    bed.submit(Count(5, 1, 0.0))
    bed.restarts(0)
    assert not bed.result_file().exists() and not bed.job().done(), "result() would not wait here"
