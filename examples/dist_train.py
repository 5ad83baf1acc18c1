"""DDP or FSDP training with torch.distributed.checkpoint under dispatch-slurm (CPU, gloo).

    eval "$(dispatch-slurm env)"
    torchrun --nproc-per-node 2 examples/dist_train.py --max-steps 1000 --save-every 100 [--fsdp] [--async-save]
    srun --ntasks-per-node 2 python examples/dist_train.py ...   # one task per rank: MASTER_ADDR set

Every rank resumes from the latest publication (DCP, the same save on every rank), saves
its shards into ``$DISPATCH_EXEC_DIR/checkpoint-<step>/`` every --save-every steps
(published once DCP's ``.metadata`` is written; --async-save: from the upload's
completion) and calls ``preemption_point()`` after each step: on SIGTERM to any rank,
all ranks stop at one step, save, the save is published once, and every rank exits 0.
Without torchrun, the rank comes from Slurm ($SLURM_PROCID, $SLURM_NTASKS). At the end,
``settle()`` then ``destroy_process_group()``: a normal end exits 0, never SIGABRT.
"""

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from dispatch_slurm import install_preemption_handler, mark_finished, preemption_point
from dispatch_slurm.integrations import dcp as ddcp
from dispatch_slurm.runtime.distributed import settle
from dispatch_slurm.store import events


class App(Stateful):
    """Model, optimizer (momentum included) and step, as DCP saves and loads them."""

    def __init__(self, model, opt):
        self.model, self.opt, self.step = model, opt, 0

    def state_dict(self):
        model, optim = get_state_dict(self.model, self.opt)
        return {"model": model, "optim": optim, "step": self.step}

    def load_state_dict(self, state):
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.step = state["step"]


def init() -> None:
    """torchrun's environment, else Slurm's (one task per rank), else one process."""
    for ours, slurm in (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS"), ("LOCAL_RANK", "SLURM_LOCALID")):
        if ours not in os.environ and slurm in os.environ:
            os.environ[ours] = os.environ[slurm]
    # a port per execution: a requeued job keeps its id, and the old port may linger in TIME_WAIT
    job, restart = int(os.environ.get("SLURM_JOB_ID", "0")), int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    os.environ.setdefault("MASTER_PORT", str(20000 + (job * 16 + restart) % 20000))
    if "RANK" not in os.environ:  # plain `python dist_train.py`: a world of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return
    dist.init_process_group("gloo")


def build(fsdp: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        model = fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def batch(step: int, rank: int):
    """One step's data on one rank, a function of (step, rank) alone: a resumed run sees the same."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(8, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.5


def digest(model) -> str:
    """A hash of the full weights, the same on every rank (FSDP: gathered)."""
    model_sd, _ = get_state_dict(model, [])
    h = hashlib.sha256()
    for k in sorted(model_sd):
        t = model_sd[k]
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        h.update(t.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, required=True)
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    ap.add_argument("--async-save", action="store_true", help="dcp.async_save, published on completion")
    ap.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (simulated work)")
    ap.add_argument("--skew", type=float, default=0.0,
                    help="rank 0 sleeps this long before each backward: the others wait inside the all-reduce")
    a = ap.parse_args(argv)
    init()
    rank = dist.get_rank()
    model, opt = build(a.fsdp)
    app = App(model, opt)
    state = {"app": app}
    if ddcp.load(state) is not None:
        text = digest(model)  # a collective under FSDP: every rank
        if rank == 0:
            print(f"resumed at step {app.step} digest {text}", flush=True)
    saver = ddcp.AsyncSaver() if a.async_save else None

    def on_preempt(left: float):
        if rank == 0:
            print(f"preempted at step {app.step}: saving with {left:.1f}s left", flush=True)
        if saver is not None:  # this step's save if in flight or published (never written twice), else a new one
            return saver.save_now(state, app.step, left)
        return ddcp.save(state, app.step, publish_it=False), app.step  # the handler publishes

    install_preemption_handler(on_preempt, defer=True)
    events.emit("execution_started", argv=sys.argv)
    while app.step < a.max_steps:
        x, y = batch(app.step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        if a.skew and rank == 0:
            time.sleep(a.skew)
        loss.backward()
        opt.step()
        app.step += 1
        if a.step_time:
            time.sleep(a.step_time)
        if app.step % a.save_every == 0:
            saver.save(state, app.step) if saver else ddcp.save(state, app.step)
            if rank == 0:
                print(f"step {app.step} saved", flush=True)
        preemption_point()  # a signal on any rank: every rank saves this step, one publication, exit 0
    if saver is not None:
        saver.close()  # the last save published; its group settled
    text = digest(model)
    if rank == 0:
        print(f"done at step {app.step} digest {text}", flush=True)
        mark_finished(step=app.step)  # the supervisor: this end is done, not a time-limit stop
    events.emit("execution_ended", exit=0)
    settle()  # after the last collective; a plain dist.barrier() here made the exit abort (see settle)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
