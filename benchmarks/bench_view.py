"""Task start-up with the view vs without: `srun -n1 true` steps inside one job whose root holds
10^4 publications, on one docker-slurm cluster, and the view's mount alone.

  spank   --dispatch-checkpoint=R                       (the plugin without a view: the baseline)
  view    --dispatch-checkpoint=R --dispatch-view=R/out (every step: the view folder checked and
          made, `view prepare` run and waited for, `view publish` started and stopped at the
          step's end, and the task's mount namespace and bind)

The view's commands are site.conf's dispatch_slurm: by default a stand-in that does nothing
(prepare exits 0, publish sleeps until its SIGTERM), so the figure is the plugin's own cost;
`--commands installed` runs the nodes' `dispatch-slurm` (the package's prepare and publisher).
Goal: <= 50 ms more per task. The mount alone (unshare, the opens as the user, the bind) is
timed in the task by spank_env/test_contexts.c on this machine's kernel (the containers' kernel).

    python benchmarks/bench_view.py [--suite trixie] [--steps 50] [--rounds 2] [--pubs 10000]
                                    [--commands stand-in|installed] [--mounts 200]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the test bed
sys.path.insert(0, str(HERE.parent))
from support import build_spank  # noqa: E402
from testbed.cluster import CONTROLLER, Cluster  # noqa: E402

from dispatch_slurm.contract import names  # noqa: E402

SITE = "/etc/dispatch-slurm/site.conf"
STAND_IN = """#!/bin/sh
# the view's commands doing nothing: the plugin's own cost
[ "$2" = publish ] && exec sleep 100000
exit 0
"""
JOB = """#!/bin/bash
#SBATCH -N1 -n1 -o {out}
start=$(date +%s.%N)
for i in $(seq {steps}); do srun -n1 --quiet true || echo "step $i failed"; done
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" 'BEGIN {{ print "elapsed", e - s }}'
srun -n1 --quiet bash -c 'echo "view=${{DISPATCH_VIEW:-none}}"'
"""


def publications(root: Path, n: int) -> None:
    """n publications in root/pub/, as alice (names of saves of earlier executions)."""
    pub = root / "pub"
    pub.mkdir()
    for i in range(n):
        (pub / names.encode(1_000_000 + i // 1000, i, f"exec/old.{i // 1000}/checkpoint-{i}")).touch()
    for p in (root, pub, *pub.iterdir()):
        os.chown(p, 2001, 2001)


def run_variant(c: Cluster, name: str, steps: int, i: int, root: str) -> float:
    out = f"/checkpoints/bench/{name}-{i}.out"
    opts = [f"--dispatch-checkpoint={root}"] + ([f"--dispatch-view={root}/out"] if name == "view" else [])
    job = c.submit("alice", JOB.format(out=out, steps=steps), args=opts)
    c.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=900)
    text = c.read(out)
    if "failed" in text or "elapsed" not in text:
        raise SystemExit(f"{name}: the job did not run cleanly:\n{text}")
    if (re.search(r"view=(\S+)", text)[1] != "none") != (name == "view"):
        raise SystemExit(f"{name}: DISPATCH_VIEW is not what this variant gives:\n{text}")
    return float(re.search(r"elapsed (\S+)", text)[1]) / steps


def mount_alone(n: int, pubs: int) -> list[float]:
    """The task's part (task_init_privileged: namespace, opens, bind), in microseconds, n times."""
    from test_spank_view import Bed  # the local tests' job tree, their stand-in commands
    top = Path(tempfile.mkdtemp(prefix="bench-view-", dir="/tmp"))
    top.chmod(0o755)
    try:
        driver = build_spank("test_contexts", top)
        (top / "bed").mkdir(mode=0o755)
        bed = Bed(top / "bed")
        publications(bed.root, pubs)
        got = []
        for _ in range(n):
            shutil.rmtree(bed.root / "exec", ignore_errors=True)
            shutil.rmtree(bed.root / "epochs", ignore_errors=True)
            r = subprocess.run([str(driver), "view", str(bed.top), str(bed.root / "out"), "plain"],
                               capture_output=True, text=True, check=True)
            m = re.search(r"^task_init_privileged_us: (\d+)$", r.stdout, re.M)
            if "task_init_privileged: 0" not in r.stdout or m is None:
                raise SystemExit(f"the driver did not bind the view:\n{r.stdout}{r.stderr}")
            got.append(int(m[1]))
        return got
    finally:
        shutil.rmtree(top)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="trixie", choices=["bookworm", "trixie", "sid"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pubs", type=int, default=10_000)
    ap.add_argument("--commands", default="stand-in", choices=["stand-in", "installed"])
    ap.add_argument("--mounts", type=int, default=200, help="times the mount alone is timed (0: skip)")
    a = ap.parse_args()
    if a.mounts:
        us = mount_alone(a.mounts, a.pubs)
        print(f"the view's mount alone (task_init_privileged: unshare, / slave, opens as the user, bind), "
              f"{a.mounts} tasks, this kernel ({os.uname().release}): median {statistics.median(us) / 1000:.2f} ms, "
              f"p90 {sorted(us)[int(len(us) * 0.9)] / 1000:.2f} ms")
    with Cluster(a.suite, "fast", log=lambda s: print(s, file=sys.stderr)) as c:
        c.exec("c1", "install -d -m 1777 /checkpoints/bench")
        root = "/checkpoints/bench/root"
        c.exec("c1", f"install -d -m 0700 -o alice -g alice {root} /checkpoints/bench/cmd")
        publications(c.path(root), a.pubs)
        if a.commands == "stand-in":
            (c.path("/checkpoints/bench/cmd") / "view-commands").write_text(STAND_IN)
            (c.path("/checkpoints/bench/cmd") / "view-commands").chmod(0o755)
            for host in [CONTROLLER, *c.node_names]:
                c.exec(host, f"echo 'dispatch_slurm = /checkpoints/bench/cmd/view-commands' >> {SITE}")
        per: dict[str, list[float]] = {"spank": [], "view": []}
        for i in range(a.rounds):
            for name in (per if i % 2 == 0 else reversed(list(per))):
                per[name].append(run_variant(c, name, a.steps, i, root))
        base, view = statistics.median(per["spank"]), statistics.median(per["view"])
        print(f"per-task start-up of `srun -n1 true`, {a.steps} steps x {a.rounds} rounds, {a.pubs} publications "
              f"in the root, view commands: {a.commands}, Slurm {c.slurm_release} (docker-slurm, 2-core host)")
        print(f"  spank  {base * 1000:7.1f} ms/step")
        print(f"  view   {view * 1000:7.1f} ms/step   {1000 * (view - base):+6.1f} ms per task (goal <= +50 ms)")


if __name__ == "__main__":
    main()
