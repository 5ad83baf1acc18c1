"""gc and the report's retention section on both stores: one story run on a POSIX root
and on an S3 root (moto's server, started by the tests), and the cessation evidence gc
asks for; then what only S3 has, on moto and on Ceph RGW: a gc that fails between
retiring and deleting, DeleteObjects' pagination, a file save. The POSIX-only safety
rules (symlinks, SIGKILL at random moments, ownership) are in tests/test_retention.py."""

from __future__ import annotations

import json
import time

import pytest
from support import cli
import test_s3
import test_store_contract as contract
from test_store_contract import S3

from dispatch_slurm import store
from dispatch_slurm.contract import names
from dispatch_slurm.retention.policy import Policy
from dispatch_slurm.errors import BadPath, StoreError
from dispatch_slurm.store import ceased as ceased_store
from dispatch_slurm import retention as gc
from dispatch_slurm.store import s3 as s3_store
from dispatch_slurm.slurm.cessation import executions as cessation_of

A, B, LIVE = "c.1.1000000", "c.2.2000000", "c.4.4000000"
LATER = time.time() + 3600  # "now" for decisions where --min-age must not matter


_outside_a_job, r = contract._outside_a_job, contract.r  # the same roots: a POSIX folder, an S3 prefix
server = test_s3.server


@pytest.fixture
def s3r(server):
    """An S3 root on each server this machine runs (test_s3.server): moto's, and Ceph
    RGW, a real implementation of DeleteObjects and the conditional PUT."""
    return S3(server, f"s3://{server.bucket()}/run1")


def _story(r) -> dict:
    """A (steps 10-30) and B (40, 50, and an unpublished checkpoint-70) have ceased; LIVE
    (80, 90) has not. Every save's path under the root."""
    saves = {}
    for attempt, steps in ((A, (10, 20, 30)), (B, (40, 50)), (LIVE, (80, 90))):
        for step in steps:
            rel = saves[(attempt, step)] = f"exec/{attempt}/checkpoint-{step}"
            store.publish(r.save(rel, ("model.bin", "optim.bin")), step, root=r.url,
                          epoch=names.attempt_epoch(attempt), sync=False)
    rel = saves[(B, 70)] = f"exec/{B}/checkpoint-70"
    r.save(rel, ("model.bin",))
    return saves


def _files(r) -> set[str]:
    """Every file of every save: exec/<attempt>/<save>/<file>."""
    return {f"exec/{f}" for f in r.listing("exec")} if isinstance(r, S3) else \
        {str(p.relative_to(r.path)) for p in (r.path / "exec").rglob("*") if p.is_file()}


def _gc(r, *ceased_, **policy):
    return {v.save.path: v for v in gc.collect(r.url, Policy(**{"min_age": 0, **policy}),
                                               {a: (True, "said by the test") for a in ceased_}, now=LATER)}


def _retired(r) -> set[str]:
    try:
        return {names.parse(e).path for e in r.listing("retired")}
    except FileNotFoundError:
        return set()


def test_keep_last_removes_exactly_the_older_saves_of_ceased_executions(r):
    saves = _story(r)
    before = _files(r)
    latest = store.latest(r.url)
    v = _gc(r, A, B, keep_last=3)
    gone = {saves[k] for k in ((A, 10), (A, 20), (A, 30), (B, 40), (B, 70))}
    assert {p for p, x in v.items() if x.action == "remove"} == gone
    assert "one of the 3 newest" in v[saves[(B, 50)]].why
    assert v[saves[(LIVE, 80)]].action == "keep"
    assert _files(r) == {f for f in before if not any(f.startswith(p + "/") for p in gone)}
    assert _retired(r) == gone
    assert all(v[p].freed == v[p].save.size > 0 for p in gone)
    if isinstance(r, S3):  # bytes stored, not blocks: 4 saves of two files, a leftover of one
        assert sum(v[p].freed for p in gone) == 4 * 200 + 100
    assert store.latest(r.url) == latest


def test_the_latest_publication_is_never_removed_nor_retired(r):
    saves = _story(r)
    latest = store.latest(r.url)
    v = _gc(r, A, B, LIVE, keep_last=1)
    assert v[latest.path].action == "keep" and v[latest.path].why == "the latest publication's save"
    assert latest.path not in _retired(r) and store.latest(r.url) == latest
    assert {f.split("/")[2] for f in _files(r)} == {"checkpoint-90"}
    assert _retired(r) == set(saves.values()) - {latest.path}


def test_latest_refuses_a_retired_latest_publication(r):
    _story(r)
    r.plant("retired", store.latest(r.url).name)  # by hand: gc never does this
    with pytest.raises(StoreError, match="the latest publication is retired"):
        store.latest(r.url)
    proc = cli("latest", r.url)
    assert proc.returncode == 2 and "the latest publication is retired" in proc.stderr


