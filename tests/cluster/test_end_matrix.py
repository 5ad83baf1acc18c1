"""Every end of a run decided right, on the real cluster.

The README's job script, run as written (its own `#SBATCH --signal=TERM@90`, overridden on the
command line by `--time=1 --signal=TERM@5` so that a time limit comes within a minute: Slurm
sends the signal at its first 30 s check from start + 25 s on), under `dispatch-slurm run`, with
a stand-in trainer (tests/testbed/longtrain.py) of three kinds:

- project: dispatch-slurm's preemption handler (it writes its own events, and says when
  training finished);
- own: a user's own SIGTERM handler that saves, prints the sentinel and exits 0, knowing
  nothing of dispatch-slurm;
- untrapped: no handler, so the job's own --signal kills it.

The matrix: trainer x output path (Slurm's default ``slurm-%j.out``, ``%j``, ``%x-%j``, a literal
file, a literal file with ``--open-mode=append`` shared by nine cells and holding an older
sentinel) x end (the time limit, training finished, a crash) -> the decision a user expects:
continue (then done, when the next execution finishes), done, failure. One supervisor per
output path (nine roots each), all at once. Before, the Epilog scanned the output path for the
sentinel: point 1, an own handler under ``slurm-%j.out`` or ``%j`` was taken as done (Slurm hands
the path over unexpanded); point 2, a finished execution whose appended log held an older
sentinel was taken as signalled (the append cells' second executions); point 3, an untrapped
trainer under the README's script FAILED at each time limit, spending --resubmit.

The long run, at the same time (the last cluster's time is CI's critical path): an own-handler
trainer with Slurm's default output path goes from step 0 to its last step across at least three
time limits and ends done (exit 0)."""

from __future__ import annotations

import json
import re
import time

import pytest

from test_continuations import LONGTRAIN, readme_job_script
from test_supervisor import Sup, describe
from testbed.cluster import CONTROLLER

pytestmark = [pytest.mark.cluster, pytest.mark.only_on("trixie")]
LIMIT = ["--time=1", "--signal=TERM@5"]  # the signal from start + 25 s (60 - 5 - 30), at a 30 s check
TRAINERS = {"project": ["--trap"], "own": ["--own-handler"], "untrapped": []}
ENDS = {"time-limit": ["--max-steps", "100000", "--steps-after-resume", "10", "--save-every", "20"],
        "finished": ["--max-steps", "20", "--step-time", "0.05"],
        "crash": ["--max-steps", "1000", "--crash-at-step", "5"]}
OUTPUTS = {"default": [], "%j": ["-o", "{d}/%j.out"], "%x-%j": ["-o", "{d}/%x-%j.out"],
           "literal": ["-o", "{d}/job.out"], "append": ["-o", "{d}/shared.out", "--open-mode=append"]}
EXPECTED = {"time-limit": ["continue", "done"], "finished": ["done"], "crash": ["fail"]}
SENTINEL = "dispatch-checkpoint-complete"

STUB = """import os, sys
cell = os.path.dirname(os.environ["DISPATCH_CHECKPOINT"])
trainer, end = os.path.basename(cell).split(".")
sys.argv[1:1] = {trainers!r}[trainer] + {ends!r}[end] + ["--log", cell + "/train.log"]
sys.argv[0] = {longtrain!r}
exec(compile(open({longtrain!r}).read(), {longtrain!r}, "exec"))
"""


def folder(c, cdir: str, hdir, name: str, stub: str) -> tuple[str, object]:
    """A job folder with the README's script, a `train.py` (``stub``) and a `python` on PATH."""
    sub, hsub = f"{cdir}/{name}", hdir / name
    hsub.mkdir()
    hsub.chmod(0o1777)
    (hsub / "train.sbatch").write_text(readme_job_script())
    (hsub / "train.py").write_text(stub)
    (hsub / "bin").mkdir()
    (hsub / "bin" / "python").symlink_to("/usr/bin/python3")
    return sub, hsub


def start(s: Sup, roots: list[str], *args: str) -> int:
    return s.start("run", *roots, "--poll", "1", *args, env={"PATH": f"{s.cdir}/bin:/usr/local/bin:/usr/bin:/bin"})


def decisions(facts: list[dict]) -> list[tuple[str, str]]:
    return [(f["rule"], f["cause"]) for f in facts if f["type"] == "rule"]


