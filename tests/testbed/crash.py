"""Run `dispatch-slurm` with the supervisor killed (SIGKILL, no cleanup) at a chosen
point of a submission, to show what a restart makes of the record:

    python3 crash.py after-sbatch run ROOT --resubmit 2 -- job.sh
    python3 crash.py before-sbatch run ROOT -- job.sh

The fault is injected here, in the test bed, by wrapping the Slurm client's submit;
production code has no crash hook. A script run by path: on docker-slurm's nodes only
dispatch_slurm is installed."""

import os
import signal
import sys

from dispatch_slurm.cli import main
from dispatch_slurm.slurm.client import Slurm

POINTS = ("before-sbatch", "after-sbatch")


def crashing_submit(point: str):
    real = Slurm.submit

    def submit(self, *args, **kwargs):
        if point == "before-sbatch":  # the intent is recorded, sbatch never runs
            os.kill(os.getpid(), signal.SIGKILL)
        job = real(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)  # queued, but the job id is never recorded
        return job
    return submit


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in POINTS:
        sys.exit(f"usage: crash.py {{{'|'.join(POINTS)}}} DISPATCH-SLURM-ARGS...")
    Slurm.submit = crashing_submit(sys.argv[1])
    main(sys.argv[2:])
