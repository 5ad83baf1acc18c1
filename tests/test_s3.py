"""What only an S3 root has: racing creators per server (moto's check-then-write and
Ceph RGW's atomic create), ListObjectsV2 pagination at 10^4 publications, watch on a
prefix (and a listing that hangs), env and submit with an s3:// root. The contract
both stores share is tests/test_store_contract.py."""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from dispatch_slurm import store
from dispatch_slurm.contract import names
from dispatch_slurm.errors import BadName
from dispatch_slurm.store import events
from support import cli

E1 = 1_000_000
A1 = f"c.1.{E1}"


@pytest.fixture(params=["moto", "ceph"])
def server(request, monkeypatch):
    """Each S3 server this machine can run, this process's env pointed at it."""
    srv = request.getfixturevalue(f"{request.param}_server")
    for key, value in srv.env.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "DISPATCH_ATTEMPT", "DISPATCH_EPOCH", "DISPATCH_CHECKPOINT"):
        monkeypatch.delenv(key, raising=False)
    return srv


def _put(srv, url, data=b"w"):
    bucket, key = names.split_s3(url)
    srv.client().put_object(Bucket=bucket, Key=key.rstrip("/"), Body=data)


def _race_publish(url, save, barrier, results):
    barrier.wait()
    try:
        res = store.publish(save, root=url, epoch=E1)  # the step its name says
        results.put("exists" if res.existed else "ok")
    except Exception as e:  # noqa: BLE001 -- any error is an outcome the test names
        results.put(f"error: {e}")


def _race_allocate(url, barrier, results):
    barrier.wait()
    results.put(store.allocate_submission(url))


def _race(target, args, n=16):
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    return got


def test_concurrent_publishers(server, capsys):
    """16 processes publish the same save at once, 10 rounds. Every one gets an answer
    and one entry exists. Exactly one wins on an atomic server (Ceph RGW); on moto,
    whose check and write are two steps, the winners are counted, not asserted."""
    url = f"s3://{server.bucket()}/run"
    winners = []
    for rnd in range(10):
        save = f"{url}/exec/{A1}/checkpoint-{rnd}"
        _put(server, f"{save}/model.bin")
        outcome = _race(_race_publish, (url, save))
        assert not [o for o in outcome if o.startswith("error")], outcome
        winners.append(outcome.count("ok"))
        assert len(store.publications(url)) == rnd + 1
    with capsys.disabled():
        print(f"\n  {server.name}: winners per round of 16 racing publishers: {winners}")
    assert min(winners) >= 1
    if server.atomic:
        assert winners == [1] * 10


def test_concurrent_submissions_get_distinct_numbers(server):
    if not server.atomic:
        pytest.skip("moto checks then writes: two submitters may both create one N (not atomic)")
    url = f"s3://{server.bucket()}/run"
    got = []
    for _ in range(4):
        got += _race(_race_allocate, (url,))
    assert sorted(got) == list(range(1, 65))


@pytest.mark.parametrize("server", ["ceph"], indirect=True)  # RGW lists 10^4 keys ~7x faster than moto
def test_pagination_at_ten_thousand_publications(server):
    """10^4 publications, 10 pages of ListObjectsV2: every one is read and parsed; a bad
    key on the last page is found; the latest is the true max."""
    url = f"s3://{server.bucket()}/run"
    bucket, prefix = names.split_s3(url)
    c = server.client()
    keys = [f"{prefix}pub/" + names.encode(E1 + i % 7, i, f"exec/c.{i % 7}.{E1 + i % 7}/checkpoint-{i}")
            for i in range(10_000)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: c.put_object(Bucket=bucket, Key=k, Body=b""), keys))
    for k in range(7):  # each epoch's claim, as env made it (latest reads the latest's)
        c.put_object(Bucket=bucket, Key=f"{prefix}epochs/{names.claim_name(E1 + k)}", Body=f"c.{k}.{E1 + k}\n".encode())
    pubs = store.publications(url)
    assert len(pubs) == 10_000 and len({p.name for p in pubs}) == 10_000
    assert store.latest(url) == max(pubs, key=lambda p: (p.epoch, p.step, p.name))
    assert store.latest(url).step == 9_995  # the greatest epoch (E1 + 6), then the greatest step
    c.put_object(Bucket=bucket, Key=f"{prefix}pub/zz-not-a-publication", Body=b"")  # sorts last
    with pytest.raises(BadName, match="'zz-not-a-publication'"):
        store.latest(url)
    c.put_object(Bucket=bucket, Key=f"{prefix}pub/sub/folder", Body=b"")  # a '/' in a key: never skipped
    c.delete_object(Bucket=bucket, Key=f"{prefix}pub/zz-not-a-publication")
    with pytest.raises(BadName, match="'sub/folder'"):
        store.latest(url)


