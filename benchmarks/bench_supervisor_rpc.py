"""slurmctld RPCs of supervision: 1, 10 and 100 supervised jobs, and how soon a job that
ended is resubmitted (issue 26's "before", and later its "after", side by side).

On docker-slurm (default Slurm 26.05, fast profile; nodes declared with enough CPUs for
every job at once), each of N roots gets one tiny job (`--wrap 'sleep L; exit 3 on the
first submission'`, one root per job as for a sweep) under `dispatch-slurm run ROOT
--resubmit 1` with the default poll: the first execution FAILS after L s, `run`
resubmits, the second completes after L s more, and `run` exits 0. The supervisors run
where a user runs them, in the controller container (the login node) as alice.

Modes, measured in the same run:

  per-root  one `dispatch-slurm run ROOT ...` process per root (today's; the reference)
  shared    one `dispatch-slurm run ROOT... -- ...` process for all N roots (supervisor/fleet.py)

Counted from `sdiag` (reset with `sdiag --reset` as root when a scenario starts, then read
as root: the benchmark's own queries are root's and never alice's):

  RPCs       the per-user count of alice, the supervisors' user: every RPC that the
             supervisors and the Slurm commands they run (scontrol, sbatch, sacct...) sent
             to slurmctld. sacct talks to slurmdbd, so it appears only where it also asks
             slurmctld.
  per type   the per-message-type counts over the same window, minus sdiag's own
             (REQUEST_STATS_INFO, REQUEST_RESET_STATS). sdiag has no user x type table:
             these are every user's, so the node daemons' job-lifecycle messages
             (REQUEST_COMPLETE_BATCH_SCRIPT, MESSAGE_EPILOG_COMPLETE,
             REQUEST_COMPLETE_PROLOG...) appear here over a whole life, not in RPCs.
  steady     a window in which every first execution runs and none is due to end: from
             all started + 10 s to the earliest first end - 5 s (needs >= 30 s; else raise
             --job-seconds).
  whole life from the launch to the last supervisor's exit; RPCs/min = count / minutes,
             and RPCs per job = count / N.
  CPU        of the supervisor processes (user+sys, their reaped children included: each
             scontrol/sbatch they ran), from /proc/PID/stat in the steady window and from
             bash's `times` over the whole life; slurmctld's own in the steady window.
  end->resubmission  Slurm's recorded End of the failed first job to the Submit time of
             the next (sacct, 1 s resolution); beside it, from the record, Slurm's End to
             the `ended` fact (the poll) and that fact to the `submitted` one.

Other scenarios (--what):

  issue      issue 26's figure: one `dispatch-slurm run ROOT --resubmit 0 -- --wrap
             'sleep 240'`, its whole life and its steady state
  probe      what each CLI query costs slurmctld on this release, one by one (three of
             alice's jobs pending or running), for choosing the shared poller's query

    python benchmarks/bench_supervisor_rpc.py [--suite sid] [--jobs 1,10,100] \\
        [--modes per-root[,shared]] [--what sweep[,issue][,probe]] [--job-seconds 240] \\
        [--json bench_supervisor_rpc.json]
"""

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # the test bed
from dispatch_slurm.slurm.dialects import DATA_PARSER  # noqa: E402
from dispatch_slurm.supervisor.record import Record  # noqa: E402
from testbed import sdiag as sdiag_mod  # noqa: E402
from testbed import wait  # noqa: E402
from testbed.cluster import CONTROLLER, SUITES, Cluster  # noqa: E402

USER = "alice"
NODES = 3
SDIAG_OWN = {"REQUEST_STATS_INFO", "REQUEST_RESET_STATS"}
_TIMES = re.compile(r"(\d+)m([\d.]+)s")


class Unavailable(Exception):
    """A mode this dispatch-slurm cannot run yet."""


# -- modes: which processes supervise which roots ------------------------------------------

def per_root_argvs(roots: list[str], run_args: list[str], sbatch: list[str]) -> list[list[str]]:
    """Today's: one `dispatch-slurm run ROOT` process per root."""
    return [["dispatch-slurm", "run", root, *run_args, "--", *sbatch] for root in roots]


