"""The README says what exists: every `dispatch-slurm <command>` it shows is a command,
and its on-disk contract table is the layout module's (issue 11)."""

import pathlib
import re

from dispatch_slurm.cli import dispatch
from dispatch_slurm.contract import layout
from dispatch_slurm.supervisor import rules

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "docker-slurm" / "README.md"]


def code(text: str) -> list[str]:
    """The README's code: fenced blocks and inline `spans` (prose names the project)."""
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    rest = re.sub(r"```[^\n]*\n.*?```", "", text, flags=re.S)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


def named_commands(text: str) -> set[tuple[str, ...]]:
    out = set()
    for snippet in code(text):
        snippet = re.sub(r"(^|\s)#.*", "", snippet, flags=re.M)  # shell comments are prose
        for m in re.finditer(r"(?<![\w/:=-])dispatch-slurm((?: [a-z][a-z-]*){1,2})", snippet):
            out.add(tuple(m[1].split()))
    return out


def test_every_command_the_readmes_name_exists():
    named = set().union(*(named_commands(p.read_text()) for p in DOCS))
    assert named, "the README names no command at all?"
    missing = []
    for words in sorted(named):
        cmd = dispatch.get_command(None, words[0])
        if cmd is None:
            missing.append(" ".join(words))
        elif len(words) > 1 and hasattr(cmd, "get_command") and cmd.get_command(None, words[1]) is None:
            missing.append(" ".join(words))
    assert not missing, f"the README names commands that do not exist: {missing}"


def test_the_on_disk_contract_table_is_the_layout_module():
    assert layout.table() in (REPO / "README.md").read_text()


def test_the_supervisors_rules_table_is_the_rule_table():
    assert rules.table() in (REPO / "README.md").read_text(), "regenerate it: dispatch_slurm.supervisor.rules.table()"
