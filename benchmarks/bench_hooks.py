"""Per-task start-up cost of the hooks: 100 `srun -n1 true` steps inside one job, for
each way of wiring dispatch-slurm, side by side on one docker-slurm cluster.

  none        no plugin in plugstack.conf, no TaskProlog            (the baseline)
  idle        plugin + TaskProlog installed, the job uses neither   ("cost ~nothing")
  spank       plugin injects DISPATCH_* (--dispatch-checkpoint)
  taskprolog  TaskProlog prints DISPATCH_* (inputs exported, no plugin)

Variants are switched at run time: every srun and slurmstepd reads plugstack.conf
afresh; the TaskProlog line is in slurm.conf (`scontrol reconfigure`). The rounds
alternate the variants so drift hits all of them.

    python benchmarks/bench_hooks.py [--suite trixie] [--steps 100] [--rounds 2]
"""

import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # the test bed
from testbed.cluster import CONTROLLER, Cluster  # noqa: E402

DROPIN = "/etc/slurm/plugstack.conf.d/dispatch-slurm.conf"  # the package's enabling symlink
VARIANTS = {  # name: (plugin loaded, TaskProlog configured, sbatch options / exported inputs)
    "none": (False, False, []),
    "idle": (True, True, []),
    "spank": (True, False, ["--dispatch-checkpoint={root}"]),
    "taskprolog": (False, True, ["--export=ALL,DISPATCH_CHECKPOINT={root},DISPATCH_SUBMISSION=1"]),
}
JOB = """#!/bin/bash
#SBATCH -N1 -n1 -o {out}
start=$(date +%s.%N)
for i in $(seq {steps}); do srun -n1 --quiet true || echo "step $i failed"; done
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" 'BEGIN {{ print "elapsed", e - s }}'
srun -n1 --quiet bash -c 'echo "attempt=${{DISPATCH_ATTEMPT:-none}}"'
"""


def configure(c: Cluster, plugin: bool, taskprolog: bool) -> None:
    for host in [CONTROLLER, *c.node_names]:
        c.exec(host, f"ln -sfn /usr/share/dispatch-slurm/plugstack.conf {DROPIN}" if plugin else f"rm -f {DROPIN}")
        line = "TaskProlog=/usr/libexec/dispatch-slurm/taskprolog" if taskprolog else "#TaskProlog=off"
        c.exec(host, f"sed -i -E 's|^#?TaskProlog=.*|{line}|' /etc/slurm/slurm.conf")
    c.exec(CONTROLLER, ["scontrol", "reconfigure"])
    want = "/usr/libexec/dispatch-slurm/taskprolog" if taskprolog else "(null)"
    # 24.11 re-executes slurmctld on reconfigure: poll until it answers with the new value
    c.wait_until(lambda: re.search(r"TaskProlog\s*=\s*" + re.escape(want),
                                   c.exec(CONTROLLER, ["scontrol", "show", "config"], check=False).stdout),
                 timeout=60, what=f"TaskProlog={want}")
    c.wait_nodes(lambda ns: all(n.state == {"IDLE"} for n in ns), timeout=60, what="nodes idle")


def run_variant(c: Cluster, name: str, steps: int, i: int) -> float:
    plugin, taskprolog, opts = VARIANTS[name]
    configure(c, plugin, taskprolog)
    root = f"/checkpoints/bench/{name}-{i}"
    c.exec("c1", f"mkdir -p {root} && chmod 700 {root}", user="alice")
    if name == "taskprolog":  # N=1 exported by hand: allocated first, as `dispatch-slurm submit` does
        c.exec("c1", ["python3", "-c", f"from dispatch_slurm import store; store.allocate_submission({root!r})"],
               user="alice")
    out = f"/checkpoints/bench/{name}-{i}.out"
    job = c.submit("alice", JOB.format(out=out, steps=steps), args=[o.format(root=root) for o in opts])
    c.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=600)
    text = c.read(out)
    if "failed" in text or "elapsed" not in text:
        raise SystemExit(f"{name}: the job did not run cleanly:\n{text}")
    injected = re.search(r"attempt=(\S+)", text)[1]
    if (injected != "none") != (name in ("spank", "taskprolog")):
        raise SystemExit(f"{name}: DISPATCH_ATTEMPT={injected} is not what this variant gives")
    return float(re.search(r"elapsed (\S+)", text)[1]) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="trixie", choices=["bookworm", "trixie"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    with Cluster(a.suite, "fast", log=lambda s: print(s, file=sys.stderr)) as c:
        c.exec("c1", "install -d -m 1777 /checkpoints/bench")
        per = {name: [] for name in VARIANTS}
        for i in range(a.rounds):
            order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                per[name].append(run_variant(c, name, a.steps, i))
        base = statistics.median(per["none"])
        print(f"per-task start-up of `srun -n1 true`, {a.steps} steps x {a.rounds} rounds, "
              f"Slurm {c.slurm_release} (docker-slurm, 2-core host)")
        for name, xs in per.items():
            m = statistics.median(xs)
            print(f"  {name:<11} {m * 1000:7.1f} ms/step   {m / base:5.2f}x")


if __name__ == "__main__":
    main()