# ---- watch on an S3 prefix -------------------------------------------------------

def _watch_env(srv, url, attempt=A1):
    base = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    return {**base, **srv.env, "DISPATCH_CHECKPOINT": url, "DISPATCH_EXEC_DIR": f"{url}/exec/{attempt}",
            "DISPATCH_EPOCH": str(E1), "DISPATCH_ATTEMPT": attempt}


def _watch(srv, url, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", *args], env=_watch_env(srv, url),
                          capture_output=True, text=True, timeout=timeout)


def test_watch_publishes_complete_saves_in_step_order(s3_env, s3_root):
    ex = f"{s3_root}/exec/{A1}"
    for step in (30, 7, 200):
        _put(s3_env, f"{ex}/checkpoint-{step}/model.bin")
        _put(s3_env, f"{ex}/checkpoint-{step}/trainer_state.json", b'{"global_step": %d}' % step)
    _put(s3_env, f"{ex}/checkpoint-40/model.bin")  # no trainer_state.json yet: incomplete
    _put(s3_env, f"{ex}/checkpoint-50/trainer_state.json", b'{"global_st')  # does not parse
    _put(s3_env, f"{ex}/notes.txt")
    out = _watch(s3_env, s3_root, "--once")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"published step {s} exec/{A1}/checkpoint-{s}" for s in (7, 30, 200)]
    _put(s3_env, f"{ex}/checkpoint-40/trainer_state.json", b"{}")
    again = _watch(s3_env, s3_root, "--once")
    assert again.stdout.splitlines() == [f"published step 40 exec/{A1}/checkpoint-40"]
    assert [p.step for p in store.publications(s3_root)] == [7, 30, 40, 200]
    assert [e["step"] for e in events.read(s3_root) if e["by"] == "watch"] == [7, 30, 200, 40]


