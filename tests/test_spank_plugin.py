"""The SPANK plugin's shape, pyxis's: one file per SPANK context, each with its own
exit that clears its own state and frees exactly what its own init loaded (driven in every
context, under valgrind where it is installed, and read from the sources); no include circle
among spank_env/'s units; one cleanup path per function; the default build neither fails on
warnings nor lowers or redefines _FORTIFY_SOURCE, while CI's (WERROR=1, what the tests build)
fails on any warning; the distribution builds ask for neither. Each source check is also run
on a broken copy of the sources, so it can fail."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support import REPO, build_spank

SRC = REPO / "spank_env"
WERROR = re.compile(r"-Werror(?![=\w-])")  # every warning an error; -Werror=<one> is a distribution's choice
CONTEXTS = ["local", "allocator", "remote", "slurmd"]  # as test_contexts.c names them
needs_make = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="no C compiler or make")


def sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(SRC.glob("*.[ch]"))}


def functions(text: str) -> dict[str, str]:
    """Every function defined in a C file (the tree's style: the body's braces in column 0),
    name -> body."""
    found = re.finditer(r"^(?:static\s+)?[\w \t*]+?\b(\w+)\(([^;{]*?)\)\n\{\n(.*?)^\}", text, re.M | re.S)
    return {m[1]: m[3] for m in found}


def statics(text: str) -> list[str]:
    """The file-scope static variables of a C file (its own state)."""
    return re.findall(r"^static\b[^(;{=]*?\b(\w+)\s*(?:\[[^\]]*\])?\s*(?:=[^;]*)?;", text, re.M)


def context_problems(src: dict[str, str]) -> list[str]:
    """What breaks "each context's exit clears its own state, and only its own": a context file
    (one defining a dsp_<ctx>_init that plugin.c's slurm_spank_init calls) without
    dsp_<ctx>_exit; an exit that does not free a module its init loaded (dsp_<m>_load /
    dsp_<m>_register -> dsp_<m>_free) or frees one its init never loaded (another context's); a
    file-scope static its exit never touches; a plugin.c exit that frees anything itself or
    misses a context's exit."""
    problems = []
    plugin = functions(src["plugin.c"])
    dispatched = set(re.findall(r"\bdsp_(\w+?)_init\(", plugin["slurm_spank_init"]))
    for name, text in src.items():
        if not name.endswith(".c") or name == "plugin.c" or name.startswith("test_"):
            continue
        fns = functions(text)
        for ctx in sorted(c for c in dispatched if f"dsp_{c}_init" in fns):
            exit_ = fns.get(f"dsp_{ctx}_exit")
            if exit_ is None:
                problems.append(f"{name}: dsp_{ctx}_init has no dsp_{ctx}_exit")
                continue
            loaded = set(re.findall(r"\bdsp_(\w+?)_(?:load|register)\(", fns[f"dsp_{ctx}_init"]))
            freed = set(re.findall(r"\bdsp_(\w+?)_free\(", exit_))
            problems += [f"{name}: dsp_{ctx}_exit does not free {m} (its init loads it)"
                         for m in sorted(loaded - freed)]
            problems += [f"{name}: dsp_{ctx}_exit frees {m}, which its init never loaded"
                         for m in sorted(freed - loaded)]
            problems += [f"{name}: dsp_{ctx}_exit leaves its static {v} as it is" for v in statics(text)
                         if not re.search(rf"\b{v}\b", exit_)]
    for cb in ("slurm_spank_exit", "slurm_spank_slurmd_exit"):
        if re.search(r"\bdsp_\w+_free\(|\bfree\(|\bmemset\(", plugin.get(cb, "")):
            problems.append(f"plugin.c: {cb} frees state itself (each context's exit does)")
    exits = set(re.findall(r"\bdsp_(\w+?)_exit\(", plugin.get("slurm_spank_exit", "")))
    problems += [f"plugin.c: slurm_spank_exit never calls dsp_{c}_exit" for c in sorted(dispatched - exits)]
    if "slurmd" in dispatched and "dsp_slurmd_exit(" not in plugin.get("slurm_spank_slurmd_exit", ""):
        problems.append("plugin.c: slurm_spank_slurmd_exit (what slurmd calls) does not call dsp_slurmd_exit")
    return problems


def include_cycles(src: dict[str, str]) -> list[list[str]]:
    """Circles among the units (x.c and x.h are one unit) through #include "y.h"."""
    graph: dict[str, set[str]] = {}
    for name, text in src.items():
        unit = name.rsplit(".", 1)[0]
        included = (h.rsplit(".", 1)[0] for h in re.findall(r'^#include "([\w.]+)"', text, re.M))
        graph.setdefault(unit, set()).update(u for u in included if u != unit)
    cycles, state = [], {}

    def visit(unit, path):
        state[unit] = "open"
        for dep in sorted(graph.get(unit, ())):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[unit] = "done"
    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [unit])
    return cycles


CLEANUP = re.compile(r"\s*(?:(?:close|close_fd|closedir)\(\w+\);|if \(\w+(?: >= 0)?\))$")


def close_chains(text: str) -> list[int]:
    """Lines where two or more descriptors are closed in a row outside a cleanup label: a
    copy of a function's close chain, which belongs after its one `out:` label."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        j = i
        while j < len(lines) and CLEANUP.fullmatch(lines[j]):
            j += 1
        closes = sum("close" in line for line in lines[i:j])
        if closes >= 2 and not (i and re.fullmatch(r"\w+:", lines[i - 1])):
            found.append(i + 1)
        i = max(j, i + 1)
    return found


def test_each_context_file_has_its_own_exit_and_frees_only_its_own_state():
    src = sources()
    assert context_problems(src) == []
    # the check sees each way to break it
    broken = dict(src)
    broken["slurmd.c"] = src["slurmd.c"].replace("\tdsp_config_free();", "\tdsp_config_free();\n\tdsp_opts_free();")
    broken["remote.c"] = src["remote.c"].replace("\tuser_error[0] = '\\0';\n", "")
    broken["alloc.c"] = src["alloc.c"].replace("\tdsp_config_free();\n", "")
    broken["plugin.c"] = src["plugin.c"].replace("\t\treturn dsp_remote_exit(sp);",
                                                 "\t\tdsp_opts_free();\n\t\treturn 0;")
    assert broken != src
    assert context_problems(broken) == [
        "alloc.c: dsp_alloc_exit does not free config (its init loads it)",
        "remote.c: dsp_remote_exit leaves its static user_error as it is",
        "slurmd.c: dsp_slurmd_exit frees opts, which its init never loaded",
        "plugin.c: slurm_spank_exit frees state itself (each context's exit does)",
        "plugin.c: slurm_spank_exit never calls dsp_remote_exit",
    ]
    assert context_problems({**src, "slurmd.c": src["slurmd.c"].replace("dsp_slurmd_exit", "slurmd_done")}) == [
        "slurmd.c: dsp_slurmd_init has no dsp_slurmd_exit"]
    unhooked = src["plugin.c"].replace("\n\treturn dsp_slurmd_exit(sp);", "\n\treturn 0;")
    assert context_problems({**src, "plugin.c": unhooked}) == [
        "plugin.c: slurm_spank_slurmd_exit (what slurmd calls) does not call dsp_slurmd_exit"]


def test_the_plugin_defines_no_job_prolog_or_epilog():
    """Where a plugin defines slurm_spank_job_prolog/epilog, slurmd runs it and then unsets
    the SPANK option variables in what the Prolog and Epilog scripts get (seen on 26.05: of
    --dispatch-checkpoint, --dispatch-grace and the submission one survived), and those hooks
    know a dispatch job by its --dispatch-checkpoint: they would skip it, no cessation
    recorded (tests/cluster/test_hooks.py shows it on Slurm)."""
    defined = re.compile(r"^int\s+(slurm_spank_\w+)\s*\(", re.M)
    names = {n for text in sources().values() for n in defined.findall(text)}
    assert "slurm_spank_user_init" in names  # the pattern sees the plugin's callbacks
    assert not names & {"slurm_spank_job_prolog", "slurm_spank_job_epilog"}


def test_no_include_circle():
    """contract.c <-> siteconf.c through dsp_fail was one: dsp_fail now lives in fail.c."""
    src = sources()
    assert include_cycles(src) == []
    assert '#include "contract.h"' not in src["siteconf.c"] and '#include "fail.h"' in src["siteconf.c"]
    old = {**src, "siteconf.c": src["siteconf.c"].replace('#include "fail.h"', '#include "contract.h"')}
    assert include_cycles(old) == [["contract", "siteconf", "contract"]]


def test_one_cleanup_path_per_function():
    for name, text in sources().items():
        assert close_chains(text) == [], f"{name}: close chains outside a cleanup label at lines {close_chains(text)}"
    copied = ("\tif (fsync(sub)) {\n\t\tclose(sub);\n\t\tclose(root);\n\t\treturn -1;\n\t}\n"
              "out:\n\tclose_fd(sub);\n\tclose(root);\n")
    assert close_chains(copied) == [2]


# ---- the plugin in each SPANK context (spank_env/test_contexts.c) ------------------------

@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    if not Path("/usr/include/slurm/spank.h").exists():
        pytest.skip("no slurm/spank.h: apt-get install libslurm-dev (tools/setup-host does)")
    return build_spank("test_contexts", tmp_path_factory.mktemp("contexts"))


@needs_make
@pytest.mark.parametrize("context", CONTEXTS)
def test_each_context_exit_leaves_nothing(contexts, context, tmp_path):
    """init, options, post_opt / user_init / task_init, then the exit Slurm calls in that
    context: afterwards every accessor is empty again and (valgrind) nothing is allocated."""
    cmd = [str(contexts), context, str(tmp_path)]
    if shutil.which("valgrind"):
        cmd = ["valgrind", "-q", "--leak-check=full", "--show-leak-kinds=all", "--errors-for-leak-kinds=all",
               "--error-exitcode=97", *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # sbatch outside a job
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert (r.returncode, r.stdout) == (0, f"{context}: ok\n"), f"{cmd}\n{r.stdout}\n{r.stderr}"


@needs_make
def test_a_requeued_batch_step_takes_its_restart_count_from_the_prologs_record(tmp_path):
    """Slurm sets a batch step's SLURM_RESTART_COUNT only in its task, after user_init: the
    Prolog records the count (root's file, 0644; test_hooks_local.py), user_init reads it, a
    record others could write is ignored."""
    if not Path("/usr/include/slurm/spank.h").exists():
        pytest.skip("no slurm/spank.h: apt-get install libslurm-dev (tools/setup-host does)")
    if os.geteuid() != 0:
        pytest.skip("the record is root's: run as root")
    driver = build_spank("test_contexts", tmp_path, cppflags=f"-DDSP_RUN_DIR='\"{tmp_path}/run\"'")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run([str(driver), "requeue", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert (r.returncode, r.stdout) == (0, "requeue: ok\n"), f"{r.stdout}\n{r.stderr}"
    assert not (tmp_path / "run" / "42.restart").exists()


# ---- the build flags --------------------------------------------------------------------

def compile_line(*args, env=None) -> str:
    """The command `make` would run to build the plugin (a dry run: nothing is compiled)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("CC", "CFLAGS", "CPPFLAGS", "LDFLAGS", "WERROR")}
    r = subprocess.run(["make", "-n", "-B", "-C", str(SRC), *args, "dispatch_env.so"], capture_output=True,
                       text=True, env={**clean, **(env or {})}, check=True)
    lines = [line for line in r.stdout.splitlines() if " -shared " in line]
    assert len(lines) == 1, r.stdout
    return lines[0]


def predefines_fortify(cc: str) -> bool:
    out = subprocess.run(f"{cc} -O2 -g -dM -E -x c /dev/null", shell=True, capture_output=True, text=True).stdout
    return "_FORTIFY_SOURCE" in out


@needs_make
def test_default_build_never_fails_on_warnings_nor_lowers_fortify():
    line = compile_line()
    assert not WERROR.search(line) and "-U_FORTIFY_SOURCE" not in line, line
    assert ("-D_FORTIFY_SOURCE=2" in line) != predefines_fortify("cc"), line
    assert WERROR.search(compile_line("WERROR=1"))  # CI's build (the tests) does fail on a warning
    # a level the build flags give (dpkg-buildflags, rpm's optflags) or the compiler itself
    # predefines (Ubuntu's and Fedora's gcc: 3) is left alone: not lowered, not redefined
    for given in (compile_line("CPPFLAGS=-D_FORTIFY_SOURCE=3"),
                  compile_line("CFLAGS=-O2 -Wp,-D_FORTIFY_SOURCE=3"),
                  compile_line("CC=cc -D_FORTIFY_SOURCE=3")):
        assert re.findall(r"_FORTIFY_SOURCE\S*", given) == ["_FORTIFY_SOURCE=3"], given


@needs_make
@pytest.mark.skipif(shutil.which("dpkg-buildflags") is None, reason="no dpkg-buildflags")
def test_debian_build_flags_fortify_once_without_werror():
    """debian/rules' build: dpkg-buildflags with hardening=+all, exported, and `make -C spank_env`."""
    flags = {}
    for var in ("CFLAGS", "CPPFLAGS", "LDFLAGS"):
        flags[var] = subprocess.run(["dpkg-buildflags", "--get", var], capture_output=True, text=True, check=True,
                                    env={**os.environ, "DEB_BUILD_MAINT_OPTIONS": "hardening=+all"}).stdout.strip()
    line = compile_line(env=flags)
    assert not WERROR.search(line) and "-U_FORTIFY_SOURCE" not in line, line
    assert len(re.findall(r"-D_FORTIFY_SOURCE=\d", line)) == 1, line


def test_no_distribution_build_asks_for_werror_or_undefines_fortify():
    """Only the tests set WERROR=1; the packages, the images and the install build the default."""
    builds = [REPO / "Makefile", REPO / "debian/rules", *sorted((REPO / "admin").glob("*.mk")),
              *sorted((REPO / "admin").glob("*.spec")), *sorted(p for p in (REPO / "docker-slurm").rglob("*")
                                                                  if p.is_file())]
    assert (REPO / "debian/rules") in builds and any(p.suffix == ".spec" for p in builds)
    for path in builds:
        text = path.read_text(errors="replace")
        assert not re.search(r"-Werror|\bWERROR\b|-U_?FORTIFY", text), path
    assert not re.search(r"-U_?FORTIFY", (SRC / "Makefile").read_text())


def test_the_grace_cap_is_one_number_in_c_and_python():
    """The plugin refuses --dispatch-grace above DSP_GRACE_CAP, the CLI above GRACE_CAP, the
    site config caps at both: one number, its help text made from the macro."""
    from dispatch_slurm.contract.siteconf import GRACE_CAP
    m = re.search(r"#define DSP_GRACE_CAP_N (\d+)", (SRC / "siteconf.h").read_text())
    assert m and int(m.group(1)) == GRACE_CAP
    assert "0..300" not in (SRC / "options.c").read_text()
