"""`dispatch-slurm doctor`: will the save signal reach every rank in time? `launch`: the
launcher wrapper that keeps torchrun's 30 s kill and exit status from losing a save.

Three depths, one report: the wiring alone (Slurm's configuration and the job script);
a local rehearsal (``-- COMMAND``: the command signalled the way Slurm signals a step,
no Slurm needed); a running test job (``--job JOBID``: scancel sends what Slurm will).
Exit 0: nothing found; 1: findings (each with its fix); 2: an error."""

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace

import click

from ..contract import doctor as rules
from ..errors import DispatchError
from ..runtime import probe
from . import common, options


def _signal(ctx, param, value):
    if value is None:
        return None
    try:
        return rules.parse_signal(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def _slurm_conf(partition, use_slurm, job_id=None):
    """SlurmConf from scontrol when Slurm is here (and wanted), else the defaults; the
    partition read: the one given, else the job's, else $SLURM_JOB_PARTITION, else the
    default one."""
    if use_slurm is False or (use_slurm is None and not shutil.which("scontrol")):
        if job_id:
            raise click.UsageError("--job needs Slurm (scontrol and scancel on PATH)")
        return rules.SlurmConf(), None
    from ..slurm.client import Slurm
    s = Slurm()
    parts = s.partitions()
    name = partition or (s.job(job_id).partition if job_id else None) or os.environ.get("SLURM_JOB_PARTITION")
    if name is None:
        name = next((n for n, p in parts.items() if p.get("Default") == "YES"), None)
    if name is not None and name not in parts:
        raise DispatchError(f"partition {name!r} is not one of this cluster's: {', '.join(sorted(parts))}")
    return rules.parse_conf(s.config(), parts.get(name)), name


def _wiring(script, sig, where, launcher, wrapped, processes, command=()):
    stack = rules.Stack()
    if script is not None:
        try:
            with open(script, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise DispatchError(f"--script {script}: not UTF-8 text (byte {e.start}): name the job's batch "
                                "script") from None
        found, stack = rules.parse_script(text)
        sig = sig or found
    elif command:  # a rehearsed command plays one step: its launcher read from it
        _, guess = rules.parse_script(shlex.join(command).replace("dispatch_slurm launch", "dispatch-slurm launch"))
        stack = replace(guess, where="step")
    return sig, replace(stack, **{k: v for k, v in (("where", where), ("wrapped", wrapped),
                                                      ("processes", processes)) if v is not None},
                        **({"launcher": None if launcher == "none" else launcher} if launcher else {}))


def _signal_at_once(script, sig) -> list:
    """The script's --time against its --signal: a lead as long as the limit makes every end
    look stopped (`dispatch-slurm run` refuses it; contract/signals.lead_problem)."""
    from ..contract.signals import job_time_limit, lead_problem
    if script is None:
        return []
    with open(script, encoding="utf-8", errors="replace") as f:
        problem = lead_problem(sig, job_time_limit([], {}, f.read()))
    return [rules.Finding("signal-at-once", problem, "give #SBATCH --time more than the signal's lead, or a shorter "
                          "--signal time")] if problem else []


def _overrides(conf, kill_wait, grace_time, preempt_mode, send_user_signal):
    given = {"kill_wait": kill_wait, "grace_time": grace_time,
             "preempt_mode": preempt_mode.upper() if preempt_mode else None, "send_user_signal": send_user_signal}
    return replace(conf, **{k: v for k, v in given.items() if v is not None})


def _fmt(v, unit=" s", sign=False):
    return "-" if v is None else f"{'+' if sign and v >= 0 else ''}{v:.2f}{unit}"


def render(sig, stack, conf, partition, wins, table, findings, run=None) -> str:
    where = "an srun step" if stack.where == "step" else "the batch shell"
    lines = [f"doctor: {sig or 'no --signal'}; the trainer in {where}"
             f"{' under ' + stack.launcher if stack.launcher else ''}{' (dispatch-slurm launch)' if stack.wrapped else ''}",
             f"slurm: KillWait {conf.kill_wait:g} s, PreemptMode {conf.preempt_mode}"
             f"{f' (partition {partition})' if partition else ''}, GraceTime {conf.grace_time:g} s, "
             f"send_user_signal {'yes' if conf.send_user_signal else 'no'}",
             "windows (signal to SIGKILL): " + ", ".join(f"{k} {v:g} s" for k, v in wins.items())]
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


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--script", type=click.Path(exists=True, dir_okay=False), help="the sbatch script: its "
              "#SBATCH --signal and how it starts the trainer (srun, torchrun, accelerate launch, exec, trap)")
@click.option("--signal", "sig", metavar=options.SIGNAL_METAVAR, callback=_signal,
              help="the job's --signal, as sbatch takes it (over the script's), e.g. TERM@90 or B:USR2@120")
@click.option("--where", type=click.Choice(["step", "shell"]), help="where the trainer runs: an srun step, "
              "or the batch shell itself  [default: from --script, else step]")
@click.option("--launcher", type=click.Choice(["none", "torchrun", "accelerate"]),
              help="the launcher between Slurm and the ranks  [default: from --script, else none]")
@click.option("--wrapped/--not-wrapped", default=None, help="the launcher runs under `dispatch-slurm launch`")
@click.option("--processes", type=click.IntRange(1), help="accelerate launch's --num_processes")
@options.grace_option("the grace the handler counts on", fractions=True, envvar="DISPATCH_GRACE_S", show_envvar=True)
@click.option("--save-seconds", type=click.FloatRange(0), callback=common.finite, help="a save's measured duration (else: "
              "measured by the rehearsal)")
@click.option("--partition", help="the partition whose GraceTime and PreemptMode count  "
              "[default: $SLURM_JOB_PARTITION, else the default partition]")
@click.option("--slurm/--no-slurm", "use_slurm", default=None, help="read scontrol show config/partition  "
              "[default: when scontrol is on PATH]")
@click.option("--kill-wait", type=click.FloatRange(0), callback=common.finite, help="KillWait, over Slurm's (30 s without Slurm)")
@click.option("--grace-time", type=click.FloatRange(0), callback=common.finite, help="the partition's GraceTime, over Slurm's")
@click.option("--preempt-mode", help="PreemptMode, over Slurm's (OFF without Slurm), e.g. REQUEUE")
@click.option("--send-user-signal/--no-send-user-signal", default=None,
              help="PreemptParameters=send_user_signal, over Slurm's")
@click.option("--preempt", is_flag=True, help="rehearse a preemption (SIGTERM, or the job's signal with "
              "send_user_signal, then the kill when GraceTime ends) instead of the time limit")
@click.option("--every-process", is_flag=True, help="rehearsal: signal every process of COMMAND, as linuxproc "
              "tracking does  [default: its first process only, as cgroup tracking does]")
@click.option("--ranks", type=click.IntRange(1), default=1, show_default=True,
              help="the ranks whose handlers must report")
@click.option("--ready-timeout", type=click.FloatRange(0.1, 3600), default=120, show_default=True,
              help="seconds to wait for every rank's handler before signalling anyway")
@click.option("--job", "job_id", type=click.IntRange(1), help="rehearse on this running job: scancel sends "
              "the signal as Slurm will (the job ends)")
@click.option("--probe-dir", type=click.Path(file_okay=False), help="where the handlers record (--job: "
              "default: the job's $DISPATCH_EXEC_DIR/dispatch-probe under --root)")
@common.root_option("the job's checkpoint root (--job)")
@click.option("--json", "as_json", is_flag=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def doctor(script, sig, where, launcher, wrapped, processes, grace, save_seconds, partition, use_slurm,
           kill_wait, grace_time, preempt_mode, send_user_signal, preempt, every_process, ranks, ready_timeout, job_id,
           probe_dir, root, as_json, command):
    """Check that the save signal reaches every rank and the save fits, before the first
    preemption or time limit does. Names each misconfiguration with its one-line fix.
    Exit 0: nothing found, 1: findings, 2: an error.

    \b
    The wiring only (Slurm's config, the job script):
        dispatch-slurm doctor --script train.sbatch
    A local rehearsal (no Slurm: COMMAND plays an srun task and is signalled as Slurm
    signals one: its own process, T s later SIGTERM again, KillWait later SIGKILL):
        dispatch-slurm doctor --signal TERM@20 --kill-wait 5 --ranks 2 -- \\
            torchrun --nproc-per-node 2 train.py
    A running test job (it ends; every rank's handler records under --root):
        dispatch-slurm doctor --script train.sbatch --job 1234 --ranks 4 --root /scratch/me/run1"""
    if command and job_id:
        raise click.UsageError("give either a COMMAND (a local rehearsal) or --job, not both")
    sig, stack = _wiring(script, sig, where, launcher, wrapped, processes, command)
    conf, partition = _slurm_conf(partition, False if command and use_slurm is None else use_slurm, job_id)
    conf = _overrides(conf, kill_wait, grace_time, preempt_mode, send_user_signal)
    rehearsal = bool(command or job_id)
    if rehearsal and sig is None and not preempt:
        raise click.UsageError("a rehearsal of the time limit needs the job's --signal (or --script), "
                               "or --preempt")
    sig_ = sig or rules.Signal("TERM", False, 60)
    findings = rules.check(sig, stack, conf, grace, save_seconds) + _signal_at_once(script, sig)
    wins = rules.windows(sig, stack, conf)
    table, run = [], None
    if rehearsal:
        window = wins.get("preemption" if preempt else "time limit") or \
            ((conf.grace_time if preempt else sig_.seconds) + conf.kill_wait)
        if command:
            run, table = _local(list(command), sig_, conf, ranks, ready_timeout, preempt, probe_dir, every_process)
        else:
            run, table = _on_job(job_id, sig_, conf, ranks, ready_timeout, preempt, probe_dir, root)
        findings = _measured(findings, table, run, window, sig, sig_, stack, conf, grace, save_seconds, ranks, preempt)
    _emit(as_json, sig, stack, conf, partition, wins, table, findings, run)
    sys.exit(1 if findings else 0)


def _emit(as_json, sig, stack, conf, partition, wins, table, findings, run) -> None:
    if not as_json:
        click.echo(render(sig, stack, conf, partition, wins, table, findings, run), nl=False)
        return
    click.echo(json.dumps({"signal": str(sig) if sig else None, "stack": asdict(stack), "slurm": asdict(conf),
                           "partition": partition, "windows": wins, "ranks": [asdict(r) for r in table],
                           "run": None if run is None else asdict(run),
                           "findings": [asdict(f) for f in findings]}, indent=1))


def _measured(findings, table, run, window, sig, sig_, stack, conf, grace, save_seconds, ranks, preempt):
    """The wiring's findings, re-checked with the signals the handlers say they catch (over
    the guess), plus what the measured run says that the wiring did not."""
    handled = {n[3:] for r in table for n in r.signals}
    if handled:
        findings = rules.check(sig, stack, conf, grace, save_seconds, handled=handled)
    seen = {f.code for f in findings}
    path = "preemption" if preempt else "time limit"
    lim = rules.limits(sig, stack, conf, handled or None).get(path)
    binds = rules.binding(path, lim, sig, stack, conf) if lim is not None and lim.seconds > 0 else None
    return findings + [f for f in rules.verdict(table, ranks, window, run.exit_code, stack.launcher,
                                                None if preempt else sig_.seconds, binds)
                       if f.code not in seen or f.code == "save-too-long"]


def _local(argv, sig, conf, ranks, ready_timeout, preempt, probe_dir, every_process):
    from ..runtime.rehearse import Rehearsal
    where = probe_dir or tempfile.mkdtemp(prefix="dispatch-doctor-")
    os.makedirs(where, exist_ok=True)
    r = Rehearsal(argv, where, every_process=every_process)
    try:
        run = r.rehearse(sig, conf, ranks, ready_timeout, preempt)
    except FileNotFoundError as e:
        raise DispatchError(f"cannot run {argv[0]!r}: {e.strerror}") from None
    return run, rules.rows(probe.read(where), run.sent_at or time.time(), run.end_at or time.time())


def _job_probes(root, job_id):
    """The probe folders under ROOT's exec folders that hold records of ``job_id``."""
    exec_dir = os.path.join(root, "exec")
    found = []
    for attempt in sorted(os.listdir(exec_dir)) if os.path.isdir(exec_dir) else []:
        where = os.path.join(exec_dir, attempt, probe.DIRNAME)
        if any(str(p.get("installed", {}).get("job")) == str(job_id) for p in probe.read(where).values()):
            found.append(where)
    return found


def _on_job(job_id, sig, conf, ranks, ready_timeout, preempt, probe_dir, root):
    """The rehearsal on a running job: wait for its handlers, scancel as Slurm would, wait
    for its end (bounded), read the records."""
    from ..runtime.rehearse import Run
    from ..slurm.client import Slurm
    if probe_dir is None and root is None:
        raise click.UsageError("--job needs --root (or $DISPATCH_CHECKPOINT) or --probe-dir: where the ranks record")
    s, run = Slurm(), Run()

    def records():
        dirs = [probe_dir] if probe_dir else _job_probes(root, job_id)
        out = {}
        for d in dirs:
            out.update({k: v for k, v in probe.read(d).items() if str(v.get("installed", {}).get("job")) == str(job_id)})
        return out
    run.ready = _until_ready(s, job_id, records, ranks, time.monotonic() + ready_timeout)
    run.sent_at = time.time()
    _send(s, job_id, sig, conf, preempt, run)
    job = _until_ended(s, job_id, run.end_at - conf.kill_wait)
    if job is None or not job.ended:
        s.cancel(job_id)
        run.log.append((round(time.time() - run.sent_at, 2), f"{'GraceTime over' if preempt else 'the limit'}: "
                        "scancel (SIGTERM, KillWait, SIGKILL)"))
        job = _until_ended(s, job_id, time.time() + conf.kill_wait + 30)
    run.exit_code = None if job is None else job.exit_code
    run.log.append((round(time.time() - run.sent_at, 2), f"job {job_id} {job.state if job else 'gone'}"))
    _until_settled(s, job_id, job, records, run, time.time() + conf.kill_wait + SETTLE_S)
    return run, rules.rows(records(), run.sent_at, run.end_at)


SETTLE_S = 60.0  # past KillWait: a job's epilogs and the kill of its last processes (COMPLETING)
VISIBLE_S = 10.0  # once no process of the job is left: for the last records to be seen (NFS)


def _until_settled(s, job_id, job, records, run, deadline: float) -> None:
    """After the job ended, before judging: wait until it left COMPLETING (no process of
    it is left to write) and every rank's handler has its exit record, polling both; past
    ``deadline`` (or, once nothing of the job is left, VISIBLE_S more), say in the run's
    log which is missing. A job that "ended" may still be COMPLETING: its ranks may still
    be saving and publishing in KillWait, and a record read then says "published no"."""
    def note(what):
        run.log.append((round(time.time() - run.sent_at, 2), what))
    while job is not None and "COMPLETING" in job.states and time.time() < deadline:
        time.sleep(0.5)
        job = s.find_job(job_id)
    if job is not None and "COMPLETING" in job.states:
        note(f"job {job_id} still COMPLETING after the wait: its ranks may still be writing, and the table "
             "below may miss what they did last")
        return
    settled = min(deadline, time.time() + VISIBLE_S)
    while any("exit" not in p for p in records().values() if "installed" in p) and time.time() < settled:
        time.sleep(0.5)
    missing = [(p["installed"].get("rank"), host, pid) for (host, pid), p in records().items()
               if "installed" in p and "exit" not in p]
    note(f"job {job_id} no longer COMPLETING" + ("; every rank's exit record is there" if not missing else
         "; no exit record from " + ", ".join(f"rank {'?' if r is None else r} ({h} pid {pid})" for r, h, pid in missing)
         + ": killed before it exited (or its record is not visible here yet)"))


def _until_ready(s, job_id, records, ranks, deadline) -> int:
    """Poll the probe records until ``ranks`` handlers are installed (or the deadline);
    a job that ends first is an error. Returns how many were."""
    while sum("installed" in p for p in records().values()) < ranks and time.monotonic() < deadline:
        job = s.find_job(job_id)
        if job is None or job.ended:
            raise DispatchError(f"job {job_id} ended before its handlers reported (state {job and job.state})")
        time.sleep(1)
    return sum("installed" in p for p in records().values())


def _send(s, job_id, sig, conf, preempt, run) -> None:
    """scancel as Slurm would signal: a preemption (SIGTERM, or the job's signal with
    send_user_signal), or the time limit's early signal; sets when the kill comes."""
    if preempt:
        name = sig.name if conf.send_user_signal else "TERM"
        batch = sig.batch and conf.send_user_signal
        run.end_at = run.sent_at + conf.grace_time + conf.kill_wait
    else:
        name, batch = sig.name, sig.batch
        run.end_at = run.sent_at + sig.seconds + conf.kill_wait
    s.cancel(job_id, name, batch=batch)
    run.log.append((0.0, f"scancel --signal={name}{' --batch' if batch else ''} {job_id}"))


def _until_ended(s, job_id, t):
    job = s.find_job(job_id)
    while job is not None and not job.ended and time.time() < t:
        time.sleep(0.5)
        job = s.find_job(job_id)
    return job


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--signal", "sigs", metavar=options.SIGNAL_METAVAR, multiple=True, envvar="DISPATCH_SIGNAL",
              show_envvar=True, callback=options.launch_signals, help="a save signal besides SIGTERM: the job's "
              "--signal, as sbatch takes it (only SIG matters here); once per signal")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def launch(sigs, command):
    """Run a launcher (torchrun, accelerate launch, python) so that a save signal reaches
    every rank, torchrun does not SIGKILL them 30 s later, and a saved preemption exits 0.

    \b
        srun --ntasks-per-node=1 dispatch-slurm launch -- torchrun --nproc-per-node 4 train.py
        dispatch-slurm launch --signal USR2 -- accelerate launch train.py"""
    from ..runtime.launch import launch as run
    env = dict(os.environ)
    if sigs:
        env["DISPATCH_SIGNAL"] = sigs
    try:
        code = run(list(command), env)
    except FileNotFoundError as e:
        raise DispatchError(f"cannot run {command[0]!r}: {e.strerror}") from None
    except (AttributeError, ValueError) as e:
        raise DispatchError(f"--signal {sigs!r}: not a signal ({e})") from None
    sys.exit(code)


