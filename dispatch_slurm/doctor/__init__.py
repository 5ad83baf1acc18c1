"""The doctor: will the save signal reach every rank in time, and does the save fit?

Three depths, one report: the wiring alone (Slurm's configuration and the job script:
wiring.py, judged by rules.py, pure); a local rehearsal (a command signalled the way Slurm
signals a step, no Slurm needed: rehearse.py); a running test job (scancel sends what Slurm
will: running.py). What every rank's handler did comes from its probe records, which the
preemption handler writes in every job (runtime/probe.py: the runtime writes them, so they
stay there). report.py writes the page. `dispatch-slurm doctor` (cli/doctor.py) is a thin
command over ``diagnose``.

`dispatch-slurm launch`, which the doctor recommends for torchrun and accelerate, is not
here: it runs inside every job that uses it, as part of the job's runtime (runtime/launch.py),
while the doctor runs once, before the first real preemption."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from . import report, rules
from . import running
from .rehearse import Run, local
from .wiring import UsageError, overrides, signal_at_once, slurm_conf, wiring

__all__ = ["Ask", "Diagnosis", "UsageError", "diagnose"]


@dataclass
class Ask:
    """What the doctor is asked (the command's options, by the same names)."""
    script: Optional[str] = None
    sig: Optional[rules.Signal] = None
    where: Optional[str] = None
    launcher: Optional[str] = None
    wrapped: Optional[bool] = None
    processes: Optional[int] = None
    grace: Optional[float] = None
    save_seconds: Optional[float] = None
    partition: Optional[str] = None
    use_slurm: Optional[bool] = None
    kill_wait: Optional[float] = None
    grace_time: Optional[float] = None
    preempt_mode: Optional[str] = None
    send_user_signal: Optional[bool] = None
    preempt: bool = False
    every_process: bool = False
    ranks: int = 1
    ready_timeout: float = 120.0
    job_id: Optional[int] = None
    probe_dir: Optional[str] = None
    root: Optional[str] = None
    command: tuple[str, ...] = ()


@dataclass
class Diagnosis:
    sig: Optional[rules.Signal]
    stack: rules.Stack
    conf: rules.SlurmConf
    partition: Optional[str]
    windows: dict
    findings: list[rules.Finding]
    table: list[rules.Row] = field(default_factory=list)
    run: Optional[Run] = None
    mode: Optional[str] = None  # --job: which way the job came in (running.mode)

    def _parts(self) -> tuple:
        return (self.sig, self.stack, self.conf, self.partition, self.windows, self.table, self.findings, self.run,
                self.mode)

    def text(self) -> str:
        return report.render(*self._parts())

    def json(self) -> str:
        return report.as_json(*self._parts())


def diagnose(a: Ask) -> Diagnosis:
    """The wiring's findings and, with a command or a job, the rehearsal's (UsageError: options
    that cannot work together)."""
    if a.command and a.job_id:
        raise UsageError("give either a COMMAND (a local rehearsal) or --job, not both")
    sig, stack = wiring(a.script, a.sig, a.where, a.launcher, a.wrapped, a.processes, a.command)
    conf, partition = slurm_conf(a.partition, False if a.command and a.use_slurm is None else a.use_slurm, a.job_id)
    conf = overrides(conf, a.kill_wait, a.grace_time, a.preempt_mode, a.send_user_signal)
    if (a.command or a.job_id) and sig is None and not a.preempt:
        raise UsageError("a rehearsal of the time limit needs the job's --signal (or --script), or --preempt")
    d = Diagnosis(sig, stack, conf, partition, rules.windows(sig, stack, conf),
                  rules.check(sig, stack, conf, a.grace, a.save_seconds) + signal_at_once(a.script, sig))
    if a.command or a.job_id:
        _rehearse(a, d)
    return d


def _rehearse(a: Ask, d: Diagnosis) -> None:
    """Run the rehearsal (the command here, else the job), then judge what the ranks recorded."""
    sig = d.sig or rules.Signal("TERM", False, 60)
    window = d.windows.get("preemption" if a.preempt else "time limit") or \
        ((d.conf.grace_time if a.preempt else sig.seconds) + d.conf.kill_wait)
    if a.command:
        d.run, d.table = local(list(a.command), sig, d.conf, a.ranks, a.ready_timeout, a.preempt, a.probe_dir,
                               a.every_process)
    else:
        assert a.job_id is not None  # diagnose() rehearses with a command or a job
        d.run, d.table = running.rehearse(a.job_id, sig, d.conf, a.ranks, a.ready_timeout, a.preempt, a.probe_dir,
                                          a.root)
        d.mode = running.mode(a.root, a.job_id) if a.root else None
    _judge(a, d, window, d.run.exit_code, None if a.preempt else sig.seconds)


def _judge(a: Ask, d: Diagnosis, window: float, exit_code: Optional[int], limit_at: Optional[float]) -> None:
    """The wiring's findings re-checked with the signals the handlers say they catch (over the
    guess), plus what the measured run says that the wiring did not."""
    handled = {n[3:] for r in d.table for n in r.signals}
    if handled:
        d.findings = rules.check(d.sig, d.stack, d.conf, a.grace, a.save_seconds, handled=handled)
    seen = {f.code for f in d.findings}
    path = "preemption" if a.preempt else "time limit"
    lim = rules.limits(d.sig, d.stack, d.conf, handled or None).get(path)
    binds = rules.binding(path, lim, d.sig, d.stack, d.conf) if lim is not None and lim.seconds > 0 else None
    d.findings = d.findings + [f for f in rules.verdict(d.table, a.ranks, window, exit_code, d.stack.launcher,
                                                          limit_at, binds)
                               if f.code not in seen or f.code == "save-too-long"]
