"""The layout shows the architecture, and stays that way.

* Each subpackage depends only on the layers below it: contract <- store <- runtime /
  integrations; slurm and supervisor on top of the store; the CLI on everything. The
  core (contract, store, runtime) imports nothing Slurm-, Docker- or test-bed-related.
* The wheel users install holds the package, its ``py.typed`` marker (users' mypy reads the
  package's annotations) and nothing of the test bed.
* Every module keeps radon's maintainability index at A, no function above radon's
  complexity rank C, and pyflakes finds nothing.
* The modules of slurm/ reach one another through public names only, so each module's
  private names are its own to change.
* contract/ does no I/O: no open(), os.environ / os.getenv, subprocess or pathlib there; the
  callers read and pass values in, so the rules can be checked without a machine.
* contract/env.py is the one module that reads DISPATCH_* variables from the environment
  (one message for a missing one, wherever it is needed); the others ask its view,
  ``Execution.current()``.
* No two modules import each other, however far round (a function's own import counts),
  and nothing changes the process's working directory (one process follows many roots,
  each job with its own folder).
* mypy, with pyproject.toml's settings, finds no error in the package."""

import ast
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "dispatch_slurm"
# subpackage -> the subpackages (of dispatch_slurm) it may import
ALLOWED = {
    "errors": set(),
    "contract": {"errors"},
    "store": {"errors", "contract"},
    "runtime": {"errors", "contract", "store"},
    "integrations": {"errors", "contract", "store", "runtime"},
    "slurm": {"errors", "contract", "store"},
    "retention": {"errors", "contract", "store", "slurm"},
    "supervisor": {"errors", "contract", "store", "slurm", "retention"},
    "report": {"errors", "contract", "store", "slurm", "retention", "supervisor"},  # slurm: cessation/
    "doctor": {"errors", "contract", "store", "runtime", "slurm"},
    "view": {"errors", "contract", "store", "runtime", "slurm"},
    "cli": {"errors", "contract", "store", "runtime", "integrations", "slurm", "retention", "supervisor", "report",
            "doctor", "view"},
    "__init__": {"errors", "contract", "store", "runtime"},
    "__main__": {"cli"},
}
FOREIGN = ("docker", "testcontainers", "testbed", "pytest", "hypothesis")


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        yield ".".join(("dispatch_slurm", *rel.parts)), path


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """Absolute names of every module ``name`` imports (relative imports resolved)."""
    pkg = name.rpartition(".")[0]  # a module's package (an __init__ module's: its own)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    """subpackage -> the dispatch_slurm subpackages it imports (what the note shows)."""
    g: dict[str, set[str]] = {}
    for name, path in _modules():
        layer = name.split(".")[1] if "." in name else name
        deps = {m.split(".")[1] for m in _imports(name, path) if m.startswith("dispatch_slurm.")}
        g.setdefault(layer, set()).update(deps - {layer})
    return g


def test_each_layer_imports_only_the_layers_below_it():
    g = graph()
    assert set(g) <= set(ALLOWED), f"a new subpackage needs a place in ALLOWED: {set(g) - set(ALLOWED)}"
    wrong = {layer: deps - ALLOWED[layer] for layer, deps in g.items() if deps - ALLOWED[layer]}
    assert not wrong, f"imports against the layering: {wrong}"


def test_the_package_imports_nothing_of_docker_or_the_test_bed():
    for name, path in _modules():
        bad = {m for m in _imports(name, path) if m.split(".")[0] in FOREIGN}
        assert not bad, f"{name} imports {bad}"


