"""The fault campaign: long runs under a seeded nemesis, judged by an independent checker.

Each run is drawn from its seed (``setup_for``, ``schedule_for``): a setup as users have
them (the deterministic trainer with dispatch-slurm's handler, with its own handler
printing the sentinel, or untrapped; a Hugging Face Trainer; one or two ranks; Slurm's
default output path, ``%x-%j``, a literal file, an appended one; under ``dispatch-slurm run``
or plugin-only with Slurm's requeue; with or without ``--signal``; with or without gc) and
a schedule of overlapping faults (``KINDS``). The same schedule hits both modes side by
side: *dispatch* (the setup as the user guide writes it) and *naive* (one shared folder,
the framework's own resume and rotation, Slurm's requeue, a user who resubmits by hand).

A nemesis thread applies each fault at its time to whatever runs then (a node fault to the
nodes the executions run on), and undoes it after its duration; the trainers log every
step; when both modes have ended, Slurm's accounting is read and ``checker.check`` judges
each mode from the root, sacct and the trainer's log alone. Every anomaly is printed with
its seed, class and the command that replays the run (the same setup and schedule; the
cluster's own timing is not replayed: this is a real Slurm, not a simulation).
Goodput: the trainer's log split into ``dispatch_slurm.report.goodput``'s buckets, beside
Young/Daly's prediction and, for dispatch mode, the estimate ``dispatch-slurm report``
makes from the root alone.

One module per job: ``schedule`` (the seeded draws), ``nemesis`` (the faults), ``runs`` (the
jobs on the cluster), ``judge`` (the checker's verdicts and the goodput), ``report`` (what is
printed). Their names are this package's."""

from dispatch_slurm.report import goodput  # noqa: F401

from .. import checker  # noqa: F401
from .schedule import (  # noqa: F401
    ADDED,
    AXES,
    GIVE_UP,
    KINDS,
    NODE_FAULTS,
    STRAYS,
    Fault,
    Params,
    parse_setup,
    plan,
    replay_command,
    schedule_for,
    Setup,
    setup_for,
)
from .nemesis import (  # noqa: F401
    FS,
    FS_MIB,
    Applied,
    Nemesis,
    Undo,
)
from .judge import (  # noqa: F401
    _quick_run,
    lineage,
    measured_goodput,
    rejudge,
    report_estimate,
)
from .report import (  # noqa: F401
    _totals,
    evidence,
    plot_run,
    seed_ranges,
    summarize,
)
from .runs import (  # noqa: F401
    HOST_SITE,
    IMAGE_TESTBED,
    NAIVE_SCRIPT,
    README,
    USER,
    Campaign,
    readme_job_script,
    run,
    RunState,
    Side,
    wrapper,
)
