"""A stand-in for `train.py` in the README's job script: a run longer than one time limit.

It takes what the README passes a trainer (``--output-dir``, ``--resume-from``), trains one
step every ``--step-time`` seconds up to ``--max-steps`` and then exits 0, saves
``checkpoint-<step>/`` every ``--save-every`` steps in the Hugging Face layout
(``trainer_state.json`` last, so ``dispatch-slurm watch`` publishes it), and fails the way
real trainers fail:

- ``--trap``: dispatch-slurm's preemption handler (``defer=True``): on the time-limit
  signal it saves the last whole step, publishes it, prints the sentinel and exits 0; at
  the end of training it says so (``mark_finished``), as the integrations do;
- ``--own-handler``: a user's own SIGTERM handler that knows nothing of dispatch-slurm: at
  the next step it saves (``watch`` publishes it), prints the sentinel, as users copy it from
  the docs, and exits 0;
- with neither the signal kills it (Slurm's TIMEOUT, or the --signal's SIGTERM);
- ``--crash-at-step K``: exits 1 at step K, as a trainer with a bug does;
- ``--steps-after-resume K``: a resumed execution trains K more steps, then finishes (a
  run whose first execution meets its time limit and whose second one ends it).

Every step, save and resume is a JSON line in ``--log`` (with the execution's attempt),
so a test can check that each execution resumed exactly where the previous one saved.
A script, not a module of the test bed's package: jobs run it by path on the nodes."""

import argparse
import json
import os
import signal
import sys
import time

STATE = "trainer_state.json"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--resume-from")
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--trap", action="store_true")
    ap.add_argument("--own-handler", action="store_true")
    ap.add_argument("--steps-after-resume", type=int)
    ap.add_argument("--crash-at-step", type=int)
    ap.add_argument("--log", required=True)
    a = ap.parse_args(argv)
    attempt = os.environ.get("DISPATCH_ATTEMPT", "none")
    fd = os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(op, **fields):
        os.write(fd, (json.dumps({"t": time.time(), "attempt": attempt, "op": op, **fields}) + "\n").encode())

    def save(step):
        path = os.path.join(a.output_dir, f"checkpoint-{step}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "model.bin"), "w") as f:
            f.write("x" * 1024)
        with open(os.path.join(path, STATE), "w") as f:
            json.dump({"global_step": step}, f)
        log("save", step=step, path=path)
        return path

    step = 0
    if a.resume_from:
        with open(os.path.join(a.resume_from, STATE)) as f:
            step = json.load(f)["global_step"]
    log("start", resumed_at=step, resume_from=a.resume_from)
    max_steps = a.max_steps if a.steps_after_resume is None or not a.resume_from else step + a.steps_after_resume
    if a.trap:
        from dispatch_slurm import install_preemption_handler, preemption_point
        install_preemption_handler(lambda left: save(step), defer=True)
    stop = []
    if a.own_handler:
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if a.trap or a.own_handler:
        log("trapped")  # after the handler is in place: a signal before this line killed the trainer
    while step < max_steps:
        time.sleep(a.step_time)
        step += 1
        log("step", step=step)
        if a.crash_at_step is not None and step >= a.crash_at_step:
            log("crash", step=step)
            print(f"longtrain: crashed at step {step}", file=sys.stderr)
            sys.exit(1)
        if step % a.save_every == 0:
            save(step)
        if a.trap:
            preemption_point()  # a pending signal: save this whole step, publish it, exit 0
        if stop:
            save(step)
            log("stopped", step=step)
            print("dispatch-checkpoint-complete", flush=True)
            sys.exit(0)
    save(step)  # the final save, as the Trainer makes one at the end of training
    if a.trap:
        from dispatch_slurm import mark_finished
        mark_finished(step=step)
    log("done", step=step)


if __name__ == "__main__":
    main()
