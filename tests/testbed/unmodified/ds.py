"""A DeepSpeed trainer as its user writes it (one rank, or several under torchrun; CPU, gloo,
ZeRO-1): ``engine.load_checkpoint(--out)``, which loads the tag DeepSpeed's ``latest`` file
names, then ``engine.save_checkpoint(--out)`` every ``--save-every`` steps (``global_step<N>/``
and ``latest``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Log, Pace, arguments, digest  # noqa: E402


def main() -> None:
    a = arguments(__doc__).parse_args()
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29517")):
        os.environ.setdefault(key, value)  # `python ds.py`: one rank
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log = Log(a.record, rank)
    import torch
    import deepspeed
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(a.seed)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    config = {"train_micro_batch_size_per_gpu": 8, "train_batch_size": 8 * world,
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    log("start")
    path, _ = engine.load_checkpoint(a.out)  # (None, None) while --out has no `latest`
    if path is not None:
        log("resume", step=engine.global_steps, path=path)
    g = torch.Generator().manual_seed(a.seed)
    batches = torch.randn(a.max_steps, world, 8, 16, generator=g)
    pace = Pace(a.step_time)
    while engine.global_steps < a.max_steps:
        x = batches[engine.global_steps, rank]
        loss = ((engine(x) - x) ** 2).mean()
        engine.backward(loss)
        engine.step()
        pace()
        log("step", step=engine.global_steps)
        if engine.global_steps % a.save_every == 0:
            engine.save_checkpoint(a.out)
            log("save", step=engine.global_steps)
    log("done", step=engine.global_steps, h=digest(engine.module.state_dict()))


if __name__ == "__main__":
    main()
