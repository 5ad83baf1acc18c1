"""Retention (gc) on a real filesystem: the policy, every safety rule, gc killed at
random moments, adoption racing gc, `ls`, the CLI, and the supervisor's gc after an
execution ends. Which executions have ceased is given as data here (the store's
contract); tests/cluster/test_trials.py runs gc during real overlaps."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from support import claim, cli

from dispatch_slurm import store
from dispatch_slurm.contract import names
from dispatch_slurm.retention.policy import Policy
from dispatch_slurm.errors import BadPath, DispatchError, StoreError
from dispatch_slurm.store import durable, events, posix
from dispatch_slurm.store.posix import PosixStore
from dispatch_slurm import retention as gc
from dispatch_slurm import retention as sup_gc
from dispatch_slurm.slurm.cessation import executions as cessation_of

A, B, C, LIVE = "c.1.1000000", "c.2.2000000", "c.3.3000000", "c.4.4000000"
LATER = time.time() + 3600  # "now" for decisions where --min-age must not matter


def mksave(root, attempt, step, files=3, size=4096, publish=True, name=None):
    d = root / "exec" / attempt / (name or f"checkpoint-{step}")
    d.mkdir(parents=True)
    for i in range(files):
        (d / f"f{i}").write_bytes(os.urandom(size))
    if publish:
        store.publish(str(d), step, root=str(root), epoch=names.attempt_epoch(attempt), sync=False)
    return d


def digest(path) -> str | None:
    """A checksum of every file under a save (names and bytes), None if it is gone."""
    if not os.path.isdir(path):
        return None
    h = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            h.update(os.path.relpath(p, path).encode() + b"\0" + open(p, "rb").read())
    return h.hexdigest()


def ceased(*attempts):
    return {a: (True, "said by the test") for a in attempts}


def run_gc(root, ceased_, now=LATER, **policy):
    return {v.save.path: v for v in gc.collect(str(root), Policy(**{"min_age": 0, **policy}), ceased_, now=now)}


def age(folder, seconds=600):
    """Make everything under ``folder`` look untouched for ``seconds`` (--min-age)."""
    old = time.time() - seconds
    for d, dirs, files in os.walk(folder):
        for f in files + dirs + ["."]:
            os.utime(os.path.join(d, f), (old, old), follow_symlinks=False)


def rel(p, root):
    return os.path.relpath(p, root)


def retired_paths(root) -> set[str]:
    d = root / "retired"
    return {names.parse(e).path for e in os.listdir(d)} if d.exists() else set()


@pytest.fixture
def three(root):
    """Executions A (steps 10-30), B (40-60, plus an unpublished checkpoint-70) and a live
    one (80, 90): every save's path and checksum."""
    saves = {}
    for attempt, steps in ((A, (10, 20, 30)), (B, (40, 50, 60)), (LIVE, (80, 90))):
        for s in steps:
            saves[(attempt, s)] = mksave(root, attempt, s)
    saves[(B, 70)] = mksave(root, B, 70, publish=False)
    return saves


# ---- the policy ---------------------------------------------------------------------------------

def test_keep_last_keeps_the_newest_existing_saves_and_removes_the_rest(root, three):
    v = run_gc(root, ceased(A, B), keep_last=3)
    kept = {p for p, x in v.items() if x.action == "keep"}
    assert kept == {rel(three[k], root) for k in ((B, 60), (LIVE, 80), (LIVE, 90))}, v
    for k, d in three.items():
        assert d.exists() == (rel(d, root) in kept), k
    assert "one of the 3 newest" in v[rel(three[(B, 60)], root)].why
    assert "unpublished leftover" in v[rel(three[(B, 70)], root)].why
    assert retired_paths(root) == {rel(three[k], root) for k in ((A, 10), (A, 20), (A, 30), (B, 40), (B, 50),
                                                                 (B, 70))}
    assert store.latest(str(root)).path == rel(three[(LIVE, 90)], root)


def test_keep_every_keeps_the_first_save_of_each_window(root, three):
    v = run_gc(root, ceased(A, B), keep_last=1, keep_every=25)
    kept = {p for p, x in v.items() if x.action == "keep" and x.save.exists}
    # windows of 25 steps: 0-24 -> 10, 25-49 -> 30, 50-74 -> 50; live saves are kept anyway
    assert kept == {rel(three[k], root) for k in ((A, 10), (A, 30), (B, 50), (LIVE, 80), (LIVE, 90))}
    assert "--keep-every 25" in v[rel(three[(A, 30)], root)].why


def test_a_published_save_the_trainer_rotated_away_is_retired_not_counted(root, three):
    import shutil
    shutil.rmtree(three[(B, 50)])  # save_total_limit removed it; its publication stays, unheld (60 came after)
    v = run_gc(root, ceased(A, B), keep_last=4)
    assert v[rel(three[(B, 40)], root)].action == "keep", "a vanished save does not use up a --keep-last place"
    assert rel(three[(B, 50)], root) in retired_paths(root)


