"""The POSIX store on a real filesystem: behaviour, races, crashes and faults."""

import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dispatch_slurm import store
from dispatch_slurm.contract import names
from dispatch_slurm.errors import BadName, BadPath, DispatchError, StoreError
from dispatch_slurm.store import events
from support import claim, cli

E1, E2 = 1_000_000, 2_000_000  # N=1 and N=2, G=R=0
A1, A2 = f"c.1.{E1}", f"c.2.{E2}"  # the attempts (exec folders) of two executions


@pytest.fixture(autouse=True)
def _outside_a_job(monkeypatch):
    for key in ("DISPATCH_ATTEMPT", "DISPATCH_EPOCH", "DISPATCH_CHECKPOINT"):
        monkeypatch.delenv(key, raising=False)


def save(root, rel):
    """A save folder holding one file (an empty folder is refused)."""
    p = root / rel
    p.mkdir(parents=True)
    (p / "model.bin").write_bytes(b"w")
    return p


def publish(root, path, step, epoch, **kw):
    return store.publish(path, step, root=root, epoch=epoch, **kw).publication


def test_publish_then_latest(root):
    a = save(root, f"exec/{A1}/checkpoint-10")
    b = save(root, f"exec/{A1}/checkpoint-20")
    assert store.latest(root) is None
    publish(root, a, 10, E1)
    pb = publish(root, b, 20, E1)
    assert store.latest(root) == pb
    assert pb.path == f"exec/{A1}/checkpoint-20"
    assert [p.step for p in store.publications(root)] == [10, 20]
    entry = root / "pub" / pb.name
    assert entry.stat().st_size == 0 and not entry.stat().st_mode & 0o222


def test_higher_epoch_outranks_any_step(root):
    """An old run's late save (lower epoch, higher step) never outranks the replacement."""
    old = save(root, f"exec/{A1}/checkpoint-9000")
    new = save(root, f"exec/{A2}/checkpoint-5")
    publish(root, new, 5, E2)
    publish(root, old, 9000, E1)  # published after, as a stalled old run would
    assert store.latest(root).path == f"exec/{A2}/checkpoint-5"


def test_publish_again_confirms_durability_and_changes_nothing(root):
    a = save(root, f"exec/{A1}/checkpoint-1")
    first = store.publish(a, root=root, epoch=E1)
    again = store.publish(a, root=root, epoch=E1)
    assert (first.existed, again.existed) == (False, True)
    assert first.publication == again.publication
    assert len(os.listdir(root / "pub")) == 1
    assert [e["existed"] for e in events.read(root) if e["type"] == "published"] == [False, True]


def test_only_a_save_of_the_publishing_execution_is_published(root, monkeypatch):
    """An old execution's save at the replacement's epoch, and protocol
    entries, are refused whoever calls; --adopt says so explicitly and is recorded."""
    old = save(root, f"exec/{A1}/checkpoint-900")
    save(root, f"exec/{A2}/checkpoint-5")
    with pytest.raises(BadPath, match=f"written by execution {A1} \\(epoch {E1}\\), not at epoch {E2}.*--adopt"):
        publish(root, old, 900, E2)
    monkeypatch.setenv("DISPATCH_ATTEMPT", f"other.9.{E1}")  # same epoch, another execution's folder
    with pytest.raises(BadPath, match=f"not by this one \\(other.9.{E1}\\)"):
        publish(root, old, 900, E1)
    monkeypatch.delenv("DISPATCH_ATTEMPT")
    (root / "sub").mkdir()
    (root / "sub" / "x").mkdir()
    for protocol_entry in (root / "sub" / "x", root / "sub"):
        for adopt in (False, True):
            with pytest.raises(BadPath, match="part of the protocol, not a save"):
                publish(root, protocol_entry, 1, E2, adopt=adopt)
    assert store.latest(root) is None
    with pytest.raises(DispatchError, match=f"no execution has claimed that epoch .*epochs/{E2:020d}"):
        publish(root, old, 900, E2, adopt=True)  # adopted by whom? Not an epoch's claimant: refused
    monkeypatch.setenv("DISPATCH_ATTEMPT", A2)  # the replacement adopts the old save
    res = store.publish(old, 900, root=root, epoch=E2, adopt=True)
    assert res.adopted and store.latest(root) == res.publication
    ev = [e for e in events.read(root) if e["type"] == "published"]
    assert ev[-1]["adopted"] is True and ev[-1]["adopted_from"] == A1
    assert (root / "epochs" / f"{E2:020d}").read_bytes() == f"{A2}\n".encode(), "the adopter claimed its epoch"


