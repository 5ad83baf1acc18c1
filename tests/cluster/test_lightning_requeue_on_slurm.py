"""Lightning's own requeue under the plugin, on the real cluster.

The user's run: a Lightning trainer that keeps Lightning's default inside Slurm,
``SLURMEnvironment(auto_requeue=True)``, with ``default_root_dir=dl.output_dir()``
($DISPATCH_EXEC_DIR) and ``fit(ckpt_path=dl.resume_path())``, submitted with
``--dispatch-checkpoint`` (no ``run`` supervisor), ``#SBATCH --time=2 --signal=USR1@40``.
Slurm sends SIGUSR1 50-80 s after the start (its 30 s time-limit check); Lightning saves
``hpc_ckpt_1.ckpt`` into the old execution's folder and runs ``scontrol requeue``; the
requeued execution has a new, empty folder and starts from step 0. That restart cannot be
avoided from inside the job (nothing published that save), but it must not be silent: the
resume call says so on the job's stderr, naming the file and the command that publishes it,
records a ``warning`` event, and ``report`` lists it under "warnings". Before, the requeued
execution printed nothing of the kind and ``report`` said only "resumed from scratch".

Needs torch and lightning in the cluster: only bookworm (Python 3.11) can use this machine's
site-packages, mounted read-only at /opt/host-site."""

from __future__ import annotations

import re

import pytest

from dispatch_slurm import store
from dispatch_slurm.store import events
from testbed.cluster import Cluster
from support import HOST_SITE

pytestmark = [pytest.mark.cluster, pytest.mark.only_on("bookworm")]  # the host's torch runs there

# A user's trainer: Lightning's defaults inside Slurm (SLURMEnvironment, auto_requeue=True),
# dispatch-slurm only for the folder and the resume point. No periodic checkpoint: the only
# save is Lightning's hpc_ckpt on SIGUSR1.
TRAINER = """
import os, sys, time, torch
import lightning.pytorch as L
from dispatch_slurm.integrations import lightning as dl

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def on_train_start(self):
        # on stderr, as the warning: srun forwards a task's stdout and stderr apart, so
        # only lines of one stream keep their order in the job's output file
        print(f"TRAIN_START global_step={self.global_step}", file=sys.stderr, flush=True)
    def training_step(self, batch, i):
        time.sleep(0.02)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

torch.manual_seed(0)
x = torch.randn(4096, 8)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
trainer = L.Trainer(max_steps=1000000, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False, default_root_dir=dl.output_dir())
trainer.fit(Tiny(), data, ckpt_path=dl.resume_path())
"""


def script(wd: str) -> str:
    return (f"#!/bin/bash\n#SBATCH -o {wd}/job.out --open-mode=append -p normal -N 1 -n 1 --time=2 "
            "--signal=USR1@40\n"
            'echo "execution restart=${SLURM_RESTART_COUNT:-0} attempt=$DISPATCH_ATTEMPT"\n'
            f"srun env PYTHONPATH={HOST_SITE} python3 {wd}/train.py\n")


def test_lightnings_own_requeue_is_not_a_silent_restart_from_step_0(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    if HOST_SITE not in c.volumes.values():
        pytest.skip(f"no torch usable in the {c.suite} cluster (only bookworm's Python 3.11 can use the host's)")
    pytest.importorskip("lightning")
    cdir, hdir = workdir
    (hdir / "train.py").write_text(TRAINER)
    c.exec("c1", f"mkdir -m 700 {cdir}/root", user="alice")
    root = str(hdir / "root")
    job = c.submit("alice", script(cdir), args=[f"--dispatch-checkpoint={cdir}/root"])
    out = hdir / "job.out"

    def text() -> str:
        return out.read_text() if out.exists() else ""

    def first_running():
        if c.job(job).ended:  # fail now, with the job's output, not at the deadline
            raise AssertionError(f"the job ended: {text()[-3000:]}")
        return "TRAIN_START global_step=0" in text()
    c.wait_until(first_running, timeout=120, what="the first execution to train")
    # Slurm's USR1 (50-80 s after the start), Lightning's save and `scontrol requeue`
    c.wait_job(job, lambda j: j.restart_count == 1, timeout=150)

    def second_started():
        if c.job(job).ended:
            raise AssertionError(f"the job ended: {text()[-3000:]}")
        rest = text().partition("execution restart=1")[2]
        return rest if "TRAIN_START" in rest else None
    second = c.wait_until(second_started, timeout=120, what="the requeued execution to train")
    c.cancel(job)
    c.wait_job(job, lambda j: j.ended, timeout=120)
    first = text().partition("execution restart=1")[0]

    attempts = re.findall(r"execution restart=(\d) attempt=(\S+)", text())
    assert [r for r, _ in attempts] == ["0", "1"], attempts
    old, new = (a for _, a in attempts)
    hpc = f"exec/{old}/hpc_ckpt_1.ckpt"
    assert "Handling auto-requeue signal" in first and (hdir / "root" / hpc).is_file(), first[-3000:]
    assert store.latest(root) is None, "nothing published the hpc_ckpt"
    # what stays true: the requeued execution starts from step 0 (its folder is new and empty) ...
    assert "TRAIN_START global_step=0" in second and "Restoring states" not in second, second[-3000:]
    # ... but not silently: on the job's stderr, before training, the file and the fix
    said = re.search(r"dispatch-slurm: warning: nothing is published .*", second)
    assert said and second.index(said[0]) < second.index("TRAIN_START"), second[-3000:]
    assert hpc in said[0] and "starts from step 0" in said[0], said[0]
    epoch = int(old.rsplit(".", 1)[1])  # the folder's last field
    fix = f"dispatch-slurm publish --root {cdir}/root --epoch {epoch} --step STEP {cdir}/root/{hpc}"
    assert fix in said[0] and "auto_requeue=False" in said[0], said[0]

    warned = [e for e in events.read(root) if e["type"] == "warning"]
    assert [(e["attempt"], e["kind"], e["by"]) for e in warned] == [(new, "unpublished_saves", "resume")], warned
    assert hpc in warned[0]["paths"] and hpc in warned[0]["message"]

    report = c.exec("ctl", ["dispatch-slurm", "report", f"{cdir}/root"], user="alice", check=False)
    assert report.returncode == 0, report.stderr
    section = report.stdout.partition("\nwarnings:\n")[2]
    assert f"  {new}: started from step 0 while earlier executions had left saves nothing published: {hpc}" \
        in section, report.stdout
