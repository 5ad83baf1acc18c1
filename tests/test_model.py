"""The protocol as a model checked by SPIN (tests/model/protocol.pml).

Every interleaving of two executions (their submissions, envs, resumes, trainers and
watches), a gc run, an adoption and a crash at any step is explored exhaustively, in three
configurations (CONFIGS: with a crash, with an adoption, with a third execution): the protocol must break none of the README's guarantees,
over more states than a floor (a model that stopped exploring would pass vacuously),
and each broken design must break the one it is known to break, with a counterexample
whose replay (`spin -t`) names the guarantee. The model's steps are mapped to the
functions that implement them (tests/model/mapping.toml), checked both ways with ast.

Each check compiles and runs its own pan in a temporary folder, one at a time (an
xdist group). Without spin (Debian's `spin` package; tools/setup-host installs it) the
checks are skipped on a developer's machine, and fail under CI (CI=true)."""

import ast
import os
import pathlib
import re
import shutil
import subprocess
import time
import tomllib
from typing import NamedTuple

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
MODEL = REPO / "tests" / "model" / "protocol.pml"
MAPPING = REPO / "tests" / "model" / "mapping.toml"
DEPTH = 2000       # pan's search depth bound; the model's deepest path is ~160 steps
TIMEOUT = 300      # seconds for one pan run

pytestmark = pytest.mark.xdist_group("spin")

# name -> the model's bounds (-D...) and the fewest states its check must store
CONFIGS = {
    # two executions of 2 saves each, watch, gc and a crash at any step
    "crash": (["-DNE=2", "-DNS=2", "-DADOPT=0", "-DCRASH=1", "-DNGC=1"], 5_000_000),
    # two executions of 1 save each, watch, gc and an adoption racing it
    "adopt": (["-DNE=2", "-DNS=1", "-DADOPT=1", "-DCRASH=0", "-DNGC=1"], 1_000_000),
    # three executions of 1 save each publishing it themselves (the preemption handler, the
    # integrations: no watch process), gc and a crash at any step
    "three": (["-DNE=3", "-DNS=1", "-DINLINE_PUBLISH=1", "-DADOPT=0", "-DCRASH=1", "-DNGC=1"], 10_000_000),
}

# the broken designs: the variant, the configuration it runs in, the guarantee it breaks
VARIANTS = {
    "VARIANT_POINTER": ("crash", "an old execution's publication never outranks the replacement's"),
    "VARIANT_SHARED_FOLDER": ("crash", "no save of an execution that has not ceased is removed"),
    "VARIANT_GC_NO_CESSATION": ("crash", "no save of an execution that has not ceased is removed"),
    "VARIANT_PUBLISH_BEFORE_FSYNC": ("crash", "latest names a complete, durable save"),
    "VARIANT_GC_NO_PUB_FSYNC": ("crash", "latest names a complete, durable save"),
    "VARIANT_ADOPT_CHECK_BEFORE_PIN": ("adopt", "the latest is never removed"),
    "VARIANT_SUBMIT_NO_EXCL": ("adopt", "two executions never share an epoch"),
}


class Run(NamedTuple):
    errors: int
    stored: int
    depth: int
    seconds: float
    out: str
    folder: pathlib.Path


@pytest.fixture(scope="module")
def spin():
    """spin and gcc, or a skip (a failure under CI: the check must run there)."""
    missing = [t for t in ("spin", "gcc") if shutil.which(t) is None]
    if missing:
        why = f"{' and '.join(missing)} not installed (apt-get install spin gcc; tools/setup-host does)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: the model check must run here, but {why}")
        pytest.skip(why)
    return shutil.which("spin")


def check(spin: str, defines: list[str], folder: pathlib.Path) -> Run:
    """spin -a, gcc -DSAFETY -DCOLLAPSE, pan (-E: a process blocked forever is not an
    error here: a refused job, an adopter whose execution never runs)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL, folder / MODEL.name)
    t0 = time.monotonic()
    for argv in ([spin, *defines, "-a", MODEL.name],
                 ["gcc", "-O2", "-w", "-DSAFETY", "-DCOLLAPSE", "-o", "pan", "pan.c"]):
        res = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=TIMEOUT)
        assert res.returncode == 0, f"{' '.join(argv)} failed:\n{res.stdout}{res.stderr}"
    res = subprocess.run(["./pan", "-E", f"-m{DEPTH}", "-w24"], cwd=folder, capture_output=True, text=True,
                         timeout=TIMEOUT)
    out = res.stdout + res.stderr
    assert "max search depth too small" not in out, f"pan's depth bound {DEPTH} cut the search short:\n{out}"
    m = re.search(r"depth reached (\d+), errors: (\d+)", out)
    stored = re.search(r"(\d+) states, stored", out)
    assert m and stored, f"pan's output has no summary:\n{out}"
    return Run(int(m[2]), int(stored[1]), int(m[1]), time.monotonic() - t0, out, folder)


def trail(spin: str, defines: list[str], run: Run) -> list[str]:
    """The counterexample replayed: the model's own lines (MODEL: ..., INVARIANT BROKEN: ...)."""
    assert (run.folder / f"{MODEL.name}.trail").exists(), f"pan reported an error but wrote no trail:\n{run.out}"
    res = subprocess.run([spin, *defines, "-t", MODEL.name], cwd=run.folder, capture_output=True, text=True,
                         timeout=TIMEOUT)
    return [line.strip() for line in res.stdout.splitlines() if re.match(r"\s*(MODEL|INVARIANT BROKEN):", line)]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_the_protocol_keeps_every_guarantee(spin, tmp_path, config):
    defines, floor = CONFIGS[config]
    run = check(spin, defines, tmp_path)
    summary = "\n".join(line for line in run.out.splitlines()
                        if re.search(r"errors:|states, (stored|matched)|transitions|elapsed", line))
    print(f"{config}: {' '.join(defines)}\n{summary}")
    assert run.errors == 0, "the protocol breaks a guarantee:\n" + "\n".join(trail(spin, defines, run))
    assert run.stored >= floor, f"only {run.stored} states explored (floor {floor}): has the model stopped exploring?"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_broken_design_breaks_its_guarantee(spin, tmp_path, variant):
    config, broken = VARIANTS[variant]
    defines = [*CONFIGS[config][0], f"-D{variant}"]
    run = check(spin, defines, tmp_path)
    assert run.errors >= 1, f"{variant} was not rejected ({run.stored} states):\n{run.out}"
    lines = trail(spin, defines, run)
    print(f"{variant}: {run.stored} states, {run.seconds:.1f} s; counterexample:\n  " + "\n  ".join(lines))
    found = [line for line in lines if line.startswith("INVARIANT BROKEN:")]
    assert found and found[0] == f"INVARIANT BROKEN: {broken}", \
        f"{variant}: expected the trail to break {broken!r}, it shows {found}:\n" + "\n".join(lines)


