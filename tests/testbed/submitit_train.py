"""The submitit trainer of tests/test_submitit.py and tests/cluster/test_submitit_on_slurm.py.

``Count(steps, every, pace)`` counts to ``steps``, one step per ``pace`` seconds of "work",
publishes every ``every`` steps, and answers ``{"answer": steps, "attempt": ..., "resumed": ...}``.
Each execution prints one JSON line per event (start, with where it resumed from and what its
pickled self held; published; done) on stdout: its own log, under the integration.
``$COUNT_GATE``: before answering, wait (bounded) until that file exists, so a test decides
which of two overlapping executions answers last."""

import json
import os
import time

from dispatch_slurm.integrations import submitit as ds

GATE_TIMEOUT_S = 600


def say(**fields) -> None:
    print(json.dumps({"t": time.time(), "attempt": os.environ.get("DISPATCH_ATTEMPT"), **fields}), flush=True)


class Count(ds.Checkpointable):
    defer = True  # save between whole steps, at preemption_point()

    def __init__(self, steps: int, every: int, pace: float):
        self.steps, self.every, self.pace = steps, every, pace

    def run(self):
        pickled = getattr(self, "step", None)  # a fresh instance has none: the pickle holds no state
        t_resume = time.time()
        path = self.resume_path()
        self.step = 0
        if path is not None:
            with open(os.path.join(path, "state.json")) as f:
                self.step = json.load(f)["step"]
        resumed = self.step
        say(event="start", resumed=resumed, latest=path, t_resume=t_resume, pickled_step=pickled, host=os.uname().nodename)
        while self.step < self.steps:
            time.sleep(self.pace)  # the work of one step
            self.step += 1
            if self.step % self.every == 0:
                ds.publish(self.save_checkpoint(ds.output_dir()))
                say(event="published", step=self.step)
            self.preemption_point()
        gate = os.environ.get("COUNT_GATE")
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while gate and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        say(event="done", step=self.step)
        return {"answer": self.step, "attempt": os.environ["DISPATCH_ATTEMPT"], "resumed": resumed}

    def save_checkpoint(self, exec_dir: str) -> str:
        path = ds.save_dir(exec_dir, self.step)  # refused when this step is published: the signal stops on it
        with open(os.path.join(path, "state.json"), "w") as f:
            json.dump({"step": self.step}, f)
        say(event="saved", step=self.step)
        return path