def test_an_executions_newest_save_its_trainer_removed_is_held_counted_and_removed_with_its_links(root, three):
    """The rotation (or an rm) took B's newest save from its folder; its publication's held
    links keep it: it exists for gc like any save, and goes, links and all, when the policy
    no longer keeps it."""
    import shutil
    shutil.rmtree(three[(B, 60)])
    b60 = rel(three[(B, 60)], root)
    held = [p.name for p in store.publications(str(root)) if p.path == b60]
    assert os.listdir(root / "held" / held[0])  # the publication's own links
    v = run_gc(root, ceased(A, B), keep_last=3)
    assert v[b60].action == "keep" and v[b60].save.exists and v[b60].save.held_only
    assert v[rel(three[(B, 50)], root)].action == "remove"
    v = run_gc(root, ceased(A, B), keep_last=2)
    assert v[b60].action == "remove" and "held links go with it" in v[b60].why and v[b60].freed > 0
    assert not (root / "held" / held[0]).exists() and b60 in retired_paths(root)


# ---- the safety rules ---------------------------------------------------------------------------

def test_the_latest_publication_is_never_removed_nor_retired(root, three):
    latest = store.latest(str(root))
    # even when its execution has ceased, its save vanished and no policy place is left for it
    import shutil
    shutil.rmtree(three[(LIVE, 90)])
    v = run_gc(root, ceased(A, B, LIVE), keep_last=1)
    assert v[latest.path].action == "keep" and v[latest.path].why == "the latest publication's save"
    assert latest.name not in os.listdir(root / "retired")
    assert store.latest(str(root)) == latest
    assert not three[(LIVE, 80)].exists(), "the latest's held links keep it: it is the one --keep-last 1 keeps"
    assert os.listdir(root / "held" / latest.name) and v[latest.path].save.held_only


def test_gc_fsyncs_pub_before_it_removes_anything(root, three, monkeypatch):
    """The model's find (tests/model/protocol.pml, VARIANT_GC_NO_PUB_FSYNC): the latest gc
    keeps may be a publication its publisher has not fsynced pub/ for yet; gc fsyncs pub/
    itself before its first removal, so a crash cannot take the latest away while gc's
    removals stay (an older latest whose save gc removed)."""
    log = []
    real_fsync, real_remove = os.fsync, PosixStore.remove

    def fsync(fd):
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def remove(self, path, held=()):
        log.append(("remove", path))
        return real_remove(self, path, held)
    monkeypatch.setattr(posix.os, "fsync", fsync)
    monkeypatch.setattr(PosixStore, "remove", remove)
    run_gc(root, ceased(A, B), keep_last=1)
    first = next(i for i, (what, _) in enumerate(log) if what == "remove")
    assert ("fsync", str(root / "pub")) in log[:first], log[:first + 1]


def test_latest_refuses_a_retired_latest_publication(root, three):
    latest = store.latest(str(root))
    (root / "retired").mkdir()
    (root / "retired" / latest.name).touch()  # by hand: gc never does this
    with pytest.raises(StoreError, match="the latest publication is retired"):
        store.latest(str(root))


def test_saves_of_an_execution_not_shown_to_have_ceased_are_all_kept(root, three):
    v = run_gc(root, {**ceased(A), B: (False, "node c2 recorded no epilog")}, keep_last=1)
    for s in (40, 50, 60, 70):
        assert three[(B, s)].exists(), s
        assert "not shown to have ceased: node c2 recorded no epilog" in v[rel(three[(B, s)], root)].why
    assert not three[(A, 10)].exists() and three[(LIVE, 80)].exists(), "the live one was not asked: kept"
    assert "not known to have ceased" in v[rel(three[(LIVE, 80)], root)].why


def test_unpublished_leftovers_go_only_after_their_execution_ceased(root, three):
    left = three[(B, 70)]
    run_gc(root, ceased(A), keep_last=1)
    assert left.exists()
    run_gc(root, ceased(A, B), keep_last=1)
    assert not left.exists()


def test_only_entries_named_like_a_save_are_leftovers(root, three):
    (root / "exec" / B / "runs").mkdir()
    (root / "exec" / B / "runs" / "events.out").write_bytes(b"tensorboard")
    (root / "exec" / B / "train.log").write_text("log")
    run_gc(root, ceased(A, B), keep_last=1)
    assert (root / "exec" / B / "runs" / "events.out").exists() and (root / "exec" / B / "train.log").exists()
    assert not (root / "exec" / A).exists(), "an exec folder left empty goes too"


def test_an_exec_folder_still_being_written_is_kept(root, three):
    age(root / "exec")
    (three[(A, 20)] / "f0").write_bytes(b"a late write")  # one write, anywhere in A's folder
    v = run_gc(root, ceased(A, B), now=time.time(), keep_last=1, min_age=60)
    assert all(three[(A, s)].exists() for s in (10, 20, 30))
    assert "still being written: exec/c.1.1000000 was modified" in v[rel(three[(A, 10)], root)].why
    assert not three[(B, 40)].exists(), "B's folder is quiet: collected"