def test_dry_run_and_a_quiet_period_remove_nothing(r):
    _story(r)
    before = _files(r)
    v = gc.collect(r.url, Policy(keep_last=1, min_age=0), {A: (True, ""), B: (True, "")}, dry_run=True, now=LATER)
    assert sum(x.action == "remove" for x in v) == 6
    young = gc.collect(r.url, Policy(keep_last=1, min_age=3600), {A: (True, ""), B: (True, "")})
    assert not [x for x in young if x.action == "remove"]
    assert all("still being written" in x.why for x in young if x.save.attempt in (A, B))
    assert _files(r) == before and not _retired(r)


def test_pins_are_honoured(r):
    saves = _story(r)
    assert gc.pin(r.url, f"{r.url}/{saves[(A, 10)]}") == (saves[(A, 10)], True)
    assert gc.pin(r.url, f"{r.url}/exec/{B}") == (f"exec/{B}", True)
    assert gc.pin(r.url, f"{r.url}/exec/{B}")[1] is False
    v = _gc(r, A, B, keep_last=1)
    assert v[saves[(B, 40)]].why == "pinned" and v[saves[(A, 10)]].why == "pinned"
    assert _retired(r) == {saves[(A, 20)], saves[(A, 30)]}
    assert gc.unpin(r.url, f"{r.url}/exec/{B}") == (f"exec/{B}", True)
    assert gc.unpin(r.url, f"{r.url}/exec/{B}") == (f"exec/{B}", False)
    _gc(r, A, B, keep_last=1)
    assert saves[(A, 10)] in {f.rsplit("/", 1)[0] for f in _files(r)}
    assert not any(f.startswith(f"exec/{B}/") for f in _files(r))


def test_adopting_a_retired_save_is_refused(r, monkeypatch):
    saves = _story(r)
    _gc(r, A, B, keep_last=1)
    r.save(saves[(A, 10)])  # the save is back (a stray writer), its publication retired
    with pytest.raises(BadPath, match="gc retired it"):
        store.publish(f"{r.url}/{saves[(A, 10)]}", 95, root=r.url, epoch=names.attempt_epoch(LIVE), adopt=True)
    assert not r.listing("pinned"), "the refused adopter dropped its pin"
    monkeypatch.setenv("DISPATCH_ATTEMPT", f"c.5.{names.attempt_epoch(LIVE) + 1}")  # LIVE's requeue adopts
    adopted = store.publish(f"{r.url}/{saves[(LIVE, 80)]}", 95, root=r.url, epoch=names.attempt_epoch(LIVE) + 1,
                            adopt=True).publication
    assert store.latest(r.url) == adopted and not r.listing("pinned")


def test_the_cli_and_the_report(r):
    saves = _story(r)
    env = {"PATH": "/nonexistent"}  # no Slurm here: cessation cannot be shown but for --ceased
    dry = cli("gc", r.url, "--keep-last", "1", "--min-age", "0", "--dry-run", "--ceased", A, env=env, check=True)
    assert f"{saves[(A, 10)]}" in dry.stdout and "would remove" in dry.stdout and f"gc --ceased {B}" in dry.stdout
    assert not _retired(r)
    real = json.loads(cli("gc", r.url, "--keep-last", "1", "--min-age", "0", "--ceased", A, "--json", env=env,
                          check=True).stdout)
    assert {x["path"] for x in real if x["action"] == "remove"} == {saves[(A, s)] for s in (10, 20, 30)}
    rep = json.loads(cli("report", r.url, "--json", check=True).stdout)["retention"]
    assert rep["totals"]["retired"]["saves"] == 3 and rep["totals"]["kept"]["saves"] == 5
    assert rep["totals"]["kept"]["bytes"] >= 4 * 200 + 100
    assert {x["path"] for x in rep["saves"] if x["state"] == "retired"} == {saves[(A, s)] for s in (10, 20, 30)}
    text = cli("report", r.url, check=True).stdout
    assert "retention (no gc policy" in text and f"{saves[(LIVE, 90)]} (latest)" in text


# ---- what only S3 has ---------------------------------------------------------------------------------

