"""Training overhead of each integration against the bare framework, side by side.

Each framework trains the same model under torchrun (2 ranks, gloo, CPU) in alternating
rounds, bare and with dispatch-slurm:
  * torch DDP and accelerate (the preemption handler installed on both sides): the loop
    with and without ``preemption_point()`` after each step (the agreement's all-reduce,
    overlapped with the next step);
  * Hugging Face Trainer: without and with ``DispatchCallback`` (no saves in either);
  * Lightning: its own ``ModelCheckpoint`` (what ``enable_checkpointing`` adds by default) and
    ``DispatchCheckpoint`` in its place (no saves due in either).
The figure is the median step time (wall clock between two step ends, rank 0), the spread of
the ratio over the ABBA pairs of rounds (interquartile range), and the mean
time per step spent inside dispatch-slurm's per-step call (``preemption_point()``, or
``stop_requested()`` in the integrations' callbacks): what the protocol adds to the critical
path, whatever the machine's other load does to the A/B ratio (on 2 busy cores one round
differs from its partner by up to +-10%, a whole run's ratio by +-2%). Goal: <= 1%. Saves cost the same either way and are left out.

    python benchmarks/bench_integrations.py [--frameworks ddp,accelerate,hf,lightning] [--rounds 6]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

STEPS = {"ddp": 25, "accelerate": 25, "hf": 60, "lightning": 100}  # per round
PLAIN_ROUNDS = 10  # the plain loops interleave 10x more, shorter rounds: other load hits both sides alike


def model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 1))


def schedule(rounds: int):
    """(with dispatch?, measured?) per round: one unmeasured warm-up, then ABBA pairs so drift
    and the machine's other load hit both sides alike."""
    yield False, False
    for i in range(rounds):
        yield from (((False, True), (True, True)) if i % 2 == 0 else ((True, True), (False, True)))


def timed(fn, inside: list):
    """``fn``, adding the seconds each call takes to ``inside``."""
    def call(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            inside.append(time.perf_counter() - t)
    return call


def loop_round(step_fn, steps: int, point) -> list[float]:
    """Step times (wall clock between step ends), ``point`` called after each step."""
    times, last = [], time.perf_counter()
    for _ in range(steps):
        step_fn()
        if point:
            point()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times[2:]  # the round's first steps: warm-up


def loop_worker(rounds: int, m, opt, backward, framework: str) -> dict:
    """A plain training loop, bare and with preemption_point() after each step."""
    import torch
    from dispatch_slurm import install_preemption_handler, preemption_point
    x, y = torch.randn(64, 256), torch.randn(64, 1)

    def step():
        opt.zero_grad()
        backward(torch.nn.functional.mse_loss(m(x), y))
        opt.step()
    install_preemption_handler(lambda left: None)
    out = {"bare": [], "with": [], "inside": []}
    for with_, keep in schedule(rounds * PLAIN_ROUNDS):
        times = loop_round(step, STEPS[framework], timed(preemption_point, out["inside"]) if with_ else None)
        out["with" if with_ else "bare"] += [times] if keep else []
    return out


def worker_ddp(rounds: int) -> dict:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    m = torch.nn.parallel.DistributedDataParallel(model())
    return loop_worker(rounds, m, torch.optim.SGD(m.parameters(), lr=0.01), lambda loss: loss.backward(), "ddp")


def worker_accelerate(rounds: int) -> dict:
    import torch
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    m = model()
    m, opt = acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.01))
    return loop_worker(rounds, m, opt, acc.backward, "accelerate")


