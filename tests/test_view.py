"""The view's two halves, ``dispatch-slurm view prepare`` and ``view publish``, as the plugin runs
them: as the job user (nobody), on a real filesystem, the trainer in a real mount namespace where
the view folder is the execution's own (tests/testbed/viewbed.py does what the plugin does).

prepare: per framework, the latest publication lands under the name the framework looks for,
made of links to the published, read-only files (a write into one fails, the published save is
unchanged), with the framework's pointer written fresh; once per execution, whatever races it.
publish: each framework's completion rule, read from real saves' layouts; never what prepare
placed; the end with the execution's processes; one per node; what it leaves unpublished named."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import pytest

from dispatch_slurm import store, view
from dispatch_slurm.contract import layout
from dispatch_slurm.store import events
from testbed import viewbed, wait

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"),
                                reason="the view needs root for its mount namespace and a job user to drop to")


def _torch_save(path: pathlib.Path, obj) -> None:
    import torch
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)


def _write(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _mine(folder: str) -> None:
    """The job user's, as its trainer would have written them."""
    for d, dirs, files in os.walk(folder):
        for n in [d, *(os.path.join(d, f) for f in dirs + files)]:
            os.chown(n, *viewbed.USER, follow_symlinks=False)


def _ds_states(world: int) -> dict:
    import torch
    return {"module": {"w": torch.ones(2)}, "dp_world_size": world, "mp_world_size": 1, "global_steps": 4}


# what each framework writes for its save of step 4 (relative to the folder it saves into), the
# save's path there, and the pointer it resumes through (and what it holds)
SAVES = {
    "huggingface": (lambda d: (_torch_save(d / "checkpoint-4/pytorch_model.bin", {"w": 1}),
                               _write(d / "checkpoint-4/trainer_state.json", b'{"global_step": 4}')),
                    "checkpoint-4", None),
    "torchtitan": (lambda d: (_write(d / "checkpoint/step-4/__0_0.distcp", b"shard"),
                              _write(d / "checkpoint/step-4/.metadata", b"meta")),
                   "checkpoint/step-4", None),
    "deepspeed": (lambda d: (_torch_save(d / "global_step4/mp_rank_00_model_states.pt", _ds_states(2)),
                             _torch_save(d / "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt", {"o": 0}),
                             _torch_save(d / "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt", {"o": 1}),
                             _write(d / "latest", b"global_step4")),
                  "global_step4", ("latest", b"global_step4")),
    "megatron": (lambda d: (_write(d / "iter_0000004/__0_0.distcp", b"shard"),
                            _write(d / "iter_0000004/.metadata", b"meta"),
                            _write(d / "iter_0000004/metadata.json", b'{"sharded_backend": "torch_dist"}'),
                            _write(d / "latest_checkpointed_iteration.txt", b"4")),
                 "iter_0000004", ("latest_checkpointed_iteration.txt", b"4")),
    "lightning": (lambda d: (_torch_save(d / "ckpts/epoch=1-step=4.ckpt", {"state_dict": {}, "global_step": 4}),
                             _torch_save(d / "ckpts/last.ckpt", {"state_dict": {}, "global_step": 4})),
                  "ckpts/epoch=1-step=4.ckpt", ("ckpts/last-v0.ckpt", None)),
    "torch.save": (lambda d: _torch_save(d / "checkpoint-4.pt", {"model": {}, "step": 4}), "checkpoint-4.pt", None),
}


def _published(bed: viewbed.Bed, framework: str) -> tuple[viewbed.Execution, str]:
    """Execution A saves step 4 the framework's way and publishes it (as `view publish` would)."""
    a = bed.execution("A")
    make, where, _ = SAVES[framework]
    make(pathlib.Path(a.exec_dir))
    _mine(a.exec_dir)
    env = {**bed.env, **a.values, "DISPATCH_VIEW": str(bed.view)}
    got = bed.cli("publish", os.path.join(a.exec_dir, where), "--step", "4", env=env)
    assert got.returncode == 0, got.stderr
    return a, where


