"""The preemption handler in real child processes, driven by real signals."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dispatch_slurm import store
from dispatch_slurm.runtime import preempt
from dispatch_slurm.store import events
from testbed import wait
from dispatch_slurm.errors import DispatchError

E1 = 1_000_000
SENTINEL = "dispatch-checkpoint-complete"

CHILD = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    from dispatch_slurm import install_preemption_handler, preemption_point, time_remaining
    cfg = json.loads(sys.argv[1])
    out = cfg["out"]
    calls, lock, state = [], threading.Lock(), {"a": 0, "b": 0}

    def spin(seconds):  # work inside the save, not synchronisation
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    def save(left):
        calls.append(left)
        if cfg.get("resignal"):
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal while saving
        with lock:  # deadlocks if the save runs while the loop holds the lock
            t0 = time_remaining()
            spin(0.2)
            t1 = time_remaining()
            with open(os.path.join(out, "fn.json"), "w") as f:
                json.dump({"arg": left, "t0": t0, "t1": t1, "before": BEFORE, "calls": len(calls),
                           "a": state["a"], "b": state["b"]}, f)
        if cfg.get("raise"):
            raise RuntimeError("disk full (test)")
        path = os.path.join(cfg["exec"], "checkpoint-7")
        os.makedirs(path)
        with open(os.path.join(path, "state.bin"), "wb") as f:
            f.write(b"weights")
        return path

    install_preemption_handler(save, signals=[getattr(signal, s) for s in cfg["signals"]],
                               grace=cfg.get("grace"), defer=cfg.get("defer", False))
    BEFORE = time_remaining()  # installed, no signal yet
    if cfg.get("midline"):  # the signal finds the program in the middle of a line
        sys.stdout.write("progress: 41%")
        sys.stdout.flush()
    open(os.path.join(out, "ready"), "w").close()
    while True:
        if not cfg.get("midline"):
            print("training", flush=True)
        if cfg.get("defer"):
            with lock:  # one step: a and b move together, under the lock
                state["a"] += 1
                spin(0.05)
                state["b"] += 1
            preemption_point()
        else:
            time.sleep(0.01)
""")


def start(tmp_path, root, env=None, blocked=(), **cfg):
    exec_dir = root / "exec" / "c.1.1000000"
    exec_dir.mkdir(parents=True, exist_ok=True)
    cfg = {"out": str(tmp_path), "exec": str(exec_dir), "signals": ["SIGTERM"], **cfg}
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "RANK", "SLURM_"))}
    e = {**base, "DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": str(E1),
         "DISPATCH_ATTEMPT": "c.1.1000000", "SLURM_JOB_ID": "42", **(env or {})}
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(cfg)], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, blocked)) if blocked else None)

    def ready():
        if proc.poll() is not None:
            raise AssertionError(f"child exited {proc.returncode} early: {proc.stderr.read()}")
        return (tmp_path / "ready").exists()
    wait.until(ready, timeout=30, what="the child to install its handler", every=0.05)
    return proc


def finish(proc, timeout=30):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"child did not exit within {timeout}s (deadlock?): {err}")
    return proc.returncode, out, err


def fn_record(tmp_path):
    return json.loads((tmp_path / "fn.json").read_text())


def test_sigterm_saves_publishes_prints_sentinel_and_exits_0(tmp_path, root):
    proc = start(tmp_path, root)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out.splitlines()[-1] == SENTINEL and out.count(SENTINEL) == 1
    save = root / "exec" / "c.1.1000000" / "checkpoint-7"
    assert (save / "state.bin").read_bytes() == b"weights"
    pub = store.latest(root)
    assert (pub.epoch, pub.step, pub.path) == (E1, 7, "exec/c.1.1000000/checkpoint-7")
    evs = events.read(root)
    assert [e["type"] for e in evs] == ["preempt_signal", "published", "checkpoint_complete"]
    assert all(e["v"] == 1 and e["job"] == "42" and e["attempt"] == "c.1.1000000" and e["epoch"] == E1
               and e["pid"] == proc.pid for e in evs)
    assert evs[0]["signal"] == "SIGTERM" and evs[0]["grace"] == 60
    assert evs[1]["step"] == 7 and evs[1]["by"] == "preempt"
    assert 0 < evs[2]["time_remaining"] <= 60 and evs[2]["elapsed"] >= 0.2


