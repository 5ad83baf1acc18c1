"""Commands used around and inside a job: env, submit, watch."""

import json
import os
import shlex
import signal
import sys
from collections.abc import Mapping

import click

from .. import store
from ..contract import env as envmod
from ..contract import epoch as epochmod
from ..contract import layout, names
from ..errors import DispatchError
from ..slurm import sitefile
from ..store import epochs
from . import common, options


@click.command("env")
@click.option("--format", "fmt", type=click.Choice(["sh", "json", "dotenv"]), default="sh", show_default=True)
@click.option("--no-mkdir", is_flag=True, help="compute and check only; create nothing (no claim, no exec folder)")
@click.option("--local", is_flag=True, help="a new execution on this machine, without Slurm: root "
              f"$DISPATCH_CHECKPOINT, else ./{envmod.LOCAL_ROOT} (created); a new submission number each time")
def env_(fmt, no_mkdir, local):
    """Print this execution's DISPATCH_* variables, claim its epoch and create its exec
    folder. Refused: a DISPATCH_SUBMISSION never allocated under ROOT/sub/, and an epoch
    another job already claimed (ROOT/epochs/). A job submitted with a plain sbatch
    (DISPATCH_SUBMISSION unset) gets its number from its first execution, recorded under
    ROOT/jobs/<cluster>.<job id>, where its requeues find the same one.

    Use inside the sbatch script:  eval "$(dispatch-slurm env)"

    When it fails in sh format with stdout not a terminal, it prints `exit 2` for the
    eval as well as the error on stderr, so the job script stops there instead of
    training without its exec folder (eval of an empty string succeeds).

    With --local (a laptop, a login node: no Slurm), each call is a new execution of
    cluster "local": it allocates the next submission number under the root, as
    `submit` does, so a later execution outranks an earlier one; latest, publish, watch,
    the preemption handler and the integrations then work as in a job."""
    inputs: Mapping[str, str] = os.environ
    try:
        site = sitefile.load()
        st, inputs = _local_inputs() if local else (epochs.job_store(os.environ), os.environ)
        values = epochs.enter(st, inputs, site, create=not no_mkdir)
        if local and not no_mkdir:
            _started_here(st, values)
    except (DispatchError, OSError):
        if local and inputs is not os.environ:
            _unallocate(st, inputs)
        if fmt == "sh" and not sys.stdout.isatty():
            click.echo("echo 'dispatch-slurm env failed (see above): stopping the job script' >&2; exit 2")
        raise
    _unpublished(st, values)
    _no_view(values, local)
    click.echo(envmod.render(values, fmt), nl=False)


@click.command(cls=common.RootCommand)
@common.root_argument()
@click.option("--generation", type=click.IntRange(0, epochmod.G_MAX), default=0, show_default=True,
              help="G (supersessions)")
@options.grace_option()
@click.option("--shared-checkpoint", is_flag=True, help="the job cannot isolate its writes")
@click.option("--signal", "sig", metavar=options.SIGNAL_METAVAR, help=options.SIGNAL_HELP)
@click.option("--json", "as_json", is_flag=True)
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED, required=True)
def submit(root, generation, grace, shared_checkpoint, sig, as_json, sbatch_args):
    """Allocate the next submission number N under ROOT, then sbatch SBATCH_ARGS with
    DISPATCH_CHECKPOINT/GENERATION/SUBMISSION exported to the job. Everything after
    `--` goes to sbatch unchanged.

        dispatch-slurm submit /scratch/me/run1 -- --nodes=2 train.sbatch"""
    from ..slurm.client import Slurm
    sig, grace = options.signal_grace(sig, grace)
    if any(a == "--export" or a.startswith("--export=") for a in sbatch_args):
        raise click.UsageError("submit sets --export itself; put variables in your environment")
    inputs = {"DISPATCH_CHECKPOINT": names.normalize_root(root), "DISPATCH_GENERATION": str(generation)}
    if grace is not None:
        inputs["DISPATCH_GRACE"] = str(grace)
    if shared_checkpoint:
        inputs["DISPATCH_SHARED_CHECKPOINT"] = "1"
    if sig is not None:
        sbatch_args = (_signal(inputs["DISPATCH_CHECKPOINT"], sig, grace), *sbatch_args)
    # refuse bad input before a submission number is spent
    envmod.check_inputs(inputs, sitefile.load(), need_submission=False)
    from ..supervisor import lead_refusal
    refused = lead_refusal({"cwd": os.getcwd()}, list(sbatch_args), {})
    if refused:
        raise DispatchError(refused)
    n = store.allocate_submission(names.submission_dir(inputs["DISPATCH_CHECKPOINT"]))
    inputs["DISPATCH_SUBMISSION"] = str(n)
    export = "--export=ALL," + ",".join(inputs)  # names only: values come from the env
    job_id = Slurm().submit([export, *sbatch_args], env={**os.environ, **inputs})
    epoch_ = epochmod.compose(generation, n, 0)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "submission": n, "generation": generation,
                               "epoch": epoch_, "root": inputs["DISPATCH_CHECKPOINT"]}))
    else:
        click.echo(f"submitted job {job_id} as submission {n} (epoch {epoch_}): sbatch {shlex.join(sbatch_args)}")