def test_the_wheel_holds_the_package_its_type_marker_and_no_test_bed(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(PKG, src / "dispatch_slurm", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(PKG.parent / f, src / f)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                    str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    files = {n for n in zipfile.ZipFile(wheel).namelist() if not n.startswith("dispatch_slurm-")}
    want = {f"dispatch_slurm/{p.relative_to(PKG)}" for p in PKG.rglob("*.py")}
    assert files == want | {"dispatch_slurm/py.typed"}
    assert not {f for f in files if any(x in f for x in ("dockerslurm", "trial", "workload", "wait", "testbed"))}


def _module_name(name: str) -> str:
    return name.removesuffix(".__init__")


def _runtime_imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports when it runs: at its top or in a
    function (an ``if TYPE_CHECKING:`` block is for type checkers only); ``from . import x``
    is the submodule x when there is one, else the package itself."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for stmt in node.body for n in ast.walk(stmt)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            out |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names} & known
    return out - {name}


def module_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports when it runs."""
    paths = {_module_name(n): p for n, p in _modules()}
    return {n: _runtime_imports(n, p, set(paths)) for n, p in paths.items()}


def _circle(g: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in ``g`` (its modules in order, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        path.pop()
        state[m] = 2
        return None
    return next((c for m in sorted(g) if m not in state and (c := visit(m))), None)


def test_no_module_imports_one_that_imports_it_back():
    circle = _circle(module_graph())
    assert circle is None, "an import circle: " + " -> ".join(circle or [])


def test_the_circle_check_can_fail(tmp_path):
    (tmp_path / "fleet.py").write_text("from .loop import Supervisor\n")
    (tmp_path / "loop.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fleet import Fleet\n"
                                      "def run():\n    from .fleet import Fleet\n")
    known = {"p.fleet", "p.loop"}
    g = {f"p.{m}": _runtime_imports(f"p.{m}", tmp_path / f"{m}.py", known) for m in ("fleet", "loop")}
    assert _circle(g) == ["p.fleet", "p.loop", "p.fleet"]
    (tmp_path / "loop.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fleet import Fleet\n")
    assert _runtime_imports("p.loop", tmp_path / "loop.py", known) == set()


def _chdirs(source: str) -> list[str]:
    """Where a module changes the process's working directory: os.chdir / os.fchdir, called or
    imported by name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("chdir", "fchdir"):
            found.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"from os import {a.name}" for a in node.names if a.name in ("chdir", "fchdir")]
    return found


def test_nothing_changes_the_process_working_directory():
    """sbatch runs where its job was defined through its own cwd (subprocess), never by moving
    this process: a supervisor of many roots, or the test runner, would follow it."""
    found = {name: _chdirs(path.read_text()) for name, path in _modules()}
    assert not {n: f for n, f in found.items() if f}, {n: f for n, f in found.items() if f}


def test_the_chdir_check_can_fail():
    assert _chdirs("import os\nfrom os import fchdir\nos.chdir(d)\n") == ["from os import fchdir", "os.chdir"]


def test_every_module_is_maintainable():
    radon = pytest.importorskip("radon.metrics")
    ranks = {name: radon.mi_visit(path.read_text(), multi=True) for name, path in _modules()}
    assert min(ranks.values()) >= 20, {n: round(v, 1) for n, v in ranks.items() if v < 20}  # radon's A


def _over_c(source: str, name: str) -> set[str]:
    from radon.complexity import cc_visit
    out = set()
    for b in cc_visit(source):
        if b.complexity > 20:
            out.add(f"{name}.{b.classname + '.' if getattr(b, 'classname', None) else ''}{b.name}")
    return out


def test_no_function_is_more_complex_than_radon_c():
    pytest.importorskip("radon.complexity")
    over = set().union(*(_over_c(p.read_text(), n.removesuffix(".__init__")) for n, p in _modules()))
    assert not over, f"split these (radon cc above C, 20): {sorted(over)}"


def test_the_complexity_check_can_fail():
    pytest.importorskip("radon.complexity")
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(21))
    assert _over_c(f"def f(x):\n{branches}    return -1\n", "m") == {"m.f"}