def test_watch_marker_mode_while_running(s3_env, s3_root):
    """A running watch (polling, as on any S3 root) publishes each save once its marker
    object appears: a folder's <save>/DONE, a file's <save>.DONE."""
    ex = f"{s3_root}/exec/{A1}"
    proc = subprocess.Popen([sys.executable, "-m", "dispatch_slurm", "watch", "--marker", "DONE",
                             "--pattern", r"(?:checkpoint-|step_)([0-9]+)(?:\.pt)?", "--poll", "0.1"],
                            env=_watch_env(s3_env, s3_root), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _put(s3_env, f"{ex}/checkpoint-3/shard-0")
        _put(s3_env, f"{ex}/step_5.pt")
        _put(s3_env, f"{ex}/step_5.pt.DONE", b"")
        assert proc.stdout.readline() == f"published step 5 exec/{A1}/step_5.pt\n"
        _put(s3_env, f"{ex}/checkpoint-3/DONE", b"")
        assert proc.stdout.readline() == f"published step 3 exec/{A1}/checkpoint-3\n"
    finally:
        proc.kill()
        proc.communicate()
    assert [p.step for p in store.publications(s3_root)] == [3, 5]


def test_a_listing_that_does_not_finish_within_timeout_ends_watch(tmp_path):
    """The S3 server is stopped (SIGSTOP: it accepts, never answers) as a hung endpoint
    would be: the watch's listing cannot finish, and --timeout ends it with exit 2."""
    import s3server
    srv = s3server.start_moto()
    try:
        url = f"s3://{srv.bucket()}/run"
        _put(srv, f"{url}/exec/{A1}/checkpoint-1/DONE", b"")
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            out = _watch(srv, url, "--marker", "DONE", "--once", "--timeout", "2", timeout=60)
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        assert out.returncode == 2, out.stderr
        assert out.stderr.splitlines()[-1] == ("dispatch-slurm: error: a scan did not finish within --timeout "
                                               "(is the filesystem or the S3 endpoint hung?)")
    finally:
        srv.stop()


# ---- env, submit, latest --resume with an s3:// root -------------------------------

def test_env_submit_and_resume(s3_env, s3_root, tmp_path):
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nenv | grep ^DISPATCH_ | sort > \"$FAKE_OUT\"\necho 4242\n")
    fake.chmod(0o755)
    e = {"PATH": f"{fake.parent}:{os.environ['PATH']}", "FAKE_OUT": str(tmp_path / "out")}
    first = json.loads(cli("submit", s3_root + "/", "--json", "--", "job.sh", env=e, check=True).stdout)
    assert (first["submission"], first["root"]) == (1, s3_root)
    assert cli("submit", s3_root, "--", "job.sh", env=e, check=True).stdout.startswith("submitted job 4242 as "
                                                                                       "submission 2")
    job = {"DISPATCH_CHECKPOINT": s3_root, "DISPATCH_SUBMISSION": "2", "SLURM_JOB_ID": "77",
           "SLURM_CLUSTER_NAME": "c"}
    values = json.loads(cli("env", "--format", "json", env=job, check=True).stdout)
    attempt = f"c.77.{2 * 10**6}"
    assert values["DISPATCH_EXEC_DIR"] == f"{s3_root}/exec/{attempt}" and values["DISPATCH_EPOCH"] == "2000000"
    assert cli("latest", "--resume", env=job, check=True).stdout == ""
    _put(s3_env, f"{values['DISPATCH_EXEC_DIR']}/checkpoint-9/model.bin")
    cli("publish", f"{values['DISPATCH_EXEC_DIR']}/checkpoint-9", env={**job, **values}, check=True)
    assert cli("latest", "--resume", env=job, check=True).stdout == f"{values['DISPATCH_EXEC_DIR']}/checkpoint-9\n"
    nobucket = cli("env", env={**job, "DISPATCH_CHECKPOINT": "s3://no-such-bucket-here/run"})
    assert nobucket.returncode == 2 and "bucket does not exist" in nobucket.stderr
    assert nobucket.stdout.endswith("exit 2\n")  # the job script's eval stops there


