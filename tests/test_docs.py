"""The documentation says what exists: every `dispatch-slurm <command>` it
shows is a command and every command is in the commands table; the on-disk contract and the
supervisor's rules are the code's own tables; the README's tree of a root is what real
commands make; every source it names exists; the site builds with `mkdocs build --strict`;
docker-slurm's compose file is valid for the Compose a Debian machine has."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from dispatch_slurm import store
from dispatch_slurm.cli import COMMANDS, dispatch
from dispatch_slurm.contract import layout, names
from dispatch_slurm.supervisor import rules

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCS = [*PAGES, REPO / "docker-slurm" / "README.md"]


def page(name: str) -> str:
    return (REPO / name).read_text()


def code(text: str) -> list[str]:
    """A page's code: fenced blocks and inline `spans` (prose names the project)."""
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


def test_every_command_the_pages_name_exists():
    named = set().union(*(named_commands(p.read_text()) for p in DOCS))
    assert len(named) > 10, "the pages name (almost) no command?"
    missing = []
    for words in sorted(named):
        cmd = dispatch.get_command(None, words[0])
        if cmd is None:
            missing.append(" ".join(words))
        elif len(words) > 1 and hasattr(cmd, "get_command") and cmd.get_command(None, words[1]) is None:
            missing.append(" ".join(words))
    assert not missing, f"the pages name commands that do not exist: {missing}"


def test_the_commands_table_has_every_command_of_the_cli():
    """One row per click command, and no row for a command the CLI lacks."""
    guide = page("docs/user-guide.md")
    table = guide[guide.index("## Commands"):].split("\n\n")[1]
    rows = {m[1] for m in re.finditer(r"^\| `dispatch-slurm ([a-z][a-z-]*)", table, re.M)}
    assert rows == set(COMMANDS), (f"missing rows: {sorted(set(COMMANDS) - rows)}, "
                                   f"rows for no command: {sorted(rows - set(COMMANDS))}")


def test_the_on_disk_contract_table_is_the_layout_module():
    assert layout.table() in page("docs/design.md"), "regenerate it: dispatch_slurm.contract.layout.table()"


def test_the_supervisors_rules_table_is_the_rule_table():
    assert rules.table() in page("docs/supervisor.md"), "regenerate it: dispatch_slurm.supervisor.rules.table()"


def test_the_supervisors_hold_table_is_the_hold_rules():
    assert rules.hold_table() in page("docs/supervisor.md"), \
        "regenerate it: dispatch_slurm.supervisor.rules.hold_table()"


# --- the README's tree of a root after two overlapping executions

