"""A real transformers.Trainer (tiny GPT-2 built from a config, CPU, no download) with
DispatchCallback: an overlapping old execution with a higher step never becomes the
resume point, and rotation never leaves its own exec folder.

Runs whenever transformers is importable; without it the module fails, unless
DISPATCH_SKIP_HF=1 says to skip it (the `hf` extra is deliberately not installed)."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
try:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.trainer_callback import TrainerControl, TrainerState
except ImportError:
    if os.environ.get("DISPATCH_SKIP_HF") == "1":
        pytest.skip("transformers not installed and DISPATCH_SKIP_HF=1", allow_module_level=True)
    raise

from dispatch_slurm import store
from dispatch_slurm.contract import names
from dispatch_slurm.contract.epoch import compose
from dispatch_slurm.integrations import hf
from dispatch_slurm.store import events
from testbed import wait
from dispatch_slurm.errors import DispatchError
from support import REPO, held_copy, preempt_one
from testbed.ranks import launch

E_OLD, E_NEW = compose(0, 1, 0), compose(0, 2, 0)
E_REQUEUE = compose(0, 2, 1)  # the replacement, requeued once
SENTINEL = "dispatch-checkpoint-complete"


def tiny_model():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=100, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def dataset():
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": x, "labels": x} for x in torch.randint(0, 100, (256, 16), generator=g)]


def execution(monkeypatch, root, attempt, epoch):
    """The DISPATCH_* environment of one execution, and its exec folder."""
    exec_dir = store.make_exec_dir(str(root), attempt)
    for k, v in {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EXEC_DIR": exec_dir,
                 "DISPATCH_EPOCH": str(epoch), "DISPATCH_ATTEMPT": attempt}.items():
        monkeypatch.setenv(k, v)
    return exec_dir


def train(max_steps, resume, limit=2, output_dir=None):
    args = TrainingArguments(output_dir=output_dir or hf.output_dir(), max_steps=max_steps,
                             save_strategy="steps", save_steps=2, save_total_limit=limit,
                             per_device_train_batch_size=4, logging_strategy="no", report_to=[],
                             use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=dataset(),
                      callbacks=[hf.DispatchCallback()])
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def outside(root, exec_dir):
    """Every file outside `exec_dir` but events/ (appended to) and the held links of its own
    publications (each newer publication lets the one before it go), with size and mtime."""
    out, skip = {}, [exec_dir, os.path.join(root, events.EVENTS)]
    own = names.attempt_epoch(os.path.basename(exec_dir))
    held = os.path.join(root, "held")
    skip += [os.path.join(held, h) for h in (os.listdir(held) if os.path.isdir(held) else ())
             if names.parse(h).epoch == own]
    for top, _, files in os.walk(root):
        if any(top == d or top.startswith(d + os.sep) for d in skip):
            continue
        for f in files:
            st = os.stat(os.path.join(top, f))
            out[os.path.relpath(os.path.join(top, f), root)] = (st.st_size, st.st_mtime_ns)
    return out


def ckpts(exec_dir):
    return sorted((n for n in os.listdir(exec_dir) if n.startswith("checkpoint-")),  # not dispatch-probe/
                  key=lambda n: int(n.split("-")[1]))


def assert_untouched(before, after):
    gone = {k: v for k, v in before.items() if after.get(k) != v}
    assert not gone, f"changed or deleted outside the exec folder: {sorted(gone)}"


def test_overlapping_old_run_never_becomes_the_resume_point(root, monkeypatch):
    # 1. the old execution trains to step 6 and publishes 2, 4, 6; rotation keeps 4, 6
    old = execution(monkeypatch, root, "c.7.1000000", E_OLD)
    assert hf.resume_from_checkpoint() is None
    train(6, hf.resume_from_checkpoint())
    assert ckpts(old) == ["checkpoint-4", "checkpoint-6"]
    assert [(p.epoch, p.step) for p in store.publications(root)] == [(E_OLD, 2), (E_OLD, 4), (E_OLD, 6)]

    # 2. the replacement (higher epoch) resumes from the old run's latest publication
    new = execution(monkeypatch, root, "c.8.2000000", E_NEW)
    assert hf.resume_from_checkpoint() == held_copy(root, "c.8.2000000", os.path.join(old, "checkpoint-6"))
    before = outside(str(root), new)
    t = train(8, hf.resume_from_checkpoint())
    assert t.state.global_step == 8 and ckpts(new) == ["checkpoint-8"]  # resumed at 6, not 0
    assert_untouched(before, outside(str(root), new))

    # 3. meanwhile the old run was never stopped: it goes on from its own save to step 14,
    #    publishing higher steps *after* the replacement's publication, and rotating
    monkeypatch.setenv("DISPATCH_EXEC_DIR", old)
    monkeypatch.setenv("DISPATCH_EPOCH", str(E_OLD))
    monkeypatch.setenv("DISPATCH_ATTEMPT", "c.7.1000000")
    before = outside(str(root), old)
    train(14, os.path.join(old, "checkpoint-6"))
    assert ckpts(old) == ["checkpoint-12", "checkpoint-14"]
    assert_untouched(before, outside(str(root), old))  # the replacement's save survived
    assert (E_OLD, 14) in [(p.epoch, p.step) for p in store.publications(root)]

    # 4. the latest is still the replacement's lineage, however high the old step
    latest = store.latest(root)
    assert (latest.epoch, latest.step, latest.path) == (E_NEW, 8, "exec/c.8.2000000/checkpoint-8")
    assert hf.resume_from_checkpoint() == held_copy(root, "c.7.1000000", os.path.join(new, "checkpoint-8"))

    # 5. the replacement is requeued: it resumes from its own lineage at step 8
    third = execution(monkeypatch, root, "c.8.2000001", E_REQUEUE)
    resume = hf.resume_from_checkpoint()
    assert resume == held_copy(root, "c.8.2000001", os.path.join(new, "checkpoint-8"))
    before = outside(str(root), third)
    t = train(12, resume, limit=1)
    assert t.state.global_step == 12 and ckpts(third) == ["checkpoint-12"]
    assert_untouched(before, outside(str(root), third))
    with open(os.path.join(third, "checkpoint-12", "trainer_state.json")) as f:
        assert json.load(f)["global_step"] == 12
    latest = store.latest(root)
    assert (latest.epoch, latest.step) == (E_REQUEUE, 12)

    pubs = [e for e in events.read(str(root)) if e["type"] == "published"]
    assert {e["by"] for e in pubs} == {"hf"}
    assert len(pubs) == len(store.publications(root)) == 3 + 1 + 4 + 2


def test_the_older_executions_rotation_cannot_take_the_save_being_resumed(root, monkeypatch):
    """The campaign's seeds 1006 and 1122 (resume-failed): a requeued execution chose
    the old execution's published checkpoint-200; the old one, cut off but still running,
    saved on and its save_total_limit rotation removed checkpoint-200 before the new trainer
    loaded it: "Can't find a valid checkpoint", the execution failed. The resume point is now
    the execution's own hard-linked copy, which that rotation cannot remove."""
    old = execution(monkeypatch, root, "c.13.1000000", E_OLD)
    train(6, None)
    assert ckpts(old) == ["checkpoint-4", "checkpoint-6"]

    new = execution(monkeypatch, root, "c.13.2000001", E_REQUEUE)
    resume = hf.resume_from_checkpoint()  # chosen: the old execution's checkpoint-6
    assert resume == held_copy(root, "c.13.2000001", os.path.join(old, "checkpoint-6"))

    # the old execution goes on meanwhile, from its own checkpoint-6: its rotation removes it
    monkeypatch.setenv("DISPATCH_EXEC_DIR", old)
    monkeypatch.setenv("DISPATCH_EPOCH", str(E_OLD))
    monkeypatch.setenv("DISPATCH_ATTEMPT", "c.13.1000000")
    train(10, os.path.join(old, "checkpoint-6"))
    assert ckpts(old) == ["checkpoint-8", "checkpoint-10"], "the chosen save was not rotated away"

    monkeypatch.setenv("DISPATCH_EXEC_DIR", new)
    monkeypatch.setenv("DISPATCH_EPOCH", str(E_REQUEUE))
    monkeypatch.setenv("DISPATCH_ATTEMPT", "c.13.2000001")
    t = train(8, resume)
    assert t.state.global_step == 8 and ckpts(new) == ["checkpoint-8"]  # resumed at 6: loaded the copy
    ev = [e for e in events.read(str(root)) if e["type"] == "resumed" and e["attempt"] == "c.13.2000001"]
    assert [(e["path"], e["loaded"]) for e in ev] == [("exec/c.13.1000000/checkpoint-6", resume)]


