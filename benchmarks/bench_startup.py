"""Start-up of the commands every job runs, against `python3 -c pass`, side by side.

`env`, `latest --resume` and `publish` run at the start of every job (and `publish` at
every save), so their start-up is paid over and over: the goal is each within 3x a bare
Python start (`--help` is listed, not held to it). Each command is a fresh process, as in
a job script. With hyperfine installed it measures (its medians, -N: no shell); else a
loop runs every command once per round, alternating, so drift hits all alike.

Bytecode is cached as an installed package has it (pip and Debian compile it): every run
writes and reads its .pyc under one temporary PYTHONPYCACHEPREFIX, and a first round,
not timed, fills it.

Several checkouts can be measured in one run (``--tree``, put on PYTHONPATH; the
interpreter is this one): before and after a change, in the same minutes.

    python benchmarks/bench_startup.py [--n 30] [--cpu] [--tree /work/wt/base --tree .] [--json out.json]
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GOAL = 3.0
HELD = ("env --local", "latest --resume", "publish")  # the commands held to GOAL


def _commands(py: str, root: str, save: str) -> dict[str, list[str]]:
    cli = [py, "-c", "from dispatch_slurm.cli import main; main()"]  # what the console script runs
    return {"--help": [*cli, "--help"], "env --local": [*cli, "env", "--local", "--format", "json"],
            "latest --resume": [*cli, "latest", "--resume", root],
            "publish": [*cli, "publish", "--no-sync", "--json", save]}


def _base_env(tree: str, pycache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": tree, "PYTHONPYCACHEPREFIX": pycache}


def _execution(py: str, base: dict, root: str) -> tuple[dict, str]:
    """A local execution under ``root`` (its variables) and a save in it to publish again
    and again (a publication of the same save again is "already published", exit 0)."""
    env = {**base, "DISPATCH_CHECKPOINT": root}
    out = subprocess.run([*_commands(py, root, "")["env --local"]], env=env,
                         capture_output=True, text=True, check=True).stdout
    values = json.loads(out)
    save = os.path.join(values["DISPATCH_EXEC_DIR"], "checkpoint-1")
    os.makedirs(save)
    with open(os.path.join(save, "trainer_state.json"), "w") as f:
        f.write("{}")
    return {**env, **values}, save


def _loop(runs: dict[str, tuple[list[str], dict]], n: int, cpu: bool = False) -> dict[str, list[float]]:
    """Each command once per round, ``n`` rounds: wall-clock seconds, or with ``cpu`` the
    process's own CPU seconds (user + system: what a loaded machine inflates least)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(n):
        for key, (argv, env) in runs.items():
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                raise subprocess.CalledProcessError(proc.returncode, argv)
            times[key].append(usage.ru_utime + usage.ru_stime if cpu else wall)
    return times


def _hyperfine(runs: dict[str, tuple[list[str], dict]], n: int) -> dict[str, list[float]]:
    """hyperfine's run times of every command (each as ``env VAR=... argv``, no shell)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmds = []
        for argv, env in runs.values():
            unset = [f"-u{k}" for k in os.environ if k not in env]
            own = [f"{k}={v}" for k, v in env.items() if os.environ.get(k) != v]
            cmds.append(shlex.join(["env", *unset, *own, *argv]))  # -N: hyperfine splits it as a shell would
        subprocess.run(["hyperfine", "-N", "--warmup", "3", "--runs", str(n), "--export-json", out.name, *cmds],
                       check=True, stdout=subprocess.DEVNULL)
        results = json.load(open(out.name))["results"]
    return {key: r["times"] for key, r in zip(runs, results)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30, help="runs of each command")
    ap.add_argument("--tree", action="append", help="a checkout to measure (PYTHONPATH)  [default: this one]")
    ap.add_argument("--loop", action="store_true", help="the alternating loop even when hyperfine is installed")
    ap.add_argument("--cpu", action="store_true", help="CPU time (user + system) instead of wall-clock time: for a "
                    "machine others load (implies --loop)")
    ap.add_argument("--json", help="write the medians and ratios here")
    a = ap.parse_args()
    py = sys.executable
    trees = [os.path.abspath(t) for t in (a.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))])]
    out = a.json and os.path.abspath(a.json)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        os.chdir(tmp)  # `python -c` puts the working directory first on sys.path: never a checkout's
        runs: dict[str, tuple[list[str], dict]] = {}
        for i, tree in enumerate(trees):
            root = os.path.join(tmp, f"root{i}")
            os.makedirs(root)
            plain = _base_env(tree, os.path.join(tmp, "pycache"))
            env, save = _execution(py, plain, root)
            runs[f"{i}:python3 -c pass"] = ([py, "-c", "pass"], plain)
            for name, argv in _commands(py, root, save).items():
                runs[f"{i}:{name}"] = (argv, env)
        _loop(runs, 1)  # fills the bytecode cache
        tool = "hyperfine" if shutil.which("hyperfine") and not (a.loop or a.cpu) else "alternating loop"
        times = _hyperfine(runs, a.n) if tool == "hyperfine" else _loop(runs, a.n, a.cpu)
    what = "CPU time" if a.cpu else "wall-clock time"
    print(f"start-up {what}, median of {a.n} runs each ({tool}); ratio to `python3 -c pass`, goal <= {GOAL}x for "
          f"{', '.join(HELD)}")
    report = []
    for i, tree in enumerate(trees):
        bare = statistics.median(times[f"{i}:python3 -c pass"])
        print(f"\n{tree}")
        for key in (k for k in runs if k.startswith(f"{i}:")):
            name, med = key.split(":", 1)[1], statistics.median(times[key])
            ratio = med / bare
            held = name in HELD
            mark = "" if not held else ("  ok" if ratio <= GOAL else "  over the goal")
            print(f"  {name:18s} {med * 1e3:7.1f} ms  {ratio:5.2f}x{mark}")
            report.append({"tree": tree, "command": name, "median_s": med, "ratio": ratio})
    if out:
        with open(out, "w") as f:
            json.dump({"tool": tool, "n": a.n, "results": report}, f, indent=1)


if __name__ == "__main__":
    main()
