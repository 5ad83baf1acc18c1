"""`dispatch-slurm`: the command line. Thin: every rule lives in the modules.

Exit codes: 0 success; 1 a negative answer (`latest`: no publication); 2 an error,
printed as one line naming what was wrong."""

import functools
import json
import os
import re
import signal
import sys

import click

from . import env as envmod
from . import epoch as epochmod
from . import names, siteconf, store
from .errors import DispatchError

ROOT_HELP = "checkpoint root [default: $DISPATCH_CHECKPOINT]"


def fail(message: str, code: int = 2):
    click.echo(f"dispatch-slurm: error: {message}", err=True)
    sys.exit(code)


def refusals(fn):
    """Turn DispatchError and OSError into one line on stderr and exit 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DispatchError as e:
            fail(str(e))
        except OSError as e:
            fail(f"{e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}")
    return wrapper


def _root(root: str | None) -> str:
    root = root or os.environ.get("DISPATCH_CHECKPOINT")
    if not root:
        raise click.UsageError("no checkpoint root: pass --root or set DISPATCH_CHECKPOINT")
    return root


def _publication_json(root: str, p: names.Publication) -> dict:
    g, n, r = p.parts
    return {"name": p.name, "epoch": p.epoch, "generation": g, "submission": n, "restart": r,
            "step": p.step, "path": p.path, "abspath": os.path.join(root, p.path)}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dispatch-slurm")
def main():
    """Make overlapping executions of a Slurm job harmless: each execution writes its
    own folder, and saves become visible only by append-only publication."""


@main.command()
@click.argument("save", type=click.Path())
@click.option("--step", type=int, help="training step [default: from a checkpoint-<step> name]")
@click.option("--root", help=ROOT_HELP)
@click.option("--epoch", "epoch_", type=int, help="[default: $DISPATCH_EPOCH]")
@click.option("--json", "as_json", is_flag=True, help="print the publication as JSON")
@refusals
def publish(save, step, root, epoch_, as_json):
    """Publish SAVE (a folder or file inside the root) at (epoch, step).

    Durable when this returns; publishing the same save twice is an error."""
    root = _root(root)
    if epoch_ is None:
        text = os.environ.get("DISPATCH_EPOCH")
        if not text:
            raise click.UsageError("no epoch: pass --epoch or set DISPATCH_EPOCH")
        epoch_ = epochmod.parse_part("DISPATCH_EPOCH", text, 0, epochmod.EPOCH_MAX)
    if step is None:
        m = re.fullmatch(r"checkpoint-([0-9]+)", os.path.basename(os.path.normpath(save)))
        if m is None:
            raise click.UsageError("no step: pass --step (SAVE is not named checkpoint-<step>)")
        step = int(m[1])
    pub = store.publish(root, save, step, epoch_)
    click.echo(json.dumps(_publication_json(root, pub)) if as_json else pub.name)


@main.command()
@click.argument("root", required=False)
@click.option("--path", "path_only", is_flag=True, help="print only the save's absolute path")
@click.option("--json", "as_json", is_flag=True)
@refusals
def latest(root, path_only, as_json):
    """The latest publication of ROOT: greatest (epoch, step).

    Exit 0 found, 1 none published yet, 2 error (e.g. an entry that does not parse)."""
    root = _root(root)
    pub = store.latest(root)
    if pub is None:
        if as_json:
            click.echo("null")
        sys.exit(1)
    if path_only:
        click.echo(os.path.join(root, pub.path))
    elif as_json:
        click.echo(json.dumps(_publication_json(root, pub)))
    else:
        g, n, r = pub.parts
        click.echo(f"{os.path.join(root, pub.path)}\tstep {pub.step}\tG={g} N={n} R={r}")


@main.command("ls")
@click.argument("root", required=False)
@click.option("--json", "as_json", is_flag=True)
@refusals
def ls_(root, as_json):
    """Every publication of ROOT in (epoch, step) order, and whether its save still exists."""
    root = _root(root)
    pubs = store.publications(root)
    rows = []
    for p in pubs:
        d = _publication_json(root, p)
        d["exists"] = os.path.lexists(d["abspath"])
        rows.append(d)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    head = ("G", "N", "R", "STEP", "EXISTS", "PATH")
    table = [head] + [(str(d["generation"]), str(d["submission"]), str(d["restart"]),
                       str(d["step"]), "yes" if d["exists"] else "NO", d["path"]) for d in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    for row in table:
        cells = [c.rjust(w) for c, w in zip(row, widths)] + [row[-1]]
        click.echo("  ".join(cells))
    if not rows:
        click.echo(f"(no publication under {root}/{names.PUB})", err=True)


@main.group()
def epoch():
    """Compose or decompose DISPATCH_EPOCH = G*10^12 + N*10^6 + R."""


@epoch.command()
@click.argument("generation", type=int)
@click.argument("submission", type=int)
@click.argument("restart", type=int)
@refusals
def compose(generation, submission, restart):
    """Print the epoch of (G, N, R)."""
    click.echo(epochmod.compose(generation, submission, restart))


@epoch.command()
@click.argument("value")
@click.option("--json", "as_json", is_flag=True)
@refusals
def decompose(value, as_json):
    """Print G N R of an epoch."""
    g, n, r = epochmod.decompose(epochmod.parse_part("epoch", value, 0, epochmod.EPOCH_MAX))
    if as_json:
        click.echo(json.dumps({"generation": g, "submission": n, "restart": r}))
    else:
        click.echo(f"G={g} N={n} R={r}")


@main.command("env")
@click.option("--format", "fmt", type=click.Choice(["sh", "json", "dotenv"]), default="sh",
              show_default=True)
@click.option("--no-mkdir", is_flag=True, help="compute only; do not create the exec folder")
@refusals
def env_(fmt, no_mkdir):
    """Print this execution's DISPATCH_* variables and create its exec folder.

    Use inside the sbatch script:  eval "$(dispatch-slurm env)" """
    site = siteconf.load()
    values = envmod.compute(os.environ, site)
    if not no_mkdir:
        store.make_exec_dir(values["DISPATCH_CHECKPOINT"], values["DISPATCH_ATTEMPT"],
                            site.exec_mode, create_root="%a" in os.environ["DISPATCH_CHECKPOINT"])
    click.echo(envmod.render(values, fmt), nl=False)


@main.command()
@click.argument("root")
@click.option("--generation", type=int, default=0, show_default=True, help="G (supersessions)")
@click.option("--grace", type=int, help="seconds to checkpoint after SIGTERM (0..300)")
@click.option("--shared-checkpoint", is_flag=True, help="the job cannot isolate its writes")
@click.option("--json", "as_json", is_flag=True)
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED, required=True)
@refusals
def submit(root, generation, grace, shared_checkpoint, as_json, sbatch_args):
    """Allocate the next submission number N under ROOT, then sbatch SBATCH_ARGS with
    DISPATCH_CHECKPOINT/GENERATION/SUBMISSION exported to the job. Everything after
    `--` goes to sbatch unchanged.

        dispatch-slurm submit /scratch/me/run1 -- --nodes=2 train.sbatch"""
    from .slurm import Slurm
    if any(a == "--export" or a.startswith("--export=") for a in sbatch_args):
        raise click.UsageError("submit sets --export itself; put variables in your environment")
    inputs = {"DISPATCH_CHECKPOINT": names.normalize_root(root),
              "DISPATCH_GENERATION": str(generation)}
    if grace is not None:
        inputs["DISPATCH_GRACE"] = str(grace)
    if shared_checkpoint:
        inputs["DISPATCH_SHARED_CHECKPOINT"] = "1"
    # refuse bad input before a submission number is spent
    envmod.check_inputs(inputs, siteconf.load(), need_submission=False)
    n = store.allocate_submission(names.submission_dir(inputs["DISPATCH_CHECKPOINT"]))
    inputs["DISPATCH_SUBMISSION"] = str(n)
    export = "--export=ALL," + ",".join(inputs)  # names only: values come from the env
    job_id = Slurm().submit([export, *sbatch_args], env={**os.environ, **inputs})
    epoch_ = epochmod.compose(generation, n, 0)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "submission": n, "generation": generation,
                               "epoch": epoch_, "root": inputs["DISPATCH_CHECKPOINT"]}))
    else:
        click.echo(f"submitted job {job_id} as submission {n} (epoch {epoch_})")


@main.command()
@click.option("--exec-dir", help="the folder the trainer saves into [default: $DISPATCH_EXEC_DIR]")
@click.option("--root", help=ROOT_HELP)
@click.option("--epoch", "epoch_", type=int, help="[default: $DISPATCH_EPOCH]")
@click.option("--marker", help="marker mode: a save is complete once <save>/MARKER exists "
              "(a file save: <save>.MARKER) [default: Hugging Face, <save>/trainer_state.json]")
@click.option("--pattern", default=r"checkpoint-([0-9]+)", show_default=True,
              help="regex a save's name must match in full; its one group is the step")
@click.option("--once", is_flag=True, help="one scan, then exit")
@click.option("--until-pid", type=int, help="exit after a final scan once process PID has exited; "
              "SIGTERM is then ignored, so the trainer's last save (in its grace window) is published")
@click.option("--poll", is_flag=True, help="poll instead of inotify")
@click.option("--interval", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
              help="seconds between polls")
@click.option("--timeout", type=click.FloatRange(min=0.01), default=300.0, show_default=True,
              help="a scan (listing, fsync, publication) taking longer is an error")
@click.option("--no-sync", is_flag=True, help="do not fsync a save's files before publishing it")
@refusals
def watch(exec_dir, root, epoch_, marker, pattern, once, until_pid, poll, interval, timeout, no_sync):
    """Publish each complete save in the exec folder, in step order, at this execution's
    epoch; one line per publication on stdout. Stops at the first error (exit 2).

    Run it beside a trainer that cannot publish itself:

        dispatch-slurm watch --until-pid $TRAINER_PID &"""
    from . import watch as watchmod
    root = _root(root)
    exec_dir = exec_dir or os.environ.get("DISPATCH_EXEC_DIR")
    if not exec_dir:
        raise click.UsageError("no exec folder: pass --exec-dir or set DISPATCH_EXEC_DIR")
    if epoch_ is None:
        text = os.environ.get("DISPATCH_EPOCH")
        if not text:
            raise click.UsageError("no epoch: pass --epoch or set DISPATCH_EPOCH")
        epoch_ = epochmod.parse_part("DISPATCH_EPOCH", text, 0, epochmod.EPOCH_MAX)
    layout = watchmod.Layout(marker, pattern)

    def said(pub):
        click.echo(f"published step {pub.step} {pub.path}")
        sys.stdout.flush()
    w = watchmod.Watcher(exec_dir, root, epoch_, layout, sync=not no_sync, on_publish=said)
    if until_pid is not None:  # Slurm signals the watch too; it must outlive the trainer
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watchmod.run(w, poll=poll, interval=interval, once=once, until_pid=until_pid, timeout=timeout)


@main.command()
@click.option("--scenario", "scenarios", multiple=True, default=("cancel", "preempt", "partition"),
              type=click.Choice(["cancel", "preempt", "partition", "local"]), show_default=True,
              help="repeat for several; local: processes on this machine, no Slurm")
@click.option("--mode", type=click.Choice(["naive", "dispatch", "both"]), default="both", show_default=True)
@click.option("--trials", type=click.IntRange(1), default=1, show_default=True)
@click.option("--target", type=click.Choice(["docker-slurm", "slurm"]), default="docker-slurm", show_default=True,
              help="docker-slurm: build and start the embedded cluster; slurm: the cluster your sbatch reaches")
@click.option("--suite", type=click.Choice(["bookworm", "trixie", "sid"]), default="trixie", show_default=True)
@click.option("--tracking", type=click.Choice(["linuxproc", "cgroup"]),
              help="docker-slurm's process tracking  [default: the profile's: fast linuxproc, site cgroup]")
@click.option("--profile", type=click.Choice(["fast", "site"]), default="fast", show_default=True,
              help="docker-slurm timings: fast (CI) or site (Slurm's defaults)")
@click.option("--dir", "base", help="--target slurm: a folder on a filesystem every node shares")
@click.option("--nodes", help="--target slurm: comma-separated nodes the trial may use")
@click.option("--interval", type=click.FloatRange(0.05), default=1.0, show_default=True,
              help="seconds between the trainer's saves")
@click.option("--warmup", type=click.FloatRange(0), default=3.0, show_default=True,
              help="seconds a replacement loads before its first step")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write every result as JSON")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="a PNG timeline (needs matplotlib)")
@refusals
def trial(scenarios, mode, trials, target, suite, tracking, profile, base, nodes, interval, warmup, json_path,
          plot_path):
    """Overlap trials: run a job, cancel / preempt / partition it, start the replacement
    as soon as Slurm says the old execution ended, and measure what the overlap did:
    how long the old one kept writing, mixed folders, lost saves, wrong resumes."""
    from dataclasses import asdict

    from . import trial as trialmod
    modes = ("naive", "dispatch") if mode == "both" else (mode,)
    results = trialmod.run(list(scenarios), modes, trials, target, suite, profile, base,
                           nodes.split(",") if nodes else None, interval, warmup,
                           log=lambda m: click.echo(m, err=True), tracking=tracking)
    click.echo(trialmod.summarize(results))
    if json_path:
        with open(json_path, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    if plot_path:
        trialmod.plot(results, plot_path)


# ---- the supervisor (issue 7): run, plan, supersede, release, ceased -------------------------

def _supervisor_options(fn):
    """Options of run, plan and supersede. Left out, they come from the root's record (a
    resumed or superseded job) or the defaults shown."""
    from .supervisor import DEFAULT_CESSATION_CMD, DEFAULT_POLL
    opts = [
        click.option("--resubmit", type=click.IntRange(0), help="resubmissions allowed after a failure, "
                     "cancel, preemption or node failure  [default: 0]"),
        click.option("--shared-checkpoint/--no-shared-checkpoint", "shared", default=None,
                     help="the job cannot isolate its writes: every recovery becomes a hold for a person"),
        click.option("--hold-for", help="how long a hold waits for an answer (90, 30m, 24h)  [default: 24h]"),
        click.option("--cessation-interval", help="how often the cessation signal is asked during a hold  "
                     "[default: 60s]"),
        click.option("--cessation-cmd", help="the site's cessation signal: exit 0 ceased, 1 not ceased, "
                     "else cannot tell; placeholders {job} {restart} {root} {generation} {submission} {epoch} "
                     "{attempt} {cluster} {nodes} {started}  [default: " + DEFAULT_CESSATION_CMD + "]"),
        click.option("--via", type=click.Choice(["spank", "env"]), help="pass G and N by the SPANK plugin's "
                     "options, or exported in the environment (the script runs `dispatch-slurm env`)  "
                     "[default: spank]"),
        click.option("--grace", type=click.IntRange(0, 300), help="seconds to checkpoint after SIGTERM"),
        click.option("--poll", type=click.FloatRange(min=0.1), default=DEFAULT_POLL, show_default=True,
                     help="seconds between two looks at the job"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _options(resubmit, shared, hold_for, cessation_interval, cessation_cmd, via, grace) -> dict:
    from .supervisor import parse_duration
    return {"resubmit": resubmit, "shared": shared, "via": via, "grace": grace, "cessation_cmd": cessation_cmd,
            "hold_for": None if hold_for is None else parse_duration(hold_for, "--hold-for"),
            "cessation_interval": None if cessation_interval is None
            else parse_duration(cessation_interval, "--cessation-interval")}


def _supervise(fn, *args):
    """Run a supervisor to its end: its message on stderr, its outcome as the exit code
    (0 done or superseded, 1 failed, 3 held after the hold expired)."""
    def stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    try:
        result = fn(*args)
    except KeyboardInterrupt:
        fail("supervisor stopped by a signal; the job is left as it is: "
             f"`dispatch-slurm run {args[0]}` resumes from the record", 130)
    click.echo(f"dispatch-slurm: {result.message}", err=True)
    sys.exit(result.code)


@main.command()
@click.argument("root")
@_supervisor_options
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@refusals
def run(root, resubmit, shared, hold_for, cessation_interval, cessation_cmd, via, grace, poll, sbatch_args):
    """Submit a job and supervise it: follow it through Slurm and, when an execution ends,
    apply the rules (`dispatch-slurm plan` shows them). Every fact goes to ROOT/record.jsonl;
    run again with only ROOT to resume after a crash (nothing is submitted twice).

        dispatch-slurm run /scratch/me/run1 --resubmit 3 -- --nodes=2 train.sbatch

    Exit 0 done, 1 failed, 2 error, 3 held (a hold expired unanswered)."""
    from . import supervisor
    opts = _options(resubmit, shared, hold_for, cessation_interval, cessation_cmd, via, grace)
    _supervise(supervisor.run, root, opts, list(sbatch_args), poll)


@main.command()
@click.argument("root")
@_supervisor_options
@click.option("--json", "as_json", is_flag=True)
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@refusals
def plan(root, resubmit, shared, hold_for, cessation_interval, cessation_cmd, via, grace, poll, as_json,
         sbatch_args):
    """Show what each rule will do for this job, before it starts: the sbatch command,
    and for a shared checkpoint the holds that stand in for recovery. With a record
    under ROOT and no arguments: the plan from where the job stands."""
    from . import supervisor
    opts = _options(resubmit, shared, hold_for, cessation_interval, cessation_cmd, via, grace)
    root = supervisor.normalize(root)
    state = supervisor.load_state(root)
    if state.g is not None and not sbatch_args:
        supervisor.check_resume(opts, [], state.defn)
        p = supervisor.plan(state.defn, root, state)
    else:
        p = supervisor.plan({"g": 0, **supervisor.make_defn(opts, list(sbatch_args))}, root)
    click.echo(json.dumps(p, indent=2) if as_json else supervisor.render_plan(p), nl=as_json)


@main.command()
@click.argument("root")
@_supervisor_options
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@refusals
def supersede(root, resubmit, shared, hold_for, cessation_interval, cessation_cmd, via, grace, poll,
              sbatch_args):
    """Start generation G+1 of ROOT's job: record the supersession, cancel generation G's
    job (its supervisor stops), and carry on as the supervisor of G+1. Options and sbatch
    arguments left out are generation G's. Its saves outrank every save of G (the epoch's
    G part), and it can resume from them."""
    from . import supervisor
    opts = _options(resubmit, shared, hold_for, cessation_interval, cessation_cmd, via, grace)
    _supervise(supervisor.supersede, root, opts, list(sbatch_args), poll)


@main.command()
@click.argument("root")
@click.option("--message", "-m", help="why it is safe (kept in the record)")
@click.option("--json", "as_json", is_flag=True)
@refusals
def release(root, message, as_json):
    """Answer the hold standing on ROOT: the old execution is known to have stopped, so
    the rule the hold replaced may apply. The supervisor picks it up at its next poll
    (or when `dispatch-slurm run ROOT` resumes). Exit 1 if no hold stands."""
    from . import supervisor
    try:
        res = supervisor.release(root, message)
    except DispatchError as e:
        if str(e).startswith("no hold stands"):
            fail(str(e), 1)
        raise
    if as_json:
        click.echo(json.dumps(res))
        return
    click.echo(f"released hold #{res['hold']} (job {res['job']} execution R={res['r']}): "
               f"{res['replaces']} applies next")
    if not res["supervisor_running"]:
        click.echo(f"no supervisor is running for {root}: `dispatch-slurm run {root}` applies it", err=True)


@main.command()
@click.argument("job_id", type=int)
@click.option("--restart", "-r", type=click.IntRange(0), default=0, show_default=True,
              help="R: which execution of the job")
@click.option("--root", help="checkpoint root: its epilog records, and the supervisor's record for G, N, "
              "nodes and start")
@click.option("--generation", type=click.IntRange(0), help="G [default: from the record]")
@click.option("--submission", type=click.IntRange(1), help="N [default: from the record]")
@click.option("--cluster", help="ClusterName [default: Slurm's]")
@click.option("--nodes", help="comma-separated nodes that ran the execution [default: record, or Slurm's]")
@click.option("--started", type=int, help="Unix time the execution started [default: record, or Slurm's]")
@click.option("--json", "as_json", is_flag=True, help="the answer with the evidence per node")
@refusals
def ceased(job_id, restart, root, generation, submission, cluster, nodes, started, as_json):
    """Have the processes of execution R of JOB_ID stopped? Exit 0 ceased, 1 not ceased,
    2 cannot tell. Ceased needs evidence: Slurm says the execution ended and nothing is
    completing, and every node that ran it recorded its Epilog for it or rebooted since it
    started. A node that is down or not responding is never evidence."""
    from . import cessation
    from .slurm import Slurm
    if root:
        root = names.normalize_root(root)
    node_list = [x for x in nodes.split(",") if x] if nodes else None
    ans = cessation.check(Slurm(), job_id, restart, root=root, generation=generation, submission=submission,
                          cluster=cluster, nodes=node_list, started=started)
    click.echo(json.dumps(ans) if as_json else cessation.render(ans), nl=as_json)
    sys.exit(cessation.exit_code(ans))