def test_only_world_process_zero_publishes(root, monkeypatch, tmp_path):
    exec_dir = execution(monkeypatch, root, "c.9.1000000", E_OLD)
    save = os.path.join(exec_dir, "checkpoint-2")
    os.makedirs(save)
    with open(os.path.join(save, "model.bin"), "wb") as f:  # a save holds a file
        f.write(b"w")
    args = TrainingArguments(output_dir=exec_dir, report_to=[], use_cpu=True)
    cb = hf.DispatchCallback()
    cb.on_save(args, TrainerState(global_step=2, is_world_process_zero=False), TrainerControl())
    assert store.latest(root) is None
    cb.on_save(args, TrainerState(global_step=2, is_world_process_zero=True), TrainerControl())
    assert store.latest(root).path == "exec/c.9.1000000/checkpoint-2"


def test_output_dir_outside_the_exec_folder_is_refused(root, monkeypatch):
    execution(monkeypatch, root, "c.10.1000000", E_OLD)
    shared = root / "shared"
    shared.mkdir()
    with pytest.raises(DispatchError, match="not inside this execution's folder"):
        train(2, None, output_dir=str(shared))
    assert os.listdir(shared) == [] and store.latest(root) is None


@pytest.mark.parametrize("how", ["exec folder linked to node-local storage", "DISPATCH_EPOCH changed"])
def test_an_exec_folder_no_save_of_which_could_be_published_fails_at_train_begin(root, monkeypatch, tmp_path, how):
    """Before, the callback compared real paths, accepted both at start, trained
    to the first save and failed there (BadPath: a component is a symlink; an epoch refused)."""
    exec_dir = execution(monkeypatch, root, "c.12.1000000", E_OLD)
    if how.startswith("exec folder"):
        local = tmp_path / "local-ssd"
        local.mkdir()
        os.rmdir(exec_dir)
        os.symlink(local, exec_dir)
        want = re.escape(f"{exec_dir} is a symlink to {local}, outside the checkpoint root")
    else:
        monkeypatch.setenv("DISPATCH_EPOCH", str(E_NEW))
        want = r"was \$DISPATCH_EPOCH changed after `dispatch-slurm env`"
    with pytest.raises(DispatchError, match=want):
        train(4, None)
    assert not [n for n in os.listdir(exec_dir) if n.startswith("checkpoint-")], "it trained to a save"