def test_a_signal_blocked_in_the_inherited_mask_still_saves(tmp_path, root):
    """A launcher (or a test runner's thread) may start the trainer with SIGTERM blocked:
    the handler would be installed and never run. Installing it unblocks its signals."""
    proc = start(tmp_path, root, blocked={signal.SIGTERM})
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc, timeout=20)
    assert rc == 0 and out.splitlines()[-1] == SENTINEL, err
    assert store.latest(root).step == 7


def test_sentinel_is_on_a_line_of_its_own(tmp_path, root):
    proc = start(tmp_path, root, midline=True)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out.splitlines() == ["progress: 41%", SENTINEL]


def test_failing_save_exits_1_with_the_error_and_no_sentinel(tmp_path, root):
    proc = start(tmp_path, root, **{"raise": True})
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 1
    assert SENTINEL not in out
    assert "RuntimeError: disk full (test)" in err
    assert store.latest(root) is None
    assert [e["type"] for e in events.read(root)] == ["preempt_signal"]


def test_time_remaining_counts_down_from_the_env_grace(tmp_path, root):
    proc = start(tmp_path, root, env={"DISPATCH_GRACE_S": "123"})
    proc.send_signal(signal.SIGTERM)
    rc, _, err = finish(proc)
    assert rc == 0, err
    r = fn_record(tmp_path)
    assert r["before"] == 123  # before any signal: the full grace
    assert 118 < r["arg"] <= 123
    assert r["t0"] <= r["arg"] and r["t0"] - r["t1"] >= 0.19  # live: 0.2 s of work in between


def test_grace_argument_overrides_the_env(tmp_path, root):
    proc = start(tmp_path, root, env={"DISPATCH_GRACE_S": "123"}, grace=7)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc)[0] == 0
    r = fn_record(tmp_path)
    assert r["before"] == 7 and 2 < r["arg"] <= 7


def test_configured_usr1_works_and_sigterm_is_left_alone(tmp_path, root):
    proc = start(tmp_path, root, signals=["SIGUSR1"])
    proc.send_signal(signal.SIGUSR1)
    rc, out, err = finish(proc)
    assert rc == 0 and out.splitlines()[-1] == SENTINEL, err
    assert events.read(root)[0]["signal"] == "SIGUSR1"

    other = tmp_path / "other"
    other.mkdir()
    proc = start(other, root, signals=["SIGUSR1"])
    proc.send_signal(signal.SIGTERM)
    rc, out, _ = finish(proc)
    assert rc == -signal.SIGTERM and SENTINEL not in out


@pytest.mark.parametrize("rank_env, published", [({"RANK": "1"}, False), ({"SLURM_PROCID": "3"}, False),
                                                 ({"RANK": "0", "SLURM_PROCID": "5"}, True)])
def test_only_the_publishing_rank_publishes(tmp_path, root, rank_env, published):
    proc = start(tmp_path, root, env=rank_env)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 0 and SENTINEL in out, err
    assert (root / "exec" / "c.1.1000000" / "checkpoint-7").is_dir()  # every rank's save ran
    assert (store.latest(root) is not None) == published


def test_deferred_save_runs_between_steps(tmp_path, root):
    """The loop holds a lock for most of each step; an immediate save would deadlock on it
    and would see a half-done step (a != b). Deferred, it runs at preemption_point()."""
    proc = start(tmp_path, root, defer=True)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 0 and SENTINEL in out, err
    r = fn_record(tmp_path)
    assert r["a"] == r["b"] >= 1


