"""The DISPATCH_* environment of one execution, computed from the job's own env.

Inputs (set at submission by `dispatch-slurm submit`, or from the SPANK options):
    DISPATCH_CHECKPOINT     the job's checkpoint root (absolute; must exist)
    DISPATCH_GENERATION     G, default 0
    DISPATCH_SUBMISSION     N, required (allocated once per submission, under <root>/sub/;
                            the store refuses one never allocated, store/epochs.py; for a
                            plain sbatch job the store fills it in first, store/jobs.py)
    DISPATCH_GRACE          per-job grace seconds, optional
    DISPATCH_SHARED_CHECKPOINT  "1" if the job cannot isolate its writes
and from Slurm: SLURM_JOB_ID, SLURM_CLUSTER_NAME, SLURM_JOB_RESTART_COUNT (Prolog,
Epilog) or SLURM_RESTART_COUNT (tasks; set only when > 0), SLURM_ARRAY_TASK_ID,
SLURM_JOB_ACCOUNT.

Pure function of its inputs: every node and task of one execution computes the
same values with no coordination, and the C plugin implements the same rules
(tests/vectors/env.json holds the cases both must reproduce)."""

from collections.abc import Mapping

from ..errors import DispatchError, EnvError
from . import layout, names
from .epoch import G_MAX, N_MAX, N_MIN, R_MAX, compose, parse_part
from .siteconf import GRACE_CAP, Site

ORDER = ("DISPATCH_CHECKPOINT", "DISPATCH_GENERATION", "DISPATCH_SUBMISSION", "DISPATCH_RESTART",
         "DISPATCH_EPOCH", "DISPATCH_ATTEMPT", "DISPATCH_EXEC_DIR", "DISPATCH_GRACE_S",
         "DISPATCH_SHARED_CHECKPOINT")


def _part(environ: Mapping[str, str], key: str, what: str, lo: int, hi: int, default=None) -> int:
    text = environ.get(key)
    if text is None or text == "":
        if default is None:
            raise EnvError(f"{key} is not set: {what} is required")
        return default
    try:
        return parse_part(f"{key} ({what})", text, lo, hi)
    except DispatchError as e:
        raise EnvError(str(e)) from None


def restart_count(environ: Mapping[str, str]) -> int:
    for key in ("SLURM_JOB_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        if environ.get(key):
            return _part(environ, key, "restart count R", 0, R_MAX)
    return 0


def grace(environ: Mapping[str, str], site: Site) -> int:
    """Per-job option > per-project (account) default > site default; the option is
    refused above the cap (a user's value is never silently changed), the site's
    defaults are capped."""
    if environ.get("DISPATCH_GRACE"):
        return _part(environ, "DISPATCH_GRACE", "grace seconds", 0, GRACE_CAP)
    return site.default_grace(environ.get("SLURM_JOB_ACCOUNT"))


def shared(environ: Mapping[str, str]) -> bool:
    value = environ.get("DISPATCH_SHARED_CHECKPOINT", "")
    if value not in ("", "0", "1"):
        raise EnvError(f"DISPATCH_SHARED_CHECKPOINT must be 1 or 0, got {value!r}")
    return value == "1"


def check_inputs(environ: Mapping[str, str], site: Site, need_submission: bool = True) -> dict:
    """The submission-time inputs, validated; used at submit time too, so bad input
    is refused before a submission number is spent or a job is queued."""
    raw_root = environ.get("DISPATCH_CHECKPOINT")
    if not raw_root:
        raise EnvError("DISPATCH_CHECKPOINT is not set: name the job's checkpoint root")
    n_what = "submission N (use `dispatch-slurm submit`)"
    if need_submission and not environ.get("DISPATCH_SUBMISSION"):
        raise EnvError("DISPATCH_SUBMISSION is not set: submit the job with `dispatch-slurm submit ROOT -- ...` "
                       "(or `sbatch --dispatch-checkpoint=ROOT` where the site has the plugin), which allocates "
                       "N under ROOT/sub/ and passes it to the job, or leave it unset inside a Slurm job "
                       "(`dispatch-slurm env`, the TaskProlog allocate it under ROOT/jobs/); never set it by hand")
    return {
        "root": names.normalize_root(raw_root),
        "g": _part(environ, "DISPATCH_GENERATION", "generation G", 0, G_MAX, default=0),
        "n": _part(environ, "DISPATCH_SUBMISSION", n_what, N_MIN, N_MAX,
                   default=None if need_submission else 0),
        "grace": grace(environ, site),
        "shared": shared(environ),
    }


def compute(environ: Mapping[str, str], site: Site | None = None) -> dict[str, str]:
    """Every DISPATCH_* value of the execution described by `environ`, in ORDER."""
    i = check_inputs(environ, site or Site())
    task = environ.get("SLURM_ARRAY_TASK_ID") or None
    root = names.expand_root(i["root"], task)
    r = restart_count(environ)
    epoch = compose(i["g"], i["n"], r)
    for key in ("SLURM_JOB_ID", "SLURM_CLUSTER_NAME"):
        if not environ.get(key):
            raise EnvError(f"{key} is not set: not inside a Slurm job")
    attempt = names.attempt_token(environ["SLURM_CLUSTER_NAME"], environ["SLURM_JOB_ID"], epoch)
    # an array task whose root has no %a would share it with its siblings; the one
    # exception is a recomputation inside the same execution (a step re-running env
    # after the batch script exported the expanded root): its attempt already matches
    if task and "%a" not in i["root"] and environ.get("DISPATCH_ATTEMPT") != attempt:
        raise EnvError(f"array task {task}: every array task needs its own root; put %a in the "
                       f"checkpoint root's last component (e.g. {i['root']}/task-%a)")
    out = {
        "DISPATCH_CHECKPOINT": root,
        "DISPATCH_GENERATION": str(i["g"]),
        "DISPATCH_SUBMISSION": str(i["n"]),
        "DISPATCH_RESTART": str(r),
        "DISPATCH_EPOCH": str(epoch),
        "DISPATCH_ATTEMPT": attempt,
        "DISPATCH_EXEC_DIR": f"{root}/{layout.exec_relpath(attempt)}",
        "DISPATCH_GRACE_S": str(i["grace"]),
    }
    if i["shared"]:
        out["DISPATCH_SHARED_CHECKPOINT"] = "1"
    return out


LOCAL_ROOT = "dispatch-local"  # `env --local`'s root when $DISPATCH_CHECKPOINT is not set, under the working dir
LOCAL_CLUSTER = "local"


def local(environ: Mapping[str, str], root: str, n: int) -> dict[str, str]:
    """The inputs of an execution on this machine, outside Slurm (`env --local`): Slurm's
    variables dropped, cluster "local", the job id the submission number ``n`` (allocated
    under the root, so every local execution has its own attempt and a greater epoch)."""
    keep = {k: v for k, v in environ.items() if not k.startswith("SLURM_")}
    return {**keep, "DISPATCH_CHECKPOINT": root, "DISPATCH_SUBMISSION": str(n), "SLURM_JOB_ID": str(n),
            "SLURM_CLUSTER_NAME": LOCAL_CLUSTER}


def render(values: Mapping[str, str], fmt: str = "sh") -> str:
    """sh: `export K='v'` lines for eval/source; dotenv: K='v'; json: one object."""
    import json
    import shlex
    if fmt == "json":
        return json.dumps(dict(values), indent=2) + "\n"
    prefix = "export " if fmt == "sh" else ""
    return "".join(f"{prefix}{k}={shlex.quote(v)}\n" for k, v in values.items())