def test_publish_refuses_missing_or_outside_saves(root, tmp_path):
    with pytest.raises(BadPath, match="does not exist"):
        publish(root, root / f"exec/{A1}/nope", 1, E1)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(BadPath, match="not inside"):
        publish(root, outside, 1, E1)
    (root / "exec" / A1).mkdir(parents=True)
    (root / "exec" / A1 / "link").symlink_to(outside)  # inside by name, outside by target
    with pytest.raises(BadPath, match="symlink"):
        publish(root, root / "exec" / A1 / "link", 1, E1)
    (outside / "ck").mkdir()
    with pytest.raises(BadPath, match="symlink"):  # a symlinked folder on the way
        publish(root, root / "exec" / A1 / "link" / "ck", 1, E1)
    with pytest.raises(BadPath, match="not inside"):
        publish(root, root, 1, E1)
    assert not (root / "pub").exists()


def test_name_over_the_limit_refused_before_anything_is_created(root):
    deep = save(root, f"exec/{A1}/" + "x" * 150)
    with pytest.raises(BadPath, match="limit of 255"):
        publish(root, deep, 1, E1)
    assert not (root / "pub").exists()


def test_missing_root_is_an_error_not_created(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        store.latest(tmp_path / "typo")
    with pytest.raises(StoreError, match="does not exist"):
        store.allocate_submission(tmp_path / "typo")
    assert not (tmp_path / "typo").exists()


def test_bad_entry_is_an_error_naming_it_never_skipped(root):
    a = save(root, f"exec/{A1}/checkpoint-1")
    publish(root, a, 1, E1)
    (root / "pub" / "latest").touch()
    for fn in (store.latest, store.publications):
        with pytest.raises(BadName, match="'latest'"):
            fn(root)
    (root / "pub" / "latest").unlink()
    bad = f"{E2:020d}-{1:020d}-" + names.b32encode(b"../../etc")
    (root / "pub" / bad).touch()
    with pytest.raises(BadName, match="'..' and could leave the root"):
        store.latest(root)


# ---- what a newcomer mistypes: refused in one line, nothing left behind -----------------------

def _job(root, attempt=A1, epoch=E1):
    return {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": str(epoch), "DISPATCH_ATTEMPT": attempt,
            "DISPATCH_EXEC_DIR": str(root / "exec" / attempt)}


def test_an_empty_folder_is_not_published(root):
    """`mkdir $DISPATCH_EXEC_DIR/checkpoint-5; dispatch-slurm publish ...` before the trainer
    wrote anything: refused, so `latest --resume` never hands out a folder with nothing to load."""
    empty = root / "exec" / A1 / "checkpoint-5"
    empty.mkdir(parents=True)
    (empty / "sub").mkdir()  # folders only: still nothing to load
    claim(root, A1)
    proc = cli("publish", empty, env=_job(root))
    assert proc.returncode == 2 and "holds no file, nothing a resume could load" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (root / "pub").exists() or os.listdir(root / "pub") == []
    assert cli("latest", "--resume", env=_job(root)).stdout == ""


def test_padded_names_of_one_step_are_one_save(root):
    """checkpoint-0010, checkpoint-010 and checkpoint-10 all say step 10: the first is
    published, the others are refused naming it (`latest` would pick among them by name
    order). A padded name alone is fine (Megatron's iter_0000500 is step 500)."""
    claim(root, A1)
    first = save(root, f"exec/{A1}/checkpoint-0010")
    assert cli("publish", first, env=_job(root)).returncode == 0
    for name in ("checkpoint-010", "checkpoint-10"):
        proc = cli("publish", save(root, f"exec/{A1}/{name}"), env=_job(root))
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert f"exec/{A1}/checkpoint-0010 is already published at that epoch and step" in proc.stderr
    assert [p.path for p in store.publications(root)] == [f"exec/{A1}/checkpoint-0010"]
    claim(root, A2)  # the other order, in another execution
    assert cli("publish", save(root, f"exec/{A2}/checkpoint-10"), env=_job(root, A2, E2)).returncode == 0
    late = cli("publish", save(root, f"exec/{A2}/checkpoint-00000000000000000010"), env=_job(root, A2, E2))
    assert late.returncode == 2 and f"exec/{A2}/checkpoint-10 is already published" in late.stderr, late.stderr
    megatron = save(root, f"exec/{A1}/iter_0000500")
    assert cli("publish", megatron, "--step", "500", env=_job(root)).returncode == 0
    wrong = cli("publish", save(root, f"exec/{A1}/iter_0000600"), "--step", "6", env=_job(root))
    assert wrong.returncode == 2 and "its name says step 600" in wrong.stderr
    assert store.latest(root).path == f"exec/{A2}/checkpoint-10"  # E2 outranks E1


def test_a_step_past_a_signed_64_bit_integer_is_refused(root):
    """Step 2**64 (a typo, or a forged entry) would outrank every later save of its epoch."""
    claim(root, A1)
    huge = save(root, f"exec/{A1}/checkpoint-{2**64}")
    by_name = cli("publish", huge, env=_job(root))
    assert by_name.returncode == 2 and f"step {2**64} is out of range 0..{2**63 - 1}" in by_name.stderr
    by_option = cli("publish", save(root, f"exec/{A1}/final"), "--step", str(2**64), env=_job(root))
    assert by_option.returncode == 2 and "--step" in by_option.stderr and str(2**63 - 1) in by_option.stderr
    assert cli("publish", save(root, f"exec/{A1}/checkpoint-{2**63 - 1}"), env=_job(root)).returncode == 0
    forged = f"{E1:020d}-{2**63:020d}-" + names.b32encode(f"exec/{A1}/checkpoint-1".encode())
    (root / "pub" / forged).touch()
    with pytest.raises(BadName, match=f"step {2**63} is out of range"):
        store.latest(root)


@pytest.mark.parametrize("forgery", ["unclaimed epoch", "step against its name"])
def test_a_forged_entry_is_never_the_latest_and_never_skipped(root, forgery):
    """A well-formed pub/ entry `publish` never made (an epoch nobody claimed, a step its
    save's name contradicts) is an error naming it for latest, ls and gc, never the latest:
    gc would keep it and could remove the real latest."""
    a = save(root, f"exec/{A1}/checkpoint-5")
    publish(root, a, 5, E1)
    rel = f"exec/{A1}/checkpoint-5"
    forged = names.encode(9 * E1, 5, rel) if forgery == "unclaimed epoch" else names.encode(E1, 99, rel)
    (root / "pub" / forged).touch()
    for args in (["latest", root], ["latest", "--resume", root], ["ls", root],
                 ["gc", root, "--keep-last", "1", "--ceased", A1]):
        proc = cli(*args)
        assert proc.returncode == 2 and f"bad entry {forged!r}" in proc.stderr, (args, proc.stderr)
        assert f"mv {root}/pub/{forged}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert a.exists(), "gc removed nothing"
    (root / "pub" / forged).unlink()
    assert store.latest(root).path == rel


def test_an_adopted_save_may_carry_another_step(root, monkeypatch):
    """An adoption (a person's deliberate `publish --adopt`) of another execution's save is
    still the latest, at the step it was given."""
    old = save(root, f"exec/{A1}/checkpoint-900")
    publish(root, old, 900, E1)
    (root / "exec" / A2).mkdir()
    claim(root, A2)
    monkeypatch.setenv("DISPATCH_ATTEMPT", A2)
    res = store.publish(old, 7, root=root, epoch=E2, adopt=True)
    assert store.latest(root) == res.publication and res.publication.step == 7


def test_symlinked_pub_is_refused(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "pub").symlink_to(elsewhere)
    a = save(root, f"exec/{A1}/checkpoint-1")
    with pytest.raises(StoreError, match="symlink"):
        publish(root, a, 1, E1)
    with pytest.raises(StoreError, match="symlink"):
        store.latest(root)
    assert os.listdir(elsewhere) == []


def test_submission_numbers(root):
    assert [store.allocate_submission(root) for _ in range(3)] == [1, 2, 3]
    (root / "sub" / names.submission_name(7)).touch()  # e.g. from another login node
    assert store.allocate_submission(root) == 8
    (root / "sub" / "junk").touch()
    with pytest.raises(BadName, match="'junk'"):
        store.allocate_submission(root)


def test_exec_dir(root, tmp_path):
    p = store.make_exec_dir(str(root), "linux.1.1000000")
    assert os.stat(p).st_mode & 0o777 == 0o700
    assert store.make_exec_dir(str(root), "linux.1.1000000") == p  # idempotent
    (root / "exec" / "planted").symlink_to(tmp_path)
    with pytest.raises(BadPath, match="symlink"):
        store.make_exec_dir(str(root), "planted")
    with pytest.raises(BadPath):
        store.make_exec_dir(str(root), "../x")


# ---- race: 16 processes publish the same name at once ---------------------------

def _race(root, barrier, results):
    barrier.wait()
    res = store.publish(os.path.join(root, f"exec/{A1}/checkpoint-1"), 1, root=root, epoch=E1, sync=False)
    results.put("exists" if res.existed else "ok")


@pytest.mark.parametrize("rep", range(5))
def test_race_exactly_one_wins(root, rep):
    save(root, f"exec/{A1}/checkpoint-1")
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(16), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(root), barrier, results)) for _ in range(16)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcome = sorted(results.get(timeout=10) for _ in procs)
    assert outcome == ["exists"] * 15 + ["ok"]
    assert len(os.listdir(root / "pub")) == 1