def test_second_signal_during_the_save_is_ignored(tmp_path, root):
    proc = start(tmp_path, root, resignal=True)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 0 and out.count(SENTINEL) == 1, err
    assert fn_record(tmp_path)["calls"] == 1
    assert [e["type"] for e in events.read(root)].count("preempt_signal") == 1


def test_grace_is_validated(monkeypatch):
    monkeypatch.setenv("DISPATCH_GRACE_S", "90")
    assert preempt.resolve_grace() == 90 and preempt.resolve_grace(5) == 5
    monkeypatch.delenv("DISPATCH_GRACE_S")
    assert preempt.resolve_grace() == 60  # the site default
    for bad in ("abc", "301", "-1"):
        monkeypatch.setenv("DISPATCH_GRACE_S", bad)
        with pytest.raises(DispatchError, match="DISPATCH_GRACE_S"):
            preempt.resolve_grace()
    with pytest.raises(DispatchError, match="grace"):
        preempt.resolve_grace(1000)
    with pytest.raises(DispatchError, match="catchable"):
        preempt.install_preemption_handler(lambda left: None, signals=[signal.SIGKILL], grace=5)


def test_events_one_file_per_process_merged_by_time(root, monkeypatch):
    monkeypatch.setenv("DISPATCH_CHECKPOINT", str(root))
    monkeypatch.setenv("DISPATCH_ATTEMPT", "c.1.1000000")
    monkeypatch.setenv("DISPATCH_EPOCH", str(E1))
    events.emit("execution_started", argv=["a"])
    code = "from dispatch_slurm.store import events; events.emit('hold', reason='shared checkpoint')"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={**os.environ, "DISPATCH_ATTEMPT": "c.1.1000001"})
    events.emit("execution_ended", exit=0)
    files = sorted(os.listdir(root / "events"))
    assert len(files) == 2 and all(f.endswith(".jsonl") for f in files)
    evs = events.read(str(root))
    assert [e["type"] for e in evs] == ["execution_started", "hold", "execution_ended"]
    assert evs[1]["attempt"] == "c.1.1000001" and evs[1]["pid"] != os.getpid()
    assert [e["t"] for e in evs] == sorted(e["t"] for e in evs)
    with pytest.raises(ValueError, match="unknown event type"):
        events.emit("started")
    with open(root / "events" / files[0], "a") as f:
        f.write('{"v": 1, "t": 1')  # a torn line
    with pytest.raises(DispatchError, match=rf"{files[0]}:3: not an event"):
        events.read(str(root))
    monkeypatch.delenv("DISPATCH_CHECKPOINT")
    assert events.emit("execution_started") is None  # outside dispatch: nowhere to write


