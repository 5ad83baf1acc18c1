"""Every bad input is one line naming the thing, exit 2, never a traceback.

Hypothesis throws arguments at every command (its own options with hostile values:
nan, inf, negative and huge numbers, control characters, undecodable bytes, missing and
odd paths) and malformed record facts at the commands that read a supervisor's record.
The CLI runs in-process, so an exception escaping `main` (a traceback) fails the test;
a watchdog turns a hang into a failure."""

import contextlib
import faulthandler
import io
import json
import os
import re
import shutil

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch_slurm.cli import commands, main
from dispatch_slurm.supervisor.record import FACTS

EXAMPLES = int(os.environ.get("DISPATCH_FUZZ_EXAMPLES", "60"))
TRIED = {"argv": 0, "records": 0}


def _commands():
    """(path, click command) of every leaf command: ("epoch", "compose") etc."""
    for name, cmd in sorted(commands().items()):
        if isinstance(cmd, click.Group):
            yield from (((name, sub), c) for sub, c in sorted(cmd.commands.items()))
        else:
            yield (name,), cmd


COMMANDS = dict(_commands())
NUMBERS = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1", "1e308", "99999999999999999999999", "0x10",
                           "3.5", " 7", "", "٣"])
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
# Odd paths that nobody may write into, root included (CI runs as root: "/" and "/etc" here
# once let `run` leave claims in every folder of /): the CLI's writes stay in its temporary cwd.
ODD = st.sampled_from(["\udcff\udcfe", "a\nb", "--", "-", "/proc", "/dev/null", "..", "%a", "=", "\t"])


def _value(root: str):
    paths = st.sampled_from([root, f"{root}/nope", f"{root}/exec", f"{root}/pub", f"{root}/file", "/proc/nonexistent"])
    return st.one_of(NUMBERS, TEXT, ODD, paths)


def _argv(path, cmd, root):
    opts = [o for p in cmd.params if isinstance(p, click.Option) for o in p.opts if o not in ("--help", "-h")]
    token = st.one_of(st.sampled_from(opts) if opts else st.nothing(), _value(root))
    once = ["--once"] if path == ("watch",) else []  # first: a later one could be an option's value
    return st.lists(token, max_size=6).map(lambda rest: [*path, *once, *rest])


def run_cli(argv: list[str], env: dict, cwd: str) -> tuple[int, str]:
    """The CLI in this process, in ``cwd`` (what it writes stays there): (exit code,
    stderr). Raises whatever escapes main()."""
    err, out = io.StringIO(), io.StringIO()
    old_env, old_cwd = dict(os.environ), os.getcwd()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    faulthandler.dump_traceback_later(60, exit=True)  # a hang ends the run with its stacks, not stuck CI
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                main(argv)
            except SystemExit as e:
                return (e.code if isinstance(e.code, int) else 1), err.getvalue()
        raise AssertionError(f"main({argv}) returned without exiting")
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)


DEPRECATED = re.compile(r"dispatch-slurm: \S+ .* is deprecated: ")


def _check(argv, code, err):
    assert code in (0, 1, 2, 3), f"{argv}: exit {code}: {err}"
    assert "Traceback" not in err, f"{argv}: {err}"
    if code == 2 and not (argv[0] == "ceased" and not err):  # ceased's 2 is an answer: "cannot tell"
        # an old spelling that was read says its new one on a line of its own (cli/options.py
        # `deprecated`): a warning about what was accepted, beside the one line of the refusal
        lines = [line for line in err.strip().splitlines() if not DEPRECATED.match(line)]
        if any(re.match(r"dispatch-slurm: \d+ roots: ", line) for line in lines):  # `run`'s fleet: a line a root
            assert all(line.startswith("dispatch-slurm: ") for line in lines), f"{argv}: {err!r}"
            return
        assert len(lines) == 1 and lines[0].startswith("dispatch-slurm"), f"{argv}: not one line: {err!r}"


def _fresh(root: str) -> None:
    """The root, and the folder the CLI runs in, as every example starts: one example's
    writes (a plot saved as ROOT/pub, a file named by a relative path) never become the
    next one's input, so a failure replays (hypothesis shrinks it) and runs in any order."""
    cwd = os.path.dirname(root)
    shutil.rmtree(cwd, ignore_errors=True)
    os.makedirs(os.path.join(root, "exec", "c.1.1000000", "checkpoint-5"))
    with open(os.path.join(root, "file"), "w") as f:
        f.write("x")


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fuzz") / "root")
    _fresh(root)
    return root


def _env(root: str) -> dict:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    return {**keep, "PATH": "/usr/bin:/bin", "DISPATCH_CHECKPOINT": root, "DISPATCH_EPOCH": "1000000",
            "DISPATCH_EXEC_DIR": f"{root}/exec/c.1.1000000", "DISPATCH_ATTEMPT": "c.1.1000000",
            "DISPATCH_SUBMISSION": "1", "SLURM_JOB_ID": "1", "SLURM_CLUSTER_NAME": "c"}


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_any_arguments_are_handled_or_refused_in_one_line(path, fuzz_root):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(argv=_argv(path, COMMANDS[path], fuzz_root))
    def case(argv):
        TRIED["argv"] += 1
        _fresh(fuzz_root)
        code, err = run_cli(argv, _env(fuzz_root), os.path.dirname(fuzz_root))
        _check(argv, code, err)
    before = TRIED["argv"]
    case()
    tried = TRIED["argv"] - before
    print(f"\nCLI fuzz: {tried} argument lists for `{' '.join(path)}`, 0 tracebacks")
    assert tried >= EXAMPLES // 2, f"hypothesis tried only {tried} argument lists"


JSONS = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), TEXT),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                     max_leaves=6)


@st.composite
def facts(draw):
    kind = draw(st.sampled_from(sorted(FACTS) + ["bogus"]))
    fields = {name: draw(JSONS) for name in FACTS.get(kind, {}) if draw(st.booleans()) or True}
    for name in draw(st.lists(st.sampled_from(sorted(fields) or ["x"]), max_size=2)):
        fields[name] = draw(JSONS)  # mistype some
    if draw(st.booleans()):
        fields.pop(draw(st.sampled_from(sorted(fields) or ["x"])), None)  # drop one
    return {"type": kind, "t": draw(st.one_of(st.floats(0, 2e9), JSONS)), **fields}


def test_malformed_record_facts_are_refused_in_one_line(tmp_path_factory):
    @settings(max_examples=EXAMPLES * 4, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(lines=st.lists(st.one_of(facts().map(lambda f: json.dumps(f)), st.sampled_from(["", "{", "[]", "7"])),
                          min_size=1, max_size=5),
           verb=st.sampled_from([["plan"], ["release"], ["report"], ["stop"], ["run", "--once"]]))
    def case(lines, verb):
        root = tmp_path_factory.mktemp("rec") / "root"
        root.mkdir()
        (root / "record.jsonl").write_text("\n".join(lines) + "\n")
        TRIED["records"] += 1
        code, err = run_cli([verb[0], str(root), *verb[1:]], _env(str(root)), str(root.parent))
        _check([*verb, "<record>"], code, err)
    before = TRIED["records"]
    case()
    tried = TRIED["records"] - before
    print(f"\nCLI fuzz: {tried} malformed records, 0 tracebacks")
    assert tried >= EXAMPLES, f"hypothesis tried only {tried} records"