def test_pyflakes_finds_nothing_in_the_package():
    """Unused imports and names, undefined names: what a refactor leaves behind."""
    pytest.importorskip("pyflakes")
    r = subprocess.run([sys.executable, "-m", "pyflakes", str(PKG)], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout, r.stdout + r.stderr


def _mypy(*args: str) -> subprocess.CompletedProcess:
    """mypy with pyproject.toml's settings, run from the checkout, writing no cache."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed: `make venv` installs it (pyproject.toml's test extra)")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PKG.parent / "pyproject.toml"),
                           "--cache-dir", os.devnull, *args], cwd=PKG.parent, capture_output=True, text=True)


def test_mypy_finds_no_error_in_the_package():
    """The annotations are checked, not only written (check_untyped_defs: the bodies of
    functions without annotations too)."""
    r = _mypy()
    assert r.returncode == 0 and "Success: no issues found" in r.stdout, r.stdout + r.stderr


def test_the_mypy_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def seconds() -> int:\n    return 1.5\n")
    r = _mypy(str(bad))
    assert r.returncode == 1 and "[return-value]" in r.stdout, r.stdout + r.stderr


def _private_uses(name: str, path: pathlib.Path, package: str) -> set[str]:
    """The private names (``_x``) of modules of ``package`` that module ``name`` uses:
    ``from .facts import _x`` and ``facts._x`` after ``from . import facts``."""
    pkg = name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    modules, found = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            for a in node.names:
                full = f"{mod}.{a.name}"
                if mod.startswith(package) and a.name.startswith("_") and not a.name.startswith("__"):
                    found.add(full)
                if full.startswith(package + "."):
                    modules.add(a.asname or a.name)  # a module bound by name (or a public name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.add(f"{node.value.id}.{node.attr}")
    return found


def test_slurm_modules_use_no_private_name_of_one_another():
    used = {name: _private_uses(name, path, "dispatch_slurm.slurm") for name, path in _modules()
            if name.startswith("dispatch_slurm.slurm.")}
    assert used and not {n: u for n, u in used.items() if u}, {n: u for n, u in used.items() if u}


def test_the_private_name_check_can_fail(tmp_path):
    bad = tmp_path / "client.py"
    bad.write_text("from .facts import _number\nfrom . import facts\nx = facts._NO_VAL\n")
    assert _private_uses("dispatch_slurm.slurm.client", bad, "dispatch_slurm.slurm") == {
        "dispatch_slurm.slurm.facts._number", "facts._NO_VAL"}


@pytest.mark.parametrize("path", sorted((PKG.parent / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_every_benchmark_imports(path, monkeypatch):
    """A benchmark runs rarely (minutes on a cluster): what it imports from the package is
    checked on every run, so a moved name fails here, not on the day it is measured."""
    import importlib.util
    monkeypatch.syspath_prepend(str(PKG.parent / "tests"))
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # top level only: main() is guarded


def test_xdist_groups_keep_each_group_on_one_worker(tmp_path):
    """`make test` relies on --dist loadgroup to boot each cluster once (tests/cluster/conftest.py
    marks by cluster): with pytest 9.2 and xdist 3.8 the marks grouped nothing and every worker
    booted its own cluster of each release. A toy suite under the same pytest shows it holds."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_collection_modifyitems(config, items):\n"
        "    for item in items:\n        item.add_marker(pytest.mark.xdist_group(f'g{item.callspec.params[\"g\"]}'))\n")
    (tmp_path / "test_toy.py").write_text(
        "import os, pytest\n\n@pytest.mark.parametrize('i', range(4))\n@pytest.mark.parametrize('g', [0, 1])\n"
        "def test_toy(g, i, tmp_path_factory):\n"
        "    open(os.path.join(os.environ['TOY_OUT'], f'{g}.{os.environ[\"PYTEST_XDIST_WORKER\"]}'), 'a').close()\n")
    out = tmp_path / "out"
    out.mkdir()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist", "loadgroup", "-p", "no:cacheprovider",
                          str(tmp_path / "test_toy.py")], cwd=tmp_path, env={**os.environ, "TOY_OUT": str(out)},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    workers = {g: {p.name.split(".")[1] for p in out.iterdir() if p.name.startswith(f"{g}.")} for g in (0, 1)}
    assert all(len(w) == 1 for w in workers.values()), f"a group ran on several workers: {workers}"


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their base name (no packages under tests/): two files of
    one name (tests/test_x.py and tests/cluster/test_x.py) are a collection error in CI."""
    names: dict[str, list[str]] = {}
    for p in (PKG.parent / "tests").rglob("test_*.py"):
        names.setdefault(p.name, []).append(str(p.relative_to(PKG.parent)))
    assert not {n: ps for n, ps in names.items() if len(ps) > 1}


# os/io names that read or write the world (files, the environment, processes)
_OS_IO = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv", "open", "fdopen", "system", "popen"}
# the one contract module that may read the environment (os.environ / os.getenv, nothing
# else): contract/env.py, being made the one reader of DISPATCH_* variables
ENV_READER = "dispatch_slurm.contract.env"


def _io_uses(source: str) -> set[str]:
    """The I/O a module's source does: open(), os.environ / os.getenv and kin (attribute or
    ``from os import``), io.open, any import of subprocess, and pathlib beyond its pure paths."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            found.add("open()")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and (node.value.id, node.attr) in {*(("os", a) for a in _OS_IO), ("io", "open")}):
            found.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Import):
            found |= {f"import {a.name}" for a in node.names if a.name.split(".")[0] in ("subprocess", "pathlib")}
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "io", "subprocess", "pathlib"):
            found |= {f"from {node.module} import {a.name}" for a in node.names
                      if node.module == "subprocess" or (node.module == "pathlib" and not a.name.startswith("Pure"))
                      or (node.module == "os" and a.name in _OS_IO) or (node.module, a.name) == ("io", "open")}
    return found


