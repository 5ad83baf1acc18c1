"""`dispatch-slurm`: the command line. Thin: every rule lives in the modules.

Exit codes: 0 success; 1 a negative answer (`latest`: nothing published, `ceased`:
not ceased); 2 an error, printed as one line on stderr naming what was wrong and how
to fix it, never a traceback (a traceback is a bug).

A command's module is imported only when that command runs: `env`, `latest` and
`publish` start every job, and importing every command (the supervisor, Slurm's
client, the report) would cost each of them several times Python's own start-up.
The registry below is all `--help` needs."""

import importlib
import os
import sys

import click

from ..errors import DispatchError

# name -> (module of cli/, its attribute, the short help `--help` lists). The short help is
# the command's own (the first sentence of its help); tests/test_architecture.py keeps the
# two equal, so listing the commands imports none of them.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "ceased": ("admin", "ceased", "Have the processes of execution R of JOB_ID stopped? Exit 0 ceased, 1 not "
               "ceased, 2 cannot tell."),
    "check-site": ("admin", "check_site", "Validate a site.conf exactly as the SPANK plugin, the hooks and `env` "
                   "read it (default: $DISPATCH_SITE_CONF, else /etc/dispatch-slurm/site.conf), and print the "
                   "settings it gives."),
    "doctor": ("doctor", "doctor", "Check that the save signal reaches every rank and the save fits, before the "
               "first preemption or time limit does."),
    "env": ("job", "env_", "Print this execution's DISPATCH_* variables, claim its epoch and create its exec "
            "folder."),
    "epoch": ("protocol", "epoch", "Compose or decompose DISPATCH_EPOCH = G*10^12 + N*10^6 + R."),
    "gc": ("retention", "gc", "Remove the saves of ROOT the policy does not keep: published saves past "
           "--keep-last/--keep-every (their publications are retired first, under ROOT/retired/), and saves an "
           "execution never published."),
    "latest": ("protocol", "latest", "The latest publication of ROOT: the greatest (epoch, step) not retired by a "
               "person (`dispatch-slurm retire`), and its save, which must still exist."),
    "launch": ("doctor", "launch", "Run a launcher (torchrun, accelerate launch, python) so that a save signal "
               "reaches every rank, torchrun does not SIGKILL them 30 s later, and a saved preemption exits 0."),
    "ls": ("protocol", "ls_", "Every publication of ROOT in (epoch, step) order: whether its save still exists, "
           "its size on disk and its state: latest (what `latest` names), kept, gone (the save no longer exists: "
           "the trainer's rotation removed it) or retired (by gc, or by a person with `dispatch-slurm retire`); "
           "then, on stderr, unpublished saves and what gc can reclaim (`dispatch-slurm gc --dry-run` says more)."),
    "mark": ("job", "mark", "Tell the supervisor how this execution ends: `saved` (it saved on its stop signal: "
             "the run goes on), `finished` (training reached its end: the run is done)."),
    "plan": ("supervise", "plan", "Show what each rule will do for this job, before it starts: the sbatch command, "
             "and for a shared checkpoint the holds that stand in for recovery."),
    "publish": ("protocol", "publish", "Publish SAVE (a folder or file in this execution's exec folder) at "
                "(epoch, step)."),
    "release": ("supervise", "release", "Answer the hold standing on ROOT: the old execution is known to have "
                "stopped, so the rule the hold replaced may apply."),
    "report": ("report", "report", "The executions of ROOT's job (attempts, epochs, nodes, how each ended), the "
               "overlaps, every publication, the holds and cessation answers, the steps lost to each "
               "interruption, and the goodput (the share of wall time that became kept training steps, and where "
               "the rest went); read from the root (the supervisor's record adds Slurm's word on each end; without "
               "one, Slurm is asked how its executions ended)."),
    "retire": ("retention", "retire", "Retire one publication of ROOT on purpose: NAME (an entry of ROOT/pub/, as "
               "`dispatch-slurm ls ROOT --json` names it; pub/NAME or its full path also do), or --latest."),
    "run": ("supervise", "run", "Submit a job and supervise it: follow it through Slurm and, when an execution "
            "ends, apply the rules (`dispatch-slurm plan` shows them)."),
    "stop": ("supervise", "stop", "Stop supervising ROOT's job and cancel it: the supervisor (the running one, or "
             "this command when none runs) cancels the job, waits until Slurm says it ended, and finishes "
             "\"stopped\"; nothing is resubmitted."),
    "submit": ("job", "submit", "Allocate the next submission number N under ROOT, then sbatch SBATCH_ARGS with "
               "DISPATCH_CHECKPOINT/GENERATION/SUBMISSION exported to the job."),
    "supersede": ("supervise", "supersede", "Start generation G+1 of ROOT's job: record the supersession, cancel "
                  "generation G's job (its supervisor stops), and carry on as the supervisor of G+1."),
    "view": ("view", "view", "The view's two halves, run by the SPANK plugin for a job submitted with "
             "--dispatch-view=DIR, as the job user, on each node before each step's tasks: `prepare`, then "
             "`publish` (detached)."),
    "watch": ("job", "watch", "Publish each complete save in the exec folder, in step order, at this execution's "
              "epoch; one line per publication on stdout."),
}