def shared_argvs(roots: list[str], run_args: list[str], sbatch: list[str]) -> list[list[str]]:
    """Issue 26's: one process follows every root, each with its own record and rules."""
    return [["dispatch-slurm", "run", *roots, *run_args, "--", *sbatch]]


MODES = {"per-root": per_root_argvs, "shared": shared_argvs}


# -- sdiag ---------------------------------------------------------------------------------

sdiag = sdiag_mod.read
sdiag_reset = sdiag_mod.reset


def delta(a: dict, b: dict) -> dict:
    """What happened between two sdiag reads: alice's count, every type's but sdiag's own."""
    def sub(part):
        return {k: v[0] - a[part].get(k, [0, 0])[0] for k, v in b[part].items()
                if v[0] - a[part].get(k, [0, 0])[0] > 0}
    types = {k: n for k, n in sub("types").items() if k not in SDIAG_OWN}
    users = sub("users")
    return {"seconds": b["t"] - a["t"], "rpcs": users.get(USER, 0), "types": types, "users": users,
            "ctl_us": sum(v[1] for k, v in b["types"].items() if k not in SDIAG_OWN) -
            sum(v[1] for k, v in a["types"].items() if k not in SDIAG_OWN)}


def short(t: str) -> str:
    return t.removeprefix("REQUEST_")


# -- CPU -----------------------------------------------------------------------------------

def cpu_ticks(c: Cluster, pids: list[int]) -> tuple[dict[int, int], int, int]:
    """({pid: utime+stime+cutime+cstime}, slurmctld's utime+stime, CLK_TCK) in the controller."""
    script = ("for p in " + " ".join(map(str, pids)) + "; do [ -r /proc/$p/stat ] && echo \"$p $(cat /proc/$p/stat)\"; "
              "done; echo \"ctl $(cat /proc/$(pgrep -xo slurmctld)/stat)\"; echo \"tck $(getconf CLK_TCK)\"")
    per, ctl, tck = {}, 0, 100
    for line in c.exec(CONTROLLER, script).stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key == "tck":
            tck = int(rest)
            continue
        f = rest.rpartition(")")[2].split()  # fields 3.. of proc(5): utime is field 14
        if key == "ctl":
            ctl = int(f[11]) + int(f[12])
        else:
            per[int(key)] = sum(int(x) for x in f[11:15])
    return per, ctl, tck


def times_children(text: str) -> float:
    """CPU seconds (user + sys) of a shell's reaped children, from bash's `times`."""
    lines = text.strip().splitlines()
    if len(lines) < 2:
        return 0.0
    return sum(int(m) * 60 + float(s) for m, s in _TIMES.findall(lines[1]))


# -- one scenario: N roots under one mode --------------------------------------------------

