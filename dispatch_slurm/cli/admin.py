"""Commands for admins and for the supervisor's cessation signal: ceased, check-site."""

import json
import sys

import click

from ..contract import names
from ..contract.epoch import G_MAX, N_MAX, N_MIN, R_MAX
from ..slurm import sitefile
from . import common


@click.command()
@click.argument("job_id", type=click.IntRange(1))
@click.option("--restart", "-r", type=click.IntRange(0, R_MAX), default=0, show_default=True,
              help="R: which execution of the job")
@common.root_option("checkpoint root: its epilog records, and the supervisor's record for G, N, nodes and start")
@click.option("--generation", type=click.IntRange(0, G_MAX), help="G [default: from the record]")
@click.option("--submission", type=click.IntRange(N_MIN, N_MAX), help="N [default: from the record]")
@click.option("--cluster", help="ClusterName [default: Slurm's]")
@click.option("--nodes", help="comma-separated nodes that ran the execution [default: record, or Slurm's]")
@click.option("--started", type=click.IntRange(0), help="Unix time the execution started [default: record, "
              "or Slurm's]")
@click.option("--json", "as_json", is_flag=True, help="the answer with the evidence per node")
def ceased(job_id, restart, root, generation, submission, cluster, nodes, started, as_json):
    """Have the processes of execution R of JOB_ID stopped? Exit 0 ceased, 1 not ceased,
    2 cannot tell. Ceased needs evidence: Slurm says the execution ended and nothing is
    completing, and every node that ran it recorded its Epilog for it or rebooted since it
    started. A node that is down or not responding is never evidence."""
    from ..slurm import cessation
    from ..slurm.client import Slurm
    from ..supervisor.record import execution
    if root:
        root = names.normalize_root(root)
    node_list = [x for x in nodes.split(",") if x] if nodes else None
    ans = cessation.check(Slurm(), job_id, restart, root=root, generation=generation, submission=submission,
                          cluster=cluster, nodes=node_list, started=started,
                          known=execution(root, job_id, restart) if root else None)
    click.echo(json.dumps(ans) if as_json else cessation.render(ans), nl=as_json)
    sys.exit(cessation.exit_code(ans))


@click.command("check-site")
@click.argument("path", required=False)
def check_site(path):
    """Validate a site.conf exactly as the SPANK plugin, the hooks and `env` read it
    (default: $DISPATCH_SITE_CONF, else /etc/dispatch-slurm/site.conf), and print the
    settings it gives. Exit 0 valid, 2 invalid (the line and the reason)."""
    click.echo(sitefile.check(path), nl=False)