def matrix(c, cdir: str, hdir) -> tuple[dict, dict, dict]:
    """Start the matrix: one supervisor per output path, nine roots each (trainer x end), its
    jobs at a lower priority (--nice) than the long run's, which then never waits for 45 of
    them. Returns (supervisors, their run numbers, cell -> host root)."""
    stub = STUB.format(trainers=TRAINERS, ends={k: v + ["--step-time", "0.1"] * ("--step-time" not in v)
                                                 for k, v in ENDS.items()}, longtrain=LONGTRAIN)
    sups, runs, cells = {}, {}, {}
    for out, oargs in OUTPUTS.items():
        sub, hsub = folder(c, cdir, hdir, out.replace("%", "p"), stub)
        (hsub / "shared.out").write_text(f"an earlier run's last line\n{SENTINEL}\n")  # an older sentinel
        (hsub / "shared.out").chmod(0o666)
        roots = []
        for trainer in TRAINERS:
            for end in ENDS:
                c.exec(CONTROLLER, f"mkdir -m 755 {sub}/{trainer}.{end} && mkdir -m 700 {sub}/{trainer}.{end}/root",
                       user="alice")
                roots.append(f"{sub}/{trainer}.{end}/root")
                cells[(trainer, out, end)] = hsub / f"{trainer}.{end}" / "root"
        s = Sup(c, sub, hsub, roots[0])
        sups[out] = s
        sbatch = ["-N1", "--nice=1000", *(a.format(d=sub) for a in oargs), f"--chdir={sub}", *LIMIT,
                  f"{sub}/train.sbatch"]
        runs[out] = start(s, roots[1:], "--resubmit", "0", "--", *sbatch)
    return sups, runs, cells


def expected(got: list[tuple[str, str]], end: str) -> bool:
    """The decisions a user expects for ``end``; before the last one, a `continue (signal_time)`
    more is the rule's safe side, not a misjudgment: an execution that exits 0 after its --signal
    time and wrote no event of its own cannot be told from one an own handler stopped (a slow
    start-up on a loaded machine finishes a resumed trainer's ten steps after start + 25 s), so it
    is continued, and the next one, with nothing left to train, is done."""
    want, rules = EXPECTED[end], [r for r, _ in got]
    if rules == want:
        return True
    extra = len(got) - len(want)
    late = [i for i, d in enumerate(got[:-1]) if d == ("continue", "signal_time")]
    return (extra > 0 and len(late) >= extra and rules[-1] == want[-1]
            and [r for i, r in enumerate(rules) if i not in late[-extra:]] == want)


def matrix_table(cells: dict) -> tuple[str, list[str]]:
    """The matrix as a Markdown table, and the cells whose decisions were not the expected."""
    rows, wrong = [], []
    for (trainer, out, end), root in cells.items():
        facts = [json.loads(line) for line in (root / "record.jsonl").read_text().splitlines()]
        got = decisions(facts)
        states = [f["state"] + (f" {f['exit_code']}" if f.get("exit_code") else "") for f in facts
                  if f["type"] == "ended"]
        ok = expected(got, end)
        rows.append((trainer, out, end, ", ".join(states), " -> ".join(f"{r} ({c_})" for r, c_ in got),
                     " -> ".join(EXPECTED[end]), "yes" if ok else "NO"))
        if not ok:
            wrong.append(f"{trainer} x {out} x {end}: {got} ({states}); " +
                         "; ".join(describe(f) for f in facts if f["type"] in ("ended", "rule", "finished")))
        evs = [json.loads(line) for p in (root / "events").glob("*.jsonl") for line in p.read_text().splitlines()]
        if [e for e in evs if e.get("source") == "epilog" and e["type"] != "cessation"]:
            wrong.append(f"{trainer} x {out} x {end}: the Epilog recorded something from the job's output")
    widths = [max(len(r[i]) for r in rows + [HEADER]) for i in range(len(HEADER))]
    return "\n".join("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |"
                     for r in [HEADER, tuple("-" * w for w in widths), *rows]), wrong


HEADER = ("trainer", "output", "end", "Slurm said", "decisions (cause)", "expected", "right")
LONG_STEPS = 1600  # more than three executions can train: each has at most ~52 s (start + 55 s, less its start-up)


