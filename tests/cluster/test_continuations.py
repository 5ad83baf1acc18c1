"""On the real cluster: a run longer than one time limit goes on to its end.

The README's own job script (its Quickstart block, run as written) with a stand-in
trainer (tests/testbed/longtrain.py) under `dispatch-slurm run`, three chains at once on
three nodes:

- signal: the trainer traps the time-limit signal (`--time=1 --signal=TERM@20`): each
  execution saves on the signal and exits 0 (COMPLETED), and the supervisor continues it;
- timeout: a script without `--signal`, a trainer that does not trap: Slurm ends each
  execution TIMEOUT, the next resumes from the last periodic save `watch` published;
- crash: the trainer exits 1: the job ends FAILED (the script propagates the trainer's
  status) and is resubmitted as a failure, then fails when the budget is spent.

Slurm checks time limits every 30 s (slurmctld's PERIODIC_TIMEOUT) and sends the
--signal at the first check within warn time + 30 s of the end: an execution with
`--time=1 --signal=TERM@20` is signalled 10-40 s after it starts, one without a signal
ends TIMEOUT 60-90 s after it starts. DISPATCH_SLOW=1 runs a timeout chain that needs two
time limits instead of one."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from test_supervisor import Sup, describe
from testbed import campaign
from testbed.cluster import CONTROLLER
from dispatch_slurm.supervisor.record import Record

pytestmark = [pytest.mark.cluster, pytest.mark.one_release]
LONGTRAIN = "/src/dispatch-slurm/tests/testbed/longtrain.py"  # the test bed's copy in the image
README = Path(__file__).resolve().parents[2] / "README.md"
SLOW = os.environ.get("DISPATCH_SLOW") == "1"


def readme_job_script() -> str:
    """The README's job script (its `job-script` snippet, the one without the view)."""
    return campaign.readme_job_script(README)


def chain(c, cdir: str, hdir: Path, name: str, train_args: list[str], *, signal: bool) -> Sup:
    """A folder with the README's script (without its --signal when ``signal`` is false), a
    `train.py` that is the stand-in and a `python` on PATH, as a user's venv would have."""
    sub, hsub = f"{cdir}/{name}", hdir / name
    hsub.mkdir()
    hsub.chmod(0o1777)
    script = readme_job_script()
    if not signal:
        script, n = re.subn(r" --signal=\S+", "", script)
        assert n == 1, "the README's script names one --signal"
    (hsub / "train.sbatch").write_text(script)
    (hsub / "train.py").write_text(
        "import os, sys\n"
        f"sys.argv[1:1] = {train_args + ['--log', f'{sub}/train.log']!r}\n"
        f"sys.argv[0] = {LONGTRAIN!r}\n"
        f"exec(compile(open({LONGTRAIN!r}).read(), {LONGTRAIN!r}, 'exec'))\n")
    (hsub / "bin").mkdir()
    (hsub / "bin" / "python").symlink_to("/usr/bin/python3")
    c.exec(CONTROLLER, f"mkdir -m 700 {sub}/root", user="alice")
    return Sup(c, sub, hsub, f"{sub}/root")