class Scenario:
    """N roots, their supervisor processes as the mode gives them, and what they cost."""

    def __init__(self, c: Cluster, label: str, n: int, mode: str, run_args: list[str], sbatch: list[str],
                 job_seconds: float, log):
        self.c, self.label, self.n, self.mode = c, label, n, mode
        self.run_args, self.sbatch, self.job_seconds, self.log = run_args, sbatch, job_seconds, log
        self.base = f"/checkpoints/rpc-{label}-{n}-{mode}-{int(time.time())}"
        self.roots = [f"{self.base}/r{i:03d}" for i in range(n)]
        self.host = c.path(self.base)
        self.argvs = MODES[mode](self.roots, run_args, sbatch)
        self.stems = [f"{self.base}/p{i:03d}" for i in range(len(self.argvs))]

    def hpath(self, path: str):
        return self.c.path(path)

    def facts(self, root: str) -> list[dict]:
        return Record(str(self.hpath(root))).read() if self.hpath(f"{root}/record.jsonl").exists() else []

    def _read(self, stem: str, ext: str) -> str:
        p = self.hpath(f"{stem}.{ext}")
        return p.read_text() if p.exists() else ""

    def launch(self) -> None:
        lines = [f"cd {self.base}"]
        for argv, stem in zip(self.argvs, self.stems):
            inner = (f"{shlex.join(argv)} & p=$!; echo $p > {stem}.pid; wait $p; rc=$?; times > {stem}.times; "
                     f"echo $rc > {stem}.rc")
            lines.append(f"setsid nohup bash -c {shlex.quote(inner)} > {stem}.log 2>&1 < /dev/null &")
        self.hpath(f"{self.base}/launch.sh").write_text("\n".join(lines) + "\n")
        self.c.exec(CONTROLLER, f"bash {self.base}/launch.sh", user=USER, workdir=self.base)

    def pids(self) -> list[int]:
        return [int(t) for s in self.stems if (t := self._read(s, "pid").strip()).isdigit()]

    def started_first(self) -> list[dict]:
        return [f for root in self.roots for f in self.facts(root) if f["type"] == "started" and f["n"] == 1]

    def exited(self) -> bool:
        return all(self._read(s, "rc").strip() for s in self.stems)

    def run(self) -> dict:
        c, n = self.c, self.n
        c.exec(CONTROLLER, f"mkdir -p {self.base} && cd {self.base} && mkdir -m 700 " +
               " ".join(r.rsplit("/", 1)[1] for r in self.roots), user=USER)
        s0 = sdiag_reset(c)
        t0 = time.time()
        self.log(f"{self.label}: {n} job(s), mode {self.mode}: {len(self.argvs)} supervisor process(es)")
        self.launch()
        first = wait.until(lambda: (s := self.started_first()) and len(s) == n and s, every=1,
                           timeout=300 + 3 * n, what=f"{n} first executions to start ({self.base})")
        t_started = time.time()
        pids = wait.until(lambda: len(p := self.pids()) == len(self.stems) and p, timeout=30, every=1,
                          what="every supervisor's pid")
        steady = self.steady_window(first, pids)
        wait.until(self.exited, timeout=2 * self.job_seconds + 300 + 3 * n, every=1,
                   what=f"the {len(self.stems)} supervisor(s) to exit ({self.base})")
        s_end = sdiag(c)
        t_end = max(self.hpath(f"{s}.rc").stat().st_mtime for s in self.stems)
        rcs = [int(self._read(s, "rc")) for s in self.stems]
        if any(rcs):
            bad = next(s for s, rc in zip(self.stems, rcs) if rc)
            raise SystemExit(f"{self.label}: a supervisor exited {max(rcs)}:\n{self._read(bad, 'log')[-2000:]}")
        life = delta(s0, s_end)
        life["seconds"] = t_end - t0
        cpu = sum(times_children(self._read(s, "times")) for s in self.stems)
        out = {"label": self.label, "jobs": n, "mode": self.mode, "processes": len(self.stems),
               "start_s": t_started - t0, "life": life, "steady": steady, "life_cpu_s": cpu,
               "latency": self.latencies(), "wall_s": time.time() - t0}
        return out

    def steady_window(self, first: list[dict], pids: list[int]) -> dict | None:
        """sdiag and CPU over the window where every first execution runs and none ends."""
        starts = [f["start_time"] for f in first if f.get("start_time")]
        t_a = time.time() + 10
        t_b = min(starts) + self.job_seconds - 5 if starts else t_a
        if t_b - t_a < 30:
            self.log(f"{self.label}: no steady window ({t_b - t_a:.0f} s between all started and the first end; "
                     "raise --job-seconds)")
            return None
        time.sleep(max(0.0, t_a - time.time()))  # a measurement window, not a synchronisation
        a, (ca, ctl_a, tck) = sdiag(self.c), cpu_ticks(self.c, pids)
        time.sleep(max(0.0, t_b - time.time()))
        b, (cb, ctl_b, _) = sdiag(self.c), cpu_ticks(self.c, pids)
        d = delta(a, b)
        gone = [p for p in ca if p not in cb]
        if gone:
            raise SystemExit(f"{self.label}: supervisor(s) {gone} exited inside the steady window")
        d["cpu_s"] = sum(cb[p] - ca[p] for p in ca) / tck
        d["ctl_cpu_s"] = (ctl_b - ctl_a) / tck
        return d

    def latencies(self) -> list[dict]:
        """Per root that resubmitted: Slurm's End of the ended job -> Submit of the next, and
        the record's view (End -> `ended` fact -> `submitted` fact)."""
        pairs = []
        for root in self.roots:
            facts = self.facts(root)
            for e in (f for f in facts if f["type"] == "ended"):
                nxt = next((f for f in facts if f["type"] == "submitted" and f["t"] > e["t"]), None)
                if nxt:
                    pairs.append((root, e, nxt))
        if not pairs:
            return []
        ids = sorted({p[1]["job"] for p in pairs} | {p[2]["job"] for p in pairs})

        def accounted():
            out = self.c.exec(CONTROLLER, ["sacct", "-X", "-n", "-P", "--allusers", "-j", ",".join(map(str, ids)),
                                           "-o", "JobID,Submit,End"], env={"SLURM_TIME_FORMAT": "%s"}).stdout
            rows = {int(j): (s, e) for j, s, e in (line.split("|") for line in out.splitlines() if line.strip())
                    if j.isdigit()}
            return rows if all(i in rows and rows[i][0].isdigit() for i in ids) else None
        rows = wait.until(accounted, timeout=60, every=2, what="sacct to have every job's Submit and End")
        lat = []
        for root, e, s in pairs:
            end = rows[e["job"]][1]
            if not end.isdigit():
                continue
            lat.append({"root": root, "end": int(end), "submit": int(rows[s["job"]][0]),
                        "slurm_s": int(rows[s["job"]][0]) - int(end), "poll_s": e["t"] - int(end),
                        "decide_submit_s": s["t"] - e["t"]})
        return lat