@click.command()
@click.option("--exec-dir", envvar="DISPATCH_EXEC_DIR", show_envvar=True, required=True,
              help="the folder the trainer saves into")
@common.root_option()
@common.epoch_option()
@click.option("--marker", help="marker mode: a save is complete once <save>/MARKER exists "
              "(a file save: <save>.MARKER)  [default: Hugging Face, <save>/trainer_state.json]")
@click.option("--pattern", default=names.STEP_PATTERN, show_default=True,
              help="regex a save's name must match in full; its one group is the step")
@click.option("--once", is_flag=True, help="one scan, then exit")
@click.option("--until-pid", type=click.IntRange(1, 2**22), help="exit after a final scan once process PID has "
              "exited (refused if it does not exist at the start); SIGTERM is then ignored, so the trainer's last "
              "save (in its grace window) is published. Exit 1 when saves were left unpublished above the last "
              "one published")
@options.watch_poll_options
@options.duration_option("--timeout", minimum=0.01, maximum=86400, default=300.0, show_default=True,
                         help_="a scan (listing, fsync, publication) taking longer is an error")
@options.duration_option("--incomplete-after", maximum=86400, default=300.0, show_default=True,
                         help_="how long a save may stay incomplete before it is named on stderr")
@click.option("--no-sync", is_flag=True, help="do not fsync a save's files before publishing it")
def watch(exec_dir, root, epoch_, marker, pattern, once, until_pid, poll_s, no_inotify, interval, timeout,
          incomplete_after, no_sync):
    """Publish each complete save in the exec folder, in step order, at this execution's
    epoch; one line per publication on stdout. Stops at the first error (exit 2).

    Run it beside a trainer that cannot publish itself, and end the job script with the
    trainer's exit status (a bare `wait` would turn a crash into success):

    \b
        python train.py --output-dir "$DISPATCH_EXEC_DIR" & T=$!
        dispatch-slurm watch --until-pid $T
        wait $T

    A save is never published before it is complete (see --marker), nor while one of its
    files is torn (a torch.save zip without its central directory, a safetensors file
    shorter than its header says): it stays pending, named on stderr once it has been so
    for --incomplete-after seconds, and again when the watch ends. With --until-pid the
    watch exits 1 when the trainer ended leaving such saves above the last step published,
    so the job fails instead of ending with its progress unkept. When the trainer's process
    (srun) ends while the execution's processes run on on this node (a frozen slurmd: Slurm
    took the node for dead, nothing killed them), the watch publishes until they are gone.
    Ctrl-C (SIGINT) ends it by that signal, after it names what it left unpublished."""
    from ..runtime import watch as watchmod
    poll, interval = options.watch_polling(poll_s, no_inotify, interval)
    if until_pid is not None:
        watchmod.check_pid(until_pid)
    root, epoch_ = store.env_root(root), store.env_epoch(epoch_)
    layout = watchmod.Layout(marker, pattern)

    def said(pub):
        click.echo(f"published step {pub.step} {common.text(pub.path)}")
        sys.stdout.flush()
    w = watchmod.Watcher(exec_dir, root, epoch_, layout, sync=not no_sync, on_publish=said)
    click.echo(f"dispatch-slurm watch: {w.describe()}", err=True)
    if until_pid is not None:  # Slurm signals the watch too; it must outlive the trainer
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        watchmod.run(w, poll=poll, interval=interval, once=once, until_pid=until_pid, timeout=timeout,
                     incomplete_after=incomplete_after, linger=_lingering(w) if until_pid is not None else None)
    except KeyboardInterrupt:
        _unfinished(w, root)
        raise  # main() dies by SIGINT, as the shell expects
    if once:
        if not w.published:
            incomplete = f" ({len(w.pending)} incomplete: {', '.join(sorted(w.pending)[:3])})" if w.pending else ""
            click.echo(f"dispatch-slurm watch: nothing complete to publish in {exec_dir}{incomplete}", err=True)
        return
    if _unfinished(w, root) and until_pid is not None:
        sys.exit(1)