def test_gc_never_follows_a_symlink(root, tmp_path):
    outside = tmp_path / "outside"
    (outside / "checkpoint-5").mkdir(parents=True)
    (outside / "checkpoint-5" / "precious").write_text("keep me")
    (root / "exec").mkdir()
    os.symlink(outside, root / "exec" / "c.9.9000000")  # an exec folder that is a symlink
    save = mksave(root, A, 10)
    os.symlink(outside, save / "link-to-outside")         # a symlink inside a save
    os.symlink(outside / "checkpoint-5", root / "exec" / A / "checkpoint-6")  # a leftover-named symlink
    mksave(root, B, 20)
    run_gc(root, ceased(A, B, "c.9.9000000"), keep_last=1)
    assert not save.exists() and (outside / "checkpoint-5" / "precious").read_text() == "keep me"
    assert os.path.islink(root / "exec" / "c.9.9000000") and os.path.islink(root / "exec" / A / "checkpoint-6")


def test_a_publication_behind_a_symlink_is_left_alone(root, tmp_path):
    outside = tmp_path / "outside"
    (outside / "checkpoint-5").mkdir(parents=True)
    (outside / "checkpoint-5" / "precious").write_text("keep me")
    (root / "exec" / A).mkdir(parents=True)
    os.symlink(outside, root / "exec" / A / "sub")
    (root / "pub").mkdir()
    (root / "pub" / names.encode(1_000_000, 5, f"exec/{A}/sub/checkpoint-5")).touch()  # by hand
    mksave(root, B, 20)
    v = run_gc(root, ceased(A, B), keep_last=1)
    assert v[f"exec/{A}/sub/checkpoint-5"].action == "keep" and "symlink" in v[f"exec/{A}/sub/checkpoint-5"].why
    assert (outside / "checkpoint-5" / "precious").exists()


def test_remove_tree_unlinks_a_symlink_and_refuses_a_folder_swapped_for_one(tmp_path, monkeypatch):
    target = tmp_path / "target"
    target.mkdir()
    (target / "f").write_text("x")
    os.symlink(target, tmp_path / "link")
    fd = durable.open_dir(str(tmp_path))
    try:
        durable.remove_tree("link", fd)
        assert not os.path.lexists(tmp_path / "link") and (target / "f").exists()
        real_stat = os.stat

        def swap(name, *a, **kw):  # the folder becomes a symlink between lstat and open
            st = real_stat(name, *a, **kw)
            if name == "victim" and not os.path.islink(tmp_path / "victim"):
                os.rename(tmp_path / "victim", tmp_path / "moved")
                os.symlink(target, tmp_path / "victim")
            return st
        (tmp_path / "victim").mkdir()
        monkeypatch.setattr(os, "stat", swap)
        with pytest.raises(OSError) as refused:
            durable.remove_tree("victim", fd)
        assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)
        monkeypatch.undo()
        assert (target / "f").exists() and (tmp_path / "moved").exists()
    finally:
        os.close(fd)


def test_pinned_saves_and_folders_are_kept_until_unpinned(root, three):
    gc.pin(str(root), str(three[(A, 10)]))
    gc.pin(str(root), str(root / "exec" / B))
    v = run_gc(root, ceased(A, B), keep_last=1)
    assert three[(A, 10)].exists() and not three[(A, 20)].exists()
    assert all(three[(B, s)].exists() for s in (40, 50, 60, 70)) and v[rel(three[(B, 40)], root)].why == "pinned"
    assert gc.unpin(str(root), str(root / "exec" / B)) == (f"exec/{B}", True)
    run_gc(root, ceased(A, B), keep_last=1)
    assert not any(three[(B, s)].exists() for s in (40, 50, 60, 70)) and three[(A, 10)].exists()


# ---- adoption racing gc: one of the two always sees the other --------------------------------------

def _adopt(root, save, attempt=LIVE):
    return store.publish(str(save), 95, root=str(root), epoch=names.attempt_epoch(attempt), adopt=True, sync=False)


def test_adopting_a_retired_save_is_refused(root, three, monkeypatch):
    real = PosixStore.pins
    raced = []

    def adopter_in_between(self):  # once gc has retired A's saves, before it reads the pins
        if (root / "retired").exists() and not raced:
            with pytest.raises(BadPath, match="gc retired it"):
                _adopt(root, three[(A, 20)])
            raced.append(True)
        return real(self)
    monkeypatch.setattr(PosixStore, "pins", adopter_in_between)
    run_gc(root, ceased(A, B), keep_last=1)
    assert raced and not three[(A, 20)].exists()
    assert store.latest(str(root)).path == rel(three[(LIVE, 90)], root), "nothing was published"
    assert not os.listdir(root / "pinned"), "the refused adopter dropped its pin"


def test_a_save_adopted_after_gc_looked_is_kept(root, three, monkeypatch):
    stale = store.at(str(root)).inventory()       # gc's inventory, taken before the adoption
    adopted = _adopt(root, three[(A, 20)]).publication
    monkeypatch.setattr(PosixStore, "inventory", lambda *a, **kw: stale)
    v = run_gc(root, ceased(A, B), keep_last=1)
    assert "published again meanwhile" in v[rel(three[(A, 20)], root)].why
    assert store.latest(str(root)) == adopted and digest(three[(A, 20)]) is not None
    assert adopted.name not in os.listdir(root / "retired")


