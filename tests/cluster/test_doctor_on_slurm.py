"""On the real cluster: each misconfiguration of the signal path reproduced in a
job (the save lost), the doctor naming it, the fixed job's save landing; a signal during
a plain loop's warm-up and evaluation published from there; the doctor's report for a
correct 2-node job. No torch (the stand-ins are plain Python, as the sid image has):
torchrun's own kill is reproduced with the real torchrun in tests/test_doctor.py."""

from __future__ import annotations

import json
import re

import pytest

from dispatch_slurm import store
from dispatch_slurm.runtime import probe
from testbed.cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]
SENTINEL = "dispatch-checkpoint-complete"

TRAINER = """
import os, signal, sys, time
from dispatch_slurm import install_preemption_handler, preemptible, preemption_point
exec_dir, rank = os.environ["DISPATCH_EXEC_DIR"], int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
step = 0

def save(left):
    path = os.path.join(exec_dir, f"checkpoint-{step}")
    os.makedirs(path, exist_ok=True)
    time.sleep(float(os.environ.get("SAVE_S", "0.2")))  # the save's own work
    open(os.path.join(path, f"rank{rank}"), "w").write(str(step))
    print(f"rank {rank} saved step {step}", flush=True)
    return path

if sys.argv[1] != "no-handler":
    install_preemption_handler(save, signals=[getattr(signal, "SIG" + s) for s in os.environ["SIGS"].split(",")],
                               defer=True)
print(f"rank {rank} running", flush=True)
for _ in preemptible(range(int(os.environ.get("WARMUP", "0")))):  # warm-up: prefetching, compiling
    time.sleep(0.05)
while True:
    time.sleep(0.05)
    step += 1
    preemption_point()
    if step == int(os.environ.get("EVAL_AT", "0")):
        print(f"eval at step {step}", flush=True)
        for _ in preemptible(range(400)):  # 20 s of evaluation
            time.sleep(0.05)
        print(f"eval done at step {step}", flush=True)
"""

# `accelerate launch` with one process, in essence: no signal handled, the child waited for
PLAIN_LAUNCHER = """
import subprocess, sys
sys.exit(subprocess.Popen([sys.executable, *sys.argv[1:]]).wait())
"""


def job_script(wd: str, signal_line: str, command: str, *, nodes: int = 1, partition: str = "scavenger",
               env: str = "") -> str:
    sig = f" --signal={signal_line}" if signal_line else ""
    return (f"#!/bin/bash\n#SBATCH -N {nodes} --ntasks-per-node=1 -o {wd}/job.out -p {partition}{sig}\n"
            f"{env}srun {command}\n")


def start(c: Cluster, workdir, script: str, *, sigs: str = "TERM", extra: str = "") -> tuple[int, str]:
    cdir, hdir = workdir
    (hdir / "trainer.py").write_text(TRAINER)
    (hdir / "plain.py").write_text(PLAIN_LAUNCHER)
    c.exec("c1", f"mkdir -p -m 700 {cdir}/root", user="alice")
    text = script.replace("srun ", f"export SIGS={sigs} {extra}\nsrun ", 1)
    (hdir / "job.sbatch").write_text(text)
    job = c.submit("alice", text, args=[f"--dispatch-checkpoint={cdir}/root"])
    return job, cdir


def doctor(c: Cluster, cdir: str, job: int | None, *args: str, ranks: int = 1) -> tuple[int, dict, str]:
    """`dispatch-slurm doctor` in the controller as alice, on the job (or the wiring only)."""
    cmd = ["dispatch-slurm", "doctor", "--script", f"{cdir}/job.sbatch", *args]
    if job is not None:
        cmd += ["--job", str(job), "--ranks", str(ranks), "--root", f"{cdir}/root", "--ready-timeout", "60"]
    text = c.exec("ctl", cmd, user="alice", check=False)
    js = c.exec("ctl", [*cmd[:2], "--json", *cmd[2:]] if job is None else ["true"], user="alice", check=False)
    assert text.returncode in (0, 1), text.stderr
    return text.returncode, (json.loads(js.stdout) if job is None else {}), text.stdout


def codes(report_text: str) -> set[str]:
    return {line.split(":")[0] for line in report_text.splitlines() if line and not line.startswith(
        (" ", "doctor", "slurm", "windows", "rehearsal", "rank", "verdict")) and ":" in line}


