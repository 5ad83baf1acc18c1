"""The store's contract, one suite run against both stores: a POSIX root on a real
filesystem and an S3 root on a real S3 server (moto's, started by the tests; the race
on an atomic server is in test_s3.py). The POSIX-only properties (syscall order from a
real trace, ENOSPC, symlinks, SIGKILL) stay in test_store.py."""

import json
import multiprocessing as mp
import os

import pytest

from dispatch_slurm import store
from dispatch_slurm.contract import names
from dispatch_slurm.errors import BadName, BadPath, EnvError, StoreError
from dispatch_slurm.store import events
from support import cli

E1, E2 = 1_000_000, 2_000_000  # N=1 and N=2, G=R=0
A1, A2 = f"c.1.{E1}", f"c.2.{E2}"  # the attempts (exec folders) of two executions


class Posix:
    """A root on the local filesystem, driven as a user would: files and folders."""

    def __init__(self, path):
        self.path, self.url = path, str(path)

    def save(self, rel, files=("model.bin",)):
        d = self.path / rel
        d.mkdir(parents=True, exist_ok=True)
        for f in files:
            (d / f).write_bytes(b"w" * 100)
        return str(d)

    def plant(self, folder, name):
        (self.path / folder).mkdir(exist_ok=True)
        (self.path / folder / name).touch()

    def unplant(self, folder, name):
        (self.path / folder / name).unlink()

    def listing(self, folder):
        return sorted(os.listdir(self.path / folder))

    def size(self, folder, name):
        return (self.path / folder / name).stat().st_size

    def remove_save(self, rel):
        """The save gone for good: from its folder and from its publications' held links."""
        for d in [self.path / rel] + [self.path / "held" / p.name for p in store.publications(str(self.path))
                                      if p.path == rel and (self.path / "held" / p.name).exists()]:
            for f in d.iterdir():
                f.unlink()
            d.rmdir()


class S3:
    """A root on the S3 server: objects, written with a plain client."""

    def __init__(self, server, url):
        self.server, self.url = server, url
        self.bucket, self.prefix = names.split_s3(url)
        self.c = server.client()

    def save(self, rel, files=("model.bin",)):
        for f in files:
            self.c.put_object(Bucket=self.bucket, Key=f"{self.prefix}{rel}/{f}", Body=b"w" * 100)
        return f"{self.url}/{rel}"

    def plant(self, folder, name):
        self.c.put_object(Bucket=self.bucket, Key=f"{self.prefix}{folder}/{name}", Body=b"")

    def unplant(self, folder, name):
        self.c.delete_object(Bucket=self.bucket, Key=f"{self.prefix}{folder}/{name}")

    def listing(self, folder):
        pages = self.c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{self.prefix}{folder}/")
        return sorted(o["Key"].split("/", len(self.prefix.split("/")))[-1] for p in pages for o in p.get("Contents", ()))

    def size(self, folder, name):
        return self.c.head_object(Bucket=self.bucket, Key=f"{self.prefix}{folder}/{name}")["ContentLength"]

    def remove_save(self, rel):
        for f in self.c.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}{rel}/").get("Contents", ()):
            self.c.delete_object(Bucket=self.bucket, Key=f["Key"])


