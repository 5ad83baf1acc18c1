"""Time from SIGTERM to the published save, per rank count (1, 2, 4): examples/dist_train.py
under torchrun (gloo, CPU), SIGTERM to every rank at a random moment (as Slurm sends it),
measured from the signal to the `published` event of the preemption's save (every rank's
shards written and fsynced, the ranks' agreement, one publication). The same trials also
check the save (complete, resumable from its step): see tests/testbed/ranks.py.

    PYTHONPATH=tests python benchmarks/bench_preempt_ranks.py [--trials 3] [--ranks 1,2,4]
"""

import argparse
import os
import random
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from testbed import ranks  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print(f"{'ranks':>5} {'model':>5} {'trials':>6} {'median s':>9} {'max s':>7}   SIGTERM -> published")
    failed = 0
    for n in map(int, a.ranks.split(",")):
        for fsdp in (False, True):
            times = []
            for _ in range(a.trials):
                t = ranks.Trial(nproc=n, fsdp=fsdp, async_save=False, target="all", delay=rng.uniform(0.5, 2.0))
                with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
                    os.mkdir(os.path.join(tmp, "root"))
                    r = ranks.run(t, os.path.join(tmp, "root"), rng, tmp)
                if r.error or r.deadlock or r.torn:
                    failed += 1
                    print(f"trial failed: {r.error[:500]}", file=sys.stderr)
                else:
                    times.append(r.published_s)
            if times:
                print(f"{n:>5} {'fsdp' if fsdp else 'ddp':>5} {len(times):>6} {statistics.median(times):>9.3f} "
                      f"{max(times):>7.3f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