def test_a_vanished_latest_save_is_an_error(root, monkeypatch):
    exec_dir = execution(monkeypatch, root, "c.11.1000000", E_OLD)
    os.makedirs(os.path.join(exec_dir, "checkpoint-4"))
    with open(os.path.join(os.path.join(exec_dir, "checkpoint-4"), "model.bin"), "wb") as f:  # a save holds a file
        f.write(b"w")
    pub = store.publish(os.path.join(exec_dir, "checkpoint-4"), 4, root=str(root), epoch=E_OLD).publication
    shutil.rmtree(os.path.join(exec_dir, "checkpoint-4"))
    assert hf.resume_from_checkpoint().endswith("/checkpoint-4")  # its publication's held links keep it
    shutil.rmtree(os.path.join(root, "held", pub.name))  # by hand: the save and its held links
    with pytest.raises(DispatchError, match="no longer exists"):
        hf.resume_from_checkpoint()
    monkeypatch.delenv("DISPATCH_EXEC_DIR")
    with pytest.raises(DispatchError, match="DISPATCH_EXEC_DIR is not set"):
        hf.output_dir()


def test_pytorch_example_resumes_and_checkpoints_on_sigterm(root, tmp_path):
    """examples/pytorch_train.py: resume from the latest publication, save + publish
    within the grace window on SIGTERM, and the next execution resumes from that save."""
    def run(attempt, epoch, *args, wait=True):
        exec_dir = store.make_exec_dir(str(root), attempt)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "RANK", "SLURM_"))}
        env = {**base, "DISPATCH_CHECKPOINT": str(root), "DISPATCH_EXEC_DIR": exec_dir,
               "DISPATCH_EPOCH": str(epoch), "DISPATCH_ATTEMPT": attempt, "DISPATCH_GRACE_S": "30"}
        proc = subprocess.Popen([sys.executable, str(REPO / "examples" / "pytorch_train.py"), *args],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if wait:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            return out
        return proc

    out = run("c.1.1000000", E_OLD, "--max-steps", "30", "--save-every", "10")
    assert out.splitlines()[-1] == "done at step 30"
    assert [p.step for p in store.publications(root)] == [10, 20, 30]

    proc = run("c.2.2000000", E_NEW, "--max-steps", "1000000", "--save-every", "100000",
               "--step-time", "0.002", wait=False)
    try:
        wait.until(lambda: proc.poll() is not None or any(
            e["type"] == "execution_started" and e["epoch"] == E_NEW for e in events.read(str(root))),
            timeout=120, what="the second execution to start training", every=0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.splitlines()[0] == "resumed from exec/c.1.1000000/checkpoint-30 at step 30"
    assert out.splitlines()[-1] == "dispatch-checkpoint-complete"
    latest = store.latest(root)
    assert latest.epoch == E_NEW and latest.step > 30
    state = torch.load(os.path.join(root, latest.path, "state.pt"), weights_only=True)
    assert state["step"] == latest.step and state["optimizer"]["state"]  # momentum saved too

    out = run("c.2.2000001", E_REQUEUE, "--max-steps", str(latest.step + 5), "--save-every", "5")
    assert out.splitlines()[0] == f"resumed from {latest.path} at step {latest.step}"
    assert out.splitlines()[-1] == f"done at step {latest.step + 5}"
    types = [e["type"] for e in events.read(str(root)) if e["epoch"] == E_NEW]
    assert types[0] == "execution_started" and types[-2:] == ["published", "checkpoint_complete"]
    assert "preempt_signal" in types


TRAINER = """
import os, sys
sys.path.insert(0, {tests!r})
from test_hf import dataset, tiny_model
from transformers import Trainer, TrainerCallback, TrainingArguments
from dispatch_slurm.integrations import hf

class Ready(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 3:
            open(os.path.join(os.environ["OUT"], f"ready-{{os.getpid()}}"), "w").close()

args = TrainingArguments(output_dir=hf.output_dir(), max_steps=100000, save_strategy="steps", save_steps=100000,
                         per_device_train_batch_size=4, logging_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=True, seed=0, dataloader_num_workers={workers})
Trainer(model=tiny_model(), args=args, train_dataset=dataset() * 100,
        callbacks=[hf.DispatchCallback(), Ready()]).train(resume_from_checkpoint=hf.resume_from_checkpoint())
print("training ended without a signal", flush=True)
"""


@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_saves_through_the_trainer_and_a_replacement_resumes(root, monkeypatch, tmp_path, nproc):
    """A real Trainer (one process, or two under torchrun/DDP with the signal on rank 1
    only) gets SIGTERM mid-training: it saves checkpoint-<step> through its own control
    flow, the save is published once, every process exits 0 with the sentinel, and the
    next execution resumes from exactly that step."""
    exec_dir = execution(monkeypatch, root, "c.12.1000000", E_OLD)
    (tmp_path / "out").mkdir()
    (tmp_path / "trainer.py").write_text(TRAINER.format(tests=str(REPO / "tests"), workers=0))
    proc = launch([tmp_path / "trainer.py"], nproc=nproc, env={**os.environ, "OUT": str(tmp_path / "out"),
                  "DISPATCH_GRACE_S": "60"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = preempt_one(proc, tmp_path / "out", nproc, "the Trainer to reach step 3")
    assert proc.returncode == 0, out[-3000:]
    assert out.count(SENTINEL) == nproc and "training ended without a signal" not in out, out[-3000:]
    pubs = store.publications(root)
    assert len(pubs) == 1 and pubs[0].step >= 3, pubs
    step = pubs[0].step
    assert pubs[0].path == f"exec/c.12.1000000/checkpoint-{step}"
    with open(os.path.join(exec_dir, f"checkpoint-{step}", "trainer_state.json")) as f:
        assert json.load(f)["global_step"] == step
    assert [e["by"] for e in events.read(str(root)) if e["type"] == "published"] == ["preempt"]

    execution(monkeypatch, root, "c.12.1000001", compose(0, 1, 1))
    t = train(step + 2, hf.resume_from_checkpoint())
    assert t.state.global_step == step + 2
    assert store.latest(root).step == step + 2
    # the supervisor's facts: the stopped execution saved on a signal, the other finished training
    kinds = {(e["attempt"], e["type"]) for e in events.read(str(root))}
    assert ("c.12.1000000", "checkpoint_complete") in kinds and ("c.12.1000000", "training_finished") not in kinds
    finished = [e for e in events.read(str(root)) if e["type"] == "training_finished"]
    assert [(e["attempt"], e["step"]) for e in finished] == [("c.12.1000001", step + 2)]



def test_the_steps_signal_to_the_dataloaders_workers_too_saves_once_in_the_trainer(root, monkeypatch, tmp_path):
    """SIGTERM to every process of the step (Slurm's linuxproc tracking, `dispatch-slurm
    launch`), two DataLoader workers among them: the Trainer saves and publishes once, from its
    own process; no worker dies before it (the DataLoader would raise in the Trainer), records
    an event or prints the sentinel."""
    from dispatch_slurm.runtime.launch import descendants
    exec_dir = execution(monkeypatch, root, "c.13.1000000", E_OLD)
    (tmp_path / "out").mkdir()
    (tmp_path / "trainer.py").write_text(TRAINER.format(tests=str(REPO / "tests"), workers=2))
    with open(tmp_path / "log", "w+") as log:
        proc = launch([tmp_path / "trainer.py"], env={**os.environ, "OUT": str(tmp_path / "out")},
                      stdout=log, stderr=subprocess.STDOUT)
        try:
            wait.until(lambda: proc.poll() is not None or os.listdir(tmp_path / "out"), timeout=180,
                       what="the Trainer to reach step 3")
            workers = descendants(proc.pid)
            os.killpg(proc.pid, signal.SIGTERM)
            rc = proc.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the step's end: what is left goes
            proc.wait()
    out = (tmp_path / "log").read_text()
    assert len(workers) == 2, workers
    assert rc == 0 and out.count(SENTINEL) == 1, out[-3000:]
    assert "killed by signal" not in out and "training ended without a signal" not in out, out[-3000:]
    (pub,) = store.publications(root)
    assert pub.path == f"exec/c.13.1000000/checkpoint-{pub.step}" and pub.step >= 3
    with open(os.path.join(exec_dir, f"checkpoint-{pub.step}", "trainer_state.json")) as f:
        assert json.load(f)["global_step"] == pub.step
    evs = events.read(str(root))
    assert {e["pid"] for e in evs} == {proc.pid}, evs
    assert [e["type"] for e in evs] == ["resumed", "preempt_signal", "published", "checkpoint_complete"]


def test_missing_dispatch_env_fails_at_train_begin_and_local_mode_runs(monkeypatch, tmp_path):
    for k in ("DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR", "DISPATCH_EPOCH", "DISPATCH_ATTEMPT", "DISPATCH_LOCAL"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(DispatchError, match=r"DISPATCH_CHECKPOINT; \$DISPATCH_EXEC_DIR is not set.*DISPATCH_EPOCH \(.*"
                                            r"DISPATCH_LOCAL=1"):
        train(4, None, output_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("checkpoint-*"))  # failed before a step
    monkeypatch.setenv("DISPATCH_LOCAL", "1")
    t = train(4, None, output_dir=str(tmp_path / "out"))
    assert t.state.global_step == 4 and (tmp_path / "out" / "checkpoint-4").is_dir()


def test_the_module_docstrings_import_runs():
    """The usage the module's docstring shows imports (it once named a module path that does not exist)."""
    lines = [x.strip() for x in hf.__doc__.splitlines() if x.strip().startswith(("from dispatch_slurm", "import "))]
    assert lines
    for line in lines:
        exec(line, {})


def test_outside_slurm_local_runs_the_readme_snippet_and_env_local_publishes(monkeypatch, tmp_path):
    """With DISPATCH_LOCAL=1 and no dispatch variables the README's calls work
    (output_dir() a folder of the working directory, nothing to resume from); with the
    variables `env --local` prints, the callback publishes and the next run resumes."""
    for k in ("DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR", "DISPATCH_EPOCH", "DISPATCH_ATTEMPT", "DISPATCH_LOCAL",
              "DISPATCH_LOCAL_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DISPATCH_LOCAL", "1")
    assert hf.output_dir() == str(tmp_path / "dispatch-local-run") and hf.resume_from_checkpoint() is None
    t = train(2, hf.resume_from_checkpoint(), output_dir=hf.output_dir())
    assert t.state.global_step == 2 and (tmp_path / "dispatch-local-run" / "checkpoint-2").is_dir()
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(tmp_path / "elsewhere"))
    assert hf.output_dir() == str(tmp_path / "elsewhere")
    monkeypatch.delenv("DISPATCH_LOCAL")
    for run in (1, 2):
        out = subprocess.run([sys.executable, "-m", "dispatch_slurm", "env", "--local", "--format", "json"],
                             cwd=tmp_path, capture_output=True, text=True, check=True).stdout
        for k, v in json.loads(out).items():
            monkeypatch.setenv(k, v)
        resume = hf.resume_from_checkpoint()
        assert (resume is None) == (run == 1)
        train(2 * run, resume)
        assert store.latest(str(tmp_path / "dispatch-local")).step == 2 * run


EVAL_TRAINER = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from test_hf import dataset, tiny_model
from transformers import Trainer, TrainerCallback, TrainingArguments
from dispatch_slurm.integrations import hf

OUT = os.environ["OUT"]

class SignalInEval(TrainerCallback):  # SIGTERM to itself at the first evaluation batch; each batch slow
    def on_prediction_step(self, args, state, control, **kw):
        if not os.path.exists(os.path.join(OUT, "signalled")):
            open(os.path.join(OUT, "signalled"), "w").write(str(state.global_step))
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # an evaluation longer than any grace would wait for
    def on_evaluate(self, args, state, control, **kw):
        open(os.path.join(OUT, "evaluated"), "w").close()
    def on_step_end(self, args, state, control, **kw):
        open(os.path.join(OUT, f"step-{{state.global_step}}"), "w").close()

args = TrainingArguments(output_dir=hf.output_dir(), max_steps=50, save_strategy="no", eval_strategy="steps",
                         eval_steps=3, eval_on_start={on_start}, per_device_train_batch_size=4,
                         per_device_eval_batch_size=2, logging_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=True, seed=0, dataloader_num_workers=0)
Trainer(model=tiny_model(), args=args, train_dataset=dataset(), eval_dataset=dataset(),
        callbacks=[SignalInEval(), hf.DispatchCallback()]).train()
print("training ended without a save", flush=True)
"""


@pytest.mark.parametrize("on_start", [False, True], ids=["evaluation", "eval_on_start-warm-up"])
def test_a_signal_during_evaluation_saves_there_not_after_it(root, monkeypatch, tmp_path, on_start):
    """SIGTERM at the first batch of an evaluation (at step 3, or eval_on_start's before
    any step) that would take 128 batches: the save of that step is published from inside
    the evaluation, which never finishes, and the process exits 0 with the sentinel."""
    execution(monkeypatch, root, "c.13.1000000", E_OLD)
    (tmp_path / "out").mkdir()
    (tmp_path / "t.py").write_text(EVAL_TRAINER.format(tests=str(REPO / "tests"), on_start=on_start))
    p = subprocess.run([sys.executable, str(tmp_path / "t.py")], env={**os.environ, "OUT": str(tmp_path / "out"),
                       "DISPATCH_PROBE_DIR": str(tmp_path / "probe")}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == SENTINEL, p.stderr[-3000:]
    step = 0 if on_start else 3
    assert (tmp_path / "out" / "signalled").read_text() == str(step)
    assert [x.step for x in store.publications(root)] == [step]
    assert not (tmp_path / "out" / "evaluated").exists()  # saved mid-evaluation, not after it
    assert not (tmp_path / "out" / f"step-{step + 1}").exists()
    from dispatch_slurm.runtime import probe
    (rec,) = probe.read(str(tmp_path / "probe")).values()
    assert rec["stop"]["t"] - rec["signal"]["t"] < 1.0 and rec["exit"]["code"] == 0  # the next batch, not the end