# ---- gc killed at random moments --------------------------------------------------------------------

CHILD = """
import sys
from dispatch_slurm import retention
from dispatch_slurm.retention.policy import Policy
print("ready", flush=True)
root, *attempts = sys.stdin.readline().split()
retention.collect(root, Policy(keep_last=2, min_age=0), {a: (True, "test") for a in attempts})
print("done", flush=True)
"""
KILLS = 200


class Child:
    """A gc process, started ahead (Python's start-up is most of its cost) and waiting
    for a root: gc runs from the moment ``go`` sends it."""

    def __init__(self):
        self.p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)

    def go(self, root, attempts) -> float:
        assert self.p.stdout.readline() == "ready\n"
        self.p.stdin.write(" ".join([str(root), *attempts]) + "\n")
        self.p.stdin.flush()
        return time.monotonic()

    def finish(self) -> None:
        assert self.p.stdout.readline() == "done\n"
        self.p.wait()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        self.p.stdin.close()
        self.p.stdout.close()


def _template(base):
    """Four ceased executions of five saves (20 files each) and an unpublished leftover,
    and a live one; the expected survivors of --keep-last 2."""
    root = base / "template"
    root.mkdir()
    attempts = [f"c.{i}.{i}000000" for i in range(1, 5)]
    for i, a in enumerate(attempts):
        for s in range(5):
            mksave(root, a, 100 * i + 10 * s, files=20, size=2048)
        mksave(root, a, 100 * i + 99, files=20, size=2048, publish=False)
    for s in (500, 510):
        mksave(root, LIVE, s, files=20, size=2048)
    sums = {p.path: digest(root / p.path) for p in store.publications(str(root))}
    keep = {f"exec/{LIVE}/checkpoint-500", f"exec/{LIVE}/checkpoint-510"}
    return root, attempts, sums, keep


def _check(root, sums, keep):
    """After a kill: latest and ls answer, and every publication is intact or retired."""
    latest = store.latest(str(root))
    assert latest.path == f"exec/{LIVE}/checkpoint-510" and digest(root / latest.path) == sums[latest.path]
    retired = set(os.listdir(root / "retired")) if (root / "retired").exists() else set()
    rows = {r["path"]: r for r in gc.state(str(root))}
    for p in store.publications(str(root)):
        if p.name in retired:
            assert p.path not in keep, f"a kept save was retired: {p.path}"
            assert p.name in rows[p.path]["retired"]
        else:
            assert digest(root / p.path) == sums[p.path], f"{p.path} is neither whole nor retired"
            assert rows[p.path]["exists"]
    return retired


def test_gc_killed_at_any_moment_leaves_every_publication_intact_or_retired(tmp_path):
    import shutil
    template, attempts, sums, keep = _template(tmp_path)
    children: list[Child] = []

    def spawn() -> Child:
        children.append(Child())
        return children[-1]

    def fresh(i):  # hard links: a copy in no time, and removal unlinks only the copy's names
        root = tmp_path / f"root{i}"
        shutil.copytree(template, root, symlinks=True, copy_function=os.link)
        return root

    try:
        seen, span = _kill_gc_at_random(attempts, sums, keep, fresh, spawn)
    finally:
        for c in children:
            c.kill()
    print(f"{KILLS} kills over {span * 1000:.0f} ms of gc: {seen}")
    assert all(n >= 3 for n in seen.values()), f"the kills did not cover every phase: {seen}"


def _kill_gc_at_random(attempts, sums, keep, fresh, spawn):
    import shutil
    rng = random.Random(1234)
    child, durations = spawn(), []
    for i in range(5):
        t0 = child.go(fresh(f"t{i}"), attempts)
        child, ready = spawn(), child
        ready.finish()
        durations.append(time.monotonic() - t0)
    span = sorted(durations)[2] * 1.2  # the median gc, and a little after it
    seen = {"before any retirement": 0, "retired, removal under way": 0, "finished": 0}
    for i in range(KILLS):
        root = fresh(i)
        child.go(root, attempts)
        time.sleep(rng.uniform(0, span))  # the fault's timing, not a synchronisation
        child, killed = spawn(), child
        killed.kill()
        retired = _check(root, sums, keep)
        left = [p for p in sums if p not in keep and (root / p).exists()]
        seen["before any retirement" if not retired else "finished" if not left else
             "retired, removal under way"] += 1
        if i % 20 == 0:  # the CLI answers the same
            assert json.loads(cli("latest", "--json", root, check=True).stdout)["path"] == f"exec/{LIVE}/checkpoint-510"
            cli("ls", root, check=True)
        gc.collect(str(root), Policy(keep_last=2, min_age=0), ceased(*attempts))  # a later gc finishes it
        _check(root, sums, keep)
        assert {p for p in sums if (root / p).exists()} == keep
        assert sorted(os.listdir(root / "exec")) == [LIVE], "every collected exec folder is gone"
        shutil.rmtree(root)
    return seen, span


