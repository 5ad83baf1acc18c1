"""On the real cluster: one supervisor process for many roots and for a job
array, one Slurm read per poll for all of them, and a corrupt root that stops alone.

The supervisors run as a user would run them, on the login node (the controller
container, as alice). slurmctld's own counters (sdiag, per user) say what the polls cost."""

from __future__ import annotations

import shlex

import pytest

from dispatch_slurm.supervisor.record import Record
from testbed import sdiag
from testbed.cluster import CONTROLLER

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]

# Every root's first execution fails (exit 3) but task 0's; the resubmission completes.
# (A mark per root in the test's folder: an array's N are shared by its tasks.) The sleep
# is the window in which all run and the polls are counted.
RUN_S = 40
WRAP = (f'sleep {RUN_S}; m=marks/$(basename "$DISPATCH_CHECKPOINT"); '
        'if [ ! -e "$m" ] && [ "${SLURM_ARRAY_TASK_ID:-x}" != 0 ]; then touch "$m"; exit 3; fi; exit 0')

def start(c, cdir, k, argv):
    inner = f"{shlex.join(argv)}; echo $? > {cdir}/fleet.{k}.rc"
    c.exec(CONTROLLER, f"cd {cdir} && setsid nohup bash -c {shlex.quote(inner)} > {cdir}/fleet.{k}.log 2>&1 "
                       "< /dev/null &", user="alice")


def logs(hdir) -> str:
    return "\n".join(f"fleet.{k}.log: " + (p.read_text()[-2000:] if (p := hdir / f"fleet.{k}.log").exists() else "-")
                     for k in (1, 2))


def facts(host_root):
    p = host_root / "record.jsonl"
    return Record(str(host_root)).read() if p.exists() else []


def test_one_process_follows_many_roots_and_an_array_with_one_read_per_poll(slurm_cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    c.exec(CONTROLLER, f"cd {cdir} && mkdir -m 700 a b bad sweep marks && "
                       "printf '{\"type\": \"job\"\\n{\"type\": \"job\"}\\n' > bad/record.jsonl", user="alice")
    opts = ["--resubmit", "1", "--poll", "2", "--max-poll", "12"]
    start(c, cdir, 1, ["dispatch-slurm", "run", "a", "b", "bad", *opts, "--", "-o", "/dev/null", "--wrap", WRAP])
    start(c, cdir, 2, ["dispatch-slurm", "run", "sweep/task%a", *opts, "--",
                       "-o", "/dev/null", "--array=0-2", "--wrap", WRAP])
    roots = {name: hdir / name for name in ("a", "b")} | {f"task{i}": hdir / "sweep" / f"task{i}" for i in range(3)}

    def all_running():
        started = {n: [f for f in facts(r) if f["type"] == "started"] for n, r in roots.items()}
        return all(len(s) == 1 for s in started.values()) and started
    try:
        started = c.wait_until(all_running, timeout=90, what="every root's first execution to start")
    except Exception as e:
        raise AssertionError(f"{e}\n{logs(hdir)}\n" + "\n".join(f"{n}: {[f['type'] for f in facts(r)]}"
                                                             for n, r in roots.items())) from None
    # while all five run: the two processes read Slurm once per poll each while the
    # executions start, then at most every --max-poll; per root it would be 2 RPCs a poll
    # per job (scontrol show job ID: REQUEST_FED_INFO + REQUEST_JOB_INFO_SINGLE)
    t_first = max(f["start_time"] for s in started.values() for f in s)
    a = sdiag.read(c)
    c.wait_until(lambda: sdiag.read(c)["t"] >= t_first + 30, timeout=60, poll=1, what="30 s of running jobs")
    b = sdiag.read(c)
    rpcs, seconds = sdiag.user_rpcs(a, b, "alice"), b["t"] - a["t"]
    per_root_would = 5 * 2 * seconds / 2
    assert rpcs <= 2 * (seconds / 12 + 3) + 4, f"{rpcs} RPCs of alice in {seconds:.0f} s (per root: " \
                                               f"~{per_root_would:.0f})"

    rc = {k: c.wait_until(lambda k=k: (p := hdir / f"fleet.{k}.rc").exists() and p.read_text().strip(),
                          timeout=3 * RUN_S + 120, poll=1, what=f"supervisor process {k} to exit "
                          f"({(hdir / f'fleet.{k}.log').read_text()[-1500:] if (hdir / f'fleet.{k}.log').exists() else ''})")
          for k in (1, 2)}
    log1 = (hdir / "fleet.1.log").read_text()
    summary = "\n".join(f"{n}: {[(f['type'], f.get('job'), f.get('n'), f.get('state'), f.get('exit_code'), f.get('rule')) for f in facts(r) if f['type'] in ('submitted', 'ended', 'rule')]}" for n, r in roots.items())
    assert rc == {1: "2", 2: "0"}, f"{rc}\n{logs(hdir)}\n{summary}"
    assert "3 roots: 2 done, 0 failed, 0 held, 1 error" in log1 and "bad/record.jsonl" in log1, log1
    for name, r in roots.items():
        rules = [(f["rule"], f["cause"]) for f in facts(r) if f["type"] == "rule"]
        ends = [f["state"] for f in facts(r) if f["type"] == "ended"]
        if name == "task0":
            assert rules == [("done", "completed")] and ends == ["COMPLETED"], (name, rules)
        else:
            assert rules == [("resubmit", "failure"), ("done", "completed")], (name, rules)
            assert ends == ["FAILED", "COMPLETED"], (name, ends)
    # each task its own job, submitted as --array=I (the script saw SLURM_ARRAY_TASK_ID)
    jobs = {name: [f["job"] for f in facts(r) if f["type"] == "submitted"] for name, r in roots.items()}
    assert len({j for js in jobs.values() for j in js}) == 9, jobs
    assert (hdir / "bad" / "record.jsonl").read_text() == '{"type": "job"\n{"type": "job"}\n'  # left as it was
