"""One grammar per option name, whichever command takes it (cli/common.py's module doc).

An option of one name reads its value one way in every command: ``--signal`` is sbatch's
--signal, ``--grace`` whole seconds, ``--poll SECONDS`` the time between two looks, and
the root is ``--root ROOT`` in every command that takes one (and ROOT first where the root
is what the command is about). An old spelling still works, for scripts, and says the new
one in one line on stderr."""

import json
import os
import sys

import click
import pytest

from dispatch_slurm.cli import commands
from dispatch_slurm.cli.common import RootCommand
from dispatch_slurm.contract.signals import parse_signal
from support import cli


def _leaves():
    for name, cmd in commands().items():
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            yield from ((f"{name} {sub}", cmd.get_command(ctx, sub)) for sub in cmd.list_commands(ctx))
        else:
            yield name, cmd


def grammar(p: click.Parameter) -> tuple:
    """What a user types after an option: a flag, or a value of this kind."""
    if isinstance(p, click.Option) and p.is_flag and not p._flag_needs_value:  # type: ignore[attr-defined]
        return ("flag",)
    return ("value", p.metavar or p.type.name)


def test_every_option_name_reads_its_value_one_way_in_every_command():
    seen: dict[str, dict[tuple, list[str]]] = {}
    for name, cmd in _leaves():
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                for opt in p.opts:
                    seen.setdefault(opt, {}).setdefault(grammar(p), []).append(name)
    several = {opt: g for opt, g in seen.items() if len(g) > 1}
    assert not several, f"an option read several ways: {several}"
    assert len(seen["--root"][("value", "ROOT")]) == 15 and len(seen["--signal"][("value", "[{R|B}:]SIG[@T]")]) == 6


def test_the_grammar_check_can_fail():
    a = click.Option(["--poll"], is_flag=True)
    b = click.Option(["--poll"], type=click.FloatRange(0.1, 3600), metavar="SECONDS")
    assert grammar(a) != grammar(b) and grammar(b) == ("value", "SECONDS")


def test_every_command_with_a_root_argument_also_takes_root_as_an_option():
    """Its class moves ``--root X`` to where ROOT is read; without it --root would be refused."""
    for name, cmd in _leaves():
        if any(isinstance(p, click.Argument) and p.name == "root" for p in cmd.params):
            assert isinstance(cmd, RootCommand), name


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    return r


def _plan(root, *args, stderr_lines=0):
    proc = cli("plan", "--json", *args, env={"PATH": os.environ["PATH"]}, check=True)
    assert len(proc.stderr.splitlines()) == stderr_lines, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("argv", [
    ["{root}", "--", "x.sbatch"], ["--root", "{root}", "--", "x.sbatch"], ["--root={root}", "x.sbatch"],
    ["--root", "{root}", "x.sbatch"], ["--via", "env", "--root", "{root}", "x.sbatch"],
    ["--poll", "3", "--root={root}", "x.sbatch"], ["--shared-checkpoint", "--root", "{root}", "--", "x.sbatch"],
])
def test_root_is_the_same_as_an_option_or_first(root, argv):
    p, _ = _plan(root, *(a.format(root=root) for a in argv))
    assert p["root"] == str(root) and p["sbatch"][-1] == "x.sbatch", p


@pytest.mark.parametrize("argv", [["latest", "{root}", "--root", "{root}"], ["latest", "--root", "{root}", "{root}"],
                                  ["plan", "--root", "{root}", "x.sbatch", "--root", "/data"]])
def test_root_named_twice_or_after_the_arguments_is_refused(root, argv):
    """A --root after an argument may be the batch script's own (sbatch x.sbatch --root /data):
    never taken for the root, refused."""
    proc = cli(*(a.format(root=root) for a in argv))
    assert proc.returncode == 2 and "name the root once" in proc.stderr, proc.stderr


def test_a_root_option_after_the_double_dash_is_sbatchs(root):
    p, _ = _plan(root, "--root", root, "--", "x.sbatch", "--root", "/data")
    assert p["root"] == str(root) and p["sbatch"][-3:] == ["x.sbatch", "--root", "/data"]


@pytest.mark.parametrize("spec", ["TERM@90", "B:USR2@120", "b:usr2@120", "SIGUSR1@30", "12@45", "R:TERM@30",
                                  "RB:USR1@20", "TERM", "B:USR2"])
def test_signal_takes_exactly_what_sbatch_takes(root, spec):
    """run/plan/submit/supersede's --signal is the job's --signal, as sbatch reads it (its time
    the save's grace, 60 s when left out, as sbatch's); the line submitted means the same."""
    p, _ = _plan(root, root, "--via", "env", "--signal", spec, "--", "x.sbatch")
    (line,) = [a for a in p["sbatch"] if a.startswith("--signal=")]
    assert parse_signal(line.removeprefix("--signal=")) == parse_signal(spec), line
    assert p["env"]["DISPATCH_GRACE"] == str(parse_signal(spec).seconds)


