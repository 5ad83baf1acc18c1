"""The campaign's Hugging Face trainer: a tiny GPT-2 built from a config (no download), a
``transformers.Trainer`` that saves every ``--save-every`` steps and keeps two saves.

With dispatch-slurm (default) it uses the integration as the user guide shows it:
``DispatchCallback()`` (publishes each save, saves and exits 0 on SIGTERM), and the README job
script's ``--output-dir``/``--resume-from`` (else ``output_dir()``, ``resume_from_checkpoint()``). With ``--naive`` it is the framework alone: one shared
``--output-dir``, resumed from ``get_last_checkpoint``, killed by SIGTERM.

It logs like dettrain.py (start, resume, step, save_begin, save, done), and ``done`` carries
the digest of the final weights (every tensor's bytes), which the checker compares with
the uninterrupted run's bit for bit. One thread, deterministic algorithms, no dropout: the
same steps give the same bits. A script run by path on the nodes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dettrain import Log  # noqa: E402  (the one log format of the campaign's trainers)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def digest(model) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", help="--naive: the one shared folder; else the exec folder (default: output_dir())")
    ap.add_argument("--resume-from", help="the save to resume from (default: resume_from_checkpoint())")
    ap.add_argument("--naive", action="store_true")
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--step-time", type=float, default=0.25, help="seconds each step takes at least")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", required=True)
    a = ap.parse_args(argv)
    job, restart = os.environ.get("SLURM_JOB_ID", str(os.getpid())), os.environ.get("SLURM_RESTART_COUNT", "0")
    attempt = os.environ.get("DISPATCH_ATTEMPT") or f"naive.{job}.{restart or 0}"
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    log = Log(a.log, {"attempt": attempt, "job": job, "restart": int(restart or 0), "rank": rank,
                      "host": socket.gethostname(), "pid": os.getpid()})
    log("launch")  # before torch and transformers load: their import is part of restoring

    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    callbacks: list = []
    if a.naive:
        out = a.output_dir
        os.makedirs(out, exist_ok=True)
        resume = get_last_checkpoint(out)
    else:  # the README's job script passes both; a script of its own asks the integration
        from dispatch_slurm.integrations.hf import DispatchCallback, output_dir, resume_from_checkpoint
        out = a.output_dir or output_dir()
        resume = a.resume_from if a.output_dir else resume_from_checkpoint()
        callbacks.append(DispatchCallback())
    log("start", resume_from=resume, max_steps=a.max_steps, save_every=a.save_every, step_time=a.step_time,
        trap="hf", ranks=1, seed=a.seed)

    class Record(TrainerCallback):
        seen: set[str] = set()
        t = 0.0

        def on_train_begin(self, args, state, control, **kw):
            if resume:
                log("resume", path=resume, step=state.global_step)
            self.seen = {e for e in os.listdir(out) if e.startswith("checkpoint-")}
            self.t = time.monotonic()

        def on_step_end(self, args, state, control, **kw):
            time.sleep(max(0.0, a.step_time - (time.monotonic() - self.t)))
            self.t = time.monotonic()
            log("step", step=state.global_step)
            if control.should_save:
                log("save_begin", step=state.global_step, path=os.path.join(out, f"checkpoint-{state.global_step}"))

        def on_save(self, args, state, control, **kw):
            log("save", step=state.global_step, path=os.path.join(out, f"checkpoint-{state.global_step}"))
            # save_total_limit rotated before this call: log what this execution's folder lost
            now = {e for e in os.listdir(out) if e.startswith("checkpoint-")}
            for gone in sorted(self.seen - now):
                log("delete", step=int(gone.split("-")[1]), path=os.path.join(out, gone))
            self.seen = now

    torch.manual_seed(a.seed)
    cfg = GPT2Config(vocab_size=100, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(a.seed)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 100, (256, 16), generator=g)]
    args = TrainingArguments(output_dir=out, max_steps=a.max_steps, save_strategy="steps", save_steps=a.save_every,
                             save_total_limit=2, per_device_train_batch_size=4, logging_strategy="no", report_to=[],
                             use_cpu=True, disable_tqdm=True, seed=a.seed, data_seed=a.seed,
                             dataloader_num_workers=0)
    # Record first: on_save logs the save before DispatchCallback publishes it (and, on a
    # signal, exits the process)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Record(), *callbacks])
    trainer.train(resume_from_checkpoint=resume)
    if trainer.state.global_step >= a.max_steps:
        log("done", step=trainer.state.global_step, h=digest(trainer.model))


if __name__ == "__main__":
    main()