# ---- ls, the CLI, the supervisor ----------------------------------------------------------------------

def test_a_persons_retirement_moves_gcs_latest_and_is_no_cessation_evidence(root, three):
    """`retire --latest` on LIVE's step 90. gc then keeps step 80 as the latest,
    keeps 90 while LIVE runs (a person's marker says nothing about cessation) and removes
    it once LIVE has ceased; `ls` and `report` agree with `latest`."""
    from dispatch_slurm.retention.policy import ceased_by_retirement
    cli("retire", root, "--latest", "-m", "diverged", check=True)
    inv = store.at(str(root)).inventory()
    assert inv.latest.path == rel(three[(LIVE, 80)], root) and LIVE not in ceased_by_retirement(inv)
    v = run_gc(root, ceased(A, B), keep_last=1)
    assert v[rel(three[(LIVE, 80)], root)].why == "the latest publication's save"
    live90 = v[rel(three[(LIVE, 90)], root)]
    assert live90.action == "keep" and live90.why.startswith("retired by ") and "(diverged)" in live90.why
    assert three[(LIVE, 90)].exists() and three[(LIVE, 80)].exists()
    v = run_gc(root, ceased(A, B, LIVE), keep_last=1)
    assert v[rel(three[(LIVE, 90)], root)].action == "remove" and not three[(LIVE, 90)].exists()
    assert three[(LIVE, 80)].exists() and store.latest(str(root)).path == rel(three[(LIVE, 80)], root)
    rows = {d["step"]: d for d in json.loads(cli("ls", root, "--json", check=True).stdout)}
    assert rows[90]["state"] == "retired" and not rows[90]["exists"] and rows[80]["state"] == "latest"
    report = json.loads(cli("report", root, "--json", check=True).stdout)
    assert report["latest"]["path"] == rel(three[(LIVE, 80)], root)
    assert "retired by " in cli("report", root, check=True).stdout


def test_ls_calls_a_save_the_trainer_rotated_away_gone_not_kept(root, three):
    import shutil
    shutil.rmtree(three[(B, 50)])  # save_total_limit removed it; its publication stays
    rows = {d["step"]: d for d in json.loads(cli("ls", root, "--json", check=True).stdout)}
    assert rows[50]["state"] == "gone" and not rows[50]["exists"] and rows[60]["state"] == "kept"
    out = cli("ls", root, check=True)
    line = next(x for x in out.stdout.splitlines() if x.split()[3] == "50")
    assert " gone " in line and " kept " not in line
    assert "gone (the trainer's rotation removed them, not retired): 1 save;" in out.stderr
    totals = json.loads(cli("report", root, "--json", check=True).stdout)["retention"]["totals"]
    assert totals["gone"]["saves"] == 1


def test_ls_shows_state_and_size(root, three):
    run_gc(root, ceased(A), keep_last=1)
    rows = json.loads(cli("ls", root, "--json", check=True).stdout)
    by = {r["path"]: r for r in rows}
    assert by[rel(three[(A, 10)], root)]["state"] == "retired" and not by[rel(three[(A, 10)], root)]["exists"]
    assert by[rel(three[(LIVE, 90)], root)]["state"] == "latest"
    assert by[rel(three[(B, 40)], root)]["state"] == "kept" and by[rel(three[(B, 40)], root)]["size"] >= 3 * 4096
    out = cli("ls", root, check=True)
    assert "retired: 3 saves, 0 B still on disk" in out.stderr and "unpublished among them: 1 save," in out.stderr
    assert out.stdout.splitlines()[0].split() == ["G", "N", "R", "STEP", "EXISTS", "SIZE", "STATE", "PATH"]


def test_ls_counts_a_resume_copy_apart_and_its_linked_bytes_once(root, three):
    """A resume's copy (exec/<attempt>/dispatch-resume/...: links to the published save's
    read-only files, clones, or for root a copy of the data) is no unpublished save, and
    the bytes it shares are its save's: `ls` says so, and the totals it gives for the saves
    stay what they were before the resume."""
    summary = lambda: cli("ls", root, check=True).stderr.strip().splitlines()[-1]  # noqa: E731
    before = summary()
    (root / "exec" / C).mkdir()
    claim(root, C)
    job = {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": "3000000", "DISPATCH_ATTEMPT": C,
           "DISPATCH_EXEC_DIR": str(root / "exec" / C)}
    held = cli("latest", "--resume", env=job, check=True).stdout.strip()
    assert held.startswith(f"{root}/exec/{C}/dispatch-resume/")
    assert open(f"{held}/f0", "rb").read() == (three[(LIVE, 90)] / "f0").read_bytes()
    after = summary()
    kept = lambda line: line.split("; resume copies")[0]  # noqa: E731
    assert kept(after) == kept(before) and "unpublished among them: 1 save," in after, (before, after)
    from dispatch_slurm.report.render import size
    save = {os.stat(p).st_ino for p in three[(LIVE, 90)].iterdir()}
    own = 0  # the folders it made, and the files whose bytes are not the save's
    for d, _, files in os.walk(root / "exec" / C / "dispatch-resume"):
        own += os.stat(d).st_blocks * 512
        own += sum(st.st_blocks * 512 for st in (os.stat(f"{d}/{f}") for f in files) if st.st_ino not in save)
    assert f"resume copies (of published saves; the bytes they do not share with them): 1 folder, {size(own)};" \
        in after, after
    rows = json.loads(cli("ls", root, "--json", check=True).stdout)
    assert all("dispatch-resume" not in r["path"] for r in rows), "a copy listed as a publication"


