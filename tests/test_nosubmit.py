"""A client that calls sbatch itself (submitit) on a site without the plugin.
It exports only DISPATCH_CHECKPOINT: no submission number exists. The job's first
process allocates N (O_EXCL under sub/, the allocator `submit` uses) and records it under
jobs/<cluster>.<job id>; every requeue (same job id, R+1) finds the same N, so each
execution gets its own, greater epoch; two jobs never share one, even racing. And a
refusing TaskProlog's reason reaches the job's stderr file, not only its stdout."""

import io
import json
import multiprocessing as mp
import os

import pytest

from dispatch_slurm import store
from dispatch_slurm.contract import names
from dispatch_slurm.errors import StoreError
from dispatch_slurm.slurm import stdio
from dispatch_slurm.slurm.hooks import taskprolog
from dispatch_slurm.store import epochs, s3
from support import cli


REAL_JOB_STDIO = getattr(stdio, "job_stdio", None)  # the autouse fixture stands it in (no slurmctld here)


@pytest.fixture(autouse=True)
def _outside_a_job(monkeypatch):
    for key in [k for k in os.environ if k.startswith(("DISPATCH_", "SLURM_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(stdio, "job_stdio", lambda job_id, run=None: (None, None), raising=False)  # no slurmctld


def plain(root, job_id: int, restarts: int = 0, **extra) -> dict:
    """What a plain `sbatch --export=ALL,DISPATCH_CHECKPOINT=ROOT` job's tasks see."""
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_CLUSTER_NAME": "linux", "DISPATCH_CHECKPOINT": str(root),
           "DISPATCH_SITE_CONF": "", **extra}
    if restarts:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    return env


def env_json(root, job_id, restarts=0, **extra) -> dict:
    return json.loads(cli("env", "--format", "json", env=plain(root, job_id, restarts, **extra), check=True).stdout)


def test_a_plain_sbatch_job_gets_one_n_across_its_requeues(root):
    """Only DISPATCH_CHECKPOINT exported; R=0, then two requeues."""
    got = [env_json(root, 101, r) for r in (0, 1, 2)]
    assert [g["DISPATCH_SUBMISSION"] for g in got] == ["1", "1", "1"]
    assert [g["DISPATCH_EPOCH"] for g in got] == ["1000000", "1000001", "1000002"], "a new epoch per execution"
    assert [g["DISPATCH_ATTEMPT"] for g in got] == [f"linux.101.{1_000_000 + r}" for r in range(3)]
    assert (root / "jobs" / "linux.101").read_bytes() == b"000001\n"
    assert sorted(os.listdir(root / "sub")) == ["000001"], "a requeue allocated again"
    for g in got:
        assert os.path.isdir(g["DISPATCH_EXEC_DIR"])
        assert (root / "epochs" / names.claim_name(int(g["DISPATCH_EPOCH"]))).read_bytes() == \
            f"{g['DISPATCH_ATTEMPT']}\n".encode()
    other = env_json(root, 102)
    assert other["DISPATCH_SUBMISSION"] == "2" and other["DISPATCH_EPOCH"] == "2000000", "another job shares N"
    again = env_json(root, 101, 2)  # a second step of the R=2 execution
    assert again == got[2]


def test_every_process_of_the_job_and_a_requeue_resume_from_the_latest(root):
    first = env_json(root, 101)
    save = os.path.join(first["DISPATCH_EXEC_DIR"], "checkpoint-10")
    os.mkdir(save)
    with open(os.path.join(save, "model.bin"), "wb") as f:  # a save holds a file
        f.write(b"w")
    cli("publish", save, env={**plain(root, 101), **first}, check=True)
    second = env_json(root, 101, 1)
    assert int(second["DISPATCH_EPOCH"]) > int(first["DISPATCH_EPOCH"])
    assert store.latest(str(root)).path == f"exec/{first['DISPATCH_ATTEMPT']}/checkpoint-10"


def test_the_task_prolog_allocates_too_and_its_exports_carry_n(root):
    out = io.StringIO()
    assert taskprolog.run(plain(root, 7), out, io.StringIO()) == 0, out.getvalue()
    assert "export DISPATCH_SUBMISSION=1\n" in out.getvalue() and "export DISPATCH_EPOCH=1000000\n" in out.getvalue()
    out = io.StringIO()
    assert taskprolog.run(plain(root, 7, 1), out, io.StringIO()) == 0
    assert "export DISPATCH_SUBMISSION=1\n" in out.getvalue() and "export DISPATCH_EPOCH=1000001\n" in out.getvalue()
    # the batch script's `env` after the TaskProlog: the exported N is used, nothing new
    values = env_json(root, 7, 1, DISPATCH_SUBMISSION="1")
    assert values["DISPATCH_EPOCH"] == "1000001" and sorted(os.listdir(root / "sub")) == ["000001"]


def test_a_submitted_job_is_untouched_and_a_hand_set_n_still_refused(root):
    n = store.allocate_submission(str(root))
    assert env_json(root, 5, DISPATCH_SUBMISSION=str(n))["DISPATCH_SUBMISSION"] == str(n)
    assert not (root / "jobs").exists(), "a submitted job got an entry"
    hand = cli("env", env=plain(root, 6, DISPATCH_SUBMISSION="9"))
    assert hand.returncode == 2 and "DISPATCH_SUBMISSION=9 was never allocated" in hand.stderr


def test_bad_input_and_no_slurm_spend_no_number(root):
    bad = cli("env", env=plain(root, 8, DISPATCH_GRACE="soon"))
    assert bad.returncode == 2 and "DISPATCH_GRACE" in bad.stderr
    outside = cli("env", env={"DISPATCH_CHECKPOINT": str(root), "DISPATCH_SITE_CONF": ""})
    assert outside.returncode == 2 and "SLURM_JOB_ID is not set" in outside.stderr
    assert "--local" in outside.stderr
    missing = cli("env", env=plain(root / "typo", 8))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert sorted(os.listdir(root)) == [], "a refused job wrote under the root"


def test_no_mkdir_reads_the_number_and_never_allocates(root):
    refused = cli("env", "--no-mkdir", env=plain(root, 9))
    assert refused.returncode == 2 and f"{root}/jobs/linux.9" in refused.stderr and "TaskProlog" in refused.stderr
    assert sorted(os.listdir(root)) == []
    env_json(root, 9)
    checked = json.loads(cli("env", "--no-mkdir", "--format", "json", env=plain(root, 9, 1), check=True).stdout)
    assert checked["DISPATCH_SUBMISSION"] == "1" and not os.path.exists(checked["DISPATCH_EXEC_DIR"])


def test_an_array_has_one_number_for_all_its_tasks(root):
    pattern = f"{root}/task-%a"
    a = env_json(pattern, 301, SLURM_ARRAY_JOB_ID="300", SLURM_ARRAY_TASK_ID="0")
    b = env_json(pattern, 302, SLURM_ARRAY_JOB_ID="300", SLURM_ARRAY_TASK_ID="1")
    assert a["DISPATCH_SUBMISSION"] == b["DISPATCH_SUBMISSION"] == "1"
    assert (root / "jobs" / "linux.300").read_bytes() == b"000001\n" and sorted(os.listdir(root / "sub")) == ["000001"]
    assert a["DISPATCH_CHECKPOINT"] == f"{root}/task-0" and b["DISPATCH_CHECKPOINT"] == f"{root}/task-1"


def test_an_incomplete_entry_is_waited_for_then_refused_naming_the_file(root, monkeypatch):
    from dispatch_slurm.store import jobs
    (root / "jobs").mkdir()
    (root / "jobs" / "linux.4").write_bytes(b"")
    monkeypatch.setattr(jobs, "SETTLE_S", 0.2)
    with pytest.raises(StoreError, match=f"{root}/jobs/linux.4 is still empty after 0.2 s"):
        jobs.for_job(store.at(str(root)), "linux", "4")
    (root / "jobs" / "linux.4").write_bytes(b"12\n")
    with pytest.raises(Exception, match="not a submission number"):
        jobs.for_job(store.at(str(root)), "linux", "4")
    assert not (root / "sub").exists()


def test_a_symlinked_jobs_folder_is_never_followed(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "jobs").symlink_to(elsewhere)
    proc = cli("env", env=plain(root, 11))
    assert proc.returncode == 2 and "symlink" in proc.stderr
    assert list(elsewhere.iterdir()) == []


# ---- races: one N per job, never one N for two jobs ------------------------------------------

def _process(root, job_id, barrier, results):
    from dispatch_slurm.store import jobs
    barrier.wait()
    try:
        results.put(("ok", job_id, jobs.for_job(store.at(root), "linux", str(job_id))))
    except Exception as e:  # noqa: BLE001 -- any other outcome is a failure the test names
        results.put(("error", job_id, repr(e)))


@pytest.mark.parametrize("rounds", [20])
def test_racing_first_processes_agree_and_two_jobs_never_share(tmp_path, rounds):
    """Per round, on a fresh root: 4 processes of job 500 (its nodes) and 4 of job 501
    start at once (a barrier). Each job's processes get one N; the two jobs' differ."""
    ctx = mp.get_context("fork")
    for rnd in range(rounds):
        root = tmp_path / f"r{rnd}"
        root.mkdir()
        barrier, results = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_process, args=(str(root), 500 + i % 2, barrier, results)) for i in range(8)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        assert all(kind == "ok" for kind, _, _ in got), got
        per_job = {j: {n for _, jj, n in got if jj == j} for j in (500, 501)}
        assert all(len(ns) == 1 for ns in per_job.values()), per_job
        assert per_job[500] != per_job[501], per_job
        for j, (n,) in per_job.items():
            assert (root / "jobs" / f"linux.{j}").read_bytes() == f"{n:06d}\n".encode()
            assert (root / "sub" / f"{n:06d}").exists()


# ---- S3 roots: the same entry, one conditional PUT --------------------------------------------

def test_s3_a_plain_job_keeps_its_number_across_requeues(s3_env, s3_root):
    got = [env_json(s3_root, 101, r) for r in (0, 1)]
    assert [g["DISPATCH_EPOCH"] for g in got] == ["1000000", "1000001"]
    assert s3.read(f"{s3_root}/jobs/linux.101") == b"000001\n"
    assert env_json(s3_root, 102)["DISPATCH_SUBMISSION"] == "2"
    assert epochs.epoch_of(got[1]["DISPATCH_ATTEMPT"]) == 1_000_001


# ---- the TaskProlog's reason in the job's stderr file -------------------------------------------

def _scontrol(stderr, stdout):
    """A stand-in for `scontrol show job`'s answer (the field layout of 22.05-26.05)."""
    def run(argv, **kw):
        assert argv[:3] == ["scontrol", "show", "job"], argv
        text = f"JobId={argv[3]} JobName=x\n   Command=/x\n   StdErr={stderr}\n   StdIn=/dev/null\n   StdOut={stdout}\n"
        return type("P", (), {"returncode": 0, "stdout": text.encode()})()
    return run


def test_the_reason_is_appended_to_a_separate_stderr_file(tmp_path, monkeypatch):
    monkeypatch.setattr(stdio, "job_stdio", REAL_JOB_STDIO)
    err, out = tmp_path / "job 1.err", tmp_path / "job 1.out"
    err.write_text("earlier\n")
    out.write_text("")
    env = {"SLURM_JOB_ID": "1"}
    assert stdio.reason_to_stderr(env, "dispatch-slurm: error: why", _scontrol(err, out))
    assert err.read_text() == "earlier\ndispatch-slurm: error: why\n"
    assert not stdio.reason_to_stderr(env, "twice", _scontrol(out, out)), "one file: the print line is there"
    assert not stdio.reason_to_stderr(env, "x", _scontrol(tmp_path / "none.err", out))
    assert not (tmp_path / "none.err").exists(), "the stderr file was created"
    (tmp_path / "link.err").symlink_to(err)
    assert not stdio.reason_to_stderr(env, "x", _scontrol(tmp_path / "link.err", out))
    assert not stdio.reason_to_stderr(env, "x", _scontrol("/dev/null", out))
    asked = []
    assert not stdio.reason_to_stderr({"SLURM_JOB_ID": "1", "SLURM_PROCID": "3"}, "x",
                                      lambda *a, **k: asked.append(a))
    assert asked == [], "task 3 asked slurmctld: one RPC per task"
    assert err.read_text() == "earlier\ndispatch-slurm: error: why\n"


def test_job_stdio_survives_no_scontrol_and_a_failing_one(monkeypatch):
    monkeypatch.setattr(stdio, "job_stdio", REAL_JOB_STDIO)

    def missing(argv, **kw):
        raise FileNotFoundError("scontrol")
    assert stdio.job_stdio("1", missing) == (None, None)
    assert stdio.job_stdio("1", lambda argv, **kw: type("P", (), {"returncode": 1, "stdout": b""})()) == (None, None)


def test_a_refusing_task_prolog_writes_its_reason_to_the_jobs_stderr(root, tmp_path, monkeypatch):
    """A hand-set N refused; Slurm shows the `print` line in the
    task's stdout only. The reason must also be in the separate stderr file."""
    err, out = tmp_path / "1.err", tmp_path / "1.out"
    err.write_text("")
    out.write_text("")
    monkeypatch.setattr(stdio, "job_stdio", lambda job_id, run=None: (str(err), str(out)), raising=False)
    printed = io.StringIO()
    assert taskprolog.run(plain(root, 1, DISPATCH_SUBMISSION="4"), printed, io.StringIO()) == 1
    assert printed.getvalue().startswith("print dispatch-slurm: error: DISPATCH_SUBMISSION=4 was never allocated")
    assert err.read_text() == printed.getvalue()[len("print "):]
