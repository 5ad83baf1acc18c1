"""The doctor's report: one text page (the wiring, Slurm's windows, the rehearsal's table per
rank, the verdict and each finding with its fix), or the same as one JSON object."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Optional

from .rehearse import Run
from .rules import Finding, Row, Signal, SlurmConf, Stack


def _fmt(v: Optional[float], unit: str = " s", sign: bool = False) -> str:
    return "-" if v is None else f"{'+' if sign and v >= 0 else ''}{v:.2f}{unit}"


def render(sig: Optional[Signal], stack: Stack, conf: SlurmConf, partition: Optional[str], wins: dict,
           table: list[Row], findings: list[Finding], run: Optional[Run] = None, mode: Optional[str] = None) -> str:
    where = "an srun step" if stack.where == "step" else "the batch shell"
    lines = [f"doctor: {sig or 'no --signal'}; the trainer in {where}"
             f"{' under ' + stack.launcher if stack.launcher else ''}{' (dispatch-slurm launch)' if stack.wrapped else ''}",
             f"slurm: KillWait {conf.kill_wait:g} s, PreemptMode {conf.preempt_mode}"
             f"{f' (partition {partition})' if partition else ''}, GraceTime {conf.grace_time:g} s, "
             f"send_user_signal {'yes' if conf.send_user_signal else 'no'}",
             "windows (signal to SIGKILL): " + ", ".join(f"{k} {v:g} s" for k, v in wins.items())]
    if mode is not None:
        lines.append(f"mode: {mode}")
    lines += _hooks(conf)
    if run is not None:
        lines.append(f"rehearsal: {run.ready} handler(s) installed when the signal was sent; the command "
                     f"exited {run.exit_code}")
        lines += [f"  +{t:.2f} s  {what}" for t, what in run.log]
        lines.append(f"{'rank':>4}  {'host':<14} {'pid':>7}  {'handler ran':>11}  {'to safe point':>13}  "
                     f"{'save':>8}  {'left':>8}  published  exit")
        for r in table:
            lines.append(f"{'?' if r.rank is None else r.rank:>4}  {r.host[:14]:<14} {r.pid:>7}  "
                         f"{_fmt(r.delay, sign=True):>11}  {_fmt(r.to_stop):>13}  {_fmt(r.save):>8}  "
                         f"{_fmt(r.left):>8}  {'yes' if r.published else 'no':<9}  {'-' if r.exit is None else r.exit}")
    lines.append("verdict: " + ("OK: every rank gets the signal and saves within the window" if not findings
                                else f"{len(findings)} problem(s)"))
    lines += [str(f) for f in findings]
    return "\n".join(lines) + "\n"


def _hooks(conf: SlurmConf) -> list[str]:
    """Where PrologFlags puts the Prolog and Epilog, when it puts them in the job."""
    flags = set(conf.prolog_flags.split(","))
    if "RunInJob" in flags:
        return [f"hooks: PrologFlags {conf.prolog_flags}: the Prolog and Epilog run in the job's extern step, "
                "inside its cgroup; the Epilog's cessation evidence leaves out its own processes"]
    if "Contain" in flags:
        return [f"hooks: PrologFlags {conf.prolog_flags}: an extern step holds the job's processes on every "
                "node; the Epilog runs after it ended"]
    return []


def as_json(sig: Optional[Signal], stack: Stack, conf: SlurmConf, partition: Optional[str], wins: dict,
            table: list[Row], findings: list[Finding], run: Optional[Run] = None, mode: Optional[str] = None) -> str:
    return json.dumps({"signal": str(sig) if sig else None, "stack": asdict(stack), "slurm": asdict(conf),
                       "mode": mode,
                       "partition": partition, "windows": wins, "ranks": [asdict(r) for r in table],
                       "run": None if run is None else asdict(run),
                       "findings": [asdict(f) for f in findings]}, indent=1)