class LazyGroup(click.Group):
    """Commands found by name in COMMANDS, their module imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[cmd_name]
        cmd = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        assert isinstance(cmd, click.Command)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, from the registry's short help: the same text, cut the same way
        (a command of that help cuts it), without importing a command."""
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [(name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def commands() -> dict[str, click.Command]:
    """Every command, each module imported (the man page, the tests)."""
    return {name: cmd for name in sorted(COMMANDS) if (cmd := dispatch.get_command(None, name)) is not None}


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dispatch-slurm")
@click.option("--endpoint-url", metavar="URL", help="S3 endpoint for s3:// roots (sets AWS_ENDPOINT_URL_S3, "
              "which boto3 reads)  [default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's, AWS's]")
@click.option("--profile", metavar="NAME", help="AWS profile for s3:// roots (sets AWS_PROFILE)")
def dispatch(endpoint_url, profile):
    """Make overlapping executions of a Slurm job harmless: each execution writes its
    own folder, and saves become visible only by append-only publication.

    A root is a path or s3://bucket/prefix (pip install 'dispatch-slurm[s3]'). A
    DURATION is seconds, or a number with a unit: 90, 90s, 1.5m, 2h, 1d."""
    # set in the environment, so that boto3 and every command this one runs see them
    if endpoint_url:
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint_url
    if profile:
        os.environ["AWS_PROFILE"] = profile


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def main(argv=None) -> None:
    """The `dispatch-slurm` entry point: one line on stderr and exit 2 for every refusal,
    whether click (a bad option) or the toolkit (bad input, an unusable root) refuses."""
    try:
        code = dispatch.main(args=argv, prog_name="dispatch-slurm", standalone_mode=False)
    except click.UsageError as e:
        where = e.ctx.command_path if e.ctx else "dispatch-slurm"
        sys.stderr.write(f"{where}: error: {_one_line(e.format_message())} (see {where} --help)\n")
        sys.exit(2)
    except click.ClickException as e:
        sys.stderr.write(f"dispatch-slurm: error: {_one_line(e.format_message())}\n")
        sys.exit(e.exit_code)
    except click.exceptions.Abort as e:
        sys.stderr.write("dispatch-slurm: aborted\n")
        if isinstance(e.__cause__ or e.__context__, KeyboardInterrupt):
            import signal

            from .common import die_by
            die_by(signal.SIGINT)
        sys.exit(130)
    except DispatchError as e:
        sys.stderr.write(f"dispatch-slurm: error: {_one_line(e)}\n")
        sys.exit(2)
    except OSError as e:
        name = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"dispatch-slurm: error: {name}{e.strerror or e}\n")
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