def test_the_old_spellings_work_and_say_the_new_one(root, tmp_path):
    p, err = _plan(root, root, "--via", "env", "--signal", "TERM", "--grace", "90", "--", "x.sbatch", stderr_lines=1)
    assert "--signal=TERM@90" in p["sbatch"] and "deprecated: write --signal TERM@90" in err

    doctor = cli("doctor", "--no-slurm", "--signal", "TERM@30", "--grace", "1.5")
    assert doctor.returncode in (0, 1) and doctor.stderr.splitlines() == [
        "dispatch-slurm: --grace 1.5 (a fraction of a second) is deprecated: give whole seconds: --grace 2"]
    assert cli("doctor", "--no-slurm", "--signal", "TERM@30", "--grace", "2").stderr == ""

    show = [sys.executable, "-c", "import os; print(os.environ['DISPATCH_SIGNAL'])"]
    old = cli("launch", "--signal", "USR1,sigusr2", "--", *show)
    new = cli("launch", "--signal", "USR1", "--signal", "B:USR2@90", "--", *show)
    assert old.stdout == new.stdout == "USR1,USR2\n" and new.stderr == ""
    assert old.stderr == ("dispatch-slurm: --signal USR1,sigusr2 is deprecated: give --signal once per signal: "
                          "--signal USR1 --signal sigusr2\n")


def test_watch_polls_every_poll_seconds_and_reads_its_old_flag(root):
    ex = root / "exec" / "c.1.1000000"
    ex.mkdir(parents=True)
    env = {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_EPOCH": "1000000", "DISPATCH_EXEC_DIR": str(ex)}
    new = cli("watch", "--once", "--no-inotify", "--poll", "0.1", env=env)
    old = cli("watch", "--once", "--poll", "--interval", "0.1", env=env)
    assert new.returncode == old.returncode == 0, old.stderr
    assert "deprecated" not in new.stderr
    said = [line for line in old.stderr.splitlines() if "deprecated" in line]
    assert said == ["dispatch-slurm: watch --poll --interval 0.1 is deprecated: write --no-inotify --poll 0.1"]
    bare = cli("watch", "--once", "--poll", env=env)
    assert "watch --poll is deprecated: write --no-inotify --poll 0.5" in bare.stderr


DURATIONS = {"--poll", "--max-poll", "--hold-for", "--cessation-interval", "--grace", "--timeout", "--incomplete-after",
             "--min-age", "--save-seconds", "--kill-wait", "--grace-time", "--ready-timeout"}


def test_every_duration_option_reads_the_one_grammar():
    """Whichever command takes it, a duration is DURATION in --help and read by one parser."""
    from dispatch_slurm.cli.options import Duration
    found = {opt: (p.metavar, type(p.type)) for _, cmd in _leaves() for p in cmd.params
             if isinstance(p, click.Option) and not p.hidden for opt in p.opts if opt in DURATIONS}
    assert set(found) == DURATIONS
    assert {opt: m for opt, (m, t) in found.items() if m != "DURATION" or not issubclass(t, Duration)} == {}


@pytest.mark.parametrize("given,seconds", [("90", 90), ("90s", 90), ("1.5m", 90), ("2h", 7200), ("2d", 172800),
                                           ("45.5", 45.5), (" 30 m ", 1800)])
def test_a_duration_is_seconds_or_a_number_with_a_unit(root, given, seconds):
    p, _ = _plan(root, root, "--via", "env", "--shared-checkpoint", "--hold-for", given,
                 "--cessation-interval", given, "--", "x.sbatch")
    assert p["hold"]["hold_for"] == p["hold"]["cessation_interval"] == seconds
    if float(seconds).is_integer() and seconds <= 300:  # the grace: whole seconds, at most 300
        p, _ = _plan(root, root, "--via", "env", "--grace", given, "--", "x.sbatch")
        assert p["env"]["DISPATCH_GRACE"] == str(seconds)


def test_old_number_spellings_are_read_and_say_the_new_one(root):
    p, err = _plan(root, root, "--via", "env", "--shared-checkpoint", "--hold-for", "1e3", "--", "x.sbatch",
                   stderr_lines=1)
    assert p["hold"]["hold_for"] == 1000
    assert err == "dispatch-slurm: --hold-for 1e3 is deprecated: write --hold-for 1000s\n"


@pytest.mark.parametrize("args,needle", [
    (["--poll", "2x"], "'2x' is not a duration: seconds, or a number with a unit (s, m, h, d), e.g. 90, 90s"),
    (["--poll", "0.01"], "'0.01' is not at least 0.1s and at most 1h"),
    (["--hold-for", "0m"], "'0m' is not more than 0s"),
    (["--grace", "1.5"], "'1.5' is not whole seconds (at least 0s and at most 5m)"),
    (["--grace", "6m"], "'6m' is not at least 0s and at most 5m"),
    (["--cessation-interval", "inf"], "'inf' is not a duration"),
])
def test_a_bad_duration_is_refused_naming_the_option_and_the_grammar(root, args, needle):
    proc = cli("plan", root, *args, "--", "x.sbatch")
    assert proc.returncode == 2 and needle in proc.stderr and f"'{args[0]}'" in proc.stderr, proc.stderr


def test_a_printed_duration_reads_back_as_the_same_seconds():
    from dispatch_slurm.contract.durations import fmt_duration, parse_duration
    for seconds in (0, 0.05, 0.5, 1, 59, 60, 90, 3599.5, 3600, 86400, 3 * 86400, 10 ** 6, 10 ** 7 + 0.25):
        assert parse_duration(fmt_duration(seconds)) == (seconds, False), fmt_duration(seconds)