def worker_hf(rounds: int) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    from dispatch_slurm.integrations import hf
    from dispatch_slurm.runtime import preempt

    class Clock(TrainerCallback):
        def __init__(self):
            self.t = []

        def on_step_end(self, args, state, control, **kw):
            self.t.append(time.perf_counter())

    cfg = GPT2Config(vocab_size=100, n_positions=32, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 100, (4096, 32), generator=torch.Generator().manual_seed(0))]
    out = {"bare": [], "with": [], "inside": []}
    preempt.stop_requested = timed(preempt.stop_requested, out["inside"])
    for with_, keep in schedule(rounds):
        clock = Clock()
        args = TrainingArguments(output_dir=hf.output_dir(), max_steps=STEPS["hf"], save_strategy="no",
                                 per_device_train_batch_size=8, logging_strategy="no", report_to=[], use_cpu=True,
                                 disable_tqdm=True, seed=0, dataloader_num_workers=0)
        torch.manual_seed(0)
        cbs = [hf.DispatchCallback(), clock] if with_ else [clock]
        Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=data, callbacks=cbs).train()
        out["with" if with_ else "bare"] += [[b - a for a, b in zip(clock.t[5:], clock.t[6:])]] if keep else []
    return out


def worker_lightning(rounds: int) -> dict:
    import lightning.pytorch as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from dispatch_slurm.integrations import lightning as dl
    from dispatch_slurm.runtime import preempt

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.t = model(), []

        def training_step(self, batch, i):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def on_train_batch_end(self, *a):
            self.t.append(time.perf_counter())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(64 * 200, 256, generator=g), torch.randn(64 * 200, 1, generator=g))
    out = {"bare": [], "with": [], "inside": []}
    preempt.stop_requested = timed(preempt.stop_requested, out["inside"])
    for with_, keep in schedule(rounds):
        net = Net()
        ckpt = (dl.DispatchCheckpoint if with_ else ModelCheckpoint)(dirpath=dl.output_dir(), every_n_train_steps=10**9)
        kw = {"callbacks": [ckpt]}
        L.Trainer(max_steps=STEPS["lightning"], accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]),
                  strategy="ddp", logger=False, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=dl.output_dir(), **kw).fit(net, torch.utils.data.DataLoader(ds, batch_size=64))
        out["with" if with_ else "bare"] += [[b - a for a, b in zip(net.t[5:], net.t[6:])]] if keep else []
    return out


def run(framework: str, rounds: int, nproc: int) -> dict:
    from dispatch_slurm import store
    with tempfile.TemporaryDirectory(prefix="bench-integrations-") as tmp:
        env = {**os.environ, "DISPATCH_CHECKPOINT": tmp, "DISPATCH_EPOCH": "1000000",
               "DISPATCH_ATTEMPT": "bench.1.1000000", "DISPATCH_EXEC_DIR": store.make_exec_dir(tmp, "bench.1.1000000"),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               os.path.abspath(__file__), "--worker", framework, "--rounds", str(rounds), "--out", out]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frameworks", default="ddp,accelerate,hf,lightning")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        result = globals()[f"worker_{a.worker}"](a.rounds)
        if int(os.environ.get("RANK", "0")) == 0:
            with open(a.out, "w") as f:
                json.dump(result, f)
        import torch.distributed as dist
        if dist.is_initialized():  # a rank tearing gloo down while another still talks aborts
            dist.barrier()
            dist.destroy_process_group()
        return
    print(f"{'framework':<12} {'bare ms/step':>13} {'with ms/step':>13} {'ratio':>7} {'pairs IQR':>13} "
          f"{'in dispatch-slurm':>18}"
          f"   ({a.nproc} ranks, gloo, CPU)")
    for fw in a.frameworks.split(","):
        r = run(fw, a.rounds, a.nproc)
        bare, with_ = (statistics.median([t for rnd in r[k] for t in rnd]) * 1e3 for k in ("bare", "with"))
        # each round beside its ABBA partner: the spread says what the machine's noise allows
        pairs = sorted(statistics.median(w) / statistics.median(b) for b, w in zip(r["bare"], r["with"]))
        q1, q3 = pairs[len(pairs) // 4], pairs[(3 * len(pairs)) // 4]
        inside = statistics.mean(r["inside"]) * 1e3  # ms per step, the rare collective's share included
        print(f"{fw:<12} {bare:>13.2f} {with_:>13.2f} {with_ / bare:>6.3f}x {q1:>6.3f}-{q3:.3f}x "
              f"{inside * 1e3:>7.0f} us = {inside / bare:>5.2%}", flush=True)


if __name__ == "__main__":
    main()
