"""A trainer that rotates its saves as Hugging Face's ``save_total_limit`` does, and that runs
on after the process that started it ended (a step whose ``srun`` ended while its tasks train
on: a frozen slurmd). Not the project's: no dispatch import.

    python tests/rotating_trainer.py OUT --steps 12 --save-every 2 --keep 1 [--step-time 0.1]
                                     [--detach READY]
    python rotating_trainer.py --output-dir OUT [--resume-from SAVE] [--log FILE] ...

Each save is ``OUT/checkpoint-<step>/`` holding ``model.bin`` and, last, ``trainer_state.json``
(what `watch` takes as complete); then every save but the newest ``--keep`` is removed with
``shutil.rmtree`` (HF's rotation). ``--resume-from SAVE`` goes on from SAVE's step, after
checking its weights are that step's (a missing or wrong save is exit 3, as a trainer's own
load fails). ``--log FILE``: one line appended per resume, save and end, ``<OUT's name> <op>
<step> <unix time>``, so executions sharing the file stay apart. ``--detach READY``: the
process that was started (the "srun") starts the trainer in a session of its own, waits
until a save of it is published (``$DISPATCH_CHECKPOINT/pub``), writes READY and exits 1, as
srun does when the controller took the node for dead; the trainer trains on. Prints "saved
<step>" after each save.
"""

import argparse
import json
import os
import shutil
import sys
import time


def weights(step: int) -> bytes:
    return f"weights of step {step}\n".encode() * 64


def log(path, out: str, op: str, step: int) -> None:
    if path:
        with open(path, "a") as f:
            f.write(f"{os.path.basename(os.path.normpath(out))} {op} {step} {time.time():.3f}\n")


def resumed_step(save: str) -> int:
    """The step of ``save``, refusing one whose weights are not that step's."""
    with open(os.path.join(save, "trainer_state.json")) as f:
        step = json.load(f)["global_step"]
    with open(os.path.join(save, "model.bin"), "rb") as f:
        if f.read() != weights(step):
            raise ValueError(f"{save}: model.bin is not the weights of step {step}")
    return step


def train(out: str, steps: int, every: int, keep: int, step_time: float, first: int = 1, log_to=None) -> int:
    for step in range(first, steps + 1):
        time.sleep(step_time)  # the step's work
        if step % every:
            continue
        d = os.path.join(out, f"checkpoint-{step}")
        os.mkdir(d)
        with open(os.path.join(d, "model.bin"), "wb") as f:
            f.write(weights(step))
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            json.dump({"global_step": step}, f)
        saves = sorted((e for e in os.listdir(out) if e.startswith("checkpoint-")), key=lambda e: int(e[11:]))
        for old in saves[:-keep]:
            shutil.rmtree(os.path.join(out, old), ignore_errors=True)
        log(log_to, out, "saved", step)
        print(f"saved {step}", flush=True)
    log(log_to, out, "done", steps)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--output-dir")
    ap.add_argument("--resume-from")
    ap.add_argument("--log")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--keep", type=int, default=1)
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--detach")
    a = ap.parse_args()
    out = a.output_dir or a.out
    if out is None:
        ap.error("OUT or --output-dir is required")
    first = 1
    if a.resume_from:
        try:
            first = resumed_step(a.resume_from) + 1
        except (OSError, ValueError, KeyError) as e:
            print(f"cannot resume: {e}", file=sys.stderr)
            return 3
        log(a.log, out, "resumed", first - 1)
        print(f"resumed from {a.resume_from} at step {first - 1}", flush=True)
    if a.detach is None:
        return train(out, a.steps, a.save_every, a.keep, a.step_time, first, a.log)
    pid = os.fork()
    if pid == 0:  # the task: its own session, reparented once the "srun" above it is gone
        os.setsid()
        if os.fork():
            os._exit(0)
        os._exit(train(out, a.steps, a.save_every, a.keep, a.step_time, first, a.log))
    os.waitpid(pid, 0)
    pub = os.path.join(os.environ["DISPATCH_CHECKPOINT"], "pub")  # the node is lost once the watch published
    deadline = time.monotonic() + 60
    while not (os.path.isdir(pub) and os.listdir(pub)):
        if time.monotonic() > deadline:
            return 2
        time.sleep(0.02)
    with open(a.detach, "w") as f:
        f.write("ready\n")
    print("srun: error: node lost: the step's srun ends, its tasks run on", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