def _prepare(bed: viewbed.Bed, ex: viewbed.Execution) -> subprocess.CompletedProcess:
    return bed.cli("view", "prepare", env={**bed.env, **ex.values, "DISPATCH_VIEW": str(bed.view)})


def _files(path: str) -> dict[str, tuple[int, bytes]]:
    out = {}
    for f in ([path] if os.path.isfile(path) else
              [os.path.join(d, n) for d, _, ns in os.walk(path) for n in ns]):
        with open(f, "rb") as fh:
            out[os.path.relpath(f, path) if f != path else "."] = (os.stat(f).st_ino, fh.read())
    return out


def _write_as_user(bed: viewbed.Bed, path: str) -> subprocess.CompletedProcess:
    """The job user opens ``path`` to write into it, as a trainer saving where it resumed would."""
    proc = bed.as_user([sys.executable, "-c", f"open({path!r}, 'r+b').write(b'CORRUPT')"], bed.env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("framework", sorted(SAVES))
def test_prepare_places_the_latest_publication_where_its_framework_looks_and_no_write_reaches_it(bed, framework):
    a, where = _published(bed, framework)
    pub = store.latest(str(bed.root))
    held = os.path.join(bed.root, layout.HELD, pub.name)
    before = _files(held)
    b = bed.execution("B")
    got = _prepare(bed, b)
    assert got.returncode == 0, got.stderr
    placed = os.path.join(b.exec_dir, where)
    assert [line for line in got.stderr.splitlines() if line.startswith("dispatch-slurm view:")] == [
        f"dispatch-slurm view: {bed.view}/{where} is step 4 of {bed.root}/{pub.path} (the latest publication, epoch "
        f"{a.epoch}): hard links to its read-only files (a write into them fails)"
        + (f"; {bed.view}/{SAVES[framework][2][0]} written fresh" if SAVES[framework][2] else "")]
    assert {k: ino for k, (ino, _) in _files(placed).items()} == {k: ino for k, (ino, _) in before.items()}, \
        "the placed files are the publication's own (hard links): no byte of data copied"
    one = sorted(_files(placed))[0]
    target = placed if one == "." else os.path.join(placed, one)
    tried = _write_as_user(bed, target)
    assert tried.returncode != 0 and "PermissionError" in tried.stderr, tried
    assert _files(held) == before and _files(os.path.join(bed.root, pub.path)) == before, \
        "the published save is unchanged"
    pointer = SAVES[framework][2]
    if pointer is not None:
        p = os.path.join(b.exec_dir, pointer[0])
        if pointer[1] is None:  # Lightning's: a second name of the placed file
            assert os.stat(p).st_ino == os.stat(placed).st_ino
        else:
            st = os.lstat(p)
            assert pathlib.Path(p).read_bytes() == pointer[1] and st.st_nlink == 1 and st.st_mode & 0o200, \
                "the pointer is a real file of its own, which the framework may rewrite"
    record = json.loads(pathlib.Path(b.exec_dir, layout.VIEW).read_text())
    assert record["publication"] == pub.name and record["placed"] == where
    assert record["made"] == {"cloned": 0, "linked": len(before), "copied_bytes": 0}


def test_prepare_runs_once_per_execution_whoever_races_it(bed):
    """Four prepares at once (the nodes of a first step), then a later step's: one placement, one
    record, the trainer's own changes never undone."""
    _published(bed, "deepspeed")
    b = bed.execution("B")
    env = {**bed.env, **b.values, "DISPATCH_VIEW": str(bed.view)}
    procs = [bed.as_user([sys.executable, "-m", "dispatch_slurm", "view", "prepare"], env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, results
    assert sorted(os.listdir(b.exec_dir)) == [layout.VIEW, "global_step4", "latest"]
    assert not [n for d, ds, fs in os.walk(b.exec_dir) for n in ds + fs if n.startswith(".")], "no leftover"
    pathlib.Path(b.exec_dir, "latest").write_text("global_step6")  # the trainer saved on
    shutil.rmtree(os.path.join(b.exec_dir, "global_step4"))  # and rotated
    got = _prepare(bed, b)  # the next srun step
    assert got.returncode == 0 and "dispatch-slurm view:" not in got.stderr, got.stderr
    assert sorted(os.listdir(b.exec_dir)) == [layout.VIEW, "latest"]
    assert pathlib.Path(b.exec_dir, "latest").read_text() == "global_step6"


def test_nothing_published_prepares_nothing_and_says_so_once(bed):
    a = bed.execution("A")
    got = _prepare(bed, a)
    assert got.returncode == 0
    assert got.stderr.splitlines() == [f"dispatch-slurm view: nothing published under {bed.root}/pub yet: {bed.view} "
                                       "starts empty (the trainer starts from step 0)"]
    assert os.listdir(a.exec_dir) == [layout.VIEW]
    again = _prepare(bed, a)
    assert again.returncode == 0 and again.stderr == ""


def test_a_latest_save_that_vanished_fails_the_tasks_in_one_line(bed):
    _, where = _published(bed, "huggingface")
    pub = store.latest(str(bed.root))
    shutil.rmtree(os.path.join(bed.root, pub.path))
    shutil.rmtree(os.path.join(bed.root, layout.HELD, pub.name))
    b = bed.execution("B")
    got = _prepare(bed, b)
    assert got.returncode == 2 and len(got.stderr.splitlines()) == 1, got.stderr
    assert "no longer exists" in got.stderr and "dispatch-slurm retire" in got.stderr
    assert not os.path.exists(os.path.join(b.exec_dir, layout.VIEW)), "nothing prepared: the next try prepares"


def test_without_the_plugin_the_commands_refuse_and_env_says_there_is_no_view(bed):
    a = bed.execution("A")
    got = bed.cli("view", "prepare", env={**bed.env, **a.values})
    assert got.returncode == 2 and "DISPATCH_VIEW is not set" in got.stderr and "README's job script" in got.stderr
    env = bed.cli("env", "--local", env={**bed.env, "DISPATCH_VIEW": str(bed.view)})
    assert env.returncode == 0
    lines = [x for x in env.stderr.splitlines() if "DISPATCH_VIEW" in x]
    assert len(lines) == 1 and "env --local runs without Slurm" in lines[0] and "README's job script" in lines[0]


# ---- the publisher ------------------------------------------------------------------------------

def _layout(skip=()):
    return view.ViewLayout(set(skip))


def _missing(folder: pathlib.Path, rel: str, is_dir: bool = True):
    return _layout().missing(str(folder / rel), is_dir, store.at(str(folder)))


def test_each_frameworks_save_is_complete_only_by_its_own_rule(tmp_path):
    d = tmp_path
    _torch_save(d / "checkpoint-2/pytorch_model.bin", {"w": 1})
    assert "no trainer_state.json" in _missing(d, "checkpoint-2")
    _write(d / "checkpoint-2/trainer_state.json", b'{"global_')
    assert "does not parse" in _missing(d, "checkpoint-2")
    _write(d / "checkpoint-2/trainer_state.json", b'{"global_step": 2}')
    assert _missing(d, "checkpoint-2") is None
    _write(d / "checkpoint/step-2/__0_0.distcp", b"x")
    assert _missing(d, "checkpoint/step-2") == "no .metadata (DCP writes it last)"
    _write(d / "checkpoint/step-2/.metadata", b"m")
    assert _missing(d, "checkpoint/step-2") is None
    data = d / "ckpts/epoch=0-step=2.ckpt"
    _torch_save(data, {"state_dict": {}})
    whole = data.read_bytes()
    data.write_bytes(whole[: len(whole) // 2])
    assert "zip archive" in _missing(d, "ckpts/epoch=0-step=2.ckpt", False)
    data.write_bytes(whole)
    assert _missing(d, "ckpts/epoch=0-step=2.ckpt", False) is None
    assert view.kind_of("last.ckpt") is None and view.kind_of("last-v1.ckpt") is None, \
        "Lightning's last.ckpt is rewritten at every save: never a save to publish"


def test_deepspeeds_save_is_complete_once_latest_names_it_and_every_ranks_files_are_there(tmp_path):
    """Rank 0 writes ``latest`` right after its own files, with no barrier before it: the other
    ranks' optimizer states may still be on their way."""
    d = tmp_path
    _torch_save(d / "global_step2/mp_rank_00_model_states.pt", _ds_states(2))
    _torch_save(d / "global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", {"o": 0})
    assert _missing(d, "global_step2").startswith("no latest beside it")
    _write(d / "latest", b"global_step2")
    assert _missing(d, "global_step2") == "optimizer states of 1 of 2 ranks"
    _torch_save(d / "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", {"o": 1})
    assert _missing(d, "global_step2") is None
    _torch_save(d / "global_step4/mp_rank_00_model_states.pt", _ds_states(2))
    assert _missing(d, "global_step4") == "optimizer states of 1 of 2 ranks" or \
        _missing(d, "global_step4").startswith("latest names")
    _write(d / "latest", b"global_step6")  # a later save: every rank passed step 4's last barrier
    assert _missing(d, "global_step4") is None


def test_megatrons_save_is_complete_once_its_tracker_names_it(tmp_path):
    d = tmp_path
    _write(d / "iter_0000004/.metadata", b"m")
    assert "no metadata.json" in _missing(d, "iter_0000004")
    _write(d / "iter_0000004/metadata.json", b"{}")
    assert _missing(d, "iter_0000004") is None, "megatron-core alone: dist_checkpointing's config, written last"
    _write(d / "latest_checkpointed_iteration.txt", b"2")
    assert "names '2'" in _missing(d, "iter_0000004"), "Megatron-LM: the tracker governs"
    _write(d / "latest_checkpointed_iteration.txt", b"4")
    assert _missing(d, "iter_0000004") is None


def test_the_publishers_listing_looks_into_the_trainers_folders_but_never_at_what_prepare_placed(tmp_path):
    d = tmp_path
    for rel in ("checkpoint-4/a", "ckpts/epoch=1-step=6.ckpt", "checkpoint/step-8/.metadata", "logs/x/y/z/w/q",
                ".checkpoint-9.saving-1-ab/x", "dispatch-resume/n/checkpoint-2/a", "global_step10/f"):
        _write(d / rel, b"x")
    got = _layout(skip={"checkpoint-4"}).listing(store.at(str(d)), str(d))
    assert sorted(got) == [("checkpoint/step-8", True), ("ckpts/epoch=1-step=6.ckpt", False),
                           ("global_step10", True)]


def _publisher(bed: viewbed.Bed, ex: viewbed.Execution, log: pathlib.Path, told: bool = False) -> subprocess.Popen:
    """``told``: as the plugin starts it, its stdin a pipe whose end says the step's tasks are gone."""
    env = {**bed.env, **ex.values, "DISPATCH_VIEW": str(bed.view)}
    if told:
        env["DISPATCH_VIEW_STEP_END"] = "stdin"
    return bed.as_user([sys.executable, "-m", "dispatch_slurm", "view", "publish"], env, stderr=open(log, "w"),
                       stdin=subprocess.PIPE if told else subprocess.DEVNULL)


def _trainer(bed: viewbed.Bed, ex: viewbed.Execution, script: str) -> subprocess.Popen:
    """A stand-in task of the execution (its DISPATCH_* environment), in the view."""
    return bed.as_user([sys.executable, "-c", script], {**bed.env, **ex.values, **ex.tagged()},
                       bind=ex.exec_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_publisher_publishes_what_completes_never_the_placed_save_and_ends_with_the_execution(bed):
    """B resumes from A's checkpoint-4 (placed); its trainer saves 6 whole and 8 without
    trainer_state.json, then exits: the publisher published 6 (never 4 again), named 8 as the
    progress nothing keeps (stderr, a warning event), and exited 1 once the trainer was gone."""
    _published(bed, "huggingface")
    b = bed.execution("B")
    assert _prepare(bed, b).returncode == 0
    log = bed.base / "publisher.err"
    pub = _publisher(bed, b, log)
    go = bed.base / "go"
    script = (f"import os, time, pathlib\nv = pathlib.Path({str(bed.view)!r})\n"
              "(v / 'checkpoint-6').mkdir(); (v / 'checkpoint-6/w.bin').write_bytes(b'w')\n"
              "(v / 'checkpoint-6/trainer_state.json').write_text('{}')\n"
              "(v / 'checkpoint-8').mkdir(); (v / 'checkpoint-8/w.bin').write_bytes(b'w')\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n")
    trainer = _trainer(bed, b, script)
    wait.until(lambda: any(p.step == 6 and p.epoch == b.epoch for p in store.publications(str(bed.root))),
               timeout=60, what="step 6 published while the trainer runs")
    assert pub.poll() is None, "the publisher lasts as long as the trainer"
    go.touch()
    assert trainer.wait(60) == 0
    assert pub.wait(60) == 1
    said = log.read_text()
    assert f"published step 6: exec/{b.attempt}/checkpoint-6" in said and "step 4" not in said, said
    assert "error: 1 save in" in said and "checkpoint-8 (no trainer_state.json" in said, said
    mine = sorted(p.step for p in store.publications(str(bed.root)) if p.epoch == b.epoch)
    assert mine == [6], "the placed save was never published again, at B's epoch"
    warned = [e for e in events.read(str(bed.root)) if e["type"] == "warning" and e.get("by") == "view"]
    assert [e["kind"] for e in warned] == ["never_complete"] and warned[0]["paths"] == [f"exec/{b.attempt}/checkpoint-8"]


def test_one_publisher_per_node_and_execution_a_standby_and_sigterm_does_not_end_it(bed):
    a = bed.execution("A")
    assert _prepare(bed, a).returncode == 0
    go = bed.base / "go"
    trainer = _trainer(bed, a, f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n")
    first = _publisher(bed, a, bed.base / "first.err")
    wait.until(lambda: _listening(a), timeout=60, what="the first publisher's claim")
    second = _publisher(bed, a, bed.base / "second.err")  # a later step's: its standby
    wait.until(lambda: "standing by" in (bed.base / "second.err").read_text(), timeout=60,
               what="the later step's publisher to stand by")
    os.killpg(first.pid, signal.SIGKILL)  # the step that claimed first ended first (an srun step)
    assert first.wait(60) == -signal.SIGKILL
    wait.until(lambda: _listening(a), timeout=60, what="the standby to take the claim over")
    assert second.poll() is None, "the standby publishes while the trainer lives"
    os.killpg(second.pid, signal.SIGTERM)  # Slurm signals the step: the grace window's save comes after
    go.touch()
    assert trainer.wait(60) == 0
    assert second.wait(60) == 0, "SIGTERM did not end it: it ended with the trainer, exit 0"


def test_a_taskprolog_counts_as_its_task_so_the_gap_before_the_exec_ends_no_publisher(tmp_path):
    """Slurm's task process (a fork of slurmstepd, titled as it) runs the TaskProlog as its child,
    then execs the program in its own pid. The publisher that started first saw only the
    TaskProlog (it carries the execution's environment), took its exit for the end of the
    execution's processes, and ended in the gap before the exec (the batch step's publisher on
    sid, gone while the batch script ran). Counted as its task, the count never drops to none."""
    from dispatch_slurm.slurm.cessation import node
    from shlex import quote
    go = tmp_path / "go"
    env = f"env DISPATCH_ATTEMPT=a.9.1 DISPATCH_CHECKPOINT={quote(str(tmp_path))}"
    prolog = f"{env} sh -c {quote(f'while [ ! -e {quote(str(go))} ]; do sleep 0.05; done')}"
    title = quote("slurmstepd: [9.batch]")
    task = f"exec -a {title} bash -c {quote(f'{prolog}; exec {env} sleep 60')}"
    stepd = subprocess.Popen(["bash", "-c", f"exec -a {title} bash -c {quote(f'({task}) & wait')}"],
                             start_new_session=True)
    try:
        def count() -> list[int]:
            return node.running_on("a.9.1", str(tmp_path), mine=set())
        ran = wait.until(count, timeout=30, what="the TaskProlog")
        (pid,) = ran
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert f.read().startswith(b"slurmstepd: [9.batch]"), "the task's process, not its prolog"
        go.touch()
        wait.until(lambda: open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"sleep"), timeout=30,
                   what="the task's exec")
        assert count() == [pid]
    finally:
        os.killpg(stepd.pid, signal.SIGKILL)
        stepd.wait()


def test_a_publisher_told_its_steps_tasks_are_gone_waits_for_no_first_process(bed):
    """A step whose task ended before its publisher looked (`srun true` on a node without the
    batch step): the end of its stdin, the plugin's word, ends it and its standby after a last
    scan, instead of waiting two minutes for a first process of the execution that never comes
    (the step's end waits for it); neither counts the other as such a process."""
    a = bed.execution("A")
    assert _prepare(bed, a).returncode == 0
    first = _publisher(bed, a, bed.base / "first.err", told=True)
    wait.until(lambda: _listening(a), timeout=60, what="the first publisher's claim")
    second = _publisher(bed, a, bed.base / "second.err", told=True)
    wait.until(lambda: "standing by" in (bed.base / "second.err").read_text(), timeout=60,
               what="the later step's publisher to stand by")
    for p, name in ((second, "second"), (first, "first")):
        p.stdin.close()
        try:
            assert p.wait(30) == 0, (bed.base / f"{name}.err").read_text()
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the {name} publisher, told, did not end: {(bed.base / f'{name}.err').read_text()}")


def test_a_short_steps_publisher_told_before_it_began_publishes_says_and_exits_1(bed):
    """`srun python train.py` whose task ended before its publisher got going (the plugin closed
    the pipe already): one scan publishes the whole save and names the torn one, and the exit
    status and stderr survive the publisher's quick exit (no interpreter shutdown, no inotify
    watch to tear down: the step's end waits for this process)."""
    a = bed.execution("A")
    assert _prepare(bed, a).returncode == 0
    script = (f"import pathlib\nv = pathlib.Path({str(bed.view)!r})\n"
              "(v / 'checkpoint-6').mkdir(); (v / 'checkpoint-6/w.bin').write_bytes(b'w')\n"
              "(v / 'checkpoint-6/trainer_state.json').write_text('{}')\n"
              "(v / 'checkpoint-8').mkdir(); (v / 'checkpoint-8/w.bin').write_bytes(b'w')\n")
    trainer = _trainer(bed, a, script)
    assert trainer.wait(60) == 0, trainer.stderr.read()
    log = bed.base / "short.err"
    env = {**bed.env, **a.values, "DISPATCH_VIEW": str(bed.view), "DISPATCH_VIEW_STEP_END": "stdin"}
    pub = bed.as_user([sys.executable, "-m", "dispatch_slurm", "view", "publish"], env, stderr=open(log, "w"),
                      stdin=subprocess.DEVNULL)  # at its end from the start: told before it began
    assert pub.wait(60) == 1, log.read_text()
    said = log.read_text()
    assert f"published step 6: exec/{a.attempt}/checkpoint-6" in said, said
    assert "error: 1 save in" in said and "checkpoint-8 (no trainer_state.json" in said, said
    assert [p.step for p in store.publications(str(bed.root)) if p.epoch == a.epoch] == [6]


def test_a_claim_answers_every_probe_and_the_batch_steps_binds_its_second_name(tmp_path):
    """A standby asks the claim's holder once a second for as long as its step runs: each ask is
    answered at once (a holder that never accepts fills its queue, and the third ask would
    wait forever). The batch step's publisher binds the name the plugin asks for an srun step;
    another step's does not."""
    root, said = str(tmp_path), []
    try:
        assert view._claim("c.1.1000000", root, said.append, batch=True) is True
        assert view._claim("c.2.1000000", root, said.append) is True
        for _ in range(20):
            assert view._holder(view.claim_name(root, "c.1.1000000")) == os.getuid()
            assert view._claim("c.1.1000000", root, said.append) is False  # a later step's: the standby
        with open("/proc/net/unix") as f:
            bound = set(f.read().split())
        assert f"@{view.claim_name(root, 'c.1.1000000', batch=True)}" in bound
        assert f"@{view.claim_name(root, 'c.2.1000000', batch=True)}" not in bound
        assert said == []
    finally:
        for sock in view._CLAIMS:  # as the process's exit would (shutdown wakes the accepting thread)
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        view._CLAIMS.clear()


def _listening(ex: viewbed.Execution) -> bool:
    """Whether this execution's publisher holds its claim on this node (view.claim_name)."""
    with open("/proc/net/unix") as f:
        return f"@{view.claim_name(ex.values['DISPATCH_CHECKPOINT'], ex.attempt)}" in f.read().split()


def test_the_epilog_publishes_what_was_complete_at_the_end(bed):
    """The publisher was killed with the step before its last scan; the Epilog's `view publish
    --once`, as the job user, publishes the save that was complete."""
    a = bed.execution("A")
    assert _prepare(bed, a).returncode == 0
    SAVES["torch.save"][0](pathlib.Path(a.exec_dir))
    _mine(a.exec_dir)
    user = {"SLURM_JOB_UID": str(viewbed.USER[0]), "SLURM_JOB_GID": str(viewbed.USER[1]), "SLURM_JOB_USER": "nobody"}
    env = {k: v for k, v in bed.env.items() if k != "DISPATCH_CHECKPOINT"}
    proc = bed.as_root([sys.executable, "-c", (
        "import json, sys; from dispatch_slurm.slurm.hooks import epilog, node\n"
        "print(json.dumps(node.as_job_user(json.loads(sys.argv[1]), epilog.publish_view, json.loads(sys.argv[2]), "
        "'n1')))"), json.dumps(user), json.dumps(a.values)], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    got = subprocess.CompletedProcess(proc.args, 0, out, err)
    answer = json.loads(got.stdout)["ok"]
    assert answer["view"] and answer["rc"] == 0 and "published step 4" in answer["said"], answer
    assert [p.step for p in store.publications(str(bed.root))] == [4]


def test_the_placed_save_is_a_copy_to_gc_and_the_report_not_an_unpublished_save(bed):
    _published(bed, "huggingface")
    b = bed.execution("B")
    assert _prepare(bed, b).returncode == 0
    inv = store.at(str(bed.root)).inventory()
    placed = inv.saves[f"exec/{b.attempt}/checkpoint-4"]
    assert placed.copy and not placed.pubs


def test_doctor_says_which_way_a_job_came_in(bed):
    """`doctor --job` names the mode from the executions' own events: A published by hand
    (`dispatch-slurm publish`, the job script's way), B under the view."""
    from dispatch_slurm.doctor import running
    a, _ = _published(bed, "huggingface")
    b = bed.execution("B")
    assert _prepare(bed, b).returncode == 0
    job = lambda ex: int(ex.attempt.split(".")[1])  # noqa: E731  (local.<N>.<epoch>: the job id is N)
    assert running.mode(str(bed.root), job(a)).startswith("job script:")
    assert running.mode(str(bed.root), job(b)).startswith("view: the plugin bound each execution's folder")
    assert running.mode(str(bed.root), 99).startswith("unknown")


def test_a_bed_signals_only_its_own_executions():
    """Two beds side by side (two test workers), each with an execution A: killing one bed's A
    leaves the other's running (they share the names A, B, C, not their processes)."""
    mine, theirs = viewbed.Bed(), viewbed.Bed()
    try:
        ours, other = mine.execution("A"), theirs.execution("A")
        for b, ex in ((mine, ours), (theirs, other)):
            ready = b.home / "ready"
            script = f"import time\nopen({str(ready)!r}, 'w').close()\nwhile True: time.sleep(0.05)\n"
            ex.trainer = _trainer(b, ex, script)
        wait.until(lambda: (mine.home / "ready").exists() and (theirs.home / "ready").exists(), timeout=60,
                   what="both trainers running")
        mine.kill(ours)
        assert other.trainer.poll() is None, "killing one bed's A killed the other bed's A"
    finally:
        for b in (mine, theirs):
            b.close()
            shutil.rmtree(b.base, ignore_errors=True)
