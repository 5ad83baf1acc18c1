"""`dispatch-slurm watch`: the real CLI in subprocesses, on a real filesystem, with
inotify and with polling."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dispatch_slurm import store
from dispatch_slurm.runtime import watch
from dispatch_slurm.store import events
from dispatch_slurm.errors import DispatchError
from testbed.workload import safetensors

E1, E2 = 1_000_000, 2_000_000
# inotify: polls so rare that only inotify can publish in time; poll: frequent polls
MODES = {"inotify": ["--poll", "60"], "poll": ["--no-inotify", "--poll", "0.1"]}


def hf_save(exec_dir, step, state=True):
    d = exec_dir / f"checkpoint-{step}"
    d.mkdir()
    (d / "model.safetensors").write_bytes(safetensors(b"w" * 1000))
    if state:
        complete(d)
    return d


def complete(d):
    (d / watch.HF_STATE).write_text(json.dumps({"global_step": int(d.name.split("-")[1])}))


@pytest.fixture
def ex(root):
    d = root / "exec" / "c.1.1000000"
    d.mkdir(parents=True)
    return d


def env_for(root, ex, epoch=E1):
    base = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    return {**base, "DISPATCH_CHECKPOINT": str(root), "DISPATCH_EXEC_DIR": str(ex),
            "DISPATCH_EPOCH": str(epoch), "DISPATCH_ATTEMPT": ex.name}


def foreground_sigint() -> None:
    """SIGINT as a shell gives its foreground command: default and not blocked. A test run
    started in the background (`make test &`, a CI runner) ignores it, and a command keeps an
    ignored SIGINT ignored, as the shell expects of its background jobs; a thread of the test
    runner may fork with it blocked."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class Watch:
    """A running `dispatch-slurm watch`; its stdout lines arrive on a queue."""

    def __init__(self, root, ex, *args):
        self.proc = subprocess.Popen([sys.executable, "-m", "dispatch_slurm", "watch", *args],
                                     env=env_for(root, ex), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=foreground_sigint)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def next(self, timeout=20):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"watch printed nothing in {timeout}s (exit {self.proc.poll()})") from None

    def exit(self, timeout=20):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()  # why: its signals, its state
            signals = [line for line in status.splitlines() if line.startswith(("State", "Sig", "Shd"))]
            self.stop()
            raise AssertionError(f"watch did not exit within {timeout}s: {signals}; stderr: "
                                 f"{self.proc.stderr.read()[-2000:]!r}") from None
        return self.proc.returncode, self.proc.stderr.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def running(root, ex):
    started = []

    def make(*args):
        w = Watch(root, ex, *args)
        started.append(w)
        return w
    yield make
    for w in started:
        w.stop()


def steps(root):
    return [p.step for p in store.publications(root)]


@pytest.mark.parametrize("mode", MODES)
def test_incomplete_save_waits_for_trainer_state(root, ex, running, mode):
    w = running(*MODES[mode])
    early = hf_save(ex, 10, state=False)  # weights written, trainer_state.json not yet
    hf_save(ex, 20)
    assert w.next() == "published step 20 exec/c.1.1000000/checkpoint-20"
    # the scan that published 20 saw 10 too, and left it: incomplete
    assert steps(root) == [20]
    (early / watch.HF_STATE).write_text('{"global_st')  # half-written: still incomplete
    hf_save(ex, 30)
    assert w.next() == "published step 30 exec/c.1.1000000/checkpoint-30"
    assert steps(root) == [20, 30]
    complete(early)
    assert w.next() == "published step 10 exec/c.1.1000000/checkpoint-10"
    assert [(e["type"], e["step"], e["by"]) for e in events.read(root)] == [
        ("published", 20, "watch"), ("published", 30, "watch"), ("published", 10, "watch")]
    pub = store.latest(root)
    assert (pub.epoch, pub.step) == (E1, 30)


