"""A training loop on torchtitan's own CheckpointManager, as its user writes it (CPU, one gloo
rank): ``checkpoint.folder="checkpoint"`` under the dump folder --out, ``keep_latest_k=2``,
``manager.load()`` (the greatest ``step-<N>`` holding DCP's ``.metadata``) at the start and
``manager.save(step)`` after every step (it saves every ``--save-every``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Log, Pace, arguments, digest  # noqa: E402


def main() -> None:
    a = arguments(__doc__).parse_args()
    log = Log(a.record)
    import torch
    import torch.distributed as dist
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(a.seed)
    model = torch.nn.Linear(16, 16)
    opt = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 0.01})],
        implementation="for-loop").build(model_parts=[model])
    lrs = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=opt, training_steps=a.max_steps)

    class TrainState:
        step = 0

        def state_dict(self):
            return {"step": self.step}

        def load_state_dict(self, sd):
            self.step = sd["step"]

    state = TrainState()
    config = CheckpointManager.Config(enable=True, folder="checkpoint", interval=a.save_every, keep_latest_k=2)
    ckpt = config.build(dataloader=None, model_parts=[model], optimizers=opt, lr_schedulers=lrs,
                        states={"train_state": state}, sd_adapter=None, base_folder=a.out)
    log("start")
    if ckpt.load():
        log("resume", step=state.step)
    g = torch.Generator().manual_seed(a.seed)
    batches = torch.randn(a.max_steps, 8, 16, generator=g)
    pace = Pace(a.step_time)
    while state.step < a.max_steps:
        x = batches[state.step]
        loss = ((model(x) - x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        lrs.step()
        state.step += 1
        pace()
        log("step", step=state.step)
        ckpt.save(state.step)
        if state.step % a.save_every == 0:
            log("save", step=state.step)
    ckpt.close()
    log("done", step=state.step, h=digest(model.state_dict()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
