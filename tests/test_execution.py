"""The execution as a process inside its job sees it: every integration and the
preemption handler read the DISPATCH_* variables through one view, so a missing variable
gets one message, whoever asks. Before, each integration said it its own way (four wordings
for a missing $DISPATCH_CHECKPOINT), some without the fix."""

import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")
pytest.importorskip("lightning")
pytest.importorskip("accelerate")
pytest.importorskip("submitit")

from dispatch_slurm.errors import DispatchError  # noqa: E402
from dispatch_slurm.integrations import accelerate as da  # noqa: E402
from dispatch_slurm.integrations import dcp as ddcp  # noqa: E402
from dispatch_slurm.integrations import hf  # noqa: E402
from dispatch_slurm.integrations import lightning as dl  # noqa: E402
from dispatch_slurm.integrations import submitit as ds  # noqa: E402

EPOCH, ATTEMPT = 1_000_000, "c.1.1000000"
ACCELERATOR = SimpleNamespace(is_main_process=True, num_processes=1)


class Job(ds.Checkpointable):
    def run(self):
        return 0


def _callback(tmp_path):
    args = SimpleNamespace(output_dir=os.environ.get("DISPATCH_EXEC_DIR") or str(tmp_path))
    return hf.DispatchCallback(local=False).on_train_begin(args, None, None)


# every way in, by the variable it cannot do without
READERS = {
    "DISPATCH_EXEC_DIR": {
        "hf.output_dir": lambda tmp_path: hf.output_dir(),
        "hf.DispatchCallback": _callback,
        "lightning.output_dir": lambda tmp_path: dl.output_dir(),
        "lightning.DispatchCheckpoint": lambda tmp_path: dl.DispatchCheckpoint(),
        "dcp.save": lambda tmp_path: ddcp.checkpoint_dir(1),
        "accelerate.save_state": lambda tmp_path: da.save_state(ACCELERATOR, 1),
        "submitit.output_dir": lambda tmp_path: ds.output_dir(),
        "submitit.Checkpointable": lambda tmp_path: Job()(),
    },
    "DISPATCH_CHECKPOINT": {
        "hf.resume_from_checkpoint": lambda tmp_path: hf.resume_from_checkpoint(),
        "hf.DispatchCallback": _callback,
        "lightning.resume_path": lambda tmp_path: dl.resume_path(),
        "dcp.load": lambda tmp_path: ddcp.load({}),
        "accelerate.load_state": lambda tmp_path: da.load_state(ACCELERATOR),
        "submitit.resume_path": lambda tmp_path: ds.resume_path(),
        "submitit.Checkpointable": lambda tmp_path: Job()(),
        "preemption handler": lambda tmp_path: _handler(tmp_path),
    },
    "DISPATCH_EPOCH": {
        "hf.DispatchCallback": _callback,
        "preemption handler": lambda tmp_path: _handler(tmp_path),
    },
    "DISPATCH_ATTEMPT": {
        "submitit.Checkpointable": lambda tmp_path: Job()(),
    },
}

HANDLER = textwrap.dedent("""
    import os, signal, sys, time
    from dispatch_slurm import install_preemption_handler

    def save(left):
        path = os.path.join(sys.argv[1], "checkpoint-7")
        os.makedirs(path)
        return path

    install_preemption_handler(save)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
""")


def _handler(tmp_path):
    """The preemption handler of a real process, signalled: its refusal, raised here."""
    save_dir = tmp_path / "saves"
    save_dir.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", HANDLER, str(save_dir)], capture_output=True, text=True,
                          timeout=60)
    m = re.search(r"preemption checkpoint failed: \w+: (.*)$", proc.stderr, re.M)
    assert proc.returncode == 1 and m, proc.stderr
    raise DispatchError(m[1])


@pytest.fixture
def job_env(root, monkeypatch):
    """A whole execution's environment (the root, its exec folder, epoch and attempt)."""
    for k in [k for k in os.environ if k.startswith("DISPATCH_")]:
        monkeypatch.delenv(k)
    for k in ("SUBMITIT_EXECUTOR", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    exec_dir = root / "exec" / ATTEMPT
    exec_dir.mkdir(parents=True)
    for k, v in {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EXEC_DIR": str(exec_dir),
                 "DISPATCH_EPOCH": str(EPOCH), "DISPATCH_ATTEMPT": ATTEMPT}.items():
        monkeypatch.setenv(k, v)
    return root


def _messages(variable, tmp_path, monkeypatch) -> dict[str, str]:
    monkeypatch.delenv(variable)
    out = {}
    for name, read in READERS[variable].items():
        with pytest.raises(DispatchError) as e:
            read(tmp_path)
        out[name] = str(e.value)
    return out


@pytest.mark.parametrize("variable", sorted(READERS))
def test_every_reader_gives_the_same_message_for_a_missing_variable(variable, job_env, tmp_path, monkeypatch):
    got = _messages(variable, tmp_path, monkeypatch)
    assert len(set(got.values())) == 1, "\n".join(f"{k}: {v}" for k, v in got.items())


@pytest.mark.parametrize("variable", sorted(READERS))
def test_the_message_is_the_contracts_and_names_every_fix(variable, job_env, tmp_path, monkeypatch):
    from dispatch_slurm import store
    from dispatch_slurm.contract.env import MISSING
    assert set(_messages(variable, tmp_path, monkeypatch).values()) == {MISSING[variable]}
    if variable == "DISPATCH_CHECKPOINT":
        with pytest.raises(DispatchError) as e:
            store.resume_path()
        assert str(e.value) == MISSING[variable]
    for fix in (variable, 'eval "$(dispatch-slurm env)"', "--dispatch-checkpoint=ROOT", "env --local",
                "slurm_additional_parameters={'dispatch-checkpoint': ROOT}"):
        assert fix in MISSING[variable]


def test_several_missing_variables_are_named_in_one_message(job_env, tmp_path, monkeypatch):
    from dispatch_slurm.contract.env import FIX, UNSET
    for k in ("DISPATCH_CHECKPOINT", "DISPATCH_EPOCH", "DISPATCH_EXEC_DIR"):
        monkeypatch.delenv(k)
    with pytest.raises(DispatchError) as e:
        _callback(tmp_path)
    heads = [UNSET[k] for k in ("DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR", "DISPATCH_EPOCH")]
    assert str(e.value) == "; ".join(heads) + f" ({FIX})"
