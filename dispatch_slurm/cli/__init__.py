"""`dispatch-slurm`: the command line. Thin: every rule lives in the modules.

Exit codes: 0 success; 1 a negative answer (`latest`: nothing published, `ceased`:
not ceased); 2 an error, printed as one line on stderr naming what was wrong and how
to fix it, never a traceback (a traceback is a bug)."""

import os
import signal
import sys

import click

from ..errors import DispatchError
from . import admin, common, doctor, job, protocol, report, retention, supervise


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dispatch-slurm")
@click.option("--endpoint-url", metavar="URL", help="S3 endpoint for s3:// roots (sets AWS_ENDPOINT_URL_S3, "
              "which boto3 reads)  [default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's, AWS's]")
@click.option("--profile", metavar="NAME", help="AWS profile for s3:// roots (sets AWS_PROFILE)")
def dispatch(endpoint_url, profile):
    """Make overlapping executions of a Slurm job harmless: each execution writes its
    own folder, and saves become visible only by append-only publication.

    A root is a path or s3://bucket/prefix (pip install 'dispatch-slurm[s3]')."""
    # set in the environment, so that boto3 and every command this one runs see them
    if endpoint_url:
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint_url
    if profile:
        os.environ["AWS_PROFILE"] = profile


for _cmd in (*protocol.COMMANDS, *job.COMMANDS, *supervise.COMMANDS, *admin.COMMANDS, *report.COMMANDS,
             *retention.COMMANDS, *doctor.COMMANDS):
    dispatch.add_command(_cmd)


def _one_line(message: str) -> str:
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
            common.die_by(signal.SIGINT)
        sys.exit(130)
    except DispatchError as e:
        sys.stderr.write(f"dispatch-slurm: error: {_one_line(e)}\n")
        sys.exit(2)
    except OSError as e:
        name = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"dispatch-slurm: error: {name}{e.strerror or e}\n")
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
