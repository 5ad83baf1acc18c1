"""`dispatch-slurm report ROOT`: what happened to a job (text, --json, --plot PNG)."""

import json

import click

from .. import report as reportmod
from .. import store
from . import common


@click.command(cls=common.RootCommand, epilog=common.ROOT_HELP)
@common.root_argument(required=False)
@click.option("--json", "as_json", is_flag=True, help="everything the report knows, as JSON")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="also draw the timeline as a PNG "
              "(needs matplotlib: the plot extra)")
def report(root, as_json, plot_path):
    """The executions of ROOT's job (attempts, epochs, nodes, how each ended), the
    overlaps, every publication, the holds and cessation answers, the steps lost to
    each interruption, and the goodput (the share of wall time that became kept training
    steps, and where the rest went); read from the root (the supervisor's record adds
    Slurm's word on each end; without one, Slurm is asked how its executions ended).

    Exit 0; 2 on an error, and when the latest publication's save is gone (the report is
    printed, then the error `latest` gives: nothing can resume from that root)."""
    if plot_path:
        reportmod.timeline._pyplot()  # refuse before the work, not after
    r = reportmod.build(root)
    if plot_path:
        reportmod.timeline.plot(r, plot_path)
    click.echo(json.dumps(r, indent=1) if as_json else reportmod.render.text(r), nl=as_json)
    if r["latest"] is not None and not r["latest"]["exists"]:
        store.latest_save(root)  # raises `latest`'s own error, naming the fix