# -- the CLI probe -------------------------------------------------------------------------

def probes(release: str, a: int, b: int, cc: int) -> list[tuple[str, str]]:
    """(label, command) of each Slurm query a poller could use, and the supervisor's others."""
    three = f"{a},{b},{cc}"
    dp = DATA_PARSER
    rows = [
        ("scontrol show job ID", f"scontrol show job {a}"),
        ("scontrol --local show job ID", f"scontrol --local show job {a}"),
        ("scontrol show job (all)", "scontrol show job"),
        ("squeue --jobs=ID", f"squeue --jobs={a}"),
        ("squeue --jobs=a,b,c", f"squeue --jobs={three}"),
        ("squeue --jobs=a,b,c --local", f"squeue --jobs={three} --local"),
        ("squeue --me", "squeue --me"),
        ("squeue --me --local", "squeue --me --local"),
        ("squeue --me --jobs=a,b,c", f"squeue --me --jobs={three}"),
        ("squeue (all)", "squeue"),
        ("squeue --json (22.05: the client's poll)", "squeue --json"),
    ]
    if release != "22.05":
        rows += [
            (f"scontrol show job ID --json={dp} (the client's poll)", f"scontrol show job {a} --json={dp}"),
            (f"scontrol --local show job ID --json={dp}", f"scontrol --local show job {a} --json={dp}"),
            (f"scontrol show job --json={dp} (all)", f"scontrol show job --json={dp}"),
            (f"scontrol --local show job --json={dp} (all)", f"scontrol --local show job --json={dp}"),
            (f"squeue --jobs=a,b,c --json={dp}", f"squeue --jobs={three} --json={dp}"),
            (f"squeue --me --json={dp}", f"squeue --me --json={dp}"),
            (f"squeue --me --local --json={dp}", f"squeue --me --local --json={dp}"),
            ("squeue --only-job-state --jobs=a,b,c", f"squeue --only-job-state --jobs={three}"),
            (f"squeue --only-job-state --json={dp} (all)", f"squeue --only-job-state --json={dp}"),
            (f"sacct -j a,b,c --json={dp}", f"sacct -j {three} --json={dp}"),
        ]
    rows += [
        ("sacct -j a,b,c -X -P", f"sacct -j {three} -X -P"),
        ("scontrol show config", "scontrol show config"),
        ("scontrol --version", "scontrol --version"),
        ("sbatch --help", "sbatch --help"),
        ("sbatch --test-only", "sbatch --test-only -o /dev/null --wrap true"),
        ("scontrol show hostnames c[1-2]", "scontrol show hostnames 'c[1-2]'"),
    ]
    return rows