def test_a_gc_failing_between_retiring_and_deleting_leaves_the_publications_retired(s3r, monkeypatch):
    saves = _story(s3r)
    before, latest = _files(s3r), store.latest(s3r.url)

    def refuse(*a, **kw):
        raise StoreError("the connection dropped (the test)")
    with monkeypatch.context() as m:
        m.setattr(s3_store, "delete", refuse)
        with pytest.raises(StoreError, match="connection dropped"):
            _gc(s3r, A, B, keep_last=3)
    gone = {saves[k] for k in ((A, 10), (A, 20), (A, 30), (B, 40), (B, 70))}
    assert _retired(s3r) == gone and _files(s3r) == before, "every marker first, no object deleted yet"
    assert store.latest(s3r.url) == latest
    rows = {x["path"]: x for x in gc.state(s3r.url)}
    assert all(rows[p]["retired"] and rows[p]["exists"] and rows[p]["state"] == "reclaimable" for p in gone)
    ls = {x["path"]: x["state"] for x in json.loads(cli("ls", s3r.url, "--json", check=True).stdout)}
    assert ls[latest.path] == "latest"
    assert {p for p, state in ls.items() if state == "retired"} == gone - {saves[(B, 70)]}  # B70: unpublished
    v = _gc(s3r, keep_last=3)  # no --ceased: a retired save's execution is known to have ceased
    assert {p for p, x in v.items() if x.action == "remove"} == gone
    assert not any(f.startswith(p + "/") for f in _files(s3r) for p in gone)


def test_a_save_of_more_than_a_thousand_objects_and_a_file_save(s3r):
    """DeleteObjects takes 1000 keys a request: a save of 1100 objects goes whole; a file
    save (one object) goes too, and not its namesake prefix checkpoint-10."""
    from concurrent.futures import ThreadPoolExecutor
    big = f"exec/{A}/checkpoint-1"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: s3r.c.put_object(Bucket=s3r.bucket, Key=f"{s3r.prefix}{big}/shard-{i:05}",
                                                 Body=b"x"), range(1100)))
    store.publish(f"{s3r.url}/{big}", 1, root=s3r.url, epoch=names.attempt_epoch(A))
    s3r.c.put_object(Bucket=s3r.bucket, Key=f"{s3r.prefix}exec/{A}/model-2.pt", Body=b"y" * 10)
    store.publish(f"{s3r.url}/exec/{A}/model-2.pt", 2, root=s3r.url, epoch=names.attempt_epoch(A))
    keep = s3r.save(f"exec/{A}/checkpoint-10")
    store.publish(keep, 10, root=s3r.url, epoch=names.attempt_epoch(A))
    v = _gc(s3r, A, keep_last=1)
    assert v[big].freed == 1100 and v[f"exec/{A}/model-2.pt"].freed == 10
    assert _files(s3r) == {f"exec/{A}/checkpoint-10/model.bin"}


def _epilog(r, attempt, node):
    """The Epilog's evidence: its own writer on POSIX; on S3 (no Epilog writes there) an
    object, as anything that has credentials for the bucket could put."""
    if isinstance(r, S3):
        r.plant("ceased", f"{attempt}.{node}")
    else:
        ceased_store.record(r.url, attempt, node)


def test_ceased_resolution_asks_slurm_with_the_record_and_keeps_what_it_cannot_show(r):
    """gc's cessation evidence on either store: Slurm says the job ended, and every node
    that ran it recorded its Epilog under ceased/ (or rebooted)."""
    from test_supervisor_rules import CLUSTER, FakeSlurm

    from dispatch_slurm.slurm.client import Slurm
    fake = FakeSlurm()
    fake.submitted(7)
    fake.start(7, ("c1", "c2"), t=2000)
    fake.end(7, "CANCELLED")
    mine = f"{CLUSTER}.7.1000000"
    _epilog(r, mine, "c1")
    got = cessation_of.ceased(r.url, [mine, f"{CLUSTER}.8.1000000", "other.7.1000000"], Slurm(fake))
    assert got[mine][0] is False and "no evidence from c2" in got[mine][1]
    assert got[f"{CLUSTER}.8.1000000"][0] is False and "unknown" in got[f"{CLUSTER}.8.1000000"][1]
    assert got["other.7.1000000"][0] is False and "cluster other" in got["other.7.1000000"][1]
    _epilog(r, mine, "c2")
    assert cessation_of.ceased(r.url, [mine], Slurm(fake))[mine][0] is True
    assert cessation_of.ceased(r.url, ["x.1.1000000"], Slurm(fake), said=["x.1.1000000"])["x.1.1000000"][0]


def test_a_save_whose_retired_key_would_be_over_s3s_limit_is_left_alone(s3_env):
    """retired/ is four bytes longer than pub/: a publication whose key just fits would
    have a marker S3 refuses, so gc leaves its save alone, before any PUT or delete."""
    name = names.encode(names.attempt_epoch(A), 10, f"exec/{A}/checkpoint-10")
    root = f"s3://{s3_env.bucket()}/" + "p" * (1024 - len(f"/pub/{name}"))
    r = S3(s3_env, root)
    for step in (10, 20):
        store.publish(r.save(f"exec/{A}/checkpoint-{step}"), step, root=root, epoch=names.attempt_epoch(A))
    v = _gc(r, A, keep_last=1)
    assert v[f"exec/{A}/checkpoint-10"].action == "keep" and "over S3's limit" in v[f"exec/{A}/checkpoint-10"].why
    assert len(_files(r)) == 2 and not _retired(r)