# pure judgement outside contract/, held to contract/'s rules: no I/O, and only contract/ and
# errors imported (the doctor's rules: its package also runs commands and reads Slurm)
PURE = {"dispatch_slurm.doctor.rules"}


def test_contract_does_no_io():
    io = {name: _io_uses(path.read_text()) for name, path in _modules()
          if name.startswith("dispatch_slurm.contract") or name in PURE}
    io[ENV_READER] = io.get(ENV_READER, set()) - {"os.environ", "os.getenv", "from os import environ",
                                                   "from os import getenv"}
    assert io and not {n: u for n, u in io.items() if u}, {n: sorted(u) for n, u in io.items() if u}


def test_pure_modules_import_only_the_contract():
    found = {name: {m for m in _imports(name, path) if m.startswith("dispatch_slurm.")
                    and m.split(".")[1] not in ("contract", "errors")} for name, path in _modules() if name in PURE}
    assert set(found) == PURE and not any(found.values()), found


def test_the_io_check_can_fail():
    src = ("import os, subprocess\nfrom pathlib import Path, PurePosixPath\nfrom os import getenv\n"
           "x = open('f').read() + os.environ['A']\n")
    assert _io_uses(src) == {"open()", "os.environ", "import subprocess", "from pathlib import Path",
                             "from os import getenv"}


# The store's own modules: the backends, their fd and fsync helpers, the chooser, the interface's
# base. Every other layer reaches a root through the store's face (dispatch_slurm.store: ``at(root)``
# and the protocol's functions), so a new store is one module and one line in the chooser.
STORE_INTERNALS = {"posix", "s3", "durable", "roots", "base", "protocol"}
# where a root's kind may be told from its name: the chooser, and the contract's spelling of roots
# (names.py: normalize_root, split_s3, shared with the C plugin's vectors)
SCHEME_READERS = {"dispatch_slurm.store.roots", "dispatch_slurm.contract.names"}