def probe(c: Cluster, log) -> list[dict]:
    base = f"/checkpoints/rpc-probe-{int(time.time())}"
    c.exec(CONTROLLER, f"mkdir -p {base}", user=USER)
    jobs = [c.submit(USER, args=["-o", "/dev/null", "-J", f"probe{i}", "--wrap", "sleep 600"]) for i in range(3)]
    for j in jobs:
        c.wait_job(j, "RUNNING", timeout=120)
    out = []
    try:
        for label, cmd in probes(c.slurm_release, *jobs):
            before = sdiag_reset(c)
            res = c.exec(CONTROLLER, cmd, user=USER, workdir=base, check=False)
            d = delta(before, sdiag(c))
            out.append({"query": label, "command": cmd, "rc": res.returncode, "rpcs": d["rpcs"], "types": d["types"],
                        "stderr": res.stderr.strip()[-200:] if res.returncode else ""})
            log(f"probe: {label}: {d['rpcs']} ({d['types']})")
    finally:
        c.exec(CONTROLLER, ["scancel", *map(str, jobs)], check=False)
    return out


# -- output --------------------------------------------------------------------------------

def per_min(count: float, seconds: float) -> float:
    return count / (seconds / 60) if seconds > 0 else float("nan")


def types_text(types: dict, seconds: float, top: int = 6) -> str:
    items = sorted(types.items(), key=lambda kv: -kv[1])
    shown = [f"{short(k)} {per_min(v, seconds):.1f}" for k, v in items[:top]]
    return ", ".join(shown) + (f", +{len(items) - top} more" if len(items) > top else "")


