"""How the end of an execution is decided (supervisor/ends.py: cause_of; rules.py's table), from facts tied to
that execution only, and the job's --signal as sbatch reads it (contract/signals.py).

Every row of the rules table is reached here from the facts that make it, with the cases
reviews found wrong: an own SIGTERM handler whose sentinel went to ``slurm-%j.out`` (the
Epilog got the path unexpanded, so the end was taken as done at step 95 of 400), a finished
run whose appended log held an older execution's sentinel (taken as signalled for ever, then
failed), and the README's job script with a trainer that does not trap SIGTERM (FAILED at
each time limit, burning --resubmit)."""

from __future__ import annotations

import signal
import time

import pytest

from dispatch_slurm.contract.signals import (JobSignal, Signal, job_signal, lead_problem, parse_signal,
                                             parse_time_limit, sbatch_options, script_options)
from dispatch_slurm.supervisor import ends, rules
from dispatch_slurm.supervisor.ends import Own

START, LIMIT = 1_800_000_000, 3600  # an hour's time limit
TERM90 = JobSignal(Signal("TERM", False, 90), "'TERM@90' from #SBATCH in train.sbatch")
NONE = JobSignal(None, "none on sbatch's command line, in SBATCH_SIGNAL or in the script's #SBATCH lines")
UNKNOWN = JobSignal(None, "", "the batch script train.sbatch (No such file or directory) could not be read")
SIGNAL_AT = START + LIMIT - 90 - 30  # Slurm may send TERM@90 from here on
ME = 2001


def ended(state="COMPLETED", end=START + 600, code=0, sig=None, **kw):
    f = {"job": 7, "r": 0, "state": state, "start_time": START, "time_limit": LIMIT, "end_time": end,
         "exit_code": code, "signal": sig, "attempt": "c.7.1000000"}
    f.update(kw)
    return {k: v for k, v in f.items() if v is not None or k in ("exit_code", "signal")}


def cause(e, own=Own(), warning=TERM90):
    return ends.cause_of(e, own, warning, ME)


# -- every row of the table ------------------------------------------------------------------

ROWS = {
    "finished": (ended(end=SIGNAL_AT + 5), Own(frozenset({"training_finished", "published"})), TERM90),
    "completed": (ended(end=SIGNAL_AT - 1), Own(), TERM90),
    "time_limit": (ended("TIMEOUT", end=START + LIMIT), Own(), TERM90),
    "signalled": (ended(end=START + 60), Own(frozenset({"preempt_signal", "checkpoint_complete"})), TERM90),
    "preempted": (ended(preempt_time=START + 50, end=START + 70), Own(), TERM90),
    "signal_time": (ended(end=SIGNAL_AT), Own(), TERM90),
    "killed_at_signal": (ended("FAILED", end=SIGNAL_AT + 3, code=143), Own(), TERM90),
    "unsure": (ended(end=START + 60), Own(), UNKNOWN),
    "failure": (ended("FAILED", code=1), Own(), TERM90),
    "preemption": (ended("PREEMPTED"), Own(), TERM90),
    "node_failure": (ended("NODE_FAIL"), Own(), TERM90),
    "cancel": (ended("CANCELLED", cancelled_by=0), Own(), TERM90),
    "user_cancel": (ended("CANCELLED", cancelled_by=ME), Own(), TERM90),
    "requeue": (ended("REQUEUED", requeued=True), Own(), TERM90),
    "unknown": (ended("UNKNOWN"), Own(), TERM90),
}


@pytest.mark.parametrize("want", [c for c, _, _, _ in rules.TABLE if c != "stop"])
def test_every_row_of_the_table_is_reached_from_the_facts_that_make_it(want):
    e, own, warning = ROWS[want]
    got, why = ends.cause_of(e, own, warning, ME)
    assert got == want, why
    assert why and "None" not in why


def test_the_table_is_the_rows_and_stop_is_a_persons_word():
    assert set(ROWS) | {"stop"} == set(rules.RULE_OF)
    assert {c: rules.RULE_OF[c] for c in ("finished", "completed")} == {"finished": "done", "completed": "done"}
    assert {rules.RULE_OF[c] for c in ("time_limit", "signalled", "preempted", "signal_time", "killed_at_signal",
                                        "unsure")} == {"continue"}


# -- the cases found wrong ----------------------------------------------------------------

def test_an_own_handler_that_saved_at_the_signal_and_exited_0_is_continued_not_done():
    """Point 1: COMPLETED, no event (its sentinel went to slurm-%j.out, which no one reads),
    ended after its --signal time: the run goes on (it stopped at step 95 of 400 before)."""
    got, why = cause(ended(end=SIGNAL_AT + 12))
    assert (got, rules.RULE_OF[got]) == ("signal_time", "continue")
    assert "after its --signal time" in why


def test_an_older_epilogs_sentinel_scan_is_no_fact_and_a_finished_run_is_done():
    """Point 2: an older Epilog recorded checkpoint_complete (source epilog) for every job
    sharing an appended log. It is not this execution's own fact: the finished run is done."""
    own = ends.own_events([{"type": "checkpoint_complete", "source": "epilog"}, {"type": "published"}])
    assert own.types == frozenset({"published"})
    assert cause(ended(end=START + 40), own) == ("completed", cause(ended(end=START + 40))[1])
    assert rules.RULE_OF["completed"] == "done"


@pytest.mark.parametrize("code, sig", [(143, None), (15, None), (None, signal.SIGTERM)],
                         ids=["srun-exit-143", "sacct-text-15", "batch-shell-killed"])
def test_an_untrapped_trainer_killed_by_the_signal_is_a_continuation_not_a_failure(code, sig):
    """Point 3: the README's job script (--signal=TERM@90) with a trainer that does not trap
    SIGTERM ends FAILED: srun exits 143 (sacct's text shows 15), or with B: the batch shell is
    killed by signal 15. After the signal time that is the time limit, not a crash."""
    got, why = cause(ended("FAILED", end=SIGNAL_AT + 20, code=code, sig=sig))
    assert (got, rules.RULE_OF[got]) == ("killed_at_signal", "continue"), why


def test_a_crash_is_a_failure_even_after_the_signal_time_and_a_kill_before_it_too():
    assert cause(ended("FAILED", end=SIGNAL_AT + 20, code=1))[0] == "failure"
    assert cause(ended("FAILED", end=SIGNAL_AT - 20, code=143))[0] == "failure"  # someone else's SIGTERM
    assert cause(ended("FAILED", end=SIGNAL_AT + 20, code=138))[0] == "failure"  # USR1, not the job's signal


def test_a_step_that_trapped_the_signal_and_died_of_a_peers_crash_is_a_failure():
    """A rank raised, and Slurm stopped the step (srun --kill-on-bad-exit, 26.05's PMI abort:
    SIGTERM to every task): the trainer's handler noted that SIGTERM (its preempt_signal event)
    and saved nothing, and srun exited 143 because the aborting rank died of it. That is no
    trainer killed by the job's --signal (a trainer that traps it is not killed by it): a crash."""
    trapped = Own(frozenset({"execution_started", "preempt_signal"}))
    got, why = cause(ended("FAILED", end=SIGNAL_AT + 20, code=143), trapped)
    assert (got, rules.RULE_OF[got]) == ("failure", "resubmit"), why
    assert "preempt_signal" in why


def test_a_signal_event_outweighs_training_finished_and_finished_outweighs_the_time():
    both = Own(frozenset({"checkpoint_complete", "training_finished"}))
    assert cause(ended(end=START + 60), both)[0] == "signalled"
    assert cause(ended(end=START + LIMIT - 1), Own(frozenset({"training_finished"})))[0] == "finished"


def test_without_a_warning_signal_an_exit_0_is_done_and_at_zero_seconds_none_is_sent():
    assert cause(ended(end=START + LIMIT - 1), warning=NONE)[0] == "completed"
    at0 = job_signal(["--signal=TERM@0", "t.sbatch"], {}, "")
    assert at0.signal is None and "never sent" in at0.source
    assert cause(ended(end=START + LIMIT - 1), warning=at0)[0] == "completed"


@pytest.mark.parametrize("missing, needle", [
    ({"warning": UNKNOWN}, "its --signal is unknown"),
    ({"start_time": None}, "no start time"),
    ({"time_limit": None}, "no time limit"),
    ({"end_time": None}, "no end time"),
    ({"own": Own(error="events/: Permission denied")}, "its events cannot be read"),
])
def test_a_missing_fact_is_the_safe_side_continue_naming_what_was_missing(missing, needle):
    warning = missing.pop("warning", TERM90)
    own = missing.pop("own", Own())
    got, why = cause(ended(end=START + 60, **missing), own, warning)
    assert got == "unsure" and rules.RULE_OF[got] == "continue" and needle in why, why


def test_an_unlimited_job_is_never_stopped_by_its_signal():
    e = ended(end=START + 60, time_limit=None, time_limit_unlimited=True)
    assert cause(e)[0] == "completed"


def test_the_decision_records_why_and_a_done_says_it():
    from test_supervisor_rules import defn
    from dispatch_slurm.supervisor.state import State
    st = State.replay([{"type": "job", "t": 1, **defn()}])
    e = ended(end=SIGNAL_AT - 100)
    c, why = cause(e)
    d = rules.decide(st, e, c, None, "/r", why)
    assert d.fact["why"] == why and d.finish == ("done", f"job 7 completed: {why}")


# -- the job's --signal, as sbatch reads it --------------------------------------------------

@pytest.mark.parametrize("spec, want", [
    ("TERM@90", Signal("TERM", False, 90)), ("B:USR2@120", Signal("USR2", True, 120)),
    ("R:TERM@30", Signal("TERM", False, 30)), ("RB:USR1", Signal("USR1", True, 60)),
    ("BR:10@5", Signal("USR1", True, 5)), ("SIGUSR1", Signal("USR1", False, 60)),
    ("12@30", Signal("USR2", False, 30)), ("term@7", Signal("TERM", False, 7)),
    ("sigterm", Signal("TERM", False, 60)), ("BTERM@9", Signal("TERM", True, 9)),
    ("TERM@", Signal("TERM", False, 0)), ("15", Signal("TERM", False, 60)),
])
def test_signal_specs_read_as_sbatchs_get_signal_opts(spec, want):
    assert parse_signal(spec) == want


@pytest.mark.parametrize("spec", ["", "X:TERM", "NOPE@3", "TERM@x", "TERM@-1", "TERM@70000", "0", "B:"])
def test_bad_signal_specs_are_refused_naming_the_form(spec):
    with pytest.raises(ValueError, match=r"expected \[B:\]SIG\[@SECONDS\]"):
        parse_signal(spec)


def test_the_lead_is_the_warning_time_and_slurms_30_s_check():
    assert Signal("TERM", False, 90).lead() == 120 and Signal("TERM").number == 15
    assert Signal("USR1").number == signal.SIGUSR1


SCRIPT = """#!/bin/bash
#SBATCH --time=24:00:00 --signal=TERM@90  # the trainer's steps get SIGTERM 90 s before the end
# a comment
#SBATCH -N 1 -o 'my out.log'

set -euo pipefail
#SBATCH --signal=USR1@5
srun python train.py
"""


def test_only_the_directives_before_the_first_command_count():
    assert script_options(SCRIPT) == ["--time=24:00:00", "--signal=TERM@90", "-N", "1", "-o", "my out.log"]
    assert script_options("#SBATCH -J a\n#SBATCH hetjob\n#SBATCH --signal=USR1\n") == ["-J", "a"]
    assert script_options("#SLURM --signal=HUP\n") == ["--signal=HUP"]
    assert script_options("  # SBATCH --signal=HUP\necho\n") == []


@pytest.mark.parametrize("argv, want", [
    (["-N", "1", "-o", "x.out", "t.sbatch", "--signal=USR1"], (None, "t.sbatch", None)),
    (["-N1", "--signal", "B:USR2@9", "t.sbatch"], ("B:USR2@9", "t.sbatch", None)),
    (["--sig=TERM@5", "--signal=USR1@9", "t.sbatch"], ("USR1@9", "t.sbatch", None)),
    (["-vJ", "name", "--time", "5", "t.sbatch"], (None, "t.sbatch", None)),
    (["--requeue", "--wrap", "echo hi"], (None, None, "echo hi")),
    (["-o", "--signal=USR1", "t.sbatch"], (None, "t.sbatch", None)),
])
def test_sbatchs_command_line_is_read_for_the_signal_and_the_script(argv, want):
    got = sbatch_options(argv)
    assert (got.signal, got.script, got.wrap) == want


def test_a_signal_time_days_away_is_said_with_its_day():
    """An hour-old run under a two-day limit: "exited 0 at 10:00, before its --signal time
    09:58" read as if the signal had come first."""
    e = ended(end=START + 3600, time_limit=2 * 86400)
    why = cause(e)[1]
    day = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # noqa: E731
    assert why == f"it exited 0 at {day(START + 3600)}, before its --signal time {day(START + 2 * 86400 - 120)}"


def test_the_supervisors_own_spank_flag_is_never_taken_for_the_script(tmp_path):
    """`run --shared-checkpoint --via spank` puts --dispatch-shared-checkpoint (a flag) before
    the script; read as taking a value, it swallowed the script, the signal became unknown and
    every finished execution was held, then failed as unsure."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --signal=TERM@20\nsrun x\n")
    defn = {"signal": None, "grace": None, "shared": True, "via": "spank", "args": [str(script)],
            "cwd": str(tmp_path)}
    argv, env = rules.sbatch_argv(defn, "/ckpt/root", 0, 1, "tag")
    assert "--dispatch-shared-checkpoint" in argv and sbatch_options(argv).script == str(script)
    from dispatch_slurm.supervisor import job_signal_of
    assert job_signal_of(defn, argv, env).signal == Signal("TERM", False, 20)


def test_every_flag_of_the_spank_plugin_is_known_to_take_no_value():
    """The plugin's options table (has_arg 0) and the reader's flags agree: a new flag in the
    plugin would otherwise eat the script's name."""
    import pathlib
    import re
    from dispatch_slurm.contract import signals
    table = (pathlib.Path(__file__).parents[1] / "spank_env" / "options.c").read_text()
    flags = {m.group(1) for m in re.finditer(r'\{\s*"([a-z-]+)",\s*NULL,[^}]*?,\s*0,\s*OPT_', table, re.S)}
    assert flags == {"dispatch-shared-checkpoint"} and flags <= signals._NO_ARG_LONG


def test_the_command_line_beats_sbatch_signal_which_beats_the_script():
    script = "#SBATCH --signal=TERM@90\nsrun x\n"
    assert job_signal(["t.sbatch"], {}, script).signal == Signal("TERM", False, 90)
    assert job_signal(["t.sbatch"], {"SBATCH_SIGNAL": "USR2@33"}, script).signal == Signal("USR2", False, 33)
    got = job_signal(["--signal=B:USR1", "t.sbatch"], {"SBATCH_SIGNAL": "USR2@33"}, script)
    assert got.signal == Signal("USR1", True, 60) and "command line" in got.source
    assert job_signal(["t.sbatch"], {}, "srun x\n").signal is None


def test_an_unreadable_script_is_unknown_unless_the_command_line_says():
    assert job_signal(["t.sbatch"], {}, None, "t.sbatch (No such file)").unknown
    assert job_signal(["--signal=TERM@5", "t.sbatch"], {}, None).signal == Signal("TERM", False, 5)
    bad = job_signal(["--signal=NOPE", "t.sbatch"], {}, "")
    assert bad.unknown and "NOPE" in bad.unknown


def test_the_record_keeps_the_signal_and_reads_it_back():
    for js in (TERM90, NONE, UNKNOWN, JobSignal(Signal("USR2", True, 5), "x")):
        assert JobSignal.from_fact(js.as_fact()).as_fact() == js.as_fact()
    assert JobSignal.from_fact(None).unknown  # a record from before: unknown, the safe side


@pytest.mark.parametrize("text, seconds", [("1", 60), ("90", 5400), ("2:30", 150), ("1:00:00", 3600),
                                           ("1-0", 86400), ("1-2:3", 93780), ("1-02:03:04", 93784),
                                           ("UNLIMITED", None), ("infinite", None)])
def test_time_limits_read_as_sbatch_reads_them(text, seconds):
    assert parse_time_limit(text) == seconds


def test_a_signal_whose_lead_is_the_whole_limit_is_refused_naming_the_fix():
    """--signal=TERM@90 with --time=2: Slurm signals at its first check, whatever the trainer
    does, so a finished run could never be told from a stopped one (it would be continued
    until the stall rule failed it)."""
    assert "give --time more than 120 s" in lead_problem(Signal("TERM", False, 90), 120)
    assert lead_problem(Signal("TERM", False, 90), 121) is None
    assert lead_problem(Signal("TERM", False, 0), 60) is None and lead_problem(None, 60) is None
    assert lead_problem(Signal("TERM", False, 5), None) is None  # the partition's default: not known here


def test_run_submit_and_doctor_refuse_a_signal_at_once_before_anything_is_submitted(tmp_path):
    from support import cli
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "t.sbatch").write_text("#!/bin/bash\n#SBATCH --time=2 --signal=TERM@90\nsrun python train.py\n")
    for argv in (["run", root, "--", "t.sbatch"], ["submit", root, "--", "t.sbatch"]):
        p = cli(*argv, cwd=tmp_path)
        assert p.returncode == 2 and "Slurm sends the signal at its first check" in p.stderr, p.stderr
    assert list(root.iterdir()) == [], "nothing written, no N spent"
    ok = cli("plan", root, "--", "--time=1:00:00", "t.sbatch", cwd=tmp_path)
    assert ok.returncode == 0 and "Slurm sends SIGTERM 90 s before the time limit" in ok.stdout, ok.stdout
    doc = cli("doctor", "--no-slurm", "--script", tmp_path / "t.sbatch", cwd=tmp_path)
    assert doc.returncode == 1 and "signal-at-once" in doc.stdout


def test_mark_writes_this_executions_fact_and_refuses_outside_one(tmp_path, monkeypatch):
    from support import cli
    from dispatch_slurm import mark_finished, mark_saved
    from dispatch_slurm.store import events
    root = tmp_path / "root"
    root.mkdir()
    env = {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_ATTEMPT": "c.7.1000000", "DISPATCH_EPOCH": "1000000"}
    assert cli("mark", "saved", env=env).returncode == 0
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    mark_finished(step=9)
    got = [(e["attempt"], e["type"], e.get("source"), e.get("step")) for e in events.read(str(root))]
    assert got == [("c.7.1000000", "checkpoint_complete", "mark", None), ("c.7.1000000", "training_finished", None, 9)]
    assert ends.own_events(events.read(str(root))).types == {"checkpoint_complete", "training_finished"}
    monkeypatch.delenv("DISPATCH_ATTEMPT")
    with pytest.raises(Exception, match="DISPATCH_ATTEMPT"):
        mark_saved()
    bare = cli("mark", "finished", env={"DISPATCH_CHECKPOINT": "", "DISPATCH_ATTEMPT": ""})
    assert bare.returncode == 2 and "DISPATCH_ATTEMPT" in bare.stderr


VIEW_EVENTS = Own(frozenset({"resumed", "published"}))  # `view prepare`'s resumed, the view publisher's published


@pytest.mark.parametrize("trainer, end, want, rule", [
    # a Hugging Face Trainer traps nothing: the time limit's SIGTERM kills it (srun: 128 + 15)
    ("huggingface", ended("FAILED", end=SIGNAL_AT + 2, code=143), "killed_at_signal", "continue"),
    # Lightning raises SIGTERMException (a SystemExit without a code) at the next batch: exit 0
    ("lightning", ended(end=SIGNAL_AT + 4), "signal_time", "continue"),
    # any of them reaching its max_steps before the signal: exit 0 before it
    ("finished", ended(end=SIGNAL_AT - 30), "completed", "done"),
    ("crashed", ended("FAILED", end=START + 300, code=1), "failure", "resubmit"),
])
def test_an_unmodified_trainer_under_the_view_ends_by_slurms_facts_alone(trainer, end, want, rule):
    """No trainer under the view writes an event of its own (no signal event, no
    training_finished): the rule reads Slurm's facts and the job's --signal, and the view's
    own events (the resume prepare resolved, the publisher's publications) say the trainer
    started, so a crash is the trainer's failure, never a refusal before training."""
    assert cause(end, VIEW_EVENTS)[0] == want
    assert ends.before_training(end, VIEW_EVENTS) is None
    assert rules.RULE_OF[want] == rule