def test_once_publishes_in_step_order_and_skips_what_is_published(root, ex):
    order = (30, 10, 200, 20, 7, 1000, 90, 3, 55, 400, 12, 8)
    for s in order:
        hf_save(ex, s)
    hf_save(ex, 40, state=False)
    listed = [int(n.split("-")[1]) for n in os.listdir(ex) if n.startswith("checkpoint-")]
    assert listed != sorted(listed)  # the directory's own order is not the step order
    (ex / "notes.txt").write_text("not a save")
    (ex / "checkpoint-x").mkdir()
    store.publish(ex / "checkpoint-20", 20, root=root, epoch=E1)  # an earlier watch, or the trainer
    out = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once"],
                         env=env_for(root, ex), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    want = sorted(s for s in order if s != 20)
    assert out.stdout.splitlines() == [f"published step {s} exec/c.1.1000000/checkpoint-{s}" for s in want]
    assert steps(root) == sorted(order)
    again = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once"],
                           env=env_for(root, ex), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == ""


@pytest.mark.parametrize("mode", MODES)
def test_marker_mode_with_folders_files_and_a_pattern(root, ex, running, mode):
    w = running("--marker", "COMPLETE", "--pattern", r"step_([0-9]+)\.pt", *MODES[mode])
    (ex / "step_5.pt").write_bytes(b"weights")  # a file save: complete with step_5.pt.COMPLETE
    (ex / "step_9.pt").write_bytes(b"weights")
    (ex / "step_9.pt.COMPLETE").touch()
    assert w.next() == "published step 9 exec/c.1.1000000/step_9.pt"
    (ex / "step_5.pt.COMPLETE").touch()
    assert w.next() == "published step 5 exec/c.1.1000000/step_5.pt"


@pytest.mark.parametrize("mode", MODES)
def test_marker_mode_folder_saves(root, ex, running, mode):
    w = running("--marker", "DONE", *MODES[mode])
    d = ex / "checkpoint-3"
    d.mkdir()
    (d / "trainer_state.json").write_text("{}")  # not the marker
    (d / "shard-0").write_bytes(b"x")
    hf_save(ex, 4)  # HF-complete, but no marker
    (ex / "checkpoint-6").mkdir()
    (ex / "checkpoint-6" / "shard-0").write_bytes(b"x")  # a marker alone vouches for nothing yet
    (ex / "checkpoint-6" / "DONE").touch()
    assert w.next() == "published step 6 exec/c.1.1000000/checkpoint-6"
    (d / "DONE").touch()
    assert w.next() == "published step 3 exec/c.1.1000000/checkpoint-3"
    assert steps(root) == [3, 6]


@pytest.mark.parametrize("mode", MODES)
def test_until_pid_exits_after_a_final_scan(root, ex, tmp_path, mode):
    trainer = subprocess.Popen([sys.executable, "-c", (
        "import json, os, sys\n"
        "sys.stdin.readline()\n"  # wait for the test's go
        f"d = {str(ex)!r} + '/checkpoint-50'\n"
        "os.mkdir(d)\n"
        "open(d + '/trainer_state.json', 'w').write('{}')\n")], stdin=subprocess.PIPE, text=True)
    try:
        w = Watch(root, ex, "--until-pid", str(trainer.pid), *MODES[mode])
        hf_save(ex, 40)
        assert w.next() == "published step 40 exec/c.1.1000000/checkpoint-40"
        w.proc.send_signal(signal.SIGTERM)  # Slurm signals the whole step: the watch stays
        trainer.communicate("go\n", timeout=30)  # the last save, then the trainer exits
        rc, err = w.exit()
        assert rc == 0, err
        assert steps(root) == [40, 50]
    finally:
        trainer.kill()
        w.stop()


@pytest.mark.parametrize("mode", MODES)
def test_store_error_stops_watch_with_a_message(root, ex, running, mode):
    (root / "pub").write_text("not a folder")  # the root cannot take publications
    w = running(*MODES[mode])
    hf_save(ex, 10)
    rc, err = w.exit()
    assert rc == 2
    assert "pub is a symlink or not a directory" in err