def records(hdir):
    """Every rank's probe records under the root's exec folders: {(host, pid): phases}."""
    out = {}
    for d in (hdir / "root" / "exec").glob(f"*/{probe.DIRNAME}"):
        out.update(probe.read(str(d)))
    return out


def steps(hdir):
    return [p.step for p in store.publications(str(hdir / "root"))]


def said(c: Cluster, cdir: str, text: str) -> bool:
    out = c.path(f"{cdir}/job.out")
    return out.exists() and text in out.read_text()


def ended(c: Cluster, job: int):
    return c.wait_job(job, lambda j: j.ended, timeout=60)


def test_a_correct_two_node_job_the_doctor_report(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "TERM@10", f"python3 {workdir[0]}/trainer.py ok", nodes=2))
    code, _, report = doctor(c, cdir, job, ranks=2)
    print(report)
    assert code == 0 and "verdict: OK" in report, report
    rows = [ln.split() for ln in report.splitlines() if re.match(r"\s+\d+\s+\S+\s+\d+\s", ln)]
    assert len(rows) == 2 and all(r[-1] == "0" for r in rows), report
    assert len(steps(workdir[1])) == 1
    ended(c, job)


def test_b_signal_with_the_trainer_in_a_step_loses_the_save_and_is_named(slurm_cluster: Cluster, workdir):
    """WarpX#4665: --signal=B:USR1 reaches the batch shell, which dies of it; the job ends,
    its step gets SIGTERM, which the USR1 handler does not catch: nothing saved."""
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "B:USR1@10", f"python3 {workdir[0]}/trainer.py ok"),
                      sigs="USR1")
    code, _, report = doctor(c, cdir, job)
    assert code == 1 and {"signal-to-shell", "signal-not-delivered"} <= codes(report), report
    ended(c, job)
    assert steps(workdir[1]) == [] and not any("signal" in p for p in records(workdir[1]).values())


def test_the_doctor_waits_while_the_job_is_completing(slurm_cluster: Cluster, workdir):
    """--signal=B:USR1 ends the batch shell, so the job "ends" at once and stays
    COMPLETING while Slurm kills its step: SIGTERM, which this rank handles, then KillWait
    (5 s) in which it saves (2 s) and publishes. The doctor judges only once the job left
    COMPLETING and the rank's exit record is there: its row says published, exit 0, and no
    no-safe-point (it read the records at the "end" before, and said "published no")."""
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "B:USR1@10", f"python3 {workdir[0]}/trainer.py ok"),
                      sigs="USR1,TERM", extra="SAVE_S=2")
    code, _, report = doctor(c, cdir, job)
    print(report)
    ended(c, job)
    assert len(steps(workdir[1])) == 1, report
    (rec,) = records(workdir[1]).values()
    assert rec["exit"]["code"] == 0 and "published" in rec, rec
    (row,) = [ln.split() for ln in report.splitlines() if re.match(r"\s+0\s+\S+\s+\d+\s", ln)]
    assert row[-2:] == ["yes", "0"], report
    assert "no-safe-point" not in codes(report) and "every rank's exit record is there" in report, report


def test_the_fixed_step_signal_saves(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "USR1@10", f"python3 {workdir[0]}/trainer.py ok"),
                      sigs="USR1,TERM")  # TERM too: this partition preempts with SIGTERM
    code, _, report = doctor(c, cdir, job)
    assert code == 0, report
    ended(c, job)
    assert len(steps(workdir[1])) == 1


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare-launcher", "dispatch-slurm-launch"])
def test_a_launcher_killed_by_the_signal_takes_the_save_with_it(slurm_cluster: Cluster, workdir, wrapped):
    """huggingface/accelerate#1918's shape: SIGUSR1 ends a launcher that handles none, the
    step ends with it, the rank is killed before its save ends (under cgroup tracking it
    never even hears of the signal: Slurm signals the task's own process); under
    `dispatch-slurm launch` it saves."""
    c = slurm_cluster
    wd = workdir[0]
    cmd = f"python3 {wd}/plain.py {wd}/trainer.py ok"
    if wrapped:
        cmd = f"dispatch-slurm launch --signal USR1 -- {cmd}"
    job, cdir = start(c, workdir, job_script(wd, "USR1@10", cmd), sigs="USR1,TERM", extra="SAVE_S=2")
    code, _, report = doctor(c, cdir, job, "--launcher", "accelerate")
    ended(c, job)
    if wrapped:
        assert code == 0 and len(steps(workdir[1])) == 1, report
    else:
        assert code == 1 and "launcher-dies" in codes(report) and steps(workdir[1]) == [], report
        (rec,) = records(workdir[1]).values()
        assert "installed" in rec and "saved" not in rec  # killed with the step, its save not made