def _lingering(w):
    """What the watch publishes for once the trainer's process ended: the execution's
    processes that run on on this node (slurm/cessation/node.py), none once its Epilog
    recorded their end here."""
    from ..slurm.cessation import node
    ex = envmod.Execution.current()
    return node.lingering(w.fs, ex.attempt, ex.root, ex.node)


def _unfinished(w, root: str) -> bool:
    """Name the saves the watch leaves unpublished (runtime/watch.py's ``unfinished``)."""
    from ..runtime import watch as watchmod
    return watchmod.unfinished(w, lambda text: click.echo(f"dispatch-slurm watch: {text}", err=True))


@click.command()
@click.argument("what", type=click.Choice(["saved", "finished"]))
def mark(what):
    """Tell the supervisor how this execution ends: `saved` (it saved on its stop signal: the
    run goes on), `finished` (training reached its end: the run is done). For a trainer with
    its own signal handler, or a job script; the preemption handler and the integrations
    write the same facts themselves. Inside a job only (after `eval "$(dispatch-slurm env)"`).

    \b
        def on_sigterm(signum, frame):      # your own handler
            save_checkpoint()
            subprocess.run(["dispatch-slurm", "mark", "saved"])
            sys.exit(0)

    Python: dispatch_slurm.mark_saved(), dispatch_slurm.mark_finished()."""
    from ..runtime import marks
    (marks.mark_saved if what == "saved" else marks.mark_finished)()




def _no_view(values: dict, local: bool) -> None:
    """A job that names a view (DISPATCH_VIEW) no plugin made: said in one line, with the way
    without it (view.py)."""
    view = envmod.Execution.current().view
    if view:
        from ..view import no_view_line
        line = no_view_line(view, values["DISPATCH_EXEC_DIR"], local)
        if line:
            click.echo(f"dispatch-slurm env: warning: {line}", err=True)


def _unpublished(st: store.Store, values: dict) -> None:
    """Nothing published: this execution starts from step 0, so say it if earlier ones left
    saves (a root `latest` cannot read is `latest`'s to report, with its fix)."""
    try:
        if not store.unpublished.nothing_published(st):
            return
        store.unpublished.check(st, by="env", attempt=values["DISPATCH_ATTEMPT"])
    except (DispatchError, OSError):
        return


def _local_inputs() -> tuple[store.Store, dict]:
    """The root's store and the job environment of an execution outside Slurm (`env --local`):
    a new submission number, allocated in that store."""
    root = envmod.local_root(os.environ)
    if root is None:
        root = os.path.abspath(envmod.LOCAL_ROOT)
        os.makedirs(root, mode=0o700, exist_ok=True)  # the default root is ours to create; a named one is not
    st = store.at(names.normalize_root(root))
    return st, envmod.local(os.environ, st.root, st.allocate_submission())


def _unallocate(st: store.Store, inputs: Mapping[str, str]) -> None:
    """The submission number a failed `env --local` allocated, removed when nothing claimed
    its epoch (a full filesystem refused the claim): nothing is left of an execution that
    never started, which `report` would list, and the number is free again."""
    n = int(inputs["DISPATCH_SUBMISSION"])
    try:
        if epochs.claimant(st, epochmod.compose(int(inputs.get("DISPATCH_GENERATION") or 0), n, 0)) is None:
            st.delete(layout.SUB, names.submission_name(n))
    except (DispatchError, OSError, ValueError):
        pass  # the error being reported is the one that matters


def _started_here(st: store.Store, values: dict) -> None:
    """A local execution's start, with the shell that evals `env --local` (the job script:
    its parent): no Slurm and no Epilog will say when it ended, its processes on this host
    will (gc, report: slurm/cessation/local.py)."""
    from ..store import events
    events.record("execution_started", root=st, attempt=values["DISPATCH_ATTEMPT"],
                  epoch=int(values["DISPATCH_EPOCH"]), source="env --local", shell_pid=os.getppid())


def _signal(root: str, spec: str, grace: int | None) -> str:
    """sbatch's --signal for ``grace``; a warning on stderr when measured saves do not fit it."""
    from ..contract.signals import fit_warning, signal_option, slowest_save
    from ..store import events
    if grace is None:
        raise click.UsageError("--signal needs --grace: the seconds the save needs before the time limit")
    option = signal_option(spec, grace)
    warning = fit_warning(grace, slowest_save(events.read(root)))
    if warning:
        click.echo(f"dispatch-slurm: {warning}", err=True)
    return option
