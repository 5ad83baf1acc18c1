"""The supervisor's commands: run, plan, supersede, release."""

import json
import signal
import sys

import click

from .. import supervisor
from ..contract.durations import fmt_duration
from . import common, options


def _supervisor_options(fn):
    """Options of run, plan and supersede. Left out, they come from the root's record (a
    resumed or superseded job) or the defaults shown."""
    opts = [
        click.option("--resubmit", type=click.IntRange(0), help="resubmissions allowed after a failure, "
                     "an admin's cancel, preemption or node failure  [default: 0]"),
        click.option("--continuations", type=click.IntRange(0), help="next executions allowed after a time-limit "
                     "end (TIMEOUT, or COMPLETED after the signal); a chain that publishes no higher step "
                     f"{supervisor.STALLS} times in a row is stopped  [default: {supervisor.DEFAULTS['continuations']}]"),
        click.option("--shared-checkpoint/--no-shared-checkpoint", "shared", default=None,
                     help="the job cannot isolate its writes: every recovery becomes a hold for a person"),
        options.duration_option("--hold-for", above=True, help_="how long a hold waits for an answer  "
                                f"[default: {fmt_duration(supervisor.DEFAULTS['hold_for'])}]"),
        options.duration_option("--cessation-interval", above=True, help_="how often the cessation signal is "
                                f"asked during a hold  [default: {fmt_duration(supervisor.DEFAULTS['cessation_interval'])}]"),
        click.option("--cessation-cmd", help="the site's cessation signal: exit 0 ceased, 1 not ceased, "
                     "else cannot tell; placeholders {job} {restart} {root} {generation} {submission} {epoch} "
                     "{attempt} {cluster} {nodes} {started}  [default: " + supervisor.DEFAULT_CESSATION_CMD + "]"),
        click.option("--via", type=click.Choice(["auto", "spank", "env"]), help="pass G and N by the SPANK "
                     "plugin's options, or exported in the environment (the script runs `dispatch-slurm env`); "
                     "auto: the plugin's where sbatch has them  [default: auto]"),
        options.grace_option(),
        click.option("--signal", "sig", metavar=options.SIGNAL_METAVAR, help=options.SIGNAL_HELP),
        click.option("--keep-last", type=click.IntRange(1), metavar="K", help="after each execution ends, "
                     "`dispatch-slurm gc ROOT --keep-last K`  [default: no gc]"),
        options.poll_option("the job", supervisor.DEFAULT_POLL, 0.1),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _options(resubmit, continuations, shared, hold_for, cessation_interval, cessation_cmd, via, grace, sig=None,
             keep_last=None) -> dict:
    sig, grace = options.signal_grace(sig, grace)
    return {"resubmit": resubmit, "continuations": continuations, "shared": shared, "via": via, "grace": grace,
            "cessation_cmd": cessation_cmd, "signal": sig, "keep_last": keep_last, "hold_for": hold_for,
            "cessation_interval": cessation_interval}


def _supervise(fn, *args):
    """Run a supervisor to its end: its message on stderr, its outcome as the exit code
    (0 done or superseded, 1 failed, 3 held after the hold expired)."""
    def stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    try:
        result = fn(*args)
    except KeyboardInterrupt:
        roots = args[0] if isinstance(args[0], str) else " ".join(args[0])
        click.echo("dispatch-slurm: supervisor stopped by a signal; the job is left as it is: "
                   f"`dispatch-slurm run {roots}` resumes from the record", err=True)
        sys.exit(130)
    for line in result.message.splitlines():
        click.echo(f"dispatch-slurm: {line}", err=True)
    sys.exit(result.code)


class _RootsThenSbatch(common.RootCommand):
    """``run ROOT [ROOT...] [OPTIONS] -- SBATCH_ARGS``: before ``--``, the roots and run's
    options; after it, sbatch's arguments. Without ``--``: ROOT, then sbatch's (as sbatch
    arguments never start with a root, one root is the only reading)."""

    def parse_args(self, ctx, args):
        args = self.roots_first(args)
        if "--" not in args:
            return super().parse_args(ctx, args)
        i = args.index("--")
        rest = super().parse_args(ctx, args[:i])
        more = ctx.params.get("sbatch_args") or ()
        ctx.params["more_roots"] = tuple(common.absolute_root(r, False) for r in more)
        ctx.params["sbatch_args"] = tuple(args[i + 1:])
        return rest

    def collect_usage_pieces(self, ctx):
        return ["[OPTIONS]", "ROOT [ROOT]...", "[-- SBATCH_ARGS...]"]


@click.command(cls=_RootsThenSbatch)
@common.root_argument()
@_supervisor_options
@click.option("--once", is_flag=True, help="do what needs doing now, then exit 0 (resumable: for scrontab "
              "or cron instead of a process that lives for days on a login node)")
@options.duration_option("--max-poll", minimum=0.1, maximum=3600,
                         help_="the longest wait between two reads of Slurm while every followed job runs (a job that is "
                   "pending, starting or near its time limit is read every --poll)  [default: 6 x --poll]")
@click.option("--roots-from", type=click.Path(), metavar="PATH", help="also supervise every root this names, "
              "looked at every poll: a folder (each folder in it is a root) or a file (one root per line); "
              "a new root without a record gets this command's sbatch arguments")
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
def run(root, resubmit, continuations, shared, hold_for, cessation_interval, cessation_cmd, via, grace, sig, keep_last, poll, once,
        max_poll, roots_from, sbatch_args, more_roots=()):
    """Submit a job and supervise it: follow it through Slurm and, when an execution ends,
    apply the rules (`dispatch-slurm plan` shows them). Every fact goes to ROOT/record.jsonl;
    run again with only ROOT to resume after a crash (nothing is submitted twice).

        dispatch-slurm run /scratch/me/run1 --resubmit 3 -- --nodes=2 train.sbatch

    Many roots, one process: name them all before `--` (each gets its own job, record and
    rules; one Slurm read per poll serves them all); a root with %a and `--array=SPEC`
    among sbatch's arguments is one root and one job per array task.

    \b
        dispatch-slurm run /scratch/me/lr1 /scratch/me/lr2 --resubmit 1 -- train.sbatch
        dispatch-slurm run '/scratch/me/sweep/task%a' -- --array=0-99 train.sbatch

    Exit 0 done (or, with --once, still running), 1 failed, 2 error, 3 held (a hold
    expired unanswered); for many roots the worst of them (error, failed, held, done)."""
    opts = _options(resubmit, continuations, shared, hold_for, cessation_interval, cessation_cmd, via, grace, sig, keep_last)
    roots = [root, *more_roots]
    _supervise(supervisor.run, roots if len(roots) > 1 else root, opts, list(sbatch_args), poll, None, once,
               max_poll, roots_from)


@click.command(cls=common.RootCommand)
@common.root_argument()
@_supervisor_options
@click.option("--json", "as_json", is_flag=True)
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
def plan(root, resubmit, continuations, shared, hold_for, cessation_interval, cessation_cmd, via, grace, sig, keep_last, poll,
         as_json, sbatch_args):
    """Show what each rule will do for this job, before it starts: the sbatch command,
    and for a shared checkpoint the holds that stand in for recovery. With a record
    under ROOT and no arguments: the plan from where the job stands."""
    from ..slurm.client import Slurm
    opts = _options(resubmit, continuations, shared, hold_for, cessation_interval, cessation_cmd, via, grace, sig, keep_last)
    root = supervisor.normalize(root)
    state = supervisor.load_state(root)
    resuming = state.g is not None and not sbatch_args
    if resuming:
        supervisor.check_resume(opts, [], state.defn)
    defn = state.defn if resuming else {"g": 0, **supervisor.make_defn(opts, list(sbatch_args))}
    resolved, warning = supervisor.resolve_via(defn["via"], supervisor.plugin_options(Slurm()))
    warnings = tuple(w for w in (warning, supervisor.signal_warning(root, defn), supervisor.signal_refusal(defn, root))
                     if w)
    p = supervisor.plan({**defn, "via": resolved}, root, state if resuming else None, warnings=warnings,
                        warning=supervisor.submission_signal(defn, root))
    click.echo(json.dumps(p, indent=2) if as_json else supervisor.render_plan(p), nl=as_json)


@click.command(cls=common.RootCommand)
@common.root_argument()
@_supervisor_options
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
def supersede(root, resubmit, continuations, shared, hold_for, cessation_interval, cessation_cmd, via, grace, sig, keep_last,
              poll, sbatch_args):
    """Start generation G+1 of ROOT's job: record the supersession, cancel generation G's
    job (its supervisor stops), and carry on as the supervisor of G+1. Options and sbatch
    arguments left out are generation G's. Its saves outrank every save of G (the epoch's
    G part), and it can resume from them."""
    opts = _options(resubmit, continuations, shared, hold_for, cessation_interval, cessation_cmd, via, grace, sig, keep_last)
    _supervise(supervisor.supersede, root, opts, list(sbatch_args), poll)


@click.command(cls=common.RootCommand)
@common.root_argument()
@click.option("--message", "-m", help="why it is safe (kept in the record)")
@click.option("--json", "as_json", is_flag=True)
def release(root, message, as_json):
    """Answer the hold standing on ROOT: the old execution is known to have stopped, so
    the rule the hold replaced may apply. The supervisor picks it up at its next poll
    (or when `dispatch-slurm run ROOT` resumes). Exit 1 if no hold stands."""
    try:
        res = supervisor.release(root, message)
    except supervisor.NoHold as e:
        click.echo(f"dispatch-slurm: {e}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(res))
        return
    click.echo(f"released hold #{res['hold']} (job {res['job']} execution R={res['r']}): "
               f"{res['replaces']} applies next")
    if not res["supervisor_running"]:
        click.echo(f"no supervisor is running for {root}: `dispatch-slurm run {root}` applies it", err=True)


@click.command(cls=common.RootCommand)
@common.root_argument()
@click.option("--message", "-m", help="why (kept in the record)")
@options.poll_option("the job, when no supervisor runs", supervisor.DEFAULT_POLL, 0.1)
def stop(root, message, poll):
    """Stop supervising ROOT's job and cancel it: the supervisor (the running one, or this
    command when none runs) cancels the job, waits until Slurm says it ended, and finishes
    "stopped"; nothing is resubmitted. A plain `scancel` by the job's user means the same."""
    _supervise(supervisor.stop, root, message, poll)