@pytest.mark.parametrize("sigs", ["USR2", "USR2,TERM"], ids=["usr2-only", "usr2-and-term"])
def test_preemption_without_send_user_signal(slurm_cluster: Cluster, workdir, sigs):
    """A real preemption (CANCEL partition, GraceTime) of a job whose --signal is USR2:
    Slurm sends SIGTERM (no PreemptParameters=send_user_signal here), which kills a
    USR2-only handler's trainer; the doctor reads that from scontrol and names it."""
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "USR2@10", f"python3 {workdir[0]}/trainer.py ok"), sigs=sigs)
    _, wiring, _ = doctor(c, cdir, None)
    assert "send-user-signal" in {f["code"] for f in wiring["findings"]} and not wiring["slurm"]["send_user_signal"]
    c.wait_until(lambda: said(c, cdir, "running"), timeout=60, what="the trainer to run")
    c.wait_until(lambda: any("installed" in p for p in records(workdir[1]).values()), timeout=30,
                 what="the handler installed")
    preemptor = c.preempt(job)
    ended(c, job)
    c.cancel(preemptor, user="bob")
    if sigs == "USR2":
        assert steps(workdir[1]) == [], c.read(f"{cdir}/job.out")
    else:
        assert len(steps(workdir[1])) == 1, c.read(f"{cdir}/job.out")
        (rec,) = records(workdir[1]).values()
        assert rec["signal"]["signal"] == "SIGTERM"


def test_a_save_longer_than_grace_time_is_lost_and_named(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "TERM@10", f"python3 {workdir[0]}/trainer.py ok"),
                      extra="SAVE_S=15")
    code, _, report = doctor(c, cdir, job, "--preempt")
    ended(c, job)
    assert code == 1 and "save-too-long" in codes(report) and steps(workdir[1]) == [], report


def test_a_trainer_that_never_installs_the_handler_is_named(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "TERM@10", f"python3 {workdir[0]}/trainer.py no-handler"))
    cmd = ["dispatch-slurm", "doctor", "--script", f"{cdir}/job.sbatch", "--job", str(job), "--root", f"{cdir}/root",
           "--ready-timeout", "15"]
    res = c.exec("ctl", cmd, user="alice", check=False)
    ended(c, job)
    assert res.returncode == 1 and "handler-not-installed" in res.stdout and steps(workdir[1]) == [], res.stdout


def test_plain_loop_signalled_in_warm_up_publishes_step_0(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "TERM@10", f"python3 {workdir[0]}/trainer.py ok"),
                      extra="WARMUP=400")
    code, _, report = doctor(c, cdir, job)
    ended(c, job)
    assert code == 0 and steps(workdir[1]) == [0], report