def _store_internals_used(name: str, path: pathlib.Path) -> set[str]:
    """The store internals module ``name`` imports: ``from ..store.posix import x``,
    ``from ..store import s3`` and ``import dispatch_slurm.store.durable`` alike."""
    pkg = name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            mods = [mod] + [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        found |= {m for m in mods if m.startswith("dispatch_slurm.store.")
                  and m.split(".")[2] in STORE_INTERNALS}
    return found


def test_only_the_store_reaches_its_backends():
    used = {name: _store_internals_used(name, path) for name, path in _modules()
            if not name.startswith("dispatch_slurm.store.")}
    assert not {n: u for n, u in used.items() if u}, {n: sorted(u) for n, u in used.items() if u}


def test_the_backend_check_can_fail(tmp_path):
    bad = tmp_path / "watch.py"
    bad.write_text("from ..store import s3, events\nfrom ..store.posix import PosixStore\n"
                   "import dispatch_slurm.store.durable\nfrom .. import store\n")
    assert _store_internals_used("dispatch_slurm.runtime.watch", bad) == {
        "dispatch_slurm.store.s3", "dispatch_slurm.store.posix", "dispatch_slurm.store.posix.PosixStore",
        "dispatch_slurm.store.durable"}


def _scheme_tests(source: str) -> list[str]:
    """Where a module tells a root's store from its name: ``is_s3(...)``, ``S3_SCHEME``,
    ``x.startswith("s3://")`` or any ``"://"`` test (``"://" in x``, ``x.startswith(...)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in ("is_s3", "S3_SCHEME"):
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in ("is_s3", "S3_SCHEME"):
            found.append(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith", "find", "index", "partition", "split")
              and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and "://" in a.value for a in node.args)):
            found.append(f"{node.func.attr}({ast.unparse(node.args[0])})")
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and isinstance(node.left.value, str) and "://" in node.left.value):
            found.append(ast.unparse(node))
    return found


def test_only_the_chooser_tells_a_roots_store_from_its_name():
    """No `is_s3` branch, `s3://` or `://` test outside the store's chooser (and the contract's
    spelling of a root): the rest asks the root's store object."""
    found = {name: _scheme_tests(path.read_text()) for name, path in _modules() if name not in SCHEME_READERS}
    assert not {n: f for n, f in found.items() if f}, {n: f for n, f in found.items() if f}


def test_the_scheme_check_can_fail():
    src = ("if is_s3(root): pass\nif root.startswith('s3://'): pass\nif '://' in d: pass\n"
           "if v.startswith(names.S3_SCHEME): pass\n")
    assert sorted(_scheme_tests(src)) == sorted(["is_s3", "startswith('s3://')", "'://' in d", "S3_SCHEME"])


# modules that still read DISPATCH_* from os.environ themselves, and the variables each may read
ENV_READS_ALLOWED: dict[str, set[str]] = {}  # none: every reader goes through the view
# Not reads of the environment, so not here: a mapping passed in (slurm/hooks/'s environ, the
# job's as Slurm gave it to the hook; store/jobs.py's; runtime/launch.py's, the launcher's child's).


