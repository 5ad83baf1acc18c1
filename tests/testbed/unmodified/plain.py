"""A plain torch.save loop: saves ``checkpoint-<step>.pt`` into --out, keeps the two newest,
and resumes from the highest ``checkpoint-<step>.pt`` it finds there."""

import glob
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Log, Pace, arguments, digest  # noqa: E402


def main() -> None:
    a = arguments(__doc__).parse_args()
    log = Log(a.record)
    torch.manual_seed(a.seed)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    os.makedirs(a.out, exist_ok=True)
    saves = sorted((int(re.search(r"checkpoint-(\d+)\.pt$", p)[1]), p)
                   for p in glob.glob(os.path.join(a.out, "checkpoint-*.pt")))
    step = 0
    log("start", resume_from=saves[-1][1] if saves else None)
    if saves:
        state = torch.load(saves[-1][1], weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        log("resume", step=step, path=saves[-1][1])
    data = torch.Generator().manual_seed(a.seed)
    batches = torch.randn(a.max_steps, 8, 16, generator=data)
    pace = Pace(a.step_time)
    while step < a.max_steps:
        x = batches[step]
        loss = ((model(x) - x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        pace()
        log("step", step=step)
        if step % a.save_every == 0:
            path = os.path.join(a.out, f"checkpoint-{step}.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
            log("save", step=step, path=path)
            for old in sorted(glob.glob(os.path.join(a.out, "checkpoint-*.pt")),
                              key=lambda p: int(re.search(r"checkpoint-(\d+)\.pt$", p)[1]))[:-2]:
                os.remove(old)
                log("delete", path=old)
    log("done", step=step, h=digest(model.state_dict()))


if __name__ == "__main__":
    main()
