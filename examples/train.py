"""A toy trainer with the interface the Quickstart's job scripts use (standard library only).

    python examples/train.py --output-dir "$DISPATCH_EXEC_DIR" [--resume-from SAVE]
                             [--steps 20] [--save-every 10] [--step-time 0.5]

Each run trains ``--steps`` more steps (one step: a toy weight moves towards a target,
then ``--step-time`` seconds of "work"), starting from the save ``--resume-from`` names, or
from step 0. Every ``--save-every`` steps it saves ``<output-dir>/checkpoint-<step>/``:
``state.json`` (the step and the weight), then ``trainer_state.json`` last, as Hugging
Face's Trainer writes it, which is what ``dispatch-slurm watch`` waits for by default. The
save is written under a temporary name and renamed into place, so ``checkpoint-<step>``
never names a half-written save. It publishes nothing itself: run ``dispatch-slurm watch``
beside it (the README's Quickstart). Replace it with your own trainer: what it must do is
take ``--output-dir`` and ``--resume-from``.
"""

import argparse
import json
import os
import sys
import time

TARGET = 3.0


def load(save: str) -> tuple[int, float]:
    with open(os.path.join(save, "state.json"), encoding="utf-8") as f:
        state = json.load(f)
    return int(state["step"]), float(state["weight"])


def save(out: str, step: int, weight: float) -> str:
    final = os.path.join(out, f"checkpoint-{step}")
    tmp = os.path.join(out, f".tmp-checkpoint-{step}.{os.getpid()}")
    os.makedirs(tmp)
    for name, body in (("state.json", {"step": step, "weight": weight}), ("trainer_state.json", {"global_step": step})):
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
    os.rename(tmp, final)
    return final


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", required=True, help="where the saves go: $DISPATCH_EXEC_DIR")
    ap.add_argument("--resume-from", help="a save of this trainer to continue from (`dispatch-slurm latest --resume`)")
    ap.add_argument("--steps", type=int, default=20, help="steps to train in this run [20]")
    ap.add_argument("--save-every", type=int, default=10, help="save every N steps [10]")
    ap.add_argument("--step-time", type=float, default=0.5, help="seconds of work per step [0.5]")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.save_every < 1 or a.step_time < 0:
        ap.error("--steps and --save-every must be >= 1, --step-time >= 0")
    step, weight = load(a.resume_from) if a.resume_from else (0, 0.0)
    print(f"train.py: {'resumed from step %d (%s)' % (step, a.resume_from) if a.resume_from else 'starting at step 0'}",
          flush=True)
    for _ in range(a.steps):
        weight += 0.1 * (TARGET - weight)
        step += 1
        time.sleep(a.step_time)
        if step % a.save_every == 0:
            print(f"train.py: saved {save(a.output_dir, step, weight)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