def test_endpoint_and_profile_options(s3_env, s3_root, tmp_path):
    """--endpoint-url and --profile reach boto3 the way AWS_ENDPOINT_URL_S3 and
    AWS_PROFILE do (a profile from AWS_CONFIG_FILE/AWS_SHARED_CREDENTIALS_FILE)."""
    creds = tmp_path / "credentials"
    creds.write_text(f"[mine]\naws_access_key_id = {s3_env.env['AWS_ACCESS_KEY_ID']}\n"
                     f"aws_secret_access_key = {s3_env.env['AWS_SECRET_ACCESS_KEY']}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_DEFAULT_REGION="us-east-1")
    args = [sys.executable, "-m", "dispatch_slurm", "--endpoint-url", s3_env.endpoint, "--profile", "mine",
            "latest", s3_root, "--resume"]
    ok = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "", "")
    bad = subprocess.run(args[:5] + ["nobody"] + args[6:], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "nobody" in bad.stderr and len(bad.stderr.splitlines()) == 1


PREEMPTED = """
import os, time
from dispatch_slurm import install_preemption_handler
from dispatch_slurm.store import s3

def save(left):
    url = os.environ["DISPATCH_EXEC_DIR"] + "/checkpoint-12"
    bucket, key = s3.split(url)
    s3.client().put_object(Bucket=bucket, Key=key + "model.bin", Body=b"w")
    return url

install_preemption_handler(save, grace=30)
import faulthandler
faulthandler.enable()  # SIGABRT from the test (no save in time): the stacks on stderr
print("ready", flush=True)
time.sleep(120)
"""


def test_preemption_handler_saves_and_publishes_to_s3(s3_env, s3_root, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", PREEMPTED], env=_watch_env(s3_env, s3_root), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # (Not faulthandler.dump_traceback_later in the child: its watchdog thread, started just
    # before "ready", took the SIGTERM in the moment before it blocks every signal, 4 runs in
    # 30 under load; Python's C handler only flags it there and the main thread slept on.)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "dispatch-checkpoint-complete" in out, (out, err)
    assert store.latest(s3_root).path == f"exec/{A1}/checkpoint-12"
    assert [e["type"] for e in events.read(s3_root)] == ["preempt_signal", "published", "checkpoint_complete"]
    assert not list(tmp_path.iterdir()), "the handler wrote local files for an s3:// execution (its probe records)"


@pytest.mark.parametrize("cmd", [["run", "s3://some-bucket/run", "--", "job.sh"], ["plan", "s3://some-bucket/run"]])
def test_the_supervisor_refuses_an_s3_root_saying_why(cmd):
    proc = cli(*cmd)
    assert proc.returncode == 2 and "the supervisor needs a POSIX root" in proc.stderr


def test_report_reads_an_s3_root(s3_env, s3_root):
    """Two executions, each saving and publishing: the report finds them from the root
    alone (exec/ listing with LastModified, pub/, the event objects)."""
    a2 = f"c.2.{2 * 10**6}"
    for attempt, epoch, steps in ((A1, E1, (10, 20)), (a2, 2 * 10**6, (15,))):
        for step in steps:
            save = f"{s3_root}/exec/{attempt}/checkpoint-{step}"
            _put(s3_env, f"{save}/model.bin")
            store.publish(save, step, root=s3_root, epoch=epoch)
    r = json.loads(cli("report", s3_root, "--json", check=True).stdout)
    assert [(e["attempt"], e["max_step"]) for e in r["executions"]] == [(A1, 20), (a2, 15)]
    assert [p["step"] for p in r["publications"]] == [10, 20, 15]
    assert all(p["t"] is not None for p in r["publications"])
    assert {k: r["latest"][k] for k in ("step", "path", "exists")} == {"step": 15, "path": f"exec/{a2}/checkpoint-15", "exists": True}


@pytest.mark.parametrize("root, want", [
    ("s3://bkt/a/b/", ("s3://bkt/a/b", "bkt", "a/b/")),
    ("s3://bkt", ("s3://bkt", "bkt", "")),
    ("s3://my.bucket-1/x/task-%a", ("s3://my.bucket-1/x/task-%a", "my.bucket-1", "x/task-%a/")),
    ("s3://Bkt/a", "not an S3 bucket name"),
    ("s3://", "not an S3 bucket name"),
    ("s3://bkt//a", "names another prefix"),
    ("s3://bkt/a/../b", "names another prefix"),
    ("s3://bkt/./b", "names another prefix"),
    ("s3://bkt/%a/x", "%a outside the last component"),
])
def test_s3_roots_are_checked_not_rewritten(root, want):
    """On S3 'a//b' and 'a/b' are different keys: a root is refused, never normalized
    into another prefix (a trailing '/' aside)."""
    if isinstance(want, str):
        with pytest.raises(Exception, match=want):
            names.normalize_root(root)
        proc = cli("latest", root)
        assert proc.returncode == 2 and want in proc.stderr
        return
    assert (names.normalize_root(root), *names.split_s3(root)) == want
