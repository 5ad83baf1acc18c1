"""One epoch per job. Two jobs of one root with a hand-set DISPATCH_SUBMISSION
both got epoch 1000000; the second resumed from the first's save and the first's later
publication became the latest. Every way in that runs without Slurm is here: `env` (the CLI,
in subprocesses), publish, the TaskProlog and the Prolog's user child, the plugin's claim
(spank_env/claim.c, driven by test_contract), S3 roots; and the claim's races."""

import io
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import threading

import pytest

from dispatch_slurm import store
from dispatch_slurm.contract import names
from dispatch_slurm.errors import BadName, BadPath, StoreError
from dispatch_slurm.slurm.hooks import job as hookjob
from dispatch_slurm.slurm.hooks import node, prolog, taskprolog
from dispatch_slurm.store import epochs, events, s3
from support import allocate, build_spank, cli, vectors

E = 1_000_000  # G=0, N=1, R=0: what two jobs with DISPATCH_SUBMISSION=1 both compute
A, B = f"linux.101.{E}", f"linux.102.{E}"  # job 101 and job 102 at that epoch
CLAIMS = vectors("claims.json")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                              reason="no C compiler or make")


@pytest.fixture(autouse=True)
def _outside_a_job(monkeypatch):
    for key in [k for k in os.environ if k.startswith(("DISPATCH_", "SLURM_"))]:
        monkeypatch.delenv(key)


def job(root, job_id: int, n: int = 1, **extra) -> dict:
    """A plain sbatch job's environment with DISPATCH_* set by hand (no submit, no plugin)."""
    return {"SLURM_JOB_ID": str(job_id), "SLURM_CLUSTER_NAME": "linux", "DISPATCH_CHECKPOINT": str(root),
            "DISPATCH_SUBMISSION": str(n), "DISPATCH_SITE_CONF": "", **extra}


