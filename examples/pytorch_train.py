"""Plain PyTorch training under dispatch-slurm: resume, save, publish, preempt.

    eval "$(dispatch-slurm env)"
    srun python examples/pytorch_train.py --max-steps 1000 --save-every 100

Reads DISPATCH_CHECKPOINT, DISPATCH_EXEC_DIR, DISPATCH_EPOCH (and DISPATCH_GRACE_S) from
the environment. Each save is ``$DISPATCH_EXEC_DIR/checkpoint-<step>/state.pt`` (model,
optimizer with its momentum, step), published once written: an interrupted save is
never published, so it is never resumed from. On SIGTERM (or --signal USR2 for
``sbatch --signal=USR2@90``) the handler saves the last whole step and publishes it
within the grace window, then prints ``dispatch-checkpoint-complete`` and exits 0.
The handler is deferred: it runs between steps (``preemption_point()``), so the saved
model and optimizer always belong to one whole step. Only rank 0 saves and publishes.
The warm-up (``--warmup``: batches fetched before the first step) and the evaluation
(``--eval-every``) iterate through ``preemptible``, so a signal there saves at the next
batch instead of waiting for the phase to end (the state is still the last whole step's).
"""

import argparse
import os
import signal
import sys
import time

import torch

from dispatch_slurm import install_preemption_handler, mark_finished, preemptible, preemption_point, store
from dispatch_slurm.runtime.preempt import is_publishing_rank
from dispatch_slurm.store import events


def need(key: str) -> str:
    value = os.environ.get(key)
    if not value:
        sys.exit(f"pytorch_train: {key} is not set: run inside `eval \"$(dispatch-slurm env)\"`")
    return value


def batch(step: int, size: int = 16):
    """The data of one step, a function of the step alone: a resumed run sees the same."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(size, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.5 + 1.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, required=True)
    ap.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (to simulate work)")
    ap.add_argument("--signal", default="TERM", help="signal that starts the final save [TERM]")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=0, help="batches of warm-up before the first step")
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: never)")
    ap.add_argument("--eval-batches", type=int, default=20, help="batches per evaluation")
    ap.add_argument("--phase-time", type=float, default=0.0, help="extra seconds per warm-up/eval batch")
    a = ap.parse_args(argv)
    if a.max_steps < 1 or a.save_every < 1:
        ap.error("--max-steps and --save-every must be >= 1")
    try:
        sig = signal.Signals[a.signal if a.signal.startswith("SIG") else f"SIG{a.signal}"]
    except KeyError:
        ap.error(f"--signal {a.signal!r} is not a signal name")
    root, exec_dir = need("DISPATCH_CHECKPOINT"), need("DISPATCH_EXEC_DIR")
    need("DISPATCH_EPOCH")
    rank0 = is_publishing_rank()

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    step = 0
    pub = store.latest_save(root)  # a vanished save is an error, never a fresh start
    if pub is not None:
        state = torch.load(os.path.join(root, pub.path, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"resumed from {pub.path} at step {step}", flush=True)
    events.emit("execution_started", argv=sys.argv)

    saved = [None]

    def save(at: int) -> str:
        path = os.path.join(exec_dir, f"checkpoint-{at}")
        if saved[0] == at:
            return path  # never rewrite a save: it may be published already
        os.makedirs(path, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": at},
                   os.path.join(path, "state.pt"))
        saved[0] = at
        return path

    def on_preempt(seconds_left: float):
        print(f"preempted at step {step}: saving with {seconds_left:.1f}s left", flush=True)
        return save(step) if rank0 else None  # the handler publishes what rank 0 returns

    install_preemption_handler(on_preempt, signals=(sig,), defer=True)
    if a.warmup:
        print("warm-up", flush=True)
    for i in preemptible(range(a.warmup)):  # e.g. filling a prefetch queue, compiling
        batch(-1 - i)
        time.sleep(a.phase_time)
    while step < a.max_steps:
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if a.step_time:
            time.sleep(a.step_time)
        if step % a.save_every == 0 or step == a.max_steps:
            if rank0:
                store.publish(save(step), step, by="example")
            print(f"step {step} loss {loss.item():.4f} saved", flush=True)
        preemption_point()  # a pending signal: save this whole step, publish, exit 0
        if a.eval_every and step % a.eval_every == 0:
            print(f"eval at step {step}", flush=True)
            with torch.no_grad():
                for i in preemptible(range(a.eval_batches)):
                    x, y = batch(10**6 + i)
                    torch.nn.functional.mse_loss(model(x), y)
                    time.sleep(a.phase_time)
            print(f"eval done at step {step}", flush=True)
    if rank0:
        mark_finished(step=step)  # the supervisor: this end is done, not a time-limit stop
    events.emit("execution_ended", exit=0)
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