def test_every_end_is_decided_right_the_matrix_and_the_long_run(slurm_cluster, workdir):
    """The matrix (45 cells, five supervisors) and, at the same time, the long run: an
    own-handler trainer with Slurm's default output path, `run ROOT --resubmit 3`, from step 0
    to its last step across at least three time limits, done, exit 0, no --resubmit spent."""
    c, (cdir, hdir) = slurm_cluster, workdir
    args = ["--own-handler", "--max-steps", str(LONG_STEPS), "--step-time", "0.1", "--save-every", "50",
            "--log", f"{cdir}/long/train.log"]
    stub = (f"import sys\nsys.argv[1:1] = {args!r}\nsys.argv[0] = {LONGTRAIN!r}\n"
            f"exec(compile(open({LONGTRAIN!r}).read(), {LONGTRAIN!r}, 'exec'))\n")
    sub, hsub = folder(c, cdir, hdir, "long", stub)
    c.exec(CONTROLLER, f"mkdir -m 700 {sub}/root", user="alice")
    long = Sup(c, sub, hsub, f"{sub}/root")
    long.runs = 10
    k = start(long, [], "--resubmit", "3", "--", "-N1", f"--chdir={sub}", *LIMIT, f"{sub}/train.sbatch")
    sups, runs, cells = matrix(c, cdir, hdir)
    t0 = time.monotonic()
    try:
        rcs = {out: s.wait_rc(runs[out], timeout=420) for out, s in sups.items()}
        took = time.monotonic() - t0
        rc = long.wait_rc(k, timeout=420)
    finally:
        for s in (*sups.values(), long):
            s.stop_all()
    table, wrong = matrix_table(cells)
    print(f"\nthe matrix, {len(cells)} cells in {took:.0f} s (Slurm {c.slurm_release}):\n{table}")
    report = c.exec(CONTROLLER, ["dispatch-slurm", "report", long.root], user="alice", check=False).stdout
    print(f"\nthe long run: exit {rc}\n" + "\n".join(describe(f) for f in long.facts()
                                                 if f["type"] in ("ended", "rule", "finished")) + f"\n{report}")

    assert not wrong, "\n".join(wrong)
    assert rcs == {out: 1 for out in OUTPUTS}, "each supervisor: 6 roots done, 3 failed (the crashes): exit 1"
    assert SENTINEL in (sups["append"].hdir / "shared.out").read_text()

    got = decisions(long.facts())
    assert rc == 0, f"{long.log(k)[-1500:]}\n{got}"
    log = [json.loads(line) for line in (long.hdir / "train.log").read_text().splitlines()]
    # Slurm may signal 25 s after the start: a trainer whose start-up took longer had no handler
    # yet, was killed by the signal (FAILED 143) and is continued as an untrapped one
    trapped = {int(r["attempt"].split(".")[-2]) for r in log if r["op"] == "trapped"}
    jobs = [f["job"] for f in long.facts("ended")]
    want = [("continue", "signal_time" if j in trapped else "killed_at_signal") for j in jobs[:-1]]
    assert got[:-1] == want and got[-1][0] == "done", (got, jobs, sorted(trapped))
    assert len(got) >= 4, f"{len(got) - 1} time limits, not three: {got}"
    execs: dict[str, list[dict]] = {}
    for r in log:
        execs.setdefault(r["attempt"], []).append(r)
    runs_ = list(execs.values())
    assert runs_[0][0]["resumed_at"] == 0 and log[-1] == {**log[-1], "op": "done", "step": LONG_STEPS}, log[-3:]
    # each execution resumed where its handler saved (one killed before it trapped: from its last
    # periodic save); if one finished training after its --signal time, it was continued once
    # more, and that one resumed at the end and was done
    finished_late = 0
    for old, new in zip(runs_, runs_[1:]):
        ops = {r["op"]: r for r in old}
        if "stopped" in ops:
            assert new[0]["resumed_at"] == ops["stopped"]["step"], (old[-1], new[0])
        elif "done" in ops:
            finished_late += 1
            assert new[0]["resumed_at"] == LONG_STEPS, new[0]
        else:
            assert "trapped" not in ops, f"trapped, yet neither stopped nor done: {old[-3:]}"
            assert new[0]["resumed_at"] in [old[0]["resumed_at"]] + [r["step"] for r in old if r["op"] == "save"]
    assert finished_late <= 1, finished_late
    assert long.facts("finished")[0]["outcome"] == "done"
    assert not [f for f in long.facts("rule") if f["rule"] == "resubmit"], "a continuation spends no --resubmit"
    outs = sorted(p.name for p in long.hdir.glob("*.out"))
    assert outs and all(re.fullmatch(r"slurm-\d+\.out", n) for n in outs), f"Slurm's default output path: {outs}"