def tree(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def claim_of(root, epoch: int = E) -> bytes:
    return (root / "epochs" / names.claim_name(epoch)).read_bytes()


# ---- the contract: the claim's name and bytes, as the vectors say (C: below) ----------

def test_claim_vectors():
    for case in CLAIMS["names"]:
        assert names.claim_name(int(case["epoch"])) == case["name"]
    for case in CLAIMS["contents"]:
        try:
            got = names.parse_claim(case["data"].encode(), int(case["epoch"]))
            got = "incomplete" if got is None else f"claim {got}"
        except BadName:
            got = "bad"
        assert got == case["expect"], case
    assert names.claim_content(A) == f"{A}\n".encode()


# ---- env: the collision reproduced, with the real CLI --------------------------------------

def test_env_refuses_a_submission_number_never_allocated(root):
    proc = cli("env", env=job(root, 101))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"DISPATCH_SUBMISSION=1 was never allocated under {root} (no {root}/sub/000001)" in proc.stderr
    assert f"`dispatch-slurm submit {root} -- ...`" in proc.stderr and "never set it by hand" in proc.stderr
    assert proc.stdout.endswith("exit 2\n"), "the eval stops the job script"
    assert tree(root) == [], "a refused job wrote something"
    # unset (a plain sbatch job): the job's first process allocates its own N (tests/test_nosubmit.py)
    unset = cli("env", env={k: v for k, v in job(root, 101).items() if k != "DISPATCH_SUBMISSION"})
    assert unset.returncode == 0 and "DISPATCH_SUBMISSION=1" in unset.stdout, unset.stderr
    assert (root / "jobs" / "linux.101").read_bytes() == b"000001\n"


def test_two_hand_made_jobs_of_one_root_never_share_an_epoch(root):
    """N=1 allocated once (one real submission), then used by two plain jobs: the first
    claims epoch 1000000, the second is refused before it writes anything, naming the
    first job and the fix; the first job's lineage stays the latest."""
    allocate(root)
    first = cli("env", env=job(root, 101), check=True)
    assert f"export DISPATCH_ATTEMPT={A}" in first.stdout
    assert claim_of(root) == f"{A}\n".encode()
    before = tree(root)
    a500 = root / "exec" / A / "checkpoint-500"
    a500.mkdir()
    (a500 / "model.bin").write_bytes(b"w")  # a save holds a file
    store.publish(str(a500), root=str(root), epoch=E)
    before = tree(root)

    # job 102's script: eval "$(dispatch-slurm env)" stops before the trainer runs
    script = (f'set -euo pipefail; eval "$({sys.executable} -m dispatch_slurm env)"; '
              'echo TRAINED; dispatch-slurm latest --resume')
    sh = subprocess.run(["bash", "-c", script], env={**os.environ, **job(root, 102)}, capture_output=True, text=True)
    assert sh.returncode == 2 and "TRAINED" not in sh.stdout
    msg = [line for line in sh.stderr.splitlines() if line.startswith("dispatch-slurm: error:")]
    assert len(msg) == 1, sh.stderr
    assert f"epoch {E} of {root} is already claimed by job linux.101 ({root}/epochs/{E:020d})" in msg[0]
    assert "this job (linux.102) would share its epoch" in msg[0]
    assert f"fix: submit with `dispatch-slurm submit {root} -- ...` or `sbatch --dispatch-checkpoint={root}`" in msg[0]
    assert "never set DISPATCH_SUBMISSION by hand" in msg[0]
    assert tree(root) == before, "the refused job wrote something"

    # job 102 publishing anyway (its own folder, its variables set by hand) is refused too
    b600 = root / "exec" / B / "checkpoint-600"
    b600.mkdir(parents=True)
    (b600 / "model.bin").write_bytes(b"w")  # a save holds a file
    pub = cli("publish", b600, env={"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": str(E), "DISPATCH_ATTEMPT": B})
    assert pub.returncode == 2 and "claimed by job linux.101" in pub.stderr and "not by this execution" in pub.stderr
    without = cli("publish", b600, env={"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": str(E)})
    assert without.returncode == 2 and "claimed by job linux.101" in without.stderr
    a600 = root / "exec" / A / "checkpoint-600"
    a600.mkdir()
    (a600 / "model.bin").write_bytes(b"w")  # a save holds a file
    cli("publish", a600, env={"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": str(E), "DISPATCH_ATTEMPT": A},
        check=True)
    assert [p.path for p in store.publications(str(root))] == [f"exec/{A}/checkpoint-500", f"exec/{A}/checkpoint-600"]
    # every process of job 101 (another node, task or step) finds its own claim
    assert json.loads(cli("env", "--format", "json", env=job(root, 101), check=True).stdout)["DISPATCH_ATTEMPT"] == A


def test_env_no_mkdir_checks_and_creates_nothing(root):
    allocate(root)
    assert cli("env", "--no-mkdir", env=job(root, 101), check=True)
    assert tree(root) == ["sub", "sub/000001"], "--no-mkdir created something"
    cli("env", env=job(root, 101), check=True)
    refused = cli("env", "--no-mkdir", env=job(root, 102))
    assert refused.returncode == 2 and "claimed by job linux.101" in refused.stderr


def test_array_tasks_claim_in_their_own_roots(root):
    allocate(root)
    pattern = f"{root}/task-%a"
    t3 = json.loads(cli("env", "--format", "json", env=job(pattern, 101, SLURM_ARRAY_TASK_ID="3"), check=True).stdout)
    assert claim_of(root / "task-3") == f"{A}\n".encode()
    # a step of that task re-running env with the expanded root finds its claim (no sub/ there)
    assert json.loads(cli("env", "--format", "json", env=job(pattern, 101, **t3), check=True).stdout) == t3
    other = cli("env", env=job(pattern, 102, SLURM_ARRAY_TASK_ID="3"))
    assert other.returncode == 2 and "claimed by job linux.101" in other.stderr
    assert f"`dispatch-slurm submit {pattern} -- ...`" in other.stderr, "the fix names the array's root"
    assert not (root / "task-3" / "exec" / B).exists()


# ---- publish: a publication at an epoch another attempt claimed is refused -----------------

def test_publish_claims_an_unclaimed_epoch_for_the_writer_and_refuses_another(root, monkeypatch):
    """A root from before claims (or a publish outside the hooks): the first publication at
    an epoch claims it for the save's writer; a save of another job at that epoch is refused."""
    a = root / "exec" / A / "checkpoint-5"
    b = root / "exec" / B / "checkpoint-9"
    for s in (a, b):
        s.mkdir(parents=True)
        (s / "model.bin").write_bytes(b"w")  # a save holds a file
    store.publish(str(a), root=str(root), epoch=E)
    assert claim_of(root) == f"{A}\n".encode()
    with pytest.raises(epochs.EpochClaimed, match=f"claimed by job linux.101 .*not by this execution \\({B}\\)"):
        store.publish(str(b), root=str(root), epoch=E)
    monkeypatch.setenv("DISPATCH_ATTEMPT", B)
    with pytest.raises(epochs.EpochClaimed, match="claimed by job linux.101"):
        store.publish(str(b), root=str(root), epoch=E)
    with pytest.raises(BadPath, match=f"DISPATCH_ATTEMPT={B} is an execution of epoch {E}"):
        store.publish(str(b), 9, root=str(root), epoch=2 * E, adopt=True)
    assert [p.path for p in store.publications(str(root))] == [f"exec/{A}/checkpoint-5"]
    assert not [e for e in events.read(str(root)) if e["type"] == "published" and e["attempt"] == B]


def test_an_adoption_joins_the_epochs_claimant(root, monkeypatch):
    """--adopt outside any execution (no DISPATCH_ATTEMPT) publishes into the epoch's
    claimant; at an epoch nobody claimed it has nobody to claim it for, and is refused."""
    old = root / "exec" / A / "checkpoint-5"
    old.mkdir(parents=True)
    (old / "model.bin").write_bytes(b"w")  # a save holds a file
    store.publish(str(old), root=str(root), epoch=E)
    with pytest.raises(BadPath, match=f"no execution has claimed that epoch .*{2 * E:020d}"):
        store.publish(str(old), 5, root=str(root), epoch=2 * E, adopt=True)
    new = f"linux.103.{2 * E}"
    (root / "exec" / new).mkdir()
    epochs.claim(store.at(str(root)), new)
    res = store.publish(str(old), 5, root=str(root), epoch=2 * E, adopt=True)
    assert res.adopted and store.latest(str(root)) == res.publication


def test_a_publish_reads_the_claim_once(root, monkeypatch):
    """The cost on the publish path: one open and read of epochs/<E> at a process's first
    publication at E; its later ones look at the claim (a stat) and know what it says."""
    store.make_exec_dir(str(root), A)
    epochs.claim(store.at(str(root)), A)
    opened = []
    real = os.open

    def spy(path, *a, **kw):
        opened.append(os.fsdecode(path))
        return real(path, *a, **kw)
    saves = [root / "exec" / A / f"checkpoint-{s}" for s in (1, 2)]
    for s in saves:
        s.mkdir()
        (s / "model.bin").write_bytes(b"w")  # a save holds a file
    monkeypatch.setattr(os, "open", spy)
    for s in saves:
        store.publish(str(s), root=str(root), epoch=E, sync=False)
    assert opened.count(names.claim_name(E)) == 1 and opened.count("epochs") == 2


def test_a_root_wiped_while_its_old_job_publishes_refuses_it_at_the_new_jobs_epoch(root):
    """The old job's process read its claim once; the root is wiped and a new job claims the
    same epoch (its submission numbers start again at 1): the old job's next publication is
    refused, as it was before the claim was remembered."""
    store.make_exec_dir(str(root), A)
    epochs.claim(store.at(str(root)), A)
    saves = [root / "exec" / A / f"checkpoint-{s}" for s in (1, 2, 3)]
    for s in saves[:2]:
        s.mkdir()
        (s / "model.bin").write_bytes(b"w")  # a save holds a file
        store.publish(str(s), root=str(root), epoch=E, sync=False)
    old = root / "exec" / A  # the old job's files, still open and written to after the wipe
    for entry in root.iterdir():
        if entry.name != "exec":
            shutil.rmtree(entry)
    other = f"linux.999.{E}"
    epochs.claim(store.at(str(root)), other)
    saves[2].mkdir()
    (saves[2] / "model.bin").write_bytes(b"w")  # a save holds a file
    with pytest.raises(epochs.EpochClaimed, match="claimed by job linux.999"):
        store.publish(str(saves[2]), root=str(root), epoch=E, sync=False)
    assert old.is_dir() and store.latest(str(root)) is None


# ---- an incomplete claim (its writer between create and write, or dead there) ---------------

def test_an_incomplete_claim_is_waited_for_then_refused_naming_the_file(root, monkeypatch):
    allocate(root)
    (root / "epochs").mkdir()
    torn = root / "epochs" / names.claim_name(E)
    torn.write_bytes(b"linux.101.10")  # no newline: the write is not done
    waits = []

    def finish_on_second_wait(pause):  # the writer completes while the reader waits
        waits.append(pause)
        if len(waits) == 2:
            torn.write_bytes(f"{A}\n".encode())
    monkeypatch.setattr(epochs, "_sleep", finish_on_second_wait)
    with pytest.raises(epochs.EpochClaimed, match="claimed by job linux.101"):
        epochs.prepare(store.at(str(root)), envmod_values(root, 102), 0o700, str(root))
    assert len(waits) == 2
    torn.write_bytes(b"")  # created, never written: its writer died
    monkeypatch.setattr(epochs, "SETTLE_S", 0.05)
    monkeypatch.setattr(epochs, "_sleep", lambda p: waits.append(p) or threading.Event().wait(p))
    with pytest.raises(StoreError, match=f"{torn} is still empty after 0.05 s: .*remove that file, and resubmit"):
        epochs.prepare(store.at(str(root)), envmod_values(root, 101), 0o700, str(root))
    torn.write_bytes(b"garbage\n")
    with pytest.raises(BadName, match=f"{names.claim_name(E)}.*not a claim of epoch {E}"):
        epochs.claim(store.at(str(root)), A)


def envmod_values(root, job_id: int, **extra) -> dict:
    from dispatch_slurm.contract import env as envmod
    return envmod.compute(job(root, job_id, **extra))


def test_planted_symlinks_are_never_followed(root, tmp_path):
    allocate(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "epochs").symlink_to(elsewhere)
    with pytest.raises(StoreError, match="symlink"):
        epochs.prepare(store.at(str(root)), envmod_values(root, 101), 0o700, str(root))
    (root / "epochs").unlink()
    (root / "epochs").mkdir()
    (root / "epochs" / names.claim_name(E)).symlink_to(elsewhere / "claim")
    with pytest.raises(StoreError, match="symlink, which the protocol never follows"):
        epochs.claim(store.at(str(root)), A)
    assert os.listdir(elsewhere) == []


# ---- the hooks' entry points -------------------------------------------------------------

def test_the_task_prolog_refuses_the_second_job_in_its_stderr(root):
    allocate(root)
    out = io.StringIO()
    assert taskprolog.run(job(root, 101), out, io.StringIO()) == 0 and f"export DISPATCH_ATTEMPT={A}" in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert taskprolog.run(job(root, 102), out, err) == 1, "the task must fail"
    assert err.getvalue().startswith("dispatch-slurm: error: epoch 1000000")
    assert out.getvalue() == f"print {err.getvalue()}", "no export line; the message as Slurm shows it"
    assert "claimed by job linux.101" in err.getvalue() and not (root / "exec" / B).exists()
    err = io.StringIO()
    assert taskprolog.run(job(root, 103, n=2), io.StringIO(), err) == 1
    assert "DISPATCH_SUBMISSION=2 was never allocated" in err.getvalue()


# What the TaskProlog wrapper runs, counting the store objects made (one per `store.at`): the
# way in opens the root's store once and passes it down, for the first process (which checks
# sub/ and claims) as for a later one (which finds its claim).
_COUNTED = """
import os, runpy, sys
from dispatch_slurm.store import base
made, init = [], base.Store.__init__
def counted(self, root):
    made.append(root)
    init(self, root)
base.Store.__init__ = counted
sys.argv = ["hooks", "task-prolog"]
try:
    runpy.run_module("dispatch_slurm.slurm.hooks", run_name="__main__")
finally:
    sys.stderr.write(f"stores made: {len(made)}\\n")
"""


@pytest.mark.parametrize("first", [True, False], ids=["first-process", "later-process"])
def test_a_way_in_opens_the_roots_store_once(root, first):
    allocate(root)
    if not first:
        epochs.claim(store.at(str(root)), A)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    proc = subprocess.run([sys.executable, "-c", _COUNTED], env={**env, **job(root, 101)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and f"export DISPATCH_ATTEMPT={A}" in proc.stdout, proc.stdout + proc.stderr
    assert "stores made: 1\n" in proc.stderr, proc.stderr
    assert claim_of(root) == f"{A}\n".encode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")
def test_the_prolog_logs_the_refusal_exits_0_and_leaves_no_files(tmp_path, monkeypatch):
    """The Prolog never drains a node: the second job's refusal is logged, it exits 0 and
    writes no /run files (the plugin's user_init then fails the job's tasks with the same
    message in the job's stderr; tests/cluster/test_epoch_claims.py shows it on Slurm)."""
    import tempfile
    monkeypatch.setattr(node, "RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(node, "LOG", str(tmp_path / "hooks.log"))
    base = tempfile.mkdtemp(prefix="dispatch-epochs-")
    try:
        os.chmod(base, 0o755)
        root = os.path.join(base, "root")
        os.mkdir(root)
        os.chown(root, 65534, 65534)
        nobody = {"SLURM_JOB_UID": "65534", "SLURM_JOB_GID": "65534", "SLURM_JOB_USER": "nobody",
                  "SLURM_CLUSTER_NAME": "linux", hookjob.SPANK_OPT + "checkpoint": root,
                  hookjob.SPANK_OPT + "submission": "1"}
        assert prolog.run({**nobody, "SLURM_JOB_ID": "101"}) == 0
        assert "never allocated" in (tmp_path / "hooks.log").read_text() and not os.path.exists(f"{root}/exec")
        assert node.as_job_user(nobody, store.allocate_submission, root) == {"ok": 1}
        assert prolog.run({**nobody, "SLURM_JOB_ID": "101"}) == 0 and node.recorded_execution("101")
        assert prolog.run({**nobody, "SLURM_JOB_ID": "102"}) == 0
        assert node.recorded_execution("102") is None and not os.path.exists(node.env_file("102"))
        log = (tmp_path / "hooks.log").read_text().splitlines()[-1]
        assert "user error, job will fail in its tasks: epoch 1000000" in log
        assert "claimed by job linux.101" in log and os.listdir(f"{root}/exec") == [A]
        assert os.stat(f"{root}/epochs/{E:020d}").st_uid == 65534, "claimed as the job user"
    finally:
        shutil.rmtree(base)


# ---- races: exactly one claimer wins, many rounds -----------------------------------------

def _claimer(root, attempt, barrier, results):
    barrier.wait()
    try:
        epochs.claim(store.at(root), attempt)
        results.put(("won", attempt))
    except epochs.EpochClaimed as e:
        results.put(("refused", e.owner))
    except Exception as e:  # noqa: BLE001 -- any other outcome is a failure the test names
        results.put(("error", repr(e)))


@pytest.mark.parametrize("rounds", [40])
def test_racing_claimers_exactly_one_wins(tmp_path, rounds):
    """8 jobs at one epoch claim at once (a barrier), 40 rounds, each on a fresh root:
    one wins, the 7 others are refused naming it, and the claim holds the winner."""
    ctx = mp.get_context("fork")
    for rnd in range(rounds):
        root = tmp_path / f"r{rnd}"
        root.mkdir()
        barrier, results = ctx.Barrier(8), ctx.Queue()
        attempts = [f"linux.{200 + i}.{E}" for i in range(8)]
        procs = [ctx.Process(target=_claimer, args=(str(root), a, barrier, results)) for a in attempts]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        won = [a for kind, a in got if kind == "won"]
        assert len(won) == 1, got
        assert sorted(got) == sorted([("won", won[0])] + [("refused", won[0])] * 7), got
        assert claim_of(root) == f"{won[0]}\n".encode()


def test_racing_publishers_of_two_jobs_at_one_epoch(tmp_path):
    """Two jobs publish at one epoch at once, 20 rounds, no claim beforehand (a root from
    before claims): only one job's publications exist, whichever won."""
    ctx = mp.get_context("fork")
    for rnd in range(20):
        root = tmp_path / f"r{rnd}"
        saves = {a: root / "exec" / a / "checkpoint-1" for a in (A, B)}
        for s in saves.values():
            s.mkdir(parents=True)
            (s / "model.bin").write_bytes(b"w")  # a save holds a file
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_publisher, args=(str(root), str(s), barrier, results)) for s in saves.values()]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(30)
        assert got == ["ok", "refused"], got
        (owner,) = {p.path.split("/")[1] for p in store.publications(str(root))}
        assert claim_of(root) == f"{owner}\n".encode()


def _publisher(root, save, barrier, results):
    barrier.wait()
    try:
        store.publish(save, root=root, epoch=E, sync=False)
        results.put("ok")
    except epochs.EpochClaimed:
        results.put("refused")
    except Exception as e:  # noqa: BLE001
        results.put(f"error: {e!r}")


# ---- the plugin's claim (spank_env/claim.c), on this machine's filesystem -------------------

@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """test_contract (claim.c included, the settle deadline shortened) as a server."""
    out = build_spank("test_contract", tmp_path_factory.mktemp("claim"), "-DDSP_CLAIM_SETTLE_MS=300")
    servers = []

    def start():
        proc = subprocess.Popen([str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
        servers.append(proc)

        def ask(*fields, send=True, receive=True):
            if send:
                proc.stdin.write("\t".join(map(str, fields)) + "\n")
                proc.stdin.flush()
            return proc.stdout.readline().rstrip("\n") if receive else None
        return ask
    start.ask = start()
    yield start
    for proc in servers:
        proc.stdin.close()
        proc.wait(10)


def _fields(env: dict) -> list[str]:
    return [f"{k}={v}" for k, v in env.items() if not k.startswith("DISPATCH_SITE")]


@needs_cc
def test_c_claim_vectors(plugin):
    for case in CLAIMS["names"]:
        assert plugin.ask("claim-name", case["epoch"]) == case["name"]
    for case in CLAIMS["contents"]:
        assert plugin.ask("claim-parse", case["epoch"], case["data"].encode().hex()) == case["expect"], case


@needs_cc
def test_c_refuses_like_python_and_reads_pythons_claims(plugin, root):
    """The plugin's user_init order: check (create=0), the exec folder, claim (create=1)."""
    ask = plugin.ask
    got = ask("claim", 0, *_fields(job(root, 101)))
    assert got.startswith("error: --dispatch-submission=1 was never allocated under") and tree(root) == []
    allocate(root)
    assert ask("claim", 0, *_fields(job(root, 101))) == "ok" and tree(root) == ["sub", "sub/000001"]
    assert ask("claim", 1, *_fields(job(root, 101))) == "ok"
    assert claim_of(root) == f"{A}\n".encode(), "the same bytes as Python's claim"
    assert ask("claim", 1, *_fields(job(root, 101))) == "ok", "another node or step of the same execution"
    refused = ask("claim", 0, *_fields(job(root, 102)))
    python = cli("env", env=job(root, 102)).stderr.strip().removeprefix("dispatch-slurm: error: ")
    assert refused == f"error: {python}", "one message, C and Python"
    assert ask("claim", 1, *_fields(job(root, 102))) == refused
    # Python reads the plugin's claims: the claim of another epoch, made by C
    allocate(root, 2)
    assert ask("claim", 1, *_fields(job(root, 103, n=2))) == "ok"
    with pytest.raises(epochs.EpochClaimed, match="claimed by job linux.103"):
        epochs.claim(store.at(str(root)), f"linux.104.{2 * E}")
    # an incomplete claim: read again for DSP_CLAIM_SETTLE_MS (300 here), then refused
    (root / "epochs" / names.claim_name(3 * E)).write_bytes(b"")
    allocate(root, 3)
    torn = ask("claim", 0, *_fields(job(root, 105, n=3)))
    assert f"{names.claim_name(3 * E)} is still empty after 0.3 s" in torn and "remove that file" in torn


@needs_cc
def test_c_checks_a_given_submission_at_submit_time(plugin, root):
    """sbatch --dispatch-submission=N: refused when sub/ never allocated N, or when its
    first epoch (G, N, 0) is already another job's."""
    opts = {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_SUBMISSION": "1"}
    assert "never allocated" in plugin.ask("check-submission", *_fields(opts))
    allocate(root)
    assert plugin.ask("check-submission", *_fields(opts)) == "ok"
    epochs.claim(store.at(str(root)), A)
    got = plugin.ask("check-submission", *_fields(opts))
    assert got.startswith(f"error: epoch {E} of {root} is already claimed by job linux.101") and "fix:" in got
    assert plugin.ask("check-submission", *_fields({**opts, "DISPATCH_GENERATION": "1"})) == "ok"


@needs_cc
def test_c_and_python_claimers_race_exactly_one_wins(plugin, tmp_path):
    """Per round, 4 C claimers (test_contract servers, each sent its request in one burst)
    and 4 Python processes race for one epoch; 25 rounds: one winner, the claim names it,
    every loser names it."""
    cs = [plugin() for _ in range(4)]
    ctx = mp.get_context("fork")
    for rnd in range(25):
        root = tmp_path / f"r{rnd}"
        root.mkdir()
        allocate(root)
        barrier, results = ctx.Barrier(5), ctx.Queue()
        procs = [ctx.Process(target=_claimer, args=(str(root), f"linux.{300 + i}.{E}", barrier, results))
                 for i in range(4)]
        for p in procs:
            p.start()
        barrier.wait()
        for i, ask in enumerate(cs):
            ask("claim", 1, *_fields(job(root, 400 + i)), receive=False)
        c_got = [ask(send=False) for ask in cs]
        py_got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        winner = claim_of(root).decode().rstrip("\n")
        c_won = [f"linux.{400 + i}.{E}" for i, g in enumerate(c_got) if g == "ok"]
        py_won = [a for kind, a in py_got if kind == "won"]
        assert c_won + py_won == [winner], (c_got, py_got)
        assert all(g == "ok" or f"claimed by job {winner.rpartition('.')[0]} " in g for g in c_got), c_got
        assert all(kind == "won" or a == winner for kind, a in py_got), py_got


# ---- S3 roots: a conditional PUT with the body, a GET on 412 --------------------------------

def test_s3_env_claims_and_refuses_the_second_job(s3_env, s3_root):
    store.allocate_submission(s3_root)
    first = json.loads(cli("env", "--format", "json", env=job(s3_root, 101), check=True).stdout)
    assert first["DISPATCH_ATTEMPT"] == A
    assert s3.read(f"{s3_root}/epochs/{E:020d}") == f"{A}\n".encode()
    second = cli("env", env=job(s3_root, 102))
    assert second.returncode == 2 and f"claimed by job linux.101 ({s3_root}/epochs/{E:020d})" in second.stderr
    unallocated = cli("env", env=job(s3_root, 103, n=2))
    assert unallocated.returncode == 2 and "DISPATCH_SUBMISSION=2 was never allocated" in unallocated.stderr
    b = f"{s3_root}/exec/{B}/checkpoint-1"
    bucket, key = names.split_s3(f"{b}/model.bin")
    s3_env.client().put_object(Bucket=bucket, Key=key, Body=b"w")
    with pytest.raises(epochs.EpochClaimed, match="claimed by job linux.101"):
        store.publish(b, root=s3_root, epoch=E)
    assert store.publications(s3_root) == []



def test_newest_of_job_is_the_greatest_claimed_epoch_of_the_same_job_id(root):
    """The submitit integration's question: is there a later execution of this very job?
    Another job's greater epoch (a resubmission: another job id) is not one."""
    assert epochs.newest_of_job(str(root), "c.101.1000000") == "c.101.1000000"  # no epochs/ yet
    for attempt in ("c.101.1000000", "c.101.1000002", "c.102.2000000", "c.101.1000001"):
        epochs.claim(store.at(str(root)), attempt)
    assert epochs.newest_of_job(str(root), "c.101.1000000") == "c.101.1000002"
    assert epochs.newest_of_job(str(root), "c.101.1000002") == "c.101.1000002"
    assert epochs.newest_of_job(str(root), "c.102.2000000") == "c.102.2000000"
    assert epochs.newest_of_job(str(root), "d.101.1000000") == "d.101.1000000"  # another cluster's job 101
