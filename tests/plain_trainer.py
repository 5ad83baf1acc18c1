"""A plain PyTorch trainer that is not Hugging Face's: it saves with torch.save into
``$DISPATCH_EXEC_DIR/checkpoint-<step>/model.pt`` and resumes from ``--resume-from``.

    python tests/plain_trainer.py --steps 30 --save-every 10 [--order ORDER] [--resume-from PATH]

How it writes a save (``--order``):
    plain         model.pt only, no marker: what a user's own loop does
    marker-last   model.pt, then COMPLETE (watch --marker COMPLETE's rule)
    marker-first  COMPLETE, then model.pt: the order that tears a publication
    helper        dispatch_slurm.saving(step): complete before its name appears
``--tear-at STEP``: at that step write only the first half of model.pt (``helper``: inside
the block), print "torn <step>" and wait to be killed. Prints "saved <step>" after each
save and "resumed <step>" when it loads one.
"""

import argparse
import io
import os
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, required=True)
    ap.add_argument("--order", default="plain", choices=("plain", "marker-last", "marker-first", "helper"))
    ap.add_argument("--resume-from")
    ap.add_argument("--tear-at", type=int)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    step = 0
    if a.resume_from:
        state = torch.load(os.path.join(a.resume_from, "model.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        step = state["step"]
        print(f"resumed {step}", flush=True)
    out = os.environ["DISPATCH_EXEC_DIR"]
    while step < a.steps:
        with torch.no_grad():
            model.weight.add_(0.01)
        step += 1
        if step % a.save_every == 0:
            save(out, step, {"model": model.state_dict(), "step": step}, a.order, a.tear_at == step)
            print(f"saved {step}", flush=True)
    return 0


def write(path: str, state: dict, tear: bool) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] if tear else data)
        f.flush()
        if tear:
            print(f"torn {state['step']}", flush=True)
            while True:  # a trainer killed in the middle of writing its weights
                time.sleep(1)


def save(out: str, step: int, state: dict, order: str, tear: bool) -> None:
    if order == "helper":
        from dispatch_slurm import saving
        with saving(step) as d:
            write(str(d / "model.pt"), state, tear)
        return
    d = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(d)
    if order == "marker-first":
        open(os.path.join(d, "COMPLETE"), "w").close()
    write(os.path.join(d, "model.pt"), state, tear)
    if order == "marker-last":
        open(os.path.join(d, "COMPLETE"), "w").close()


if __name__ == "__main__":
    sys.exit(main())