def test_every_variant_is_in_the_model():
    text = MODEL.read_text()
    defined = set(re.findall(r"#ifn?def (VARIANT_\w+)", text)) | set(re.findall(r"defined\((VARIANT_\w+)\)", text))
    assert defined == set(VARIANTS), f"model's variants {sorted(defined)} vs the test's {sorted(VARIANTS)}"


# --- the mapping: model step -> implementing function

def steps() -> set[str]:
    return set(re.findall(r"@step\(([a-z_]+)\)", MODEL.read_text()))


def defined_names(path: pathlib.Path) -> set[str]:
    """Every function, and Class.method, a module defines (top level and in its classes)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.ClassDef):
            out |= {f"{node.name}.{n.name}" for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def mapping_problems(model_steps: set[str], mapping: dict) -> list[str]:
    """Why the model and the mapping disagree: a step with no entry, an entry for no step,
    an entry that names no function and says nothing of being outside, a function that
    is not where the entry says."""
    entries = mapping.get("steps", {})
    bad = [f"model step {s!r} has no entry in {MAPPING.name}" for s in sorted(model_steps - set(entries))]
    bad += [f"{MAPPING.name} maps {s!r}, which is no step of the model" for s in sorted(set(entries) - model_steps)]
    for name, entry in sorted(entries.items()):
        impl = entry.get("implements", [])
        if not impl and not entry.get("outside"):
            bad.append(f"step {name!r}: neither `implements` nor `outside`")
        for ref in impl:
            path, _, func = ref.partition("::")
            f = REPO / path
            if not f.is_file():
                bad.append(f"step {name!r}: {path} does not exist")
            elif func not in defined_names(f):
                bad.append(f"step {name!r}: {path} defines no {func} (renamed or removed? change the model with it)")
    return bad


def test_every_model_step_maps_to_the_function_that_implements_it():
    assert len(steps()) > 20, "the model's @step markers are gone?"
    assert not mapping_problems(steps(), tomllib.loads(MAPPING.read_text())), \
        "\n".join(mapping_problems(steps(), tomllib.loads(MAPPING.read_text())))


def test_the_mapping_check_fails_on_a_renamed_function_or_an_unmapped_step():
    """The check above can fail: a renamed function, a new step, a stale entry."""
    mapping = tomllib.loads(MAPPING.read_text())
    renamed = {"steps": {**mapping["steps"], "publish_create": {
        "implements": ["dispatch_slurm/store/posix.py::create_publication_renamed"]}}}
    assert any("defines no create_publication_renamed" in p for p in mapping_problems(steps(), renamed))
    assert any("'new_step' has no entry" in p for p in mapping_problems(steps() | {"new_step"}, mapping))
    assert any("no step of the model" in p for p in mapping_problems(steps() - {"crash"}, mapping))
    method = {"steps": {**mapping["steps"], "gc_retire": {
        "implements": ["dispatch_slurm/store/posix.py::PosixStore.retire_gone"]}}}
    assert any("defines no PosixStore.retire_gone" in p for p in mapping_problems(steps(), method))


def test_the_by_hand_commands_of_docs_model_run(spin):
    """docs/model.md's by-hand block, as written, from the checkout: the protocol's pan ends
    with no error, the pointer variant's with one, and its replay names the guarantee."""
    page = (REPO / "docs" / "model.md").read_text()
    block = re.search(r"<!-- snippet: model-by-hand;[^\n]*-->\n```sh\n(.*?)```", page, re.S)
    assert block, "docs/model.md has no model-by-hand block"
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", block[1]], cwd=REPO, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"errors: 0\b", res.stdout) and re.search(r"errors: 1\b", res.stdout), res.stdout
    assert "INVARIANT BROKEN: an old execution's publication never outranks the replacement's" in res.stdout