def test_bad_entry_in_pub_stops_watch(root, ex):
    (root / "pub").mkdir()
    (root / "pub" / "latest").touch()
    hf_save(ex, 10)
    out = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch"], env=env_for(root, ex),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "bad entry 'latest'" in out.stderr
    assert os.listdir(root / "pub") == ["latest"]


def test_a_scan_that_hangs_is_an_error(root, ex):
    """A FIFO for trainer_state.json blocks open() as a hung filesystem would."""
    d = ex / "checkpoint-1"
    d.mkdir()
    os.mkfifo(d / watch.HF_STATE)
    out = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once", "--timeout", "0.5"],
                         env=env_for(root, ex), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "did not finish within --timeout" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["--pattern", "checkpoint-[0-9]+"], "exactly one group"),
    (["--pattern", "checkpoint-(["], "not a regular expression"),
    (["--marker", "a/b"], "plain file name"),
    (["--exec-dir", "/nonexistent/exec"], "does not exist"),
])
def test_bad_input_is_refused(root, ex, args, message):
    out = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once", *args],
                         env=env_for(root, ex), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_layout_and_vanished_saves(root, ex, monkeypatch):
    hf = watch.Layout()
    d = hf_save(ex, 1, state=False)
    assert not hf.complete(str(d), True, store.at(str(root)))
    (d / watch.HF_STATE).write_text("{")
    assert not hf.complete(str(d), True, store.at(str(root)))  # half-written
    complete(d)
    assert hf.complete(str(d), True, store.at(str(root)))
    assert hf.step("checkpoint-12") == 12 and hf.step("checkpoint-12.tmp") is None
    with pytest.raises(DispatchError, match="not a step number"):
        watch.Layout(pattern=r"checkpoint-(\w+)").step("checkpoint-abc")
    # a save rotated away between the listing and its publication is not an error
    w = watch.Watcher(str(ex), str(root), E1, hf)
    gone = hf_save(ex, 2)
    real = store.publish

    def rotate_then_publish(save, *a, **k):
        if save == str(gone):
            for f in gone.iterdir():
                f.unlink()
            gone.rmdir()
        return real(save, *a, **k)
    monkeypatch.setattr(store, "publish", rotate_then_publish)
    assert [p.step for p in w.scan()] == [1]
    assert steps(root) == [1]


def test_a_watch_told_before_it_began_scans_once_without_inotify(root, ex, monkeypatch):
    """A short step's publisher, told at its start that the step's tasks are gone, makes its
    one scan and returns without an inotify watch: closing one waits for the kernel's SRCU
    grace period, and the step's end waits for the publisher."""
    hf_save(ex, 3)
    r, w_end = os.pipe()
    os.close(w_end)

    def no_inotify(*a, **k):
        raise AssertionError("an inotify watch for a step already over")
    monkeypatch.setattr(watch, "_open_inotify", no_inotify)
    try:
        watch.run(watch.Watcher(str(ex), str(root), E1, watch.Layout()), linger=lambda: [], first_within=60.0,
                  told=r, say=lambda s: None)
    finally:
        os.close(r)
    assert steps(root) == [3]
    monkeypatch.undo()
    r, w_end = os.pipe()  # not told yet: it watches (and ends once told)
    opened = []
    real = watch._open_inotify
    monkeypatch.setattr(watch, "_open_inotify", lambda *a, **k: opened.append(1) or real(*a, **k))
    threading.Timer(0.2, os.close, (w_end,)).start()
    try:
        watch.run(watch.Watcher(str(ex), str(root), E1, watch.Layout()), linger=lambda: [], first_within=60.0,
                  told=r, say=lambda s: None)
    finally:
        os.close(r)
    assert opened == [1]


# ---- bad arguments refused at start; a rotation race is not an error -------------------------