def test_gc_refuses_an_exec_folder_it_cannot_read(tmp_path):
    """An exec folder the user cannot read (another user's, mode 0700) is an error naming it
    and the fix, for gc, ls and the report, never silently left out of what they decide."""
    import shutil
    import tempfile
    from dispatch_slurm.slurm.hooks import node
    if os.geteuid() != 0:
        pytest.skip("needs root: gc runs as another user here")
    nobody = {"SLURM_JOB_UID": "65534", "SLURM_JOB_GID": "65534", "SLURM_JOB_USER": "nobody"}
    base = tempfile.mkdtemp(prefix="dispatch-gc-")
    try:
        os.chmod(base, 0o755)
        root = tempfile.mkdtemp(dir=base)
        os.chown(root, 65534, 65534)
        r = __import__("pathlib").Path(root)
        for attempt in (A, B):
            assert "ok" in node.as_job_user(nobody, lambda a: bool(mksave(r, a, int(a.split(".")[1]) * 10)), attempt)
        os.chown(r / "exec" / A, 0, 0)  # another user's folder
        os.chmod(r / "exec" / A, 0o700)
        for look in (lambda: gc.gc(root, Policy(keep_last=1), said=[A, B]) and None,
                     lambda: store.at(root).inventory() and None):
            res = node.as_job_user(nobody, look)
            why = res.get("user_error", "")
            assert f"{root}/exec/{A} cannot be read (Permission denied" in why and "chmod -R u+rwX" in why, res
        assert (r / "exec" / B / "checkpoint-20").exists(), "gc removed what it decided without A's folder"
    finally:
        shutil.rmtree(base)


def test_cli_gc_dry_run_explains_and_removes_nothing(root, three):
    age(root / "exec")
    env = {"PATH": "/nonexistent"}  # no Slurm here: cessation cannot be shown but for --ceased
    dry = cli("gc", root, "--keep-last", "1", "--dry-run", "--ceased", A, env=env, check=True)
    assert "would remove" in dry.stdout and f"exec/{A}/checkpoint-10" in dry.stdout
    assert "Slurm did not answer" in dry.stdout and f"gc --ceased {B}" in dry.stdout
    assert all(d.exists() for d in three.values()) and not (root / "retired").exists()
    real = cli("gc", root, "--keep-last", "1", "--ceased", A, "--json", env=env, check=True)
    removed = {v["path"] for v in json.loads(real.stdout) if v["action"] == "remove"}
    assert [v["path"] for v in json.loads(real.stdout) if v["latest"]] == [rel(three[(LIVE, 90)], root)]
    assert removed == {f"exec/{A}/checkpoint-{s}" for s in (10, 20, 30)}
    said = [e for e in events.read(str(root)) if e["type"] == "cessation" and e.get("source") == "person"]
    assert [e["attempt"] for e in said] == [A]
    assert [e["removed"] for e in events.read(str(root)) if e["type"] == "gc"] == [sorted(removed)]


def test_cli_gc_refusals(root, three):
    assert "--keep-last K" in cli("gc", root).stderr
    assert cli("gc", root, "--keep-last", "0").returncode == 2
    bad = cli("gc", root, "--keep-last", "1", "--pattern", "checkpoint")
    assert bad.returncode == 2 and "exactly one group" in bad.stderr
    pin = cli("gc", root, "--pin", root / "exec" / A / "nope")
    assert pin.returncode == 2 and "does not exist" in pin.stderr
    # two pins, the second bad: refused before anything is pinned (a refused command changes nothing)
    two = cli("gc", root, "--pin", three[(A, 10)], "--pin", "--root")
    assert two.returncode == 2 and two.stderr.count("\n") == 1 and "--root" in two.stderr, two.stderr
    unpin = cli("gc", root, "--pin", three[(A, 10)], "--unpin", "/elsewhere")
    assert unpin.returncode == 2 and not (root / "pinned").exists(), unpin.stderr
    ok = cli("gc", root, "--pin", three[(A, 10)], check=True)
    assert "pinned: exec/c.1.1000000/checkpoint-10" in ok.stderr
    assert os.listdir(root / "pinned") == [names.path_name(f"exec/{A}/checkpoint-10")]