def _allocate(root, n, results):
    results.put([store.allocate_submission(root) for _ in range(n)])


def test_race_submission_numbers_are_distinct(root):
    """16 racers, 4 numbers each. Plain processes that end by themselves, not a Pool: a
    Pool ends its workers with SIGTERM and waits for them without a bound, and in CI two
    workers forked from the xdist worker never ended (22 min); here each racer exits on
    its own and a stuck one is a failed, bounded join."""
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_allocate, args=(str(root), 4, results)) for _ in range(16)]
    for p in procs:
        p.start()
    got = [n for _ in procs for n in results.get(timeout=60)]
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * 16
    assert sorted(got) == list(range(1, 65))


# ---- crash: SIGKILL a publishing child at random moments -------------------------

CHILD = textwrap.dedent("""
    import os, sys
    from dispatch_slurm import store
    root, start = sys.argv[1], int(sys.argv[2])
    os.makedirs(os.path.join(root, "exec/c.1.1000000"), exist_ok=True)
    for step in range(start, start + 10**6):
        path = os.path.join(root, "exec/c.1.1000000", f"checkpoint-{step}")
        os.mkdir(path)
        with open(os.path.join(path, "w"), "wb") as f:  # an empty folder is refused
            f.write(b"w")
        store.publish(path, step, root=root, epoch=1_000_000)
        os.write(1, b"%d\\n" % step)   # reported only once publish returned
""")