@pytest.mark.parametrize("args, message", [
    (["--until-pid", "0"], "--until-pid"), (["--until-pid", "-1"], "--until-pid"),
    (["--timeout", "nan"], "--timeout"), (["--timeout", "inf"], "--timeout"), (["--poll", "nan"], "--poll"),
])
def test_arguments_that_would_hang_or_crash_are_refused(root, ex, args, message):
    out = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", *args],
                         env=env_for(root, ex), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_an_epoch_that_cannot_publish_fails_at_start_and_watch_says_what_it_watches(root, ex):
    n0 = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once"],
                        env=env_for(root, ex, epoch=5), capture_output=True, text=True, timeout=60)
    assert n0.returncode == 2 and "submission N=0" in n0.stderr
    other = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once"],
                           env=env_for(root, ex, epoch=E2), capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "could not be published" in other.stderr and f"epoch {E2}" in other.stderr
    hf_save(ex, 5, state=False)
    ok = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once"],
                        env=env_for(root, ex), capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and f"watching {ex}" in ok.stderr and f"at epoch {E1}" in ok.stderr
    assert "nothing complete to publish" in ok.stderr and "checkpoint-5" in ok.stderr


WORKLOAD = os.path.join(os.path.dirname(__file__), "testbed", "workload.py")


@pytest.mark.parametrize("run", range(20))
def test_watch_survives_the_trainers_rotation(root, ex, tmp_path, run):
    """A trainer saving 300-file saves with save_total_limit=1 deletes each
    save right after the next one, while watch fsyncs it. Watch never fails on that, and
    every save that survived rotation is published (the last one above all)."""
    env = {**env_for(root, ex), "SLURM_JOB_ID": "1", "DISPATCH_EPOCH": str(E1)}
    trainer = subprocess.Popen([sys.executable, WORKLOAD, "--mode", "dispatch", "--no-publish", "--log-dir",
                                str(tmp_path / "logs"), "--interval", "0.02", "--keep", "1", "--shards", "300",
                                "--max-saves", "8"], env=env)
    w = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--until-pid", str(trainer.pid)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert trainer.wait(60) == 0
    assert w.returncode == 0, w.stderr
    survivors = {int(p.name.split("-")[1]) for p in ex.iterdir() if p.name.startswith("checkpoint-")}
    published = {p.step for p in store.publications(root)}
    assert survivors and survivors <= published, f"not published: {survivors - published}"
    assert store.latest(root).step == max(survivors) == 80


# ---- unfinished saves named while the watch runs; Ctrl-C; the exec folder checked at start ----

def test_a_save_left_incomplete_is_named_while_the_watch_runs(root, ex, running):
    """Named once it has been incomplete for --incomplete-after seconds, not before (a save
    being written is no problem); one line per save, with what it lacks and the fix."""
    w = running("--incomplete-after", "0.5", "--no-inotify", "--poll", "0.1")
    (ex / "checkpoint-10").mkdir()
    (ex / "checkpoint-10" / "model.pt").write_bytes(b"not a zip")
    hf_save(ex, 20)
    assert w.next() == "published step 20 exec/c.1.1000000/checkpoint-20"
    deadline = time.monotonic() + 30
    err = ""
    while "checkpoint-10 is not complete after" not in err and time.monotonic() < deadline:
        err += w.proc.stderr.readline()
    assert "checkpoint-10 is not complete after" in err and "(no trainer_state.json)" in err, err
    assert "watch --marker NAME" in err and w.proc.poll() is None, "named while running, not at the end"


def test_once_names_a_marker_only_save_as_incomplete(root, ex):
    """A marker written before anything else: there is nothing yet it could vouch for."""
    (ex / "checkpoint-3").mkdir()
    (ex / "checkpoint-3" / "DONE").touch()
    out = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once", "--marker", "DONE"],
                         env=env_for(root, ex), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "1 incomplete: checkpoint-3" in out.stderr, out.stderr
    assert store.latest(root) is None
    (ex / "checkpoint-3" / "state.bin").write_bytes(b"w")
    subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once", "--marker", "DONE"],
                   env=env_for(root, ex), check=True, capture_output=True, timeout=60)
    assert store.latest(root).step == 3