def test_run_keep_last_collects_after_each_end_when_the_latest_moves_and_once_it_ceased(root):
    from test_supervisor_rules import FakeSlurm, defn, drive, facts, new
    from dispatch_slurm.store import ceased as ceased_store
    fake = FakeSlurm()
    sup = new(root, fake, start_defn=defn(resubmit=2, keep_last=1))
    gcs = lambda: facts(root, "gc")  # noqa: E731

    def execution(jid) -> str:
        drive(sup, lambda: sup.state.job == jid)
        fake.start(jid, ["c1"])
        drive(sup, lambda: sup.state.started)
        attempt = sup.state.started["attempt"]
        for s in (1, 2, 3):
            mksave(root, attempt, 10 * s + jid)
        age(root / "exec" / attempt)
        return attempt

    first = execution(100)
    fake.end(100, "PREEMPTED")  # ended, but its Epilog has recorded nothing yet
    drive(sup, lambda: len(gcs()) == 1)
    assert (gcs()[0]["removed"], gcs()[0]["waiting"]) == (0, 2), "kept: the latest, and 2 waiting"
    ceased_store.record(str(root), first, "c1")  # the Epilog, later
    drive(sup, lambda: len(gcs()) == 2)  # the retry, --cessation-interval later
    assert gcs()[1]["removed"] == 2 and gcs()[1]["t"] >= gcs()[0]["t"] + 60
    second = execution(101)  # its saves push 100's last one out of --keep-last 1: gc at once
    drive(sup, lambda: len(gcs()) == 3)
    assert gcs()[2]["paths"] == [f"exec/{first}/checkpoint-130"] and gcs()[2]["t"] < gcs()[1]["t"] + 60
    ceased_store.record(str(root), second, "c1")
    fake.end(101, "PREEMPTED")
    drive(sup, lambda: len(gcs()) == 4)
    assert gcs()[3]["removed"] == 2
    assert sorted(os.listdir(root / "exec")) == [second]
    assert sorted(os.listdir(root / "exec" / second)) == ["checkpoint-131"]


def test_keep_last_is_checked_in_the_job_definition(root):
    from dispatch_slurm.supervisor import make_defn
    with pytest.raises(DispatchError, match="--keep-last must be 1 or more"):
        make_defn({"keep_last": 0}, ["job.sh"])
    assert "--keep-last" in cli("run", root, "--help").stdout


def test_status_for_the_report_uses_the_records_policy_and_slurms_answers(root, three):
    from test_supervisor_rules import FakeSlurm
    from dispatch_slurm.slurm.client import Slurm
    from dispatch_slurm.supervisor.record import Record
    rec = Record(str(root))
    rec.open_for_append()
    rec.append({"type": "job", "g": 0, "resubmit": 0, "shared": False, "via": "spank", "hold_for": 1.0,
                "cessation_interval": 1.0, "cessation_cmd": "x", "args": ["job.sh"], "keep_last": 1})
    age(root / "exec")
    st = sup_gc.status(str(root), slurm=Slurm(FakeSlurm()), facts=rec.read())  # FakeSlurm's cluster is not "c": nothing ceased
    assert st["policy"]["keep_last"] == 1 and st["totals"]["reclaimable"]["saves"] == 0
    run_gc(root, ceased(A), keep_last=1)
    st = sup_gc.status(str(root), slurm=Slurm(FakeSlurm()), facts=rec.read())
    assert st["totals"]["retired"]["saves"] == 3 and st["totals"]["retired"]["bytes"] == 0
    assert st["totals"]["kept"]["saves"] == 6 and st["totals"]["kept"]["bytes"] >= 6 * 3 * 4096
    by = {r["path"]: r for r in st["saves"]}
    b40 = by[rel(three[(B, 40)], root)]
    assert b40["waiting"] and "cluster c, not on this one" in b40["why"]
    st = sup_gc.status(str(root), Policy(keep_last=1, min_age=0), slurm=Slurm(FakeSlurm()))
    assert st["policy"]["min_age"] == 0
    rows = gc.state(str(root), Policy(keep_last=1, min_age=0), ceased(B))
    reclaimable = {r["path"] for r in rows if r["state"] == "reclaimable"}
    assert reclaimable == {rel(three[(B, s)], root) for s in (40, 50, 60, 70)}
    assert all(three[(B, s)].exists() for s in (40, 50, 60, 70)), "the state is a view: nothing removed"
    offline = sup_gc.status(str(root), Policy(keep_last=1, min_age=0), ask=False)  # no Slurm asked
    assert offline["totals"]["reclaimable"]["saves"] == 0 and offline["totals"]["retired"]["saves"] == 3


def test_gc_refuses_a_root_that_is_not_yours(root, three, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 4242)
    with pytest.raises(StoreError, match="not to you"):
        run_gc(root, ceased(A, B), keep_last=1)
    assert all(d.exists() for d in three.values()) and not (root / "retired").exists()


def test_the_report_shows_kept_and_retired_saves_with_sizes(root, three):
    """`dispatch-slurm report ROOT`: gc's view from the root alone, totals and each save."""
    run_gc(root, ceased(A), keep_last=1)
    r = json.loads(cli("report", root, "--json", check=True).stdout)["retention"]
    assert r["totals"]["retired"]["saves"] == 3 and r["totals"]["kept"]["saves"] == 6
    assert {s["path"] for s in r["saves"] if s["state"] == "retired"} == {rel(three[(A, s)], root) for s in (10, 20, 30)}
    text = cli("report", root, check=True).stdout
    assert "retention (no gc policy" in text and "retired 3 saves 0 B" in text
    assert f"{rel(three[(LIVE, 90)], root)} (latest)" in text