def two_overlapping_executions(root: pathlib.Path) -> None:
    """Job 101 saves steps 100 and 200; Slurm reports it ended and its replacement, job 102
    (a new submission), resumes from 200 and saves 300; job 101 is still running and saves
    400. Every step is a real `dispatch-slurm env` or `publish` as a job script runs them."""
    env0 = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    bindir = str(pathlib.Path(sys.executable).parent)
    env0["PATH"] = f"{bindir}:{env0.get('PATH', '/usr/bin:/bin')}"

    def execution(job: int) -> dict:
        n = store.allocate_submission(str(root))  # what `dispatch-slurm submit` does before sbatch
        env = {**env0, "SLURM_JOB_ID": str(job), "SLURM_CLUSTER_NAME": "c", "DISPATCH_CHECKPOINT": str(root),
               "DISPATCH_SUBMISSION": str(n)}
        out = subprocess.run(["dispatch-slurm", "env", "--format", "json"], env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return {**env, **json.loads(out.stdout)}

    def save(env: dict, step: int) -> None:
        d = pathlib.Path(env["DISPATCH_EXEC_DIR"]) / f"checkpoint-{step}"
        d.mkdir()
        (d / "trainer_state.json").write_text('{"global_step": %d}' % step)
        res = subprocess.run(["dispatch-slurm", "publish", str(d)], env=env, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stderr

    old = execution(101)
    save(old, 100)
    save(old, 200)
    new = execution(102)
    save(new, 300)
    save(old, 400)  # the old execution's late save: in its own folder, at its lower epoch


def tree(root: pathlib.Path, shown: str) -> str:
    """The root as `tree` would draw it, each protocol entry explained; per-process event
    files are grouped (their names hold a host and a pid)."""
    latest = store.latest(str(root))

    def note(rel: str) -> str:
        top, _, name = rel.partition("/")
        if top == layout.PUB and name:
            p = names.parse(name)
            mark = "  <- latest" if name == latest.name else ""
            return f"epoch {p.epoch}, step {p.step}: {p.path}{mark}"
        if top == layout.EPOCHS and name:
            return f"claimed by {(root / rel).read_text().strip()}"
        if top == layout.SUB and name:
            return f"submission N={int(name)}"
        return ""

    lines = [shown]

    def walk(d: pathlib.Path, prefix: str) -> None:
        entries = sorted(d.iterdir())
        if d.name == layout.EVENTS:
            groups: dict[str, int] = {}
            for e in entries:
                attempt = e.name.split(".")[:3]
                groups[".".join(attempt)] = groups.get(".".join(attempt), 0) + 1
            entries = [f"{a}.<host>.<pid>.jsonl" for a in groups]
            for i, (name, count) in enumerate(zip(entries, groups.values())):
                last = i == len(entries) - 1
                lines.append(f"{prefix}{'└── ' if last else '├── '}{name}  ({count} {'file' if count == 1 else 'files'}: "
                             "one per process)")
            return
        for i, e in enumerate(entries):
            last = i == len(entries) - 1
            rel = e.relative_to(root).as_posix()
            label = e.name + ("/" if e.is_dir() else "")
            n = note(rel)
            if rel.startswith(f"{layout.PUB}/"):  # a long name: its meaning on the next line
                lines.append(f"{prefix}{'└── ' if last else '├── '}{label}")
                lines.append(f"{prefix}{'    ' if last else '│   '}    {n}")
            else:
                lines.append(f"{prefix}{'└── ' if last else '├── '}{label}" + (f"  {n}" if n else ""))
            if e.is_dir():
                walk(e, prefix + ("    " if last else "│   "))

    walk(root, "")
    return "\n".join(lines)


def readme_tree() -> str:
    m = re.search(r"<!-- tree: two overlapping executions[^>]*-->\n```text\n(.*?)```", page("README.md"), re.S)
    assert m, "README.md has no `<!-- tree: two overlapping executions -->` block"
    return m[1].rstrip("\n")


def test_the_readmes_tree_is_what_two_overlapping_executions_make(tmp_path):
    root = tmp_path / "run1"
    root.mkdir()
    two_overlapping_executions(root)
    made = tree(root, "/scratch/me/run1")
    assert store.latest(str(root)).step == 300, "the replacement's save must be the latest"
    assert readme_tree() == made, f"the README's tree is not what the commands make; it is:\n{made}"


# --- every source the pages and the comments name exists

DOTTED = re.compile(r"\bdispatch_slurm(?:\.[A-Za-z_]\w*)+")
PATHS = re.compile(r"(?<![\w/.-])((?:dispatch_slurm|tests|benchmarks|examples|tools|docker-slurm|spank_env|prolog"
                   r"|epilog|docs)/[\w./{},-]*\w)")


def _defines(module: pathlib.Path, name: str) -> bool:
    return bool(re.search(rf"^(?:async )?(?:def|class) {name}\b|^{name}\s*[:=]|^\s*(?:from \S+ )?import .*\b{name}\b",
                          module.read_text(), re.M))


def _module_exists(ref: str) -> bool:
    """`dispatch_slurm.<package>.<module>[.<name>]`: packages, a module, then at most one name it defines."""
    here = REPO / "dispatch_slurm"
    parts = ref.split(".")[1:]
    for i, part in enumerate(parts):
        if part.startswith("__") and part.endswith("__"):
            return True  # every module's own (__file__, __name__, ...)
        if (here / part).is_dir():
            here = here / part
        elif (here / f"{part}.py").is_file():
            rest = parts[i + 1:]
            return not rest or _defines(here / f"{part}.py", rest[0])
        else:
            return (here / "__init__.py").is_file() and _defines(here / "__init__.py", part)
    return True


def _expand(ref: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", ref)
    if not m:
        return [ref]
    return [x for alt in m[1].split(",") for x in _expand(ref[:m.start()] + alt + ref[m.end():])]


def _path_exists(ref: str, where: pathlib.Path) -> bool:
    for r in _expand(ref):
        stem, dot, attr = r.rpartition(".")  # store/retention.collect: a module and one of its names
        if not any(c.exists() for c in (REPO / r, where.parent / r)) and not (dot and (REPO / f"{stem}.py").exists()):
            return False
    return True


def test_every_module_and_file_the_sources_and_pages_name_exists():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    bad = []
    for f in files:
        p = REPO / f
        if p.suffix not in (".py", ".c", ".h", ".md", ".json", ".yaml", ".yml", ".toml", "") or not p.is_file():
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            bad += [f"{f}:{n}: {m[0]}" for m in DOTTED.finditer(line) if not _module_exists(m[0])]
            if p.suffix in (".md", ".c", ".h"):
                bad += [f"{f}:{n}: {m[1]}" for m in PATHS.finditer(line) if not _path_exists(m[1], p)]
    assert not bad, "names of sources that do not exist:\n" + "\n".join(bad)


def test_the_reference_check_can_fail():
    pkg = "dispatch_slurm"  # spelled apart, so that the scan above does not find these names
    assert not _module_exists(f"{pkg}.cessation") and not _module_exists(f"{pkg}.hf")
    assert _module_exists(f"{pkg}.slurm.cessation") and _module_exists(f"{pkg}.contract.layout.table")
    assert not _path_exists("dispatch_slurm/store.py", REPO / "README.md")
    assert not _path_exists("dispatch_slurm/{epoch,names}.py", REPO / "README.md")
    assert _path_exists("dispatch_slurm/contract/{epoch,names}.py", REPO / "README.md")


# --- the site

def test_the_docs_site_builds_strictly(tmp_path):
    """A broken link, a missing anchor, or a page left out of the navigation fails the build."""
    mkdocs = shutil.which("mkdocs", path=f"{pathlib.Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (it is in the test extra: pip install -e '.[test]')")
    res = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for md in (REPO / "docs").glob("*.md"):
        want = "index.html" if md.stem == "index" else f"{md.stem}/index.html"
        assert want in built, f"{md.name} was not built"


def test_every_page_is_in_the_navigation():
    nav = page("mkdocs.yml")
    missing = [p.name for p in (REPO / "docs").glob("*.md") if f": {p.name}" not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


# --- docker-slurm's compose file

def composes() -> list[tuple[str, list[str]]]:
    found = []
    if shutil.which("docker-compose"):
        out = subprocess.run(["docker-compose", "version", "--short"], capture_output=True, text=True, timeout=60)
        found.append((out.stdout.strip() or "?", ["docker-compose"]))
    if shutil.which("docker"):
        out = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True, timeout=60)
        if out.returncode == 0:
            found.append((out.stdout.strip(), ["docker", "compose"]))
    return found


def test_the_compose_file_is_valid_for_every_compose_installed():
    """compose.yaml for Compose 1.29 (Debian 12) and v2; the cgroup namespace override for v2
    only (1.29 has no `cgroup:` key, and must say so rather than ignore it)."""
    found = composes()
    if not found:
        pytest.skip("no Compose installed (Debian 12: apt-get install docker-compose; tools/setup-host does)")
    base = ["-f", "docker-slurm/compose.yaml"]
    override = [*base, "-f", "docker-slurm/compose.cgroupns.yaml"]
    for version, cmd in found:
        res = subprocess.run([*cmd, *base, "config", "-q"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"Compose {version}: {res.stderr}"
        res = subprocess.run([*cmd, *override, "config"], cwd=REPO, capture_output=True, text=True, timeout=120)
        if version.startswith("1."):
            assert res.returncode != 0 and "cgroup" in res.stderr, f"Compose {version} took the override: {res}"
        else:
            assert res.returncode == 0, f"Compose {version}: {res.stderr}"
            assert res.stdout.count("cgroup: private") == 3, res.stdout