def _is_os(node, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
        (node.value.id, node.attr) == ("os", attr)


def _dispatch_name(node) -> str | None:
    ok = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("DISPATCH_")
    return node.value if ok else None


def _env_reads(source: str) -> set[str]:
    """The DISPATCH_* variables a module reads from the environment: os.environ.get("DISPATCH_X"),
    os.environ["DISPATCH_X"], os.getenv("DISPATCH_X"), "DISPATCH_X" in os.environ."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and (
                _is_os(node.func, "getenv") or (isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                                                and _is_os(node.func.value, "environ"))):
            found.add(_dispatch_name(node.args[0]))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_os(node.value, "environ"):
            found.add(_dispatch_name(node.slice))
        elif (isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn))
              and _is_os(node.comparators[0], "environ")):
            found.add(_dispatch_name(node.left))
    return found - {None}


def test_only_contract_env_reads_dispatch_variables():
    reads = {name: _env_reads(path.read_text()) for name, path in _modules() if name != ENV_READER}
    wrong = {n: sorted(r - ENV_READS_ALLOWED.get(n, set())) for n, r in reads.items()
             if r - ENV_READS_ALLOWED.get(n, set())}
    assert not wrong, f"read these through contract/env.py's Execution.current(): {wrong}"
    stale = {n: sorted(a - reads.get(n, set())) for n, a in ENV_READS_ALLOWED.items() if a - reads.get(n, set())}
    assert not stale, f"no longer read there: take them out of ENV_READS_ALLOWED: {stale}"


def test_the_env_read_check_can_fail():
    src = ("import os\n"
           "a = os.environ.get('DISPATCH_A') or os.environ['DISPATCH_B'] + os.getenv('DISPATCH_C', '')\n"
           "b = 'DISPATCH_D' in os.environ or 'DISPATCH_E' not in os.environ\n"
           "os.environ['DISPATCH_F'] = '1'\n"  # a write, not a read
           "def f(environ):\n    return environ.get('DISPATCH_G'), os.environ.get('HOME')\n")  # a mapping passed in
    assert _env_reads(src) == {"DISPATCH_A", "DISPATCH_B", "DISPATCH_C", "DISPATCH_D", "DISPATCH_E"}


def _constants(source: str) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_hostlists_have_one_expander():
    """`scontrol show hostnames` is run from slurm/hostlist.py alone, so the client and the hooks
    cannot expand one list two ways."""
    found = {name for name, path in _modules() if "hostnames" in _constants(path.read_text())}
    assert found == {"dispatch_slurm.slurm.hostlist"}, found


# ---- commands load only what they use ---------------------------------------------------------
# `env`, `latest` and `publish` start every job (`publish` runs at every save): their import graph
# is kept to the store and the contract (benchmarks/bench_startup.py measures the start-up).
HEAVY = ("dispatch_slurm.supervisor", "dispatch_slurm.report", "dispatch_slurm.retention",
         "dispatch_slurm.slurm.client", "dispatch_slurm.slurm.cessation", "dispatch_slurm.slurm.hooks",
         "dispatch_slurm.runtime.watch", "dispatch_slurm.runtime.preempt",
         "dispatch_slurm.integrations", "dispatch_slurm.doctor", "boto3", "botocore", "torch", "numpy",
         "matplotlib", "transformers")
_LOADED = ("import json, sys\nfrom dispatch_slurm.cli import main\ntry:\n    main(sys.argv[1:])\n"
           "except SystemExit as e:\n    print(json.dumps([e.code, sorted(sys.modules)]), file=sys.__stderr__)")


def _loaded(argv: list[str], env: dict) -> tuple[int, str, set[str]]:
    """``dispatch-slurm ARGV`` in a fresh process: its exit code, stdout and every module it imported."""
    r = subprocess.run([sys.executable, "-c", _LOADED, *argv], env={**os.environ, **env}, capture_output=True,
                       text=True, timeout=120)
    code, mods = json.loads(r.stderr.strip().splitlines()[-1])
    return code or 0, r.stdout, set(mods)


def _heavy(mods: set[str], command_module: str | None) -> set[str]:
    """The modules of HEAVY, and the command modules other than ``command_module``, in ``mods``."""
    from dispatch_slurm.cli import COMMANDS
    commands = {f"dispatch_slurm.cli.{m}" for m, _, _ in COMMANDS.values()} & mods - {
        f"dispatch_slurm.cli.{command_module}"}
    return {m for m in mods if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))} | commands


def test_the_commands_a_job_starts_with_import_only_what_they_use(tmp_path):
    code, out, mods = _loaded(["env", "--local", "--format", "json"], {"DISPATCH_CHECKPOINT": str(tmp_path)})
    assert code == 0 and not _heavy(mods, "job"), sorted(_heavy(mods, "job"))
    job = json.loads(out)  # a local execution's variables, as `eval "$(dispatch-slurm env --local)"` sets them
    save = os.path.join(job["DISPATCH_EXEC_DIR"], "checkpoint-1")
    os.mkdir(save)
    with open(os.path.join(save, "trainer_state.json"), "w") as f:
        f.write("{}")
    for argv, module in ((["publish", save], "protocol"), (["latest", "--resume"], "protocol"), (["--help"], None)):
        code, out, mods = _loaded(argv, job)
        assert code == 0, argv
        assert not _heavy(mods, module), (argv, sorted(_heavy(mods, module)))
        assert argv[0] != "latest" or out.strip() == save  # it found what publish published


def test_a_command_that_reaches_no_root_loads_none_of_the_store(tmp_path):
    """The store's package imports its modules on first use: every command module imports
    it, and the ones that reach no root start without them."""
    for argv in (["epoch", "compose", "0", "1", "0"], ["check-site", "--help"], ["launch", "--help"]):
        code, _, mods = _loaded(argv, {})
        assert code == 0 and not {m for m in mods if m.startswith("dispatch_slurm.store.")}, \
            (argv, sorted(m for m in mods if m.startswith("dispatch_slurm.store.")))


def test_the_store_exports_its_names_on_first_use_and_publish_stays_the_function():
    """Importing store/publish.py (other store modules do) must not turn ``store.publish``
    into that module, as an eager import of the function never let it."""
    check = ("import importlib, types\nimport dispatch_slurm.store as s\n"
             "m = importlib.import_module('dispatch_slurm.store.publish')\n"
             "assert s.publish is m.publish and not isinstance(s.publish, types.ModuleType)\n"
             "assert set(s.__all__) == set(s._NAMES) | set(s._MODULES)\n"
             "assert all(getattr(s, n) is not None for n in s.__all__)\n"
             "assert isinstance(s.events, types.ModuleType) and s.publish is m.publish\n"
             "try:\n    s.no_such_name\nexcept AttributeError:\n    print('ok')\n")
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert r.stdout == "ok\n", r.stderr


def test_the_import_check_can_fail():
    assert _heavy({"dispatch_slurm.cli.common", "dispatch_slurm.cli.options", "dispatch_slurm.cli.protocol",
                   "dispatch_slurm.supervisor.loop",
                   "botocore.session", "json"}, "job") == {
        "dispatch_slurm.cli.protocol", "dispatch_slurm.supervisor.loop", "botocore.session"}


def test_the_help_lists_each_commands_own_short_help_without_importing_it():
    """The registry's short help (cli.COMMANDS) is each command's own, so `--help` lists what
    click would list with every command imported, from the registry alone."""
    import click
    from click.testing import CliRunner

    from dispatch_slurm import cli
    every = cli.commands()
    assert {n: c.get_short_help_str(1000) for n, c in every.items()} == {n: h for n, (_, _, h) in cli.COMMANDS.items()}
    lazy = CliRunner().invoke(cli.dispatch, ["--help"], terminal_width=80).output
    formatter = click.HelpFormatter(width=80)
    click.Group.format_commands(cli.dispatch, click.Context(cli.dispatch, terminal_width=80), formatter)
    assert "Commands:" in lazy and formatter.getvalue() in lazy  # click's own listing, every command imported


def test_the_package_exports_its_public_names_on_first_use():
    import dispatch_slurm
    assert set(dispatch_slurm.__all__) == set(dispatch_slurm._PUBLIC)
    assert all(getattr(dispatch_slurm, name) is not None for name in dispatch_slurm.__all__)
    with pytest.raises(AttributeError):
        getattr(dispatch_slurm, "no_such_name")