def test_sigkill_at_random_moments(root):
    """Every entry parses, and every publication reported as returned is present."""
    rng = random.Random(0xD15)
    reported, start = set(), 0
    env = {**os.environ, "PYTHONPATH": str(os.path.dirname(os.path.dirname(__file__)))}
    for _ in range(220):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(start)],
                                 stdout=subprocess.PIPE, env=env)
        # wait for a random number of publications (0..3), then kill mid-flight
        for _ in range(rng.randrange(4)):
            line = child.stdout.readline()
            if not line:
                break
            reported.add(int(line))
        time.sleep(rng.random() * 0.003)  # jitter: where in publish() the kill lands, not a wait
        os.kill(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        reported.update(int(x) for x in out.split())
        start = max([start - 1, *reported]) + 1
        # a killed mkdir may have left checkpoint-<start>; skip past any leftover
        while (root / "exec" / A1 / f"checkpoint-{start}").exists():
            start += 1
        assert child.returncode == -signal.SIGKILL
    pubs = store.publications(root)  # raises if any entry does not parse
    steps = {p.step for p in pubs}
    assert reported <= steps, f"lost: {sorted(reported - steps)[:5]}"
    assert len(reported) > 100


# ---- faults from the kernel, not from mocks ----------------------------------------

STRACE = shutil.which("strace")
needs_strace = pytest.mark.skipif(STRACE is None and not os.environ.get("CI"), reason="strace missing")

PUBLISH = ("import sys; from dispatch_slurm import store; "
           "r = store.publish(sys.argv[2], 1, root=sys.argv[1], epoch=1_000_000, sync=sys.argv[3] == 'sync'); "
           "print('RETURNED', 'existed' if r.existed else 'created', r.publication.name)")


def _strace(args, root, save_path, sync=True):
    env = {**os.environ, "PYTHONPATH": str(os.path.dirname(os.path.dirname(__file__)))}
    return subprocess.run([STRACE, "-f", "-qq", "-e", "trace=openat,fsync,close", *args, "-o", "/dev/stderr",
                           sys.executable, "-c", PUBLISH, str(root), str(save_path), "sync" if sync else "-"],
                          env=env, capture_output=True, text=True, timeout=60)


def _events(trace: list[str]):
    """(syscall, path) in order, resolving each fsync's fd to the path it was opened as (a path
    opened below a folder's fd by its last component: a save is opened from the root at once)."""
    fds, events = {}, []
    for line in trace:
        if m := re.search(r'openat\((\w+), "([^"]+)", ([^,)]+).*\)\s+= (\d+)$', line):
            name = m[2] if m[2].startswith("/") else m[2].rsplit("/", 1)[-1]
            fds[m[4]] = name
            events.append(("open", name, m[3]))
        elif m := re.search(r"fsync\((\d+)\)\s+= (0|-1 EIO.*)$", line):
            events.append(("fsync", fds[m[1]], "" if m[2] == "0" else "EIO"))
    return events


def _entry_index(events) -> int:
    return next(i for i, (_, path, _) in enumerate(events) if re.fullmatch(r"\d{20}-\d{20}-[A-Z2-7]+", path))


@needs_strace
@pytest.mark.parametrize("first", [True, False], ids=["creates-pub", "pub-exists"])
def test_syscall_order_from_a_real_trace(root, first):
    """The save's files are fsynced, then O_CREAT|O_EXCL|O_NOFOLLOW the entry, fsync(pub), fsync(root)."""
    a = save(root, f"exec/{A1}/checkpoint-1")
    (a / "model.bin").write_bytes(b"w" * 100)
    if not first:
        publish(root, save(root, f"exec/{A1}/checkpoint-0"), 0, E1)
    claim(root, A1)  # as env did when the execution started: publish only reads it
    proc = _strace([], root, a)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = _events(proc.stderr.splitlines())
    i = _entry_index(events)
    flags = events[i][2]
    assert all(f in flags for f in ("O_CREAT", "O_EXCL", "O_NOFOLLOW")), flags
    assert [e for e in events[i + 1:] if e[0] == "fsync"][:2] == [("fsync", "pub", ""), ("fsync", str(root), "")]
    synced = [path for kind, path, _ in events[:i] if kind == "fsync"]
    assert synced.index("model.bin") < synced.index("checkpoint-1") < synced.index(A1)  # files, save, its folder
    if first:  # creating pub/ was made durable (root fsynced) before the entry was created
        assert str(root) in synced
    assert proc.stdout.startswith("RETURNED created")


@needs_strace
@pytest.mark.parametrize("which", [1, 2])
def test_fsync_eio_means_no_success_and_a_retry_completes_durability(root, which):
    """The kernel returns EIO from fsync(pub) or fsync(root): publish
    raises. The entry may already be listed (it is in the page cache), so a retry must
    not merely say "already published": it fsyncs pub/ and the root again, and only then
    returns (existed)."""
    a = save(root, f"exec/{A1}/checkpoint-1")
    (root / "pub").mkdir()  # so that fsync #3 is pub's and #4 the root's, after the entry,
    (root / "held").mkdir()  # #1 and #2 the held links' folder and held/ (made durable before the entry)
    claim(root, A1)  # as env did when the execution started: publish only reads it
    proc = _strace(["-e", f"inject=fsync:error=EIO:when={which + 2}"], root, a, sync=False)
    assert proc.returncode != 0
    assert "RETURNED" not in proc.stdout
    assert "Input/output error" in proc.stderr
    failed = [e for e in _events(proc.stderr.splitlines()) if e[0] == "fsync"]
    assert failed[which + 1] == ("fsync", ["pub", str(root)][which - 1], "EIO")
    assert failed[0][1].startswith(".") and failed[1][1] == "held"  # the held links' folder, then held/
    retry = _strace([], root, a, sync=False)
    assert retry.returncode == 0, retry.stderr[-2000:]
    assert retry.stdout.startswith("RETURNED existed")
    assert [e for e in _events(retry.stderr.splitlines()) if e[0] == "fsync"][:2] == \
        [("fsync", "pub", ""), ("fsync", str(root), "")]
    assert len(store.publications(root)) == 1


@needs_strace
def test_eio_on_the_save_means_nothing_is_published(root):
    a = save(root, f"exec/{A1}/checkpoint-1")
    (a / "model.bin").write_bytes(b"w")
    proc = _strace(["-e", "inject=fsync:error=EIO:when=1"], root, a)
    assert proc.returncode != 0 and "Input/output error" in proc.stderr
    assert not (root / "pub").exists() and store.latest(root) is None


@pytest.fixture
def full_fs(tmp_path):
    """A real filesystem with no free inode: creating the publication fails ENOSPC."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=8", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount tmpfs (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_enospc_means_no_success(full_fs):
    root = full_fs
    (root / "pub").mkdir()
    s = save(root, f"exec/{A1}/checkpoint-1")
    claim(root, A1)
    # fill the remaining inodes
    i = 0
    while True:
        try:
            (root / f"fill{i}").touch()
            i += 1
        except OSError:
            break
    with pytest.raises(OSError) as e:
        publish(root, s, 1, E1)
    assert e.value.errno == 28  # ENOSPC
    assert os.listdir(root / "pub") == []
    assert store.latest(root) is None


def test_an_unreadable_events_file_is_no_evidence_either_way(root):
    """The Epilog's entries say an execution ceased whatever its events say: an events file
    the store refuses to read (a symlink, which the protocol never follows) is left out,
    not an error for `dispatch-slurm ceased` (it once raised)."""
    from dispatch_slurm.store import ceased
    (root / "events").mkdir()
    (root / "events" / "c.1.1000000.h.1.jsonl").symlink_to("/nonexistent")
    assert ceased.record(str(root), "c.1.1000000", "n1", {"by": "process scan"}, nodes=["n1"])
    ev = ceased.execution(str(root), "c.1.1000000")
    assert ev["ceased"] is True and ev["nodes"] == ["n1"]


def test_a_folder_that_cannot_be_created_is_an_error_never_the_current_directory(tmp_path, monkeypatch):
    """mkdir's ENOENT (the root removed under an open session; /proc, where the CLI fuzz test
    found it) once gave the folder fd None, and the O_EXCL create then wrote into the current
    directory: a claim file in whatever folder `run` was started from."""
    root, cwd = tmp_path / "root", tmp_path / "cwd"
    root.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    s = store.at(str(root))
    with s:
        root.rmdir()
        with pytest.raises(StoreError, match=r"/supervisor: cannot be created \(No such file or directory\)"):
            s.create("supervisor", "000001", b"{}")
    assert list(cwd.iterdir()) == []


def test_the_publish_benchmark_runs_and_its_floor_makes_the_publications(tmp_path):
    """benchmarks/bench_publish.py at a tiny size: it runs on this package (a renamed part of
    publish fails here, not on the day it is measured) and prints every row its docs quote."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_publish.py"
    proc = subprocess.run([sys.executable, str(bench), "--n", "20", "--dir", str(tmp_path), "--model-mb", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("bare     median", "publish  median", "floor    median", "publish / floor", "publish adds",
                "check alone"):
        assert row in proc.stdout, proc.stdout