@pytest.fixture(autouse=True)
def _outside_a_job(monkeypatch):
    for key in ("DISPATCH_ATTEMPT", "DISPATCH_EPOCH", "DISPATCH_CHECKPOINT"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(params=["posix", "s3"])
def r(request, tmp_path):
    if request.param == "posix":
        (tmp_path / "root").mkdir()
        return Posix(tmp_path / "root")
    return S3(request.getfixturevalue("s3_env"), request.getfixturevalue("s3_root"))


def publish(r, rel, step, epoch, **kw):
    return store.publish(r.save(rel), step, root=r.url, epoch=epoch, **kw).publication


def test_publish_then_latest(r):
    assert store.latest(r.url) is None and store.publications(r.url) == []
    publish(r, f"exec/{A1}/checkpoint-10", 10, E1)
    pb = publish(r, f"exec/{A1}/checkpoint-20", 20, E1)
    assert store.latest(r.url) == pb
    assert pb.path == f"exec/{A1}/checkpoint-20"
    assert [p.step for p in store.publications(r.url)] == [10, 20]
    assert r.size("pub", pb.name) == 0


def test_higher_epoch_outranks_any_step(r):
    publish(r, f"exec/{A2}/checkpoint-5", 5, E2)
    publish(r, f"exec/{A1}/checkpoint-9000", 9000, E1)  # published after, as a stalled old run would
    assert store.latest(r.url).path == f"exec/{A2}/checkpoint-5"


def test_publish_again_confirms_and_changes_nothing(r):
    save = r.save(f"exec/{A1}/checkpoint-1")
    first = store.publish(save, root=r.url, epoch=E1)
    again = store.publish(save, root=r.url, epoch=E1)
    assert (first.existed, again.existed) == (False, True)
    assert first.publication == again.publication
    assert r.listing("pub") == [first.publication.name]
    assert [e["existed"] for e in events.read(r.url) if e["type"] == "published"] == [False, True]


def test_only_a_save_of_the_publishing_execution_is_published(r, monkeypatch):
    old = r.save(f"exec/{A1}/checkpoint-900")
    with pytest.raises(BadPath, match=f"written by execution {A1} \\(epoch {E1}\\), not at epoch {E2}.*--adopt"):
        store.publish(old, 900, root=r.url, epoch=E2)
    monkeypatch.setenv("DISPATCH_ATTEMPT", f"other.9.{E1}")
    with pytest.raises(BadPath, match=f"not by this one \\(other.9.{E1}\\)"):
        store.publish(old, 900, root=r.url, epoch=E1)
    monkeypatch.delenv("DISPATCH_ATTEMPT")
    for entry in (r.save("sub/x"), r.save("ceased/x")):
        for adopt in (False, True):
            with pytest.raises(BadPath, match="part of the protocol, not a save"):
                store.publish(entry, 1, root=r.url, epoch=E2, adopt=adopt)
    with pytest.raises(BadPath, match="not inside an execution's folder"):
        store.publish(r.save("elsewhere/checkpoint-1"), 1, root=r.url, epoch=E1)
    assert store.latest(r.url) is None
    with pytest.raises(BadPath, match="no execution has claimed that epoch"):
        store.publish(old, 900, root=r.url, epoch=E2, adopt=True)  # adopted by nobody known
    monkeypatch.setenv("DISPATCH_ATTEMPT", A2)  # the replacement adopts the old save
    res = store.publish(old, 900, root=r.url, epoch=E2, adopt=True)
    assert res.adopted and store.latest(r.url) == res.publication
    ev = [e for e in events.read(r.url) if e["type"] == "published"]
    assert ev[-1]["adopted"] is True and ev[-1]["adopted_from"] == A1


def test_one_epoch_per_execution(r, monkeypatch):
    """On both stores: the first execution at an epoch claims it (env, or its
    first publication on a root from before claims); another job's env and publications at
    that epoch are refused naming it, before anything is written."""
    from dispatch_slurm.contract import env as envmod
    from dispatch_slurm.store import epochs
    job = {"DISPATCH_CHECKPOINT": r.url, "DISPATCH_SUBMISSION": "1", "SLURM_CLUSTER_NAME": "c"}
    first, second = (envmod.compute({**job, "SLURM_JOB_ID": j}) for j in ("1", "2"))
    with pytest.raises(EnvError, match="DISPATCH_SUBMISSION=1 was never allocated"):
        epochs.prepare(store.at(r.url), first, 0o700, r.url)
    store.allocate_submission(r.url)
    epochs.prepare(store.at(r.url), first, 0o700, r.url)
    before = r.listing("epochs")
    with pytest.raises(epochs.EpochClaimed, match=r"claimed by job c.1 .*this job \(c.2\)"):
        epochs.prepare(store.at(r.url), second, 0o700, r.url)
    assert r.listing("epochs") == before == [f"{E1:020d}"] and r.size("epochs", f"{E1:020d}") == len(A1) + 1
    theirs = r.save(f"exec/c.2.{E1}/checkpoint-5")
    with pytest.raises(epochs.EpochClaimed, match="claimed by job c.1 .*not by this execution"):
        store.publish(theirs, root=r.url, epoch=E1)
    ours = store.publish(r.save(f"exec/{A1}/checkpoint-6"), root=r.url, epoch=E1).publication
    assert store.latest(r.url) == ours
    old_root = r.save(f"exec/{A2}/checkpoint-7")  # no claim of E2 yet: its first publication claims it
    store.publish(old_root, root=r.url, epoch=E2)
    assert r.listing("epochs") == [f"{E1:020d}", f"{E2:020d}"]


def test_missing_or_outside_saves_are_refused(r):
    with pytest.raises(BadPath, match="does not exist"):
        store.publish(f"{r.url}/exec/{A1}/checkpoint-1", 1, root=r.url, epoch=E1)
    with pytest.raises(BadPath, match="not inside"):
        store.publish(f"{r.url}-other/exec/{A1}/checkpoint-1", 1, root=r.url, epoch=E1)
    with pytest.raises(BadPath, match="not inside"):
        store.publish(r.url, 1, root=r.url, epoch=E1)
    assert r.listing("pub") == [] if isinstance(r, S3) else not os.path.exists(f"{r.url}/pub")


def test_a_file_save_and_a_prefix_that_only_looks_like_one(r):
    """A save is a folder or a file; checkpoint-1 is not checkpoint-10."""
    r.save(f"exec/{A1}", files=("step-7.pt",))
    p = store.publish(f"{r.url}/exec/{A1}/step-7.pt", 7, root=r.url, epoch=E1).publication
    assert store.latest(r.url) == p
    r.save(f"exec/{A1}/checkpoint-10")
    with pytest.raises(BadPath, match="does not exist"):
        store.publish(f"{r.url}/exec/{A1}/checkpoint-1", 1, root=r.url, epoch=E1)


def test_name_over_the_limit_refused_before_anything_is_created(r):
    long = f"exec/{A1}/" + "x" * (150 if isinstance(r, Posix) else 250) + "/y" * 200
    save = r.save(long)
    with pytest.raises(BadPath, match="limit of"):
        store.publish(save, 1, root=r.url, epoch=E1)
    assert store.latest(r.url) is None


def test_bad_entry_is_an_error_naming_it_never_skipped(r):
    publish(r, f"exec/{A1}/checkpoint-1", 1, E1)
    r.plant("pub", "latest")
    for fn in (store.latest, store.publications):
        with pytest.raises(BadName, match="'latest'"):
            fn(r.url)
    r.unplant("pub", "latest")
    bad = f"{E2:020d}-{1:020d}-" + names.b32encode(b"../../etc")
    r.plant("pub", bad)
    with pytest.raises(BadName, match="'..' and could leave the root"):
        store.latest(r.url)
    proc = cli("latest", r.url, "--resume")
    assert proc.returncode == 2 and "bad entry" in proc.stderr and proc.stdout == ""
    # the message names the fix: move that entry out of pub/
    mv = "aws s3 mv" if r.url.startswith("s3://") else "mv"
    assert f"{mv} {r.url}/pub/{bad}" in proc.stderr and "then run the command again" in proc.stderr


# ---- a vanished latest save, and a person's retirement --------------------------------------------

def test_a_vanished_latest_save_is_an_error_naming_it_and_the_fix_never_a_path(r):
    publish(r, f"exec/{A1}/checkpoint-10", 10, E1)
    gone = publish(r, f"exec/{A1}/checkpoint-20", 20, E1)
    r.remove_save(gone.path)
    with pytest.raises(store.VanishedSave):
        store.latest_save(r.url)
    for mode in ([], ["--path"], ["--resume"], ["--json"]):
        proc = cli("latest", r.url, *mode)
        assert proc.returncode == 2 and proc.stdout == "", (mode, proc)
        err = proc.stderr
        assert err.count("\n") == 1 and f"{r.url}/pub/{gone.name}" in err and f"{r.url}/{gone.path}" in err, err
        assert f"dispatch-slurm retire {r.url} --latest" in err
    assert "no longer exists" in cli("ls", r.url).stderr
    retired = cli("retire", r.url, "--latest", "-m", "save vanished", check=True)
    assert "latest is now step 10" in retired.stdout
    assert cli("latest", r.url, "--resume", check=True).stdout == f"{r.url}/exec/{A1}/checkpoint-10\n"


def test_a_person_retires_the_latest_and_latest_moves_back_on_purpose(r):
    pubs = [publish(r, f"exec/{A1}/checkpoint-{s}", s, E1) for s in (10, 20, 30)]
    out = cli("retire", r.url, "--latest", "-m", "loss diverged", check=True)
    assert out.stdout.startswith("retired step 30 ") and "latest is now step 20" in out.stdout
    assert store.latest(r.url) == pubs[1] and store.latest_save(r.url) == pubs[1]
    assert r.listing("pub") == sorted(p.name for p in pubs), "pub/ is never touched"
    marker = json.loads(_content(r, "retired", pubs[2].name))
    assert marker["reason"] == "loss diverged" and marker["by"]
    # by name, as pub/NAME or its full path: the same publication, already retired
    for target in (pubs[2].name, f"pub/{pubs[2].name}", f"{r.url}/pub/{pubs[2].name}"):
        again = cli("retire", r.url, target, "-m", "twice", check=True)
        assert again.stdout.startswith("already retired by ") and "loss diverged" in again.stdout
    assert json.loads(_content(r, "retired", pubs[2].name))["reason"] == "loss diverged", "never rewritten"
    cli("retire", r.url, pubs[1].name, "-m", "also bad", check=True)
    assert store.latest(r.url) == pubs[0]
    assert [e["name"] for e in events.read(r.url) if e["type"] == "retired"] == [pubs[2].name, pubs[1].name]
    rows = {d["step"]: d for d in json.loads(cli("ls", r.url, "--json", check=True).stdout)}
    assert rows[30]["state"] == rows[20]["state"] == "retired" and rows[30]["reason"] == "loss diverged"
    assert rows[10]["state"] == "latest" and rows[30]["retired_by"] not in (None, "gc")
    later = publish(r, f"exec/{A2}/checkpoint-5", 5, E2)  # the next execution publishes above them all
    assert store.latest(r.url) == later
    bad = cli("retire", r.url, "no-such-name", "-m", "x")
    assert bad.returncode == 2 and "is not a publication" in bad.stderr
    assert cli("retire", r.url, "-m", "x").returncode == 2, "NAME or --latest"


def test_retiring_every_publication_leaves_nothing_to_resume_and_says_so(r):
    publish(r, f"exec/{A1}/checkpoint-10", 10, E1)
    out = cli("retire", r.url, "--latest", "-m", "bad from the start", check=True)
    assert "the next execution starts from step 0" in out.stderr
    assert store.latest(r.url) is None and cli("latest", r.url, "--resume", check=True).stdout == ""
    assert cli("retire", r.url, "--latest", "-m", "x").returncode == 2


def test_a_latest_gc_retired_stays_an_error_until_a_person_retires_it(r):
    first = publish(r, f"exec/{A1}/checkpoint-10", 10, E1)
    top = publish(r, f"exec/{A1}/checkpoint-20", 20, E1)
    r.plant("retired", top.name)  # an empty marker: gc's kind, made by hand (gc never retires the latest)
    if isinstance(r, Posix):
        os.chmod(r.path / "retired" / top.name, 0o444)  # read-only, as gc makes them
    with pytest.raises(StoreError, match="retired by gc"):
        store.latest(r.url)
    proc = cli("latest", r.url)
    assert proc.returncode == 2 and f"dispatch-slurm retire {r.url} --latest" in proc.stderr
    cli("retire", r.url, "--latest", "-m", "the marker was made by hand", check=True)
    assert store.latest(r.url) == first
    assert json.loads(_content(r, "retired", top.name))["reason"] == "the marker was made by hand"


def _content(r, folder, name) -> str:
    if isinstance(r, Posix):
        return (r.path / folder / name).read_text()
    return r.c.get_object(Bucket=r.bucket, Key=f"{r.prefix}{folder}/{name}")["Body"].read().decode()


def test_submission_numbers(r):
    assert [store.allocate_submission(r.url) for _ in range(3)] == [1, 2, 3]
    r.plant("sub", names.submission_name(7))  # e.g. from another login node
    assert store.allocate_submission(r.url) == 8
    r.plant("sub", "junk")
    with pytest.raises(BadName, match="'junk'"):
        store.allocate_submission(r.url)


def test_exec_dir(r):
    p = store.make_exec_dir(r.url, "linux.1.1000000")
    assert p == f"{r.url}/exec/linux.1.1000000"
    assert store.make_exec_dir(r.url, "linux.1.1000000") == p
    for bad in ("../x", "a/b", ""):
        with pytest.raises(BadPath):
            store.make_exec_dir(r.url, bad)


def test_missing_root_is_an_error_not_created(r):
    missing = f"{r.url}-typo" if isinstance(r, Posix) else "s3://no-such-bucket-here/run1"
    for fn in (store.latest, store.allocate_submission, lambda root: store.make_exec_dir(root, "a.1.1000000")):
        with pytest.raises(StoreError, match="does not exist"):
            fn(missing)
    assert not os.path.exists(missing)


def test_the_cli_publish_latest_ls_and_resume(r, monkeypatch):
    assert cli("latest", r.url, "--resume").stdout == ""
    assert cli("latest", r.url).returncode == 1
    env = {"DISPATCH_CHECKPOINT": r.url, "DISPATCH_EPOCH": str(E1), "DISPATCH_ATTEMPT": A1}
    for step in (3, 4):
        out = cli("publish", r.save(f"exec/{A1}/checkpoint-{step}"), env=env, check=True)
        assert out.stdout.startswith(f"published: step {step} ")
    again = cli("publish", f"{r.url}/exec/{A1}/checkpoint-4", "--json", env=env, check=True)
    assert json.loads(again.stdout)["existed"] is True
    want = f"{r.url}/exec/{A1}/checkpoint-4"
    assert cli("latest", r.url, "--resume", check=True).stdout == want + "\n"
    assert cli("latest", "--path", env=env, check=True).stdout == want + "\n"
    r.remove_save(f"exec/{A1}/checkpoint-3")
    rows = json.loads(cli("ls", r.url, "--json", check=True).stdout)
    assert [(d["step"], d["exists"], d["abspath"]) for d in rows] == [(3, False, want[:-1] + "3"), (4, True, want)]


def _race(url, save, barrier, results):
    barrier.wait()
    res = store.publish(save, 1, root=url, epoch=E1, sync=False)
    results.put("exists" if res.existed else "ok")


def test_racing_publishers(r):
    """16 processes publish the same save at once: every one gets an answer, one entry
    exists. Exactly one wins where the create is atomic (POSIX O_EXCL here; on S3 see
    test_s3.py: moto checks then writes, so its winners are counted, not asserted)."""
    save = r.save(f"exec/{A1}/checkpoint-1")
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(16), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(r.url, save, barrier, results)) for _ in range(16)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcome = sorted(results.get(timeout=10) for _ in procs)
    assert len(r.listing("pub")) == 1
    assert set(outcome) == {"exists", "ok"}
    if isinstance(r, Posix):
        assert outcome == ["exists"] * 15 + ["ok"]