def summary_row(r: dict) -> dict:
    st, life, lat = r["steady"], r["life"], r["latency"]
    ls = [x["slurm_s"] for x in lat]
    return {
        "jobs": r["jobs"], "mode": r["mode"], "processes": r["processes"],
        "steady_rpm": per_min(st["rpcs"], st["seconds"]) if st else None,
        "steady_types": types_text(st["types"], st["seconds"]) if st else "(no window)",
        "life_rpm": per_min(life["rpcs"], life["seconds"]), "life_rpcs": life["rpcs"], "life_min": life["seconds"] / 60,
        "rpcs_per_job": life["rpcs"] / r["jobs"],
        "lat_median": statistics.median(ls) if ls else None, "lat_max": max(ls) if ls else None,
        "poll_median": statistics.median(x["poll_s"] for x in lat) if lat else None,
        "submit_median": statistics.median(x["decide_submit_s"] for x in lat) if lat else None,
        "steady_cpu_pm": per_min(st["cpu_s"], st["seconds"]) if st else None,
        "steady_ctl_cpu_pm": per_min(st["ctl_cpu_s"], st["seconds"]) if st else None,
        "life_cpu_pm": per_min(r["life_cpu_s"], life["seconds"]), "life_cpu_per_job": r["life_cpu_s"] / r["jobs"],
        "wall_s": r["wall_s"],
    }


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict], header: str) -> None:
    print(header)
    print(f"{'jobs':>4} {'mode':<8} {'procs':>5} | {'RPCs/min':>8} {'RPCs/min':>8} {'RPCs':>6} {'RPCs/':>6} | "
          f"{'end->resubmit s':>15} {'poll':>5} {'submit':>6} | {'CPU s/min':>9} {'ctld':>5} {'CPU s/min':>9} "
          f"{'CPU s/':>6} | {'wall':>5} | per message type, steady (all users, /min)")
    print(f"{'':>4} {'':<8} {'':>5} | {'steady':>8} {'life':>8} {'life':>6} {'job':>6} | {'median / max':>15} "
          f"{'med':>5} {'med':>6} | {'steady':>9} {'s/min':>5} {'life':>9} {'job':>6} | {'min':>5} |")
    for s in rows:
        lat = "-" if s["lat_median"] is None else f"{s['lat_median']:.0f} / {s['lat_max']:.0f}"
        print(f"{s['jobs']:>4} {s['mode']:<8} {s['processes']:>5} | {fmt(s['steady_rpm'], '8.1f')} "
              f"{s['life_rpm']:8.1f} {s['life_rpcs']:6d} {s['rpcs_per_job']:6.1f} | {lat:>15} "
              f"{fmt(s['poll_median'], '5.1f')} {fmt(s['submit_median'], '6.1f')} | {fmt(s['steady_cpu_pm'], '9.2f')} "
              f"{fmt(s['steady_ctl_cpu_pm'], '5.2f')} {s['life_cpu_pm']:9.2f} {s['life_cpu_per_job']:6.2f} | "
              f"{s['wall_s'] / 60:5.1f} | {s['steady_types']}")
    print("  RPCs: alice's (the supervisors'); life: launch to the last exit; end->resubmit: Slurm's End of the "
          "failed job to the next one's Submit (1 s resolution); poll: End to the record's `ended` fact; submit: "
          "`ended` to `submitted` (rule, sbatch --test-only, sbatch); CPU: the supervisor processes with the "
          "commands they ran (ctld: slurmctld's, steady)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="sid", choices=list(SUITES))
    ap.add_argument("--profile", default="fast", choices=["fast", "site"])
    ap.add_argument("--jobs", default="1,10,100", help="comma-separated numbers of supervised jobs")
    ap.add_argument("--modes", default="per-root", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--what", default="sweep", help="comma-separated: sweep, issue, probe")
    ap.add_argument("--job-seconds", type=float, default=240.0, help="each execution's sleep (L)")
    ap.add_argument("--json", default="bench_supervisor_rpc.json", help="where the measurements are written")
    ap.add_argument("--show", metavar="JSON", help="print the tables of an earlier run's JSON (no cluster)")
    a = ap.parse_args()
    if a.show:
        with open(a.show) as f:
            report(json.load(f), a.show)
        return
    what = a.what.split(",")
    modes = a.modes.split(",")
    counts = [int(x) for x in a.jobs.split(",") if x]
    for w in what:
        if w not in ("sweep", "issue", "probe"):
            ap.error(f"--what {w}: one of sweep, issue, probe")
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes {m}: one of {', '.join(MODES)}")
        try:
            MODES[m](["/r"], [], [])
        except Unavailable as e:
            ap.error(str(e))
    most = max(counts + [3]) if "sweep" in what else 3
    cpus = max(2, -(-most * 6 // 5 // NODES))  # every job at once, 20% spare for COMPLETING ones
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    results: dict = {"suite": a.suite, "profile": a.profile, "node_cpus": cpus, "job_seconds": a.job_seconds,
                     "counts": counts, "sweep": [], "issue": None, "probe": None}
    t_all = time.time()
    with Cluster(a.suite, a.profile, nodes=NODES, node_cpus=cpus, log=say) as c:
        release = c.slurm_release
        results["release"] = release
        if "probe" in what:
            results["probe"] = probe(c, say)
        if "issue" in what:
            t = time.time()
            r = Scenario(c, "issue", 1, "per-root", ["--resubmit", "0"], ["--wrap", "sleep 240"], 240, say).run()
            r["wall_s"] = time.time() - t
            results["issue"] = r
        if "sweep" in what:
            L = int(a.job_seconds)
            wrap = f'sleep {L}; [ "$DISPATCH_SUBMISSION" = 1 ] && exit 3; exit 0'
            for n in counts:
                for m in modes:  # side by side: each count under every mode before the next count
                    results["sweep"].append(Scenario(c, "sweep", n, m, ["--resubmit", "1"],
                                                     ["-o", "/dev/null", "-J", "rpc-bench", "--wrap", wrap],
                                                     a.job_seconds, say).run())
                    if a.json:  # each scenario's figures kept as it ends: a later one may abort
                        with open(a.json, "w") as f:
                            json.dump(results, f, indent=1)
                    c.wait_nodes(lambda ns: all("IDLE" in n.state for n in ns), timeout=300, what="nodes idle")
    results["wall_s"] = time.time() - t_all
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    report(results, a.json)


def report(results: dict, path: str) -> None:
    host = f"Slurm {results['release']} ({results['suite']}), {results['profile']} profile, {NODES} nodes x " \
           f"{results['node_cpus']} CPUs, 2-core host; " \
           f"RPCs: sdiag's per-user count of {USER} (the supervisors)"
    if results["probe"]:
        print(f"What each CLI query costs slurmctld ({host}); 3 of {USER}'s jobs in the queue")
        for p in results["probe"]:
            rc = "" if p["rc"] == 0 else f"  [exit {p['rc']}: {p['stderr'][-80:]}]"
            types = ", ".join(f"{short(k)} {v}" for k, v in sorted(p["types"].items()))
            mark = "" if sum(p["types"].values()) == p["rpcs"] else "  (* types include other users')"
            print(f"  {p['query']:<52} {p['rpcs']:>3}  {types}{mark}{rc}")
        print()
    if results["issue"]:
        r = results["issue"]
        s = summary_row(r)
        life = r["life"]
        print(f"issue 26's figure: `dispatch-slurm run ROOT --resubmit 0 -- --wrap 'sleep 240'` ({host})")
        print(f"  whole life: {life['rpcs']} RPCs in {life['seconds'] / 60:.2f} min ({s['life_rpm']:.1f}/min): "
              f"{', '.join(f'{short(k)} {v}' for k, v in sorted(life['types'].items(), key=lambda kv: -kv[1]))}")
        if r["steady"]:
            st = r["steady"]
            print(f"  steady: {st['rpcs']} RPCs in {st['seconds']:.0f} s = {s['steady_rpm']:.1f}/min "
                  f"({types_text(st['types'], st['seconds'])}); supervisor CPU {s['steady_cpu_pm']:.2f} s/min")
        print(f"  wall {r['wall_s'] / 60:.1f} min")
        print()
    if results["sweep"]:
        rows = [summary_row(r) for r in results["sweep"]]
        print_table(rows, f"Supervising N tiny jobs, each FAILED once after {results['job_seconds']:g} s and resubmitted "
                          f"(`run ROOT --resubmit 1`, default poll) ({host})")
        by = {(s["jobs"], s["mode"]): s for s in rows}
        for n in sorted({s["jobs"] for s in rows}):
            ref, other = by.get((n, "per-root")), by.get((n, "shared"))
            if ref and other:
                def ratio(k):
                    return "-" if not (ref[k] and other[k]) else f"{other[k] / ref[k]:.3f}x"
                print(f"  {n} jobs, shared / per-root: RPCs/min steady {ratio('steady_rpm')}, whole life "
                      f"{ratio('life_rpm')}; end->resubmit median {ratio('lat_median')}; CPU steady "
                      f"{ratio('steady_cpu_pm')}")
        for r in results["sweep"]:
            life = r["life"]
            print(f"  whole life, {r['jobs']} job(s) {r['mode']}: {life['rpcs']} RPCs in {life['seconds'] / 60:.2f} min "
                  f"(every first execution running {r['start_s']:.0f} s after the launch); "
                  f"types (all users, count): {', '.join(f'{short(k)} {v}' for k, v in sorted(life['types'].items(), key=lambda kv: -kv[1]))}")
    if "wall_s" in results:  # absent when a later scenario aborted (the JSON keeps what ended)
        print(f"total wall {results['wall_s'] / 60:.1f} min; JSON: {path}")


if __name__ == "__main__":
    main()
