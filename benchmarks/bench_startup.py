"""Start-up of the commands every job runs, against both bare starts, side by side.

`env`, `latest --resume` and `publish` run at the start of every job (and `publish` at
every save), so their start-up is paid over and over: the goal is each within 3x a bare
`python3 -c pass` (`--help`, `latest` and `epoch` are listed, not held to it). Two
baselines, because they answer different questions: `python3 -c pass` is what any Python
command pays (site, and the venv's .pth files), `python3 -S -c pass` the interpreter alone.
Each command is a fresh process, as in a job script; a loop runs every command once per
round, alternating, so drift hits all alike, and wait4(2) gives each run's wall-clock time
and its CPU time (user + system: what a loaded machine inflates least), both reported.
The package modules each command has imported when it exits are counted (one run more).

Bytecode is cached as an installed package has it (pip and Debian compile it): every run
writes and reads its .pyc under one temporary PYTHONPYCACHEPREFIX, and a first round,
not timed, fills it.

Several checkouts can be measured in one run (``--tree``, put on PYTHONPATH; the
interpreter is this one): before and after a change, in the same minutes.

    python benchmarks/bench_startup.py [--n 30] [--tree /work/wt/base --tree .] [--json out.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GOAL = 3.0
HELD = ("env --local", "latest --resume", "publish")  # the commands held to GOAL
BASELINES = ("python3 -c pass", "python3 -S -c pass")


def _commands(py: str, root: str, save: str) -> dict[str, list[str]]:
    cli = [py, "-c", "from dispatch_slurm.cli import main; main()"]  # what the console script runs
    return {"--help": [*cli, "--help"], "env --local": [*cli, "env", "--local", "--format", "json"],
            "latest": [*cli, "latest", root], "latest --resume": [*cli, "latest", "--resume", root],
            "publish": [*cli, "publish", "--no-sync", "--json", save],
            "epoch compose": [*cli, "epoch", "compose", "0", "1", "0"]}


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


def _loop(runs: dict[str, tuple[list[str], dict]], n: int) -> dict[str, dict[str, list[float]]]:
    """Each command once per round, ``n`` rounds: each run's wall-clock and CPU seconds."""
    times: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in runs}
    for _ in range(n):
        for key, (argv, env) in runs.items():
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(proc.pid, 0)
            times[key]["wall"].append(time.perf_counter() - t0)
            if os.waitstatus_to_exitcode(status) not in (0, 1):  # `latest` of an empty root exits 1
                raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), argv)
            times[key]["cpu"].append(usage.ru_utime + usage.ru_stime)
    return times


COUNT = ("import atexit, os, sys\n"
         "atexit.register(lambda: os.write(2, ('modules %d\\n' % sum(m == 'dispatch_slurm' or "
         "m.startswith('dispatch_slurm.') for m in sys.modules)).encode()))\n")


def _modules(argv: list[str], env: dict) -> int:
    """How many of the package's modules ``argv`` (a ``python -c CODE ...``) has imported when it exits."""
    if "-c" not in argv:
        return 0
    i = argv.index("-c") + 1
    r = subprocess.run([*argv[:i], COUNT + argv[i], *argv[i + 1:]], env=env, capture_output=True, text=True)
    return int(r.stderr.rsplit("modules ", 1)[1].split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30, help="runs of each command")
    ap.add_argument("--tree", action="append", help="a checkout to measure (PYTHONPATH)  [default: this one]")
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
            runs[f"{i}:{BASELINES[0]}"] = ([py, "-c", "pass"], plain)
            runs[f"{i}:{BASELINES[1]}"] = ([py, "-S", "-c", "pass"], plain)
            for name, argv in _commands(py, root, save).items():
                runs[f"{i}:{name}"] = (argv, env)
        _loop(runs, 1)  # fills the bytecode cache
        counts = {key: _modules(*run) for key, run in runs.items()}
        times = _loop(runs, a.n)
    print(f"start-up, median of {a.n} runs each (alternating loop): CPU (user + system) and wall-clock, each as "
          f"a ratio to `{BASELINES[0]}` and to `{BASELINES[1]}`; goal <= {GOAL}x `{BASELINES[0]}` (CPU) for "
          f"{', '.join(HELD)}")
    report = []
    for i, tree in enumerate(trees):
        bare = {b: {k: statistics.median(times[f"{i}:{b}"][k]) for k in ("cpu", "wall")} for b in BASELINES}
        print(f"\n{tree}\n  {'':18s} {'modules':>7s}   {'CPU ms':>7s} {'x -c':>6s} {'x -S':>6s}   "
              f"{'wall ms':>7s} {'x -c':>6s} {'x -S':>6s}")
        for key in (k for k in runs if k.startswith(f"{i}:")):
            name = key.split(":", 1)[1]
            med = {k: statistics.median(times[key][k]) for k in ("cpu", "wall")}
            ratios = {k: {b: med[k] / bare[b][k] for b in BASELINES} for k in med}
            mark = "" if name not in HELD else ("  ok" if ratios["cpu"][BASELINES[0]] <= GOAL else "  over the goal")
            print(f"  {name:18s} {counts[key]:7d}   " + "   ".join(
                f"{med[k] * 1e3:7.1f} {ratios[k][BASELINES[0]]:5.2f}x {ratios[k][BASELINES[1]]:5.2f}x"
                for k in ("cpu", "wall")) + mark)
            report.append({"tree": tree, "command": name, "modules": counts[key], "cpu_s": med["cpu"],
                           "wall_s": med["wall"], "ratios": ratios})
    if out:
        with open(out, "w") as f:
            json.dump({"n": a.n, "results": report}, f, indent=1)


if __name__ == "__main__":
    main()