def test_plain_loop_signalled_in_evaluation_publishes_that_step(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    job, cdir = start(c, workdir, job_script(workdir[0], "TERM@10", f"python3 {workdir[0]}/trainer.py ok"),
                      extra="EVAL_AT=5")
    c.wait_until(lambda: said(c, cdir, "eval at step 5"), timeout=60, what="the evaluation")
    c.cancel(job, "TERM", user="alice")
    ended(c, job)
    out = c.read(f"{cdir}/job.out")
    assert steps(workdir[1]) == [5] and SENTINEL in out and "eval done" not in out, out


HF_TRAINER = """
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from dispatch_slurm.integrations import hf

class SlowEval(TrainerCallback):  # says when an evaluation begins; each batch slow
    def on_prediction_step(self, args, state, control, **kw):
        if not getattr(self, "said", False):
            print(f"eval started at step {state.global_step}", flush=True)
            self.said = True
        time.sleep(0.05)
    def on_evaluate(self, args, state, control, **kw):
        print(f"eval done at step {state.global_step}", flush=True)

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                   bos_token_id=0, eos_token_id=0))
data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 100, (256, 16))]
args = TrainingArguments(output_dir=hf.output_dir(), max_steps=50, save_strategy="no", eval_strategy="steps",
                         eval_steps=3, eval_on_start=sys.argv[1] == "on-start", per_device_train_batch_size=4,
                         per_device_eval_batch_size=1, logging_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=True, seed=0, dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=data, eval_dataset=data,
        callbacks=[SlowEval(), hf.DispatchCallback()]).train()
print("training ended without a save", flush=True)
"""


@pytest.mark.only_on("bookworm")  # the host's torch and transformers run there
@pytest.mark.parametrize("when", ["eval", "on-start"], ids=["evaluation", "eval_on_start-warm-up"])
def test_hf_trainer_signalled_in_evaluation_publishes_from_there(slurm_cluster: Cluster, workdir, when):
    """scancel --signal=TERM while the Trainer evaluates (at step 3, or eval_on_start's
    evaluation before any step: 256 batches, ~13 s): the step is published from inside the
    evaluation, which never ends, and the job exits 0 with the sentinel."""
    from support import HOST_SITE
    c = slurm_cluster
    if HOST_SITE not in c.volumes.values():
        pytest.skip(f"no torch usable in the {c.suite} cluster")
    cdir, hdir = workdir
    (hdir / "hf.py").write_text(HF_TRAINER)
    job, _ = start(c, workdir, job_script(cdir, "TERM@30", f"env PYTHONPATH={HOST_SITE} python3 {cdir}/hf.py {when}"))
    step = 0 if when == "on-start" else 3
    c.wait_until(lambda: said(c, cdir, f"eval started at step {step}"), timeout=110, what="the evaluation")
    c.cancel(job, "TERM", user="alice")
    ended(c, job)
    out = c.read(f"{cdir}/job.out")
    assert steps(hdir) == [step] and SENTINEL in out and f"eval done at step {step}" not in out, out[-3000:]
    # it stopped inside the evaluation, not after it: no "eval done" above (its on_evaluate runs
    # before the callback's), and its probe says signal, then stop, then exit 0 (no timing: the
    # machine may be loaded)
    (rec,) = records(hdir).values()
    assert rec["signal"]["t"] <= rec["stop"]["t"] <= rec["exit"]["t"] and rec["exit"]["code"] == 0, rec


@pytest.mark.only_on("bookworm")  # the host's torch runs there
@pytest.mark.parametrize("wrapped", [False, True], ids=["bare-torchrun", "dispatch-slurm-launch"])
def test_torchrun_two_nodes_its_kill_and_exit_status(slurm_cluster: Cluster, workdir, wrapped):
    """2 nodes x torchrun x 2 workers, a 3 s save, torchrun's kill at 1 s (--shutdown-timeout
    1 stands for its default 30 s): bare, every rank is killed mid-save, nothing is
    published and the job fails; under `dispatch-slurm launch` all 4 ranks save, one
    publication, the job COMPLETED; the doctor's report for each."""
    from support import HOST_SITE
    c = slurm_cluster
    if HOST_SITE not in c.volumes.values():
        pytest.skip(f"no torch usable in the {c.suite} cluster")
    cdir, hdir = workdir
    launch = "dispatch-slurm launch -- " if wrapped else ""
    cmd = (f"env PYTHONPATH={HOST_SITE} {launch}python3 -m torch.distributed.run --nnodes 2 --nproc-per-node 2 "
           f"--shutdown-timeout 1 --rdzv-backend c10d --rdzv-endpoint $MASTER:29500 {cdir}/trainer.py ok")
    # TERM@30: after its 3 s save the wrapped job still has two torchrun agents and four ranks to
    # tear down before the rehearsal's limit (the lead), on a loaded machine; the bare one is
    # killed by torchrun 1 s after the signal, whatever the lead
    job, _ = start(c, workdir, job_script(cdir, "TERM@30", cmd, nodes=2, env="export MASTER=$(hostname)\n"),
                   extra="SAVE_S=3")
    code, _, report = doctor(c, cdir, job, "--launcher", "torchrun", ranks=4)
    print(report)
    info = ended(c, job)
    if wrapped:
        assert code == 0 and len(steps(hdir)) == 1 and info.state == "COMPLETED", report
    else:
        assert code == 1 and "launcher-kill" in codes(report) and steps(hdir) == [], report
        assert info.state == "FAILED", info
