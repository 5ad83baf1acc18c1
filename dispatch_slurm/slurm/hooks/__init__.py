"""The admin side: Prolog, TaskProlog and Epilog, behind thin shell wrappers in prolog/ and
epilog/ (which exit at once for jobs without dispatch options). One module per hook context
(prolog.py, taskprolog.py, epilog.py with the sweep of Epilogs that never ran), over what
they share: node.py (root's log and files, the child that drops to the job user) and job.py
(the job as Slurm hands it over). This module only dispatches: ``python3 -m
dispatch_slurm.slurm.hooks prolog|task-prolog|epilog``.

Rules every hook keeps:
* Root never touches a user-controlled path (node.as_job_user); root only writes its own
  files under /run/dispatch-slurm/.
* A user's mistake never drains a node. Slurm drains a node whose Prolog exits non-zero,
  so every user error (bad option, missing or foreign root, planted symlink...) is logged
  and the Prolog exits 0; the job then fails in its own stderr, by the SPANK plugin's
  user_init or the TaskProlog, which run the same checks as the job user. Non-zero is kept
  for a broken node (its own /run unwritable, no Python, the package not importable).
* Nothing a user controls can make a hook exit non-zero or hang: values with any byte (a
  newline, a non-UTF-8 byte) are written and logged verbatim-but-escaped, the child's
  answer is read while it runs, the job's output is never read, and any unexpected error
  is logged as a bug and the hook exits 0.
* The site's settings come from the admin's file (``--site-conf``, else
  /etc/dispatch-slurm/site.conf), never from the job's environment.

Inputs: the plugin's options reach the Prolog and Epilog as
SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_<option>; the TaskProlog sees the task's
own environment (DISPATCH_* from the plugin or from `dispatch-slurm submit`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import Optional, Sequence

from ...contract import siteconf
from . import node

CONTEXTS = {"prolog": "prolog", "task-prolog": "taskprolog", "epilog": "epilog"}  # hook -> its module


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one hook. Exit 0 unless the node itself is broken: a user's input, even one that
    trips a bug here, must never make Slurm drain the node (a TaskProlog's non-zero fails
    only the task). Only the hook's own context is imported (a TaskProlog runs per task)."""
    ap = argparse.ArgumentParser(prog="python3 -m dispatch_slurm.slurm.hooks")
    ap.add_argument("hook", choices=list(CONTEXTS))
    ap.add_argument("--site-conf", help=f"the site's settings [default: {siteconf.DEFAULT_PATH}]; "
                    "never taken from the job's environment")
    ap.add_argument("--log", help=f"the hooks' own log [default: {node.LOG}] (LOG= in /etc/default/dispatch-slurm)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if a.log:
        node.LOG = a.log  # one hook per process: the wrapper's choice holds for all of it
    context = importlib.import_module(f"{__name__}.{CONTEXTS[a.hook]}")  # not importable: a broken node
    try:
        return context.run(os.environ, site_conf=a.site_conf)
    except Exception as e:  # noqa: BLE001 -- a bug must not drain the node
        node.log(f"BUG in the {a.hook}: {type(e).__name__}: {e}: {traceback.format_exc(limit=5)}")
        return 1 if a.hook == "task-prolog" else 0