JOB = """
"{py}" -c 'import time; time.sleep(600)' & T=$!
"{py}" -m dispatch_slurm watch --until-pid $T
wait $T
touch "{after}"
"""


def test_ctrl_c_stops_the_job_script_instead_of_running_on(root, ex, tmp_path):
    """Under job control: the script starts with SIGINT at its default (as in
    a terminal), Ctrl-C reaches the whole process group. bash makes the `&` trainer ignore it;
    the watch must die by SIGINT, so bash stops there. Before: watch exited 130 and bash went
    on to `wait $T` (the trainer trained on, unpublished) and the next line."""
    after = tmp_path / "ran-on"
    script = JOB.format(py=sys.executable, after=after)
    err = tmp_path / "err"
    with open(err, "w") as e:
        sh = subprocess.Popen(["bash", "-c", script], env=env_for(root, ex), stderr=e, start_new_session=True,
                              preexec_fn=foreground_sigint)
    try:
        deadline = time.monotonic() + 60
        while "dispatch-slurm watch: watching" not in err.read_text():
            assert time.monotonic() < deadline and sh.poll() is None, err.read_text()
            time.sleep(0.05)
        os.killpg(sh.pid, signal.SIGINT)
        rc = sh.wait(30)
    finally:
        trainer = [int(p) for p in os.listdir("/proc") if p.isdigit() and _in_group(int(p), sh.pid)]
        for pid in trainer:
            os.kill(pid, signal.SIGKILL)
        if sh.poll() is None:
            os.killpg(sh.pid, signal.SIGKILL)
    assert not after.exists(), "bash ran on after Ctrl-C: the watch did not die by SIGINT"
    assert rc in (-signal.SIGINT, 128 + signal.SIGINT), rc


def _in_group(pid: int, pgid: int) -> bool:
    try:
        return os.getpgid(pid) == pgid
    except ProcessLookupError:
        return False


def test_the_watch_itself_dies_by_sigint(root, ex):
    w = Watch(root, ex)
    try:
        assert "watching" in w.proc.stderr.readline()
        w.proc.send_signal(signal.SIGINT)
        rc, err = w.exit()
    finally:
        w.stop()
    assert rc == -signal.SIGINT, (rc, err)


@pytest.mark.parametrize("how", ["node-local link", "exec/ linked", "another epoch", "outside"])
def test_an_exec_folder_whose_saves_could_not_be_published_is_refused_at_start(root, ex, tmp_path, how):
    """Before, a symlinked exec folder was refused as "not inside the checkpoint
    root", which is not what is wrong."""
    local = tmp_path / "node-local"
    local.mkdir()
    env = env_for(root, ex)
    if how == "node-local link":
        ex.rmdir()
        ex.symlink_to(local)
        want = [f"{ex} is a symlink to {local}, outside the checkpoint root", "node-local"]
    elif how == "exec/ linked":
        (local / ex.name).mkdir()
        ex.rmdir()
        (root / "exec").rmdir()
        (root / "exec").symlink_to(local)
        want = [f"{root}/exec is a symlink to {local}", "node-local"]
    elif how == "another epoch":
        env["DISPATCH_EPOCH"] = str(E2)
        want = ["could not be published at epoch 2000000", "was $DISPATCH_EPOCH changed after `dispatch-slurm env`"]
    else:
        env["DISPATCH_EXEC_DIR"] = str(local)
        want = ["is not inside the checkpoint root", "the folder `dispatch-slurm env` made"]
    out = subprocess.run([sys.executable, "-m", "dispatch_slurm", "watch", "--once"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    for w in want:
        assert w in out.stderr, out.stderr