def train_log(s: Sup) -> list[dict]:
    p = s.hdir / "train.log"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def by_attempt(log: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for rec in log:
        out.setdefault(rec["attempt"], []).append(rec)
    return out


def start(s: Sup, *args: str) -> int:
    return s.start("run", "--poll", "1", *args, env={"PATH": f"{s.cdir}/bin:/usr/local/bin:/usr/bin:/bin"})


def chain_summary(s: Sup) -> str:
    return "\n".join(describe(f) for f in s.facts() if f["type"] in ("started", "ended", "rule", "finished"))


def test_a_run_longer_than_its_time_limit_goes_on_to_the_end(slurm_cluster, workdir):
    c, (cdir, hdir) = slurm_cluster, workdir
    max_timeout = 1850 if SLOW else 1000  # 600-900 steps per execution: 2 (SLOW: 3) executions at least
    sig = chain(c, cdir, hdir, "signal", ["--max-steps", "700", "--step-time", "0.1", "--save-every", "50",
                                          "--trap"], signal=True)
    tmo = chain(c, cdir, hdir, "timeout", ["--max-steps", str(max_timeout), "--step-time", "0.1",
                                           "--save-every", "50"], signal=False)
    crash = chain(c, cdir, hdir, "crash", ["--max-steps", "100", "--crash-at-step", "20"], signal=True)

    def sbatch(s: Sup, *extra: str) -> list[str]:
        return ["--", "-N1", f"-o{s.cdir}/slurm-%j.out", f"--chdir={s.cdir}", "--time=1", *extra,
                f"{s.cdir}/train.sbatch"]
    # the signal 20 s before the limit (on the command line, sbatch's options override #SBATCH's)
    runs = {"signal": (sig, start(sig, "--resubmit", "0", *sbatch(sig, "--signal=TERM@20"))),
            "timeout": (tmo, start(tmo, "--resubmit", "0", *sbatch(tmo))),
            "crash": (crash, start(crash, "--resubmit", "1", *sbatch(crash, "--signal=TERM@20")))}
    try:
        rcs = {name: s.wait_rc(k, timeout=600 if SLOW else 420) for name, (s, k) in runs.items()}
    finally:
        for s, _ in runs.values():
            s.stop_all()
    for name, (s, k) in runs.items():
        print(f"--- {name}: exit {rcs[name]}\n{chain_summary(s)}\n"
              + c.exec(CONTROLLER, ["dispatch-slurm", "report", s.root], user="alice", check=False).stdout)

    # signal: every execution but the last saved on the signal and was continued; the next
    # one resumed from exactly that save; nothing was resubmitted (the budget was 0). Slurm may
    # signal 10 s after the start: an execution whose trainer had not trapped the signal yet (its
    # start-up on a loaded machine) is killed by it, FAILED 143, and continued as an untrapped one
    rules = [(f["rule"], f["cause"]) for f in sig.facts("rule")]
    assert rcs["signal"] == 0, f"{sig.log(1)[-1500:]}\n{chain_summary(sig)}"
    assert len(rules) >= 3, f"the trainer needed {len(rules)} executions, not several: {rules}"
    logs = by_attempt(train_log(sig))
    trapped = {int(a.split(".")[-2]) for a, recs in logs.items() if any(r["op"] == "trapped" for r in recs)}
    jobs = [f["job"] for f in sig.facts("ended")]
    want = [("continue", "signalled") if j in trapped else ("continue", "killed_at_signal") for j in jobs[:-1]]
    assert rules == [*want, ("done", "finished")], (rules, jobs, sorted(trapped))
    assert [f["state"] for f in sig.facts("ended")] == ["COMPLETED" if j in trapped else "FAILED" for j in jobs]
    assert trapped.issuperset(jobs[-2:]), f"the trap was put to the test at least once: {rules}"
    execs = [logs[a] for a in logs]
    for old, new in zip(execs, execs[1:]):
        saves = [r["step"] for r in old if r["op"] == "save"]
        assert new[0]["op"] == "start", new[0]
        if any(r["op"] == "trapped" for r in old):
            last_step = max(r["step"] for r in old if r["op"] == "step")
            assert saves[-1] == last_step, "the signal's save is the last whole step: no step lost"
            assert new[0]["resumed_at"] == saves[-1], (old[-1], new[0])
        else:  # killed: the next one resumes from its last periodic save, or where it resumed itself
            assert new[0]["resumed_at"] in [old[0]["resumed_at"], *saves], (old, new[0])
    assert execs[-1][-1] == {**execs[-1][-1], "op": "done", "step": 700}

    # timeout: Slurm ended each execution TIMEOUT; each continuation resumed from the last
    # published periodic save, losing less than one save interval
    rules = [(f["rule"], f["cause"]) for f in tmo.facts("rule")]
    assert rcs["timeout"] == 0, f"{tmo.log(1)[-1500:]}\n{chain_summary(tmo)}"
    assert rules[:-1] == [("continue", "time_limit")] * (len(rules) - 1) and rules[-1] == ("done", "completed")
    assert len(rules) >= (3 if SLOW else 2), rules
    assert [f["state"] for f in tmo.facts("ended")][:-1] == ["TIMEOUT"] * (len(rules) - 1)
    execs = list(by_attempt(train_log(tmo)).values())
    for old, new in zip(execs, execs[1:]):
        last_step = max(r["step"] for r in old if r["op"] == "step")
        assert new[0]["resumed_at"] % 50 == 0 and 0 <= last_step - new[0]["resumed_at"] < 50 + 1, (last_step, new[0])
    assert execs[-1][-1]["op"] == "done" and execs[-1][-1]["step"] == max_timeout

    # crash: the README's script reports the trainer's exit 1, so the job is FAILED, resubmitted
    # as a failure once, then the run fails
    ended = crash.facts("ended")
    assert rcs["crash"] == 1, f"{crash.log(1)[-1500:]}\n{chain_summary(crash)}"
    assert [(f["state"], f.get("exit_code")) for f in ended] == [("FAILED", 1), ("FAILED", 1)], ended
    assert [(f["rule"], f["cause"]) for f in crash.facts("rule")] == [("resubmit", "failure"), ("fail", "failure")]
    assert "no resubmission is left" in crash.facts("finished")[0]["message"]
    assert Record(str(crash.host_root)).read()[-1]["outcome"] == "failed"