def test_ceased_takes_the_executions_nodes_from_the_root_when_nothing_else_names_them(root):
    """A plugin job nobody supervised, purged by slurmctld: `ceased` (and so a
    hold's cessation command, and gc) had "which nodes ran execution R=0 is unknown".
    The Epilog's entries name the execution's nodes: ceased once all of them recorded."""
    from test_supervisor_rules import FakeSlurm
    from dispatch_slurm.slurm import cessation
    from dispatch_slurm.slurm.client import Slurm
    from dispatch_slurm.store import ceased as ceased_store
    a = "testc.100.1000000"
    ceased_store.record(str(root), a, "c1", {"by": "process scan"}, nodes=["c1", "c2"])
    ask = lambda: cessation.check(Slurm(FakeSlurm()), 100, 0, root=str(root), generation=0,  # noqa: E731
                                  submission=1)
    ans = ask()  # purged: Slurm says it ended; c2 (idle, responding) recorded nothing
    assert ans["answer"] == cessation.NOT_CEASED and "no evidence from c2" in ans["why"], ans
    assert cessation_of.from_root(str(root), [a]) == {}
    ceased_store.record(str(root), a, "c2", {"by": "cgroup v2", "state": "gone", "cgroup": "x"}, nodes=["c1", "c2"])
    ans = ask()
    assert ans["answer"] == cessation.CEASED and set(ans["nodes"]) == {"c1", "c2"}, ans
    (ok, why), = cessation_of.from_root(str(root), [a]).values()
    assert ok and "c1: process scan, c2: cgroup v2" in why


def test_a_big_jobs_node_list_is_read_back_whole(root):
    """A 5,000-node execution: each entry names every node (the bound is well above it)."""
    from dispatch_slurm.store import ceased as ceased_store
    nodes = [f"node{i:05d}" for i in range(5000)]
    for n in nodes[:2]:
        ceased_store.record(str(root), A, n, {"by": "cgroup v2"}, nodes=nodes)
    ev = ceased_store.execution(str(root), A)
    assert ev["nodes"] == nodes and len(ev["missing"]) == 4998 and ev["ceased"] is False


# ---- gc on a local root, gc --dry-run alone ----------------------------------------------

def _slurm_that_must_not_be_asked(tmp_path) -> str:
    """A PATH whose scontrol/sacct record every call and fail (Slurm is not there)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("scontrol", "sacct", "squeue"):
        (bin_ / name).write_text(f"#!/bin/sh\necho \"$0 $*\" >>{tmp_path}/asked\nexit 1\n")
        (bin_ / name).chmod(0o755)
    return f"{bin_}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"


def test_gc_on_a_local_root_asks_no_slurm_and_knows_its_executions_by_their_processes(tmp_path):
    """Two finished `env --local` executions and a running one: gc removes what --keep-last
    does not keep of the finished ones (their processes are gone from this host), keeps the
    running one's (its shell still runs), asks Slurm nothing and needs no --ceased."""
    from support import LOCAL_SAVE, local_run
    root = tmp_path / "root"
    root.mkdir()
    for steps in ((10, 20), (30, 40)):
        local_run(root, "; ".join(f"set -- {s}; {LOCAL_SAVE}" for s in steps))
    live = local_run(root, f"set -- 50; {LOCAL_SAVE}; set -- 60; {LOCAL_SAVE}; echo saved; read -r _", wait=False)
    try:
        assert live.stdout.readline().strip() == "saved"
        path = _slurm_that_must_not_be_asked(tmp_path)
        res = cli("gc", root, "--keep-last", "1", "--min-age", "0", env={"PATH": path}, check=True)
        assert not (tmp_path / "asked").exists(), (tmp_path / "asked").read_text()
        left = sorted(p.name for p in (root / "exec").glob("*/checkpoint-*"))
        assert left == ["checkpoint-50", "checkpoint-60"], (left, res.stdout)
        assert "its processes are gone from" in res.stdout and f"pid {live.pid} still runs" in res.stdout, res.stdout
    finally:
        live.kill()
        live.wait()


def test_gc_dry_run_alone_shows_the_default_policy(root, three):
    """`gc ROOT --dry-run` without --keep-last shows what gc would do with the root's own
    policy (none recorded: every published save kept), instead of refusing; a real gc
    still needs --keep-last."""
    age(root / "exec")
    dry = cli("gc", root, "--dry-run", "--ceased", A, env={"PATH": "/nonexistent"})
    assert dry.returncode == 0, dry.stderr
    assert "every published save kept" in dry.stderr and f"exec/{A}/checkpoint-10" in dry.stdout, dry
    assert all(d.exists() for d in three.values())
    assert cli("gc", root).returncode == 2
