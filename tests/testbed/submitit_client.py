"""A submitit user's side of tests/cluster/test_submitit_on_slurm.py, run in the controller as
the job's user (``python3 -m testbed.submitit_client ...`` with tests/ on PYTHONPATH):

    submit FOLDER ROOT STEPS EVERY PACE [SITE]
                                           submit Count(STEPS, EVERY, PACE); prints the job id.
                                           SITE ``plugin`` (default): the root in the extra
                                           parameters; ``no-plugin``: exported in slurm_setup
    poll FOLDER JOB OUT STOP               until STOP exists: one JSON line per look at the answer
    result FOLDER JOB                      job.result(), as JSON

Each poll line: the job's restart count Slurm gave just before the look (``restarts``), then
what the look found: ``absent`` (no result file), ``answer`` (job.result()'s value), ``stale``
(StaleResult: an older execution's answer was refused) or ``error``."""

import json
import os
import re
import subprocess
import sys
import time

import submitit

from dispatch_slurm.integrations import submitit as ds
from testbed.submitit_train import Count

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# docs/submitit.md's parameters with a 2-minute limit. Slurm sends --signal when the time left
# is at most the delay plus its 30 s check interval: with a 1-minute limit that is true from the
# start, and the USR2 could come before submitit's handler exists (during the Prolog).
TIMEOUT_MIN, SIGNAL_DELAY_S = 2, 30


def submit(folder: str, root: str, steps: str, every: str, pace: str, site: str = "plugin") -> None:
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=10)
    setup = [f"export PYTHONPATH={TESTS}"]
    if site == "plugin":  # docs/submitit.md's submitit-submit
        executor.update_parameters(slurm_additional_parameters={"dispatch-checkpoint": root})
    else:  # its submitit-no-plugin
        setup.append(f"export DISPATCH_CHECKPOINT={root}")
    executor.update_parameters(timeout_min=TIMEOUT_MIN, slurm_signal_delay_s=SIGNAL_DELAY_S,
                               slurm_partition="normal", slurm_setup=setup)
    job = executor.submit(Count(int(steps), int(every), float(pace)))
    print(job.job_id)


def restarts(job: str) -> int | None:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    m = re.search(r"\bRestarts=(\d+)", out.stdout)
    return int(m[1]) if m else None


def look(folder: str, job: str) -> dict:
    seen = {"t": time.time(), "restarts": restarts(job)}
    j = submitit.SlurmJob(folder=folder, job_id=job)
    if not j.paths.result_pickle.exists():
        return {**seen, "outcome": "absent"}
    try:
        return {**seen, "outcome": "answer", "value": j.result()}
    except ds.StaleResult as e:
        return {**seen, "outcome": "stale", "why": str(e)}
    except Exception as e:  # noqa: BLE001 -- recorded, the test judges it
        return {**seen, "outcome": "error", "why": f"{type(e).__name__}: {e}"[:500]}


def poll(folder: str, job: str, out: str, stop: str) -> None:
    with open(out, "a") as f:
        while not os.path.exists(stop):
            f.write(json.dumps(look(folder, job)) + "\n")
            f.flush()
            time.sleep(0.5)  # the poll's own pace: the user's loop, not a synchronisation


def result(folder: str, job: str) -> None:
    print(json.dumps(submitit.SlurmJob(folder=folder, job_id=job).result()))


if __name__ == "__main__":
    {"submit": submit, "poll": poll, "result": result}[sys.argv[1]](*sys.argv[2:])