def test_a_kept_events_file_removed_renamed_or_closed_under_it_loses_no_event(root, monkeypatch, tmp_path):
    """A process keeps its own root's events file open (an event is one write); a file a
    person removed, one renamed away (NFS renames an open file that is removed to .nfsXXXX),
    or an fd closed and its number reused, is opened again: every event lands in events/."""
    from dispatch_slurm.store import durable
    monkeypatch.setattr(durable, "_kept", {})  # this worker's earlier tests kept their own roots'
    monkeypatch.setenv("DISPATCH_CHECKPOINT", str(root))
    monkeypatch.setenv("DISPATCH_ATTEMPT", "c.1.1000000")
    events.emit("execution_started", argv=["a"])
    (name,) = os.listdir(root / "events")
    os.unlink(root / "events" / name)  # a person cleans events/
    events.emit("hold", reason="one")
    assert [e["type"] for e in events.read(str(root))] == ["hold"]
    os.rename(root / "events" / name, tmp_path / ".nfs0001")  # what NFS does with an open file removed
    events.emit("release", by="two")
    assert [e["type"] for e in events.read(str(root))] == ["release"]
    assert b"release" not in (tmp_path / ".nfs0001").read_bytes()
    (fd, _, _) = durable._kept[str(root / "events" / name)]
    elsewhere = os.open(tmp_path / "someone-elses", os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(elsewhere, fd)  # the kept fd closed, its number now another file's
    os.close(elsewhere)
    try:
        events.emit("hold", reason="three")
        assert (tmp_path / "someone-elses").read_bytes() == b""
        os.fstat(fd)  # still the other file's, left open
    finally:
        os.close(fd)
    assert [e["type"] for e in events.read(str(root))] == ["release", "hold"]


def test_only_the_processs_own_root_keeps_its_events_file_open(tmp_path, monkeypatch):
    """A supervisor writes to every root it follows: those files are opened and closed per
    event; only $DISPATCH_CHECKPOINT's (a trainer's, a watch's, written at every save) is kept."""
    from dispatch_slurm.store import durable
    monkeypatch.setattr(durable, "_kept", {})
    roots = [tmp_path / f"r{i}" for i in range(3)]
    monkeypatch.setenv("DISPATCH_CHECKPOINT", str(roots[0]))
    monkeypatch.setenv("DISPATCH_ATTEMPT", "c.1.1000000")
    for r in roots:
        r.mkdir()
        events.emit("hold", root=str(r), reason="many")
    assert [os.path.dirname(os.path.dirname(p)) for p in durable._kept] == [str(roots[0])]
    assert all([e["type"] for e in events.read(str(r))] == ["hold"] for r in roots)
    for fd, _, _ in durable._kept.values():
        os.close(fd)


WORKERS = textwrap.dedent("""
    import json, multiprocessing, os, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from dispatch_slurm import install_preemption_handler, preemption_point
    cfg = json.loads(sys.argv[1])
    step = 0

    class Slow(Dataset):  # the workers are mid-batch when the signal comes
        def __len__(self):
            return 10 ** 6
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.full((4,), float(i))

    def save(left):
        path = os.path.join(os.environ["DISPATCH_EXEC_DIR"], f"checkpoint-{step}")
        os.makedirs(path)
        time.sleep(0.5)  # work inside the save: a worker's death would land in it
        torch.save({"step": step, "pid": os.getpid()}, os.path.join(path, "state.pt"))
        return path

    def own_child(running=None):  # the trainer's own multiprocessing child: it inherits the handler too
        if running is not None:
            running.set()
        while True:
            time.sleep(0.01)

    install_preemption_handler(save, defer=cfg["defer"])
    fork = multiprocessing.get_context("fork")
    fork.Process(target=own_child, daemon=True).start()
    if cfg.get("terminate"):  # a child its own parent stops: not the step's signal
        running = fork.Event()  # a signal in the instant after fork is dropped by CPython itself
        p = fork.Process(target=own_child, args=(running,), daemon=True)
        p.start()
        running.wait(30)
        t0 = time.monotonic()
        p.terminate()
        p.join(30)
        print(f"terminated {p.exitcode} {time.monotonic() - t0:.2f}", flush=True)
    for x in DataLoader(Slow(), batch_size=8, num_workers=2, multiprocessing_context=fork):
        torch.nn.functional.linear(x, torch.ones(1, 4))
        step += 1
        if step == 3:
            open(os.path.join(cfg["out"], "ready"), "w").close()
        preemption_point()
""")


def signal_the_step(tmp_path, root, **cfg):
    """WORKERS in a session of its own, SIGTERM to every process of it once it trains (what
    Slurm's linuxproc tracking and `dispatch-slurm launch` do: each process of the step, the
    DataLoader's workers and the trainer's own children included). Returns (exit status, the
    pids besides the trainer's that got it, stdout, stderr); every process is gone after."""
    from dispatch_slurm.runtime.launch import descendants
    exec_dir = root / "exec" / "c.1.1000000"
    exec_dir.mkdir(parents=True)
    (tmp_path / "trainer.py").write_text(WORKERS)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "RANK", "SLURM_"))}
    env = {**base, "DISPATCH_CHECKPOINT": str(root), "DISPATCH_EXEC_DIR": str(exec_dir), "DISPATCH_EPOCH": str(E1),
           "DISPATCH_ATTEMPT": "c.1.1000000", "SLURM_JOB_ID": "42"}
    with open(tmp_path / "stdout", "w+") as out, open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen([sys.executable, str(tmp_path / "trainer.py"), json.dumps({"out": str(tmp_path), **cfg})],
                                env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            wait.until(lambda: proc.poll() is not None or (tmp_path / "ready").exists(), timeout=60,
                       what="the trainer to train with its workers", every=0.05)
            others = descendants(proc.pid)
            os.killpg(proc.pid, signal.SIGTERM)
            rc = proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # what the step's end does to what is left
            proc.wait()
        return rc, others, (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()


@pytest.mark.parametrize("defer", [True, False], ids=["deferred", "in-handler"])
def test_the_steps_signal_saves_once_in_the_installing_process_not_in_its_workers(tmp_path, root, defer):
    """Slurm signals every process of the step: the DataLoader's workers and the trainer's own
    forked child inherit the handler. Only the process that installed it saves, publishes, prints
    the sentinel and records events; the workers outlive the signal, so the DataLoader never
    raises "worker killed by signal" in the trainer before its save is published."""
    pytest.importorskip("torch")
    rc, others, out, err = signal_the_step(tmp_path, root, defer=defer)
    assert len(others) >= 3, others  # two loader workers and the trainer's own child got it too
    assert rc == 0 and out.count(SENTINEL) == 1, err[-3000:]
    assert "killed by signal" not in err and "exited unexpectedly" not in err, err[-3000:]
    (pub,) = store.publications(root)
    import torch
    evs = events.read(root)
    assert [e["type"] for e in evs] == ["preempt_signal", "published", "checkpoint_complete"]
    assert {e["pid"] for e in evs} == {evs[0]["pid"]} and evs[0]["pid"] not in others
    saved = torch.load(os.path.join(root, pub.path, "state.pt"))
    assert saved["pid"] == evs[0]["pid"] and pub.step == saved["step"]
    probes = os.listdir(root / "exec" / "c.1.1000000" / "dispatch-probe")
    assert probes == [f"{os.uname().nodename}.{evs[0]['pid']}.jsonl"]


def test_a_forked_child_its_parent_terminates_still_dies_of_it(tmp_path, root):
    """A signal for one child alone (multiprocessing's terminate(), a pool closing) is not the
    step's: the child dies of it at once, as it would without the handler, and records nothing."""
    pytest.importorskip("torch")
    rc, _, out, err = signal_the_step(tmp_path, root, defer=True, terminate=True)
    assert rc == 0, err[-3000:]
    (line,) = [x for x in out.splitlines() if x.startswith("terminated")]
    code, seconds = line.split()[1:]
    assert int(code) == -signal.SIGTERM and float(seconds) < 5, line
    assert [e["type"] for e in events.read(root)] == ["preempt_signal", "published", "checkpoint_complete"]


def test_linger_stays_until_the_scheduler_kills(tmp_path, root):
    """Slurm 22.05 requeues a preempted job only if it is still running when the grace
    ends: with linger, the save is published and the sentinel printed, then the process
    stays (a second SIGTERM included) until SIGKILL."""
    proc = start(tmp_path, root, env={"DISPATCH_PREEMPT_LINGER": "1"})
    proc.send_signal(signal.SIGTERM)
    lines = iter(proc.stdout.readline, "")
    assert any(line.strip() == SENTINEL for line in lines)
    assert store.latest(root).path == "exec/c.1.1000000/checkpoint-7"
    proc.send_signal(signal.SIGTERM)  # what Slurm sends again when the grace ends
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=2)  # an exiting handler would be gone well within this
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL
