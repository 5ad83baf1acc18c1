"""The doctor: its rules, the probe records, and local rehearsals of stand-ins
that fail the way the real things fail -- a trainer that never installs the handler, a
launcher that swallows SIGTERM, a launcher killed by SIGUSR1, a save slower than the
window -- next to one that is wired right."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from dispatch_slurm.doctor import rules as d
from dispatch_slurm.runtime import probe

SRUN = d.Stack(where="step")
SHELL = d.Stack(where="shell")
CONF = d.SlurmConf(kill_wait=30, preempt_mode="REQUEUE", send_user_signal=False, grace_time=120)


def codes(findings):
    return {f.code for f in findings}


# -- the wiring alone ---------------------------------------------------------------------

@pytest.mark.parametrize("spec, want", [("TERM@90", d.Signal("TERM", False, 90)), ("B:USR2@120", d.Signal("USR2", True, 120)),
                                        ("SIGUSR1", d.Signal("USR1", False, 60)), ("12@30", d.Signal("USR2", False, 30))])
def test_signal_specs_parse_as_sbatch_reads_them(spec, want):
    assert d.parse_signal(spec) == want


@pytest.mark.parametrize("spec", ["TERM@x", "X:TERM", "TERM@-1", "", "NOPE@3"])
def test_bad_signal_specs_are_refused(spec):
    with pytest.raises(ValueError, match="--signal"):
        d.parse_signal(spec)


def test_a_correct_srun_job_has_no_findings():
    sig = d.Signal("TERM", False, 90)
    assert d.check(sig, SRUN, CONF, grace=60, measured=20) == []
    assert d.windows(sig, SRUN, CONF) == {"time limit": 120, "preemption": 150}


def test_b_signal_with_the_trainer_in_a_step_is_named_with_its_fix():
    (f,) = [f for f in d.check(d.Signal("TERM", True, 90), SRUN, CONF) if f.code == "signal-to-shell"]
    assert "--signal=TERM@90" in f.fix and "B:" in f.problem
    assert d.windows(d.Signal("TERM", True, 90), SRUN, CONF)["time limit"] == 30  # only the limit's KillWait


def test_step_signal_with_the_trainer_in_the_shell_and_the_reverse_fix():
    found = d.check(d.Signal("USR2", False, 90), SHELL, CONF, handled={"USR2", "TERM"})
    assert {"signal-to-steps", "preempt-to-steps"} <= codes(found)
    assert "B:USR2@90" in next(f.fix for f in found if f.code == "signal-to-steps")
    assert codes(d.check(d.Signal("TERM", True, 90), d.Stack(where="shell", execs=True), d.SlurmConf())) == set()
    assert "shell-keeps-it" in codes(d.check(d.Signal("TERM", True, 90), SHELL, d.SlurmConf()))


def test_preemption_without_send_user_signal_never_runs_a_usr2_handler():
    sig = d.Signal("USR2", False, 90)
    assert "send-user-signal" in codes(d.check(sig, SRUN, CONF))
    assert d.windows(sig, SRUN, CONF)["preemption"] == 0
    fixed = d.SlurmConf(30, "REQUEUE", True, 120)
    assert "send-user-signal" not in codes(d.check(sig, SRUN, fixed))
    assert d.windows(sig, SRUN, fixed)["preemption"] == 150


def test_torchrun_kills_at_30_s_and_dies_of_usr1_unless_launched_by_dispatch():
    tr = d.Stack(where="step", launcher="torchrun")
    found = d.check(d.Signal("TERM", False, 90), tr, CONF)
    assert "launcher-kill" in codes(found) and d.windows(d.Signal("TERM", False, 90), tr, CONF)["time limit"] == 30
    assert "launcher-dies" in codes(d.check(d.Signal("USR1", False, 90), tr, d.SlurmConf()))
    wrapped = d.Stack(where="step", launcher="torchrun", wrapped=True)
    assert codes(d.check(d.Signal("TERM", False, 90), wrapped, CONF)) == set()
    one = d.Stack(where="step", launcher="accelerate")
    assert "launcher-dies" in codes(d.check(d.Signal("TERM", False, 90), one, d.SlurmConf()))


def test_a_save_that_does_not_fit_names_the_grace_it_needs():
    (f,) = d.check(d.Signal("TERM", False, 30), SRUN, d.SlurmConf(kill_wait=10), measured=45)
    assert f.code == "save-too-long" and "--signal=TERM@57" in f.fix
    assert "no-grace-time" in codes(d.check(d.Signal("TERM", False, 90), SRUN, d.SlurmConf(30, "CANCEL", False, 0)))


def test_slurm_config_text_is_read():
    conf = d.parse_conf({"KillWait": "30 sec", "PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE",
                         "PreemptParameters": "send_user_signal"}, {"GraceTime": "5", "PreemptMode": "CANCEL"})
    assert conf == d.SlurmConf(30, "CANCEL", True, 5)
    assert d.parse_conf({"PreemptType": "preempt/none", "PreemptMode": "REQUEUE"}).preempt_mode == "OFF"


@pytest.mark.parametrize("flags, says", [
    ("Alloc", None),
    ("Alloc,Contain", "an extern step holds the job's processes on every node; the Epilog runs after it ended"),
    ("Alloc,Contain,RunInJob", "inside its cgroup; the Epilog's cessation evidence leaves out its own processes")])
def test_the_report_names_prolog_flags_that_put_the_hooks_in_the_job(flags, says):
    from dispatch_slurm.doctor import report
    conf = d.parse_conf({"PrologFlags": flags})
    assert conf.prolog_flags == flags
    text = report.render(None, d.Stack(), conf, None, {}, [], [])
    hooks = [ln for ln in text.splitlines() if ln.startswith("hooks: ")]
    assert hooks == ([] if says is None else [hooks[0]]) and (says is None or hooks[0].endswith(says)), text
    assert hooks == [] or hooks[0].startswith(f"hooks: PrologFlags {flags}: ")
    assert d.parse_conf({"PrologFlags": "(null)"}).prolog_flags == ""


def test_job_scripts_are_read():
    sig, stack = d.parse_script("#!/bin/bash\n#SBATCH --nodes=2 --signal=B:USR2@120\n"
                                "trap 'kill -USR2 $T' USR2\nsrun torchrun --nproc-per-node 4 train.py & T=$!\nwait $T\n")
    assert sig == d.Signal("USR2", True, 120)
    assert stack == d.Stack(where="step", launcher="torchrun", forwards=True)
    _, s2 = d.parse_script("#SBATCH --signal=TERM@60\nexec accelerate launch --num_processes 2 t.py\n")
    assert s2 == d.Stack(where="shell", launcher="accelerate", execs=True, processes=2)


# -- measured: probe records -> rows -> verdict --------------------------------------------

def recs(rank, **phases):
    return {("h", 100 + rank): {k: {"phase": k, "t": t, "rank": rank, **({"ok": True} if k == "saved" else {}),
                                    **({"code": 0} if k == "exit" else {})} for k, t in phases.items()}}


def test_rows_measure_each_rank_from_the_signal_sent():
    records = {**recs(0, installed=1, signal=10.1, stop=10.3, saved=12.3, published=12.4, exit=12.5),
               **recs(1, installed=1, signal=10.2, stop=10.3, saved=12.2, exit=12.5)}
    r0, r1 = d.rows(records, sent_at=10.0, end_at=40.0)
    assert (r0.delay, r0.to_stop, r0.save, r0.left, r0.published, r0.exit) == (0.1, 0.2, 2.0, 27.5, True, 0)
    assert r1.published is False and d.verdict([r0, r1], 2, 30, exit_code=0) == []


def test_verdict_names_what_the_records_show():
    assert codes(d.verdict(d.rows(recs(0, installed=1), 10, 40), 2, 30)) == {"handler-not-installed",
                                                                              "signal-not-delivered"}
    assert codes(d.verdict(d.rows(recs(0, installed=1, signal=10.1), 10, 40), 1, 30)) == {"no-safe-point"}
    (slow,) = d.verdict(d.rows(recs(0, installed=1, signal=10.1, stop=10.2), 10, 40), 1, 30)
    assert slow.code == "save-too-long"
    done = d.rows(recs(0, installed=1, signal=10.1, stop=10.2, saved=11, exit=11.1), 10, 40)
    assert codes(d.verdict(done, 1, 30, exit_code=1, launcher="torchrun")) == {"exit-status"}


def test_probe_records_land_per_process_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("DISPATCH_PROBE_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    probe.record("installed", signals=["SIGTERM"])
    probe.record("signal", signal="SIGTERM")
    (tmp_path / "x.1.jsonl").write_text('{"phase": "installed"\n')  # torn by a kill: skipped
    got = probe.read(str(tmp_path))
    mine = next(v for (h, pid), v in got.items() if pid == os.getpid())
    assert mine["installed"]["rank"] == 3 and mine["signal"]["signal"] == "SIGTERM"
    with pytest.raises(ValueError):
        probe.record("nope")
    monkeypatch.delenv("DISPATCH_PROBE_DIR")
    monkeypatch.setenv("DISPATCH_EXEC_DIR", str(tmp_path / "exec"))
    assert probe.directory() == str(tmp_path / "exec" / "dispatch-probe")


# -- local rehearsals of stand-ins (real processes, real signals) ---------------------------

TRAINER = textwrap.dedent("""
    import os, signal, sys, time
    mode = sys.argv[1]
    if mode != "no-handler":
        from dispatch_slurm import install_preemption_handler, preemption_point
        def save(left):
            time.sleep(float(os.environ.get("SAVE_S", "0.1")))  # the save's own work
            return None
        install_preemption_handler(save, defer=True)
    while True:
        time.sleep(0.02)  # one step
        if mode != "no-handler":
            preemption_point()
""")

# a launcher that traps SIGTERM and does nothing with it: the child never hears of it
SWALLOW = textwrap.dedent("""
    import signal, subprocess, sys
    signal.signal(signal.SIGTERM, lambda *a: None)
    sys.exit(subprocess.call([sys.executable, *sys.argv[1:]], start_new_session=True))
""")

# a launcher that handles no signal (accelerate launch with one process): SIGUSR1 ends it
PLAIN = textwrap.dedent("""
    import subprocess, sys
    sys.exit(subprocess.Popen([sys.executable, *sys.argv[1:]]).wait())
""")


def doctor(tmp_path, *args, env=None):
    for name, text in (("trainer.py", TRAINER), ("swallow.py", SWALLOW), ("plain.py", PLAIN)):
        (tmp_path / name).write_text(text)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_", "RANK"))}
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "dispatch_slurm", "doctor", "--no-slurm", "--json", "--ready-timeout", "30",
                        "--probe-dir", str(tmp_path / "probe"), *args], cwd=tmp_path, env=e, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def test_rehearsal_of_a_correct_trainer_reports_its_save(tmp_path):
    code, r = doctor(tmp_path, "--signal", "TERM@3", "--kill-wait", "1", "--", sys.executable, "trainer.py", "ok")
    (rank,) = r["ranks"]
    assert code == 0 and r["findings"] == [], r
    assert 0 <= rank["delay"] < 1 and rank["save"] >= 0.1 and rank["exit"] == 0 and rank["left"] > 2


def test_rehearsal_names_a_trainer_that_never_installs_the_handler(tmp_path):
    code, r = doctor(tmp_path, "--signal", "TERM@3", "--kill-wait", "1", "--ready-timeout", "2", "--",
                     sys.executable, "trainer.py", "no-handler")
    assert code == 1 and r["ranks"] == [] and "handler-not-installed" in codes_of(r)
    assert r["run"]["exit_code"] == -15  # SIGTERM's default action: it died, nothing saved


def test_rehearsal_names_a_launcher_that_swallows_sigterm(tmp_path):
    code, r = doctor(tmp_path, "--signal", "B:TERM@2", "--where", "shell", "--kill-wait", "1", "--",
                     sys.executable, "swallow.py", "trainer.py", "ok")
    (rank,) = r["ranks"]
    assert code == 1 and "signal-not-delivered" in codes_of(r), r
    assert rank["delay"] is None and rank["exit"] is None  # never signalled, SIGKILLed with the step
    (tmp_path / "linuxproc").mkdir()
    code, r = doctor(tmp_path / "linuxproc", "--signal", "B:TERM@2", "--where", "shell", "--kill-wait", "1", "--every-process", "--",
                     sys.executable, "swallow.py", "trainer.py", "ok")
    (rank,) = r["ranks"]  # linuxproc: the limit's SIGTERM reaches every process, KillWait before the kill
    assert code == 1 and "signal-not-delivered" in codes_of(r) and rank["delay"] >= 2 and rank["exit"] == 0, r


def test_rehearsal_shows_a_launcher_killed_by_usr1_takes_the_save_with_it(tmp_path):
    code, r = doctor(tmp_path, "--signal", "USR1@3", "--launcher", "accelerate", "--kill-wait", "1", "--",
                     sys.executable, "plain.py", "trainer.py", "ok", env={"SAVE_S": "1"})
    assert code == 1 and "launcher-dies" in codes_of(r)
    assert r["ranks"][0]["exit"] is None and r["run"]["exit_code"] == -10, r  # the step ended with the launcher


def test_rehearsal_names_a_save_slower_than_the_window(tmp_path):
    code, r = doctor(tmp_path, "--signal", "TERM@1", "--kill-wait", "1", "--", sys.executable, "trainer.py", "ok",
                     env={"SAVE_S": "10"})
    (rank,) = r["ranks"]
    assert code == 1 and "save-too-long" in codes_of(r) and rank["exit"] is None, r


def codes_of(report):
    return {f["code"] for f in report["findings"]}


def test_doctor_help_and_bad_input_are_clear(tmp_path):
    h = subprocess.run([sys.executable, "-m", "dispatch_slurm", "doctor", "--help"], capture_output=True, text=True)
    assert h.returncode == 0 and "dispatch-slurm doctor --script train.sbatch" in h.stdout
    bad = subprocess.run([sys.executable, "-m", "dispatch_slurm", "doctor", "--no-slurm", "--signal", "TERM@x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "expected [B:]SIG[@SECONDS]" in bad.stderr and "Traceback" not in bad.stderr
    miss = subprocess.run([sys.executable, "-m", "dispatch_slurm", "doctor", "--no-slurm", "--", "true"],
                          capture_output=True, text=True)
    assert miss.returncode == 2 and "needs the job's --signal" in miss.stderr


# -- torchrun, real: its kill (here --shutdown-timeout 2 for the default 30 s) and exit status

def torchrun(*args):
    return (sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--shutdown-timeout", "2",
            *args, "trainer.py", "ok")


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "dispatch-slurm-launch"])
def test_torchrun_kills_a_save_longer_than_its_timeout_unless_launched(tmp_path, wrapped):
    pytest.importorskip("torch")
    cmd = (sys.executable, "-m", "dispatch_slurm", "launch", "--", *torchrun()) if wrapped else torchrun()
    code, r = doctor(tmp_path, "--signal", "TERM@8", "--kill-wait", "1", "--ranks", "2", "--", *cmd,
                     env={"SAVE_S": "4"})
    exits = [x["exit"] for x in r["ranks"]]
    if wrapped:
        assert code == 0 and exits == [0, 0] and r["run"]["exit_code"] == 0, r
    else:  # SIGKILLed 2 s into a 4 s save: no rank got to exit
        assert code == 1 and exits == [None, None] and "save-too-long" in codes_of(r), r


def test_torchrun_exits_1_after_every_rank_saved_and_the_doctor_says_so(tmp_path):
    pytest.importorskip("torch")
    code, r = doctor(tmp_path, "--signal", "TERM@8", "--kill-wait", "1", "--ranks", "2", "--", *torchrun())
    assert [x["exit"] for x in r["ranks"]] == [0, 0] and r["run"]["exit_code"] == 1, r
    assert "exit-status" in codes_of(r) and code == 1


def test_launch_takes_the_save_signals_from_torchruns_list():
    from dispatch_slurm.runtime.launch import child_env, save_signals
    import signal as s
    sigs = save_signals({"DISPATCH_SIGNAL": "USR2, SIGUSR1"})
    assert sigs == [s.SIGTERM, s.SIGUSR2, s.SIGUSR1]
    env = child_env({"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGUSR2"}, sigs)
    assert env["PET_SIGNALS_TO_HANDLE"] == env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGINT"


# -- a plain loop: a signal during warm-up or evaluation saves there ------------------------

def example_env(tmp_path):
    from dispatch_slurm import store
    root = tmp_path / "root"
    root.mkdir()
    exec_dir = store.make_exec_dir(str(root), "c.14.1000000")
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_", "RANK"))}
    return root, {**e, "DISPATCH_CHECKPOINT": str(root), "DISPATCH_EXEC_DIR": exec_dir,
                  "DISPATCH_EPOCH": "1000000", "DISPATCH_ATTEMPT": "c.14.1000000"}


EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "pytorch_train.py")


def test_plain_loop_signalled_in_warm_up_publishes_step_0_under_the_doctor(tmp_path):
    """The doctor signals as soon as the handler is installed: inside a 200-batch warm-up
    (10 s, longer than the 3 s window). The save lands within a batch of the signal."""
    pytest.importorskip("torch")
    from dispatch_slurm import store
    root, env = example_env(tmp_path)
    code, r = doctor(tmp_path, "--signal", "TERM@2", "--kill-wait", "1", "--", sys.executable, EXAMPLE,
                     "--max-steps", "5", "--save-every", "100", "--warmup", "200", "--phase-time", "0.05", env=env)
    (rank,) = r["ranks"]
    assert code == 0 and rank["exit"] == 0 and rank["published"] and rank["to_stop"] < 0.5, r
    assert [p.step for p in store.publications(str(root))] == [0]


def test_plain_loop_signalled_in_evaluation_publishes_that_step(tmp_path):
    pytest.importorskip("torch")
    from dispatch_slurm import store
    root, env = example_env(tmp_path)
    p = subprocess.Popen([sys.executable, EXAMPLE, "--max-steps", "50", "--save-every", "100", "--eval-every", "4",
                          "--eval-batches", "400", "--phase-time", "0.05"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in p.stdout:  # the real state: the loop says the evaluation began
            lines.append(line.strip())
            if line.startswith("eval at step 4"):
                p.send_signal(15)
                break
        out = p.communicate(timeout=30)[0].splitlines()
    finally:
        p.kill()
    assert p.returncode == 0 and out[-1] == "dispatch-checkpoint-complete", lines + out
    assert "eval done at step 4" not in out  # saved inside the 20 s evaluation
    assert [x.step for x in store.publications(str(root))] == [4]


def test_the_verdicts_in_docs_signals_are_what_the_doctor_prints(tmp_path):
    """Every recipe in docs/signals.md (an sbatch block followed by a doctor block) is
    checked with the cluster the page names; the page must show what the doctor says."""
    import re
    text = open(os.path.join(os.path.dirname(__file__), "..", "docs", "signals.md")).read()
    pairs = re.findall(r"```sh\n(#!/bin/bash\n.*?)```\n\n```text\n(doctor:.*?)```", text, re.S)
    assert len(pairs) >= 8, "the recipes went missing from docs/signals.md"
    for i, (script, shown) in enumerate(pairs):
        (tmp_path / f"{i}.sbatch").write_text(script)
        p = subprocess.run([sys.executable, "-m", "dispatch_slurm", "doctor", "--no-slurm", "--kill-wait", "30",
                            "--preempt-mode", "REQUEUE", "--grace-time", "120", "--script", str(tmp_path / f"{i}.sbatch")],
                           capture_output=True, text=True)
        assert p.stdout == shown and p.returncode == (0 if "verdict: OK" in shown else 1), (script, p.stdout, p.stderr)


@pytest.mark.parametrize("args,needle", [
    (["--save-seconds", "inf"], "--save-seconds': 'inf' is not a duration"),
    (["--kill-wait", "nan"], "--kill-wait': 'nan' is not a duration"),
    (["--grace-time", "-inf"], "--grace-time'"),
    (["--script", "binary"], "binary: not UTF-8 text (byte 0)"),
])
def test_what_the_cli_fuzz_test_found_is_refused_in_one_line(tmp_path, args, needle):
    """An infinite duration once reached int() (OverflowError), a binary --script the UTF-8
    decoder (UnicodeDecodeError): tracebacks both, now one line each, exit 2."""
    from support import cli
    (tmp_path / "binary").write_bytes(b"\x89PNG\r\n")
    p = cli("doctor", *args, cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and needle in lines[0], p.stderr


def test_a_save_too_long_under_bare_torchrun_names_torchruns_kill_not_the_signal_lead():
    """--save-seconds 45 under bare torchrun, a job that signals at 150 s: the 30 s
    that binds is torchrun's kill of its workers after SIGTERM, so the fix is `dispatch-slurm
    launch`, never `--signal=TERM@57` (the job already signals at 150)."""
    tr = d.Stack(where="step", launcher="torchrun")
    found = {f.code: f for f in d.check(d.Signal("TERM", False, 150), tr, d.SlurmConf(kill_wait=30), measured=45)}
    f = found["save-too-long"]
    assert "@57" not in f.fix and "--signal" not in f.fix and "dispatch-slurm launch -- torchrun" in f.fix, f
    assert "torchrun SIGKILLs its workers 30 s after the signal" in f.problem and "180 s Slurm allows" in f.problem
    # where the signal lead binds, the fix is the lead; where GraceTime does, GraceTime
    (lead,) = d.check(d.Signal("TERM", False, 30), SRUN, d.SlurmConf(kill_wait=10), measured=45)
    assert "--signal=TERM@57" in lead.fix and "the job's --signal lead (30 s)" in lead.problem
    pre = [f for f in d.check(d.Signal("TERM", False, 300), SRUN, d.SlurmConf(10, "REQUEUE", False, 20), measured=45)
           if f.code == "save-too-long"]
    assert len(pre) == 1 and pre[0].problem.startswith("preemption") and "GraceTime >= 57 s" in pre[0].fix
    run = d.verdict([d.Row(0, "h", 1, ["SIGTERM"], delay=0.1, to_stop=0.1)], 1, 30,
                    binds=d.binding("time limit", d.limits(d.Signal("TERM", False, 150), tr, d.SlurmConf())
                                    ["time limit"], d.Signal("TERM", False, 150), tr, d.SlurmConf()))
    (slow,) = [f for f in run if f.code == "save-too-long"]
    assert "dispatch-slurm launch -- torchrun" in slow.fix and "torchrun SIGKILLs" in slow.problem, slow


def test_doctor_on_a_job_waits_for_completing_and_the_ranks_exit_records(tmp_path, monkeypatch):
    """`doctor --job` once read the records as soon as the job "ended", while it was
    still COMPLETING and its rank was saving in KillWait: "published no" and no-safe-point
    for a rank whose record then shows its save published. It waits until the job left
    COMPLETING and every rank's exit record is there (Slurm stood in for: its answers
    only; the cluster test does it on docker-slurm)."""
    import dataclasses
    from dispatch_slurm.doctor import running
    from dispatch_slurm.slurm.facts import JobInfo
    probe = tmp_path / "probe"
    probe.mkdir()
    rec = probe / "n1.4242.jsonl"
    t0 = time.time()

    def write(phase, t, **kw):
        with open(rec, "a") as f:
            f.write(json.dumps({"phase": phase, "t": t, "host": "n1", "pid": 4242, "rank": 0, "world": 1,
                                "job": "5", **kw}) + "\n")
    write("installed", t0, signals=["SIGTERM"], grace=60, defer=True, launcher=None)
    base = JobInfo(5, "RUNNING", frozenset(), "None", 0, ["n1"], "n1", None, None, "p", "alice", "j", {})
    polls = []

    class FakeSlurm:
        def find_job(self, job_id):
            polls.append(time.time())
            if not any(c[0] == "cancel" for c in calls):
                return base
            ended = dataclasses.replace(base, state="COMPLETED", exit_code=0)
            if len(polls) < 6:  # the batch shell is gone; the rank saves in KillWait
                if len(polls) == 3:
                    write("signal", time.time(), signal="SIGTERM")
                    write("stop", time.time())
                return dataclasses.replace(ended, flags=frozenset({"COMPLETING"}))
            if "saved" not in rec.read_text():
                now = time.time()
                write("saved", now, ok=True, error=None)
                write("published", now, path="/r/exec/a/checkpoint-69", step=69)
                write("exit", now, code=0)
            return ended

        def cancel(self, job_id, signal=None, **kw):
            calls.append(("cancel", signal))

    calls: list = []
    monkeypatch.setattr(running, "Slurm", FakeSlurm)
    monkeypatch.setattr(time, "sleep", lambda s: None)  # the stand-in answers at once
    run, table = running.rehearse(5, d.Signal("TERM", False, 10), d.SlurmConf(kill_wait=5), 1, 5, False,
                                  str(probe), None)
    (row,) = table
    assert row.published and row.exit == 0 and row.to_stop is not None, (row, run.log)
    assert not [f for f in d.verdict(table, 1, 15) if f.code == "no-safe-point"]
    assert "every rank's exit record is there" in run.log[-1][1], run.log
