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
(tests/vectors/env.json holds the cases both must reproduce).

Inside the job, ``Execution.current()`` is the one reader of those values (see it below):
this is the one module of the package that reads DISPATCH_* from the environment
(tests/test_architecture.py)."""

import os
from collections.abc import Mapping
from typing import Any, Literal, overload

from ..errors import DispatchError, EnvError
from . import layout, names
from .epoch import EPOCH_MAX, G_MAX, N_MAX, N_MIN, R_MAX, compose, parse_part
from .siteconf import GRACE_CAP, GRACE_DEFAULT, Site

ORDER = ("DISPATCH_CHECKPOINT", "DISPATCH_GENERATION", "DISPATCH_SUBMISSION", "DISPATCH_RESTART",
         "DISPATCH_EPOCH", "DISPATCH_ATTEMPT", "DISPATCH_EXEC_DIR", "DISPATCH_GRACE_S",
         "DISPATCH_SHARED_CHECKPOINT")


def _part(environ: Mapping[str, str], key: str, what: str, lo: int, hi: int, default=None) -> int:
    text = environ.get(key)
    if text is None or text == "":
        if default is None:
            raise EnvError(f"{key} is not set: {what} is required")
        return default
    return _parse(key, what, text, lo, hi)


def _parse(key: str, what: str, text, lo: int, hi: int) -> int:
    try:
        return parse_part(f"{key} ({what})", text, lo, hi)
    except DispatchError as e:
        raise EnvError(str(e)) from None


@overload
def parse_grace(name: str, value, whole: Literal[True]) -> int: ...
@overload
def parse_grace(name: str, value, whole: bool = False) -> float: ...


def parse_grace(name: str, value, whole: bool = False) -> float:
    """The one grace parser: seconds 0..GRACE_CAP, refused (naming ``name``) when not a
    number or out of range, never capped: a user's value is never silently changed.
    ``whole``: decimal digits only, the job option's rule (DISPATCH_GRACE, sbatch
    --dispatch-grace), which the C plugin applies with the same words, so both give the
    same DISPATCH_GRACE_S; the handler's own grace (DISPATCH_GRACE_S, ``grace=``) may be a
    fraction."""
    if whole:
        return _parse(name, "grace seconds", value, 0, GRACE_CAP)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise EnvError(f"{name} must be a number of seconds, got {value!r}") from None
    if not 0 <= seconds <= GRACE_CAP:  # NaN too
        raise EnvError(f"{name} must be 0..{GRACE_CAP} seconds, got {value!r}")
    return seconds


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
        return parse_grace("DISPATCH_GRACE", environ["DISPATCH_GRACE"], whole=True)
    return site.default_grace(environ.get("SLURM_JOB_ACCOUNT"))


def shared(environ: Mapping[str, str]) -> bool:
    value = environ.get("DISPATCH_SHARED_CHECKPOINT", "")
    if value not in ("", "0", "1"):
        raise EnvError(f"DISPATCH_SHARED_CHECKPOINT must be 1 or 0, got {value!r}")
    return value == "1"


_NO_ROOT = "DISPATCH_CHECKPOINT is not set: name the job's checkpoint root"


def named_root(environ: Mapping[str, str]) -> str:
    """The checkpoint root as the job named it, normalized (an array's keeps its %a)."""
    raw_root = environ.get("DISPATCH_CHECKPOINT")
    if not raw_root:
        raise EnvError(_NO_ROOT)
    return names.normalize_root(raw_root)


def check_inputs(environ: Mapping[str, str], site: Site, need_submission: bool = True) -> dict:
    """The submission-time inputs, validated; used at submit time too, so bad input
    is refused before a submission number is spent or a job is queued."""
    if not environ.get("DISPATCH_CHECKPOINT"):
        raise EnvError(_NO_ROOT)
    n_what = "submission N (use `dispatch-slurm submit`)"
    if need_submission and not environ.get("DISPATCH_SUBMISSION"):
        raise EnvError("DISPATCH_SUBMISSION is not set: submit the job with `dispatch-slurm submit ROOT -- ...` "
                       "(or `sbatch --dispatch-checkpoint=ROOT` where the site has the plugin), which allocates "
                       "N under ROOT/sub/ and passes it to the job, or leave it unset inside a Slurm job "
                       "(`dispatch-slurm env`, the TaskProlog allocate it under ROOT/jobs/); never set it by hand")
    return {
        "root": named_root(environ),
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


def site_conf(environ: Mapping[str, str] = os.environ) -> str | None:
    """$DISPATCH_SITE_CONF: the site file `env`, `submit` and `check-site` read instead of the
    default one (slurm/sitefile.py; the hooks never ask: a job must not choose the site's settings)."""
    return environ.get("DISPATCH_SITE_CONF") or None


LOCAL_ROOT = "dispatch-local"  # `env --local`'s root when $DISPATCH_CHECKPOINT is not set, under the working dir
LOCAL_CLUSTER = "local"


def local_root(environ: Mapping[str, str]) -> str | None:
    """`env --local`'s root as the environment names it: $DISPATCH_CHECKPOINT, None when it
    is unset (then ./dispatch-local). Set but empty is refused: it is a mistake (a variable
    meant to hold the root, left empty), never a request for the default."""
    value = environ.get("DISPATCH_CHECKPOINT")
    if value == "":
        raise EnvError(f"DISPATCH_CHECKPOINT is set but empty: set it to the checkpoint root (an existing "
                       f"folder), or unset it (`unset DISPATCH_CHECKPOINT`) for ./{LOCAL_ROOT}")
    return value


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


# What a process inside a job cannot do without, and the one message each gets, whoever
# asks (publish, watch, the preemption handler, every integration): one wording and the
# same fixes per variable, instead of one per integration.
UNSET = {
    "DISPATCH_CHECKPOINT": "no checkpoint root: pass --root (root= in Python) or set DISPATCH_CHECKPOINT",
    "DISPATCH_EPOCH": "no epoch: pass --epoch or set DISPATCH_EPOCH",
    "DISPATCH_EXEC_DIR": "$DISPATCH_EXEC_DIR is not set: this execution has no folder of its own to save into",
    "DISPATCH_ATTEMPT": "$DISPATCH_ATTEMPT is not set: this process cannot tell which execution it is",
}
FIX = ("inside a job: `eval \"$(dispatch-slurm env)\"` in the job script, or sbatch --dispatch-checkpoint=ROOT "
       "where the site has the plugin (submitit: slurm_additional_parameters={'dispatch-checkpoint': ROOT}, docs/submitit.md); "
       "outside Slurm: `eval \"$(dispatch-slurm env --local)\"`, or DISPATCH_LOCAL=1 for a plain run of the "
       "Hugging Face integration")
FIELDS = {"root": "DISPATCH_CHECKPOINT", "epoch": "DISPATCH_EPOCH", "exec_dir": "DISPATCH_EXEC_DIR",
          "attempt": "DISPATCH_ATTEMPT"}


def missing(*variables: str) -> str:
    """The message for these unset variables (UNSET's, in order, then the fixes once)."""
    return "; ".join(UNSET[v] for v in variables) + f" ({FIX})"


MISSING = {v: missing(v) for v in UNSET}


class Execution:
    """This execution as a process inside its job sees it: the values `dispatch-slurm env`
    (or the plugin, the TaskProlog) exported, read in one place so each variable has one
    parser and one message when it is missing, whoever reads it. A field is None when its
    variable is unset; ``need`` is how a caller that cannot go on without one asks. Each
    variable is read when its field is (publish asks for two of them; reading all of them
    every time would cost a tenth of a publication), and the epoch and the grace are parsed
    then, so a bad value fails the caller that uses it and no other (a bad grace never
    stops a publication)."""

    __slots__ = ("_env", "_given")

    def __init__(self, environ: Mapping[str, str], given: dict):
        self._env, self._given = environ, given

    @classmethod
    def current(cls, environ: Mapping[str, str] = os.environ, *, root: str | None = None,
                epoch: int | None = None, exec_dir: str | None = None,
                grace: float | None = None) -> "Execution":
        """The execution ``environ`` describes; an argument given overrides its variable
        (``publish(root=, epoch=)``, ``DispatchCallback(root=, epoch=)``, a grace argument)."""
        given: dict[str, Any] = {}  # written out: publish asks for a view several times per publication
        if root is not None:
            given["root"] = root
        if epoch is not None:
            given["epoch"] = epoch
        if exec_dir is not None:
            given["exec_dir"] = exec_dir
        if grace is not None:
            given["grace"] = grace
        return cls(environ, given)

    def _get(self, key: str) -> str | None:
        return self._env.get(key) or None

    def _on(self, key: str) -> bool:
        return self._env.get(key, "") not in ("", "0")

    @property
    def root(self) -> str | None:  # DISPATCH_CHECKPOINT
        return self._given.get("root") or self._get("DISPATCH_CHECKPOINT")

    @property
    def attempt(self) -> str | None:  # DISPATCH_ATTEMPT
        return self._get("DISPATCH_ATTEMPT")

    @property
    def exec_dir(self) -> str | None:  # DISPATCH_EXEC_DIR: where this execution's saves go
        return self._given.get("exec_dir") or self._get("DISPATCH_EXEC_DIR")

    @property
    def view(self) -> str | None:  # DISPATCH_VIEW: the folder the plugin binds the exec folder over (view.py)
        return self._get("DISPATCH_VIEW")

    @property
    def view_batch(self) -> bool:  # DISPATCH_VIEW_BATCH: the plugin started this publisher for the batch step
        return self._on("DISPATCH_VIEW_BATCH")

    @property
    def view_step_end(self) -> bool:  # DISPATCH_VIEW_STEP_END=stdin: stdin ends when the step's tasks here end
        return self._get("DISPATCH_VIEW_STEP_END") == "stdin"

    @property
    def marker(self) -> str | None:  # DISPATCH_MARKER: the view's marker of a complete save, for any other trainer
        return self._get("DISPATCH_MARKER")

    @property
    def job(self) -> str | None:  # SLURM_JOB_ID
        return self._get("SLURM_JOB_ID")

    @property
    def node(self) -> str | None:  # SLURMD_NODENAME: the node this process runs on, as Slurm names it
        return self._get("SLURMD_NODENAME")

    @property
    def rank(self) -> int | None:  # RANK (torchrun), else SLURM_PROCID: None when neither is a number
        value = self._get("RANK") or self._get("SLURM_PROCID")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def probe_dir(self) -> str | None:  # DISPATCH_PROBE_DIR (runtime/probe.py)
        return self._get("DISPATCH_PROBE_DIR")

    @property
    def local(self) -> bool:  # DISPATCH_LOCAL: a plain run, dispatch-slurm out of the way (integrations/hf.py)
        return self._on("DISPATCH_LOCAL")

    @property
    def local_dir(self) -> str | None:  # DISPATCH_LOCAL_DIR: that run's output folder
        return self._get("DISPATCH_LOCAL_DIR")

    @property
    def linger(self) -> bool:  # DISPATCH_PREEMPT_LINGER (runtime/preempt.py)
        return self._on("DISPATCH_PREEMPT_LINGER")

    @property
    def launcher(self) -> str | None:  # DISPATCH_LAUNCHER: set by `dispatch-slurm launch`
        return self._get("DISPATCH_LAUNCHER")

    @property
    def save_signals(self) -> str | None:  # DISPATCH_SIGNAL: the signals `launch` passes on
        return self._get("DISPATCH_SIGNAL")

    @property
    def epoch(self) -> int | None:
        """DISPATCH_EPOCH, 0..EPOCH_MAX (digits only); an epoch given is the caller's, as
        given (publish refuses one no (G, N, R) composes)."""
        if "epoch" in self._given:
            return self._given["epoch"]
        value = self._get("DISPATCH_EPOCH")
        return None if value is None else parse_part("DISPATCH_EPOCH", value, 0, EPOCH_MAX)

    @property
    def grace(self) -> float:
        """Seconds from the first signal to the kill: the grace given, else DISPATCH_GRACE_S
        (`env` resolved it: job option > account default > site default), else the site
        default."""
        if "grace" in self._given:
            return parse_grace("grace", self._given["grace"])
        value = self._get("DISPATCH_GRACE_S")
        return float(GRACE_DEFAULT) if value is None else parse_grace("DISPATCH_GRACE_S", value)

    def need(self, *fields: str):
        """The value of each field named (one name: the value; several: a tuple); EnvError
        with the message of every one unset (``missing``)."""
        values = tuple(getattr(self, f) for f in fields)
        unset = [FIELDS[f] for f, v in zip(fields, values) if v is None]
        if unset:
            raise EnvError(missing(*unset))
        return values[0] if len(values) == 1 else values

    def save_path(self, step: int) -> str:
        """``<exec folder>/checkpoint-<step>``: this execution's save of ``step``, named as
        watch, publish and every integration expect (names.STEP_PATTERN)."""
        return os.path.join(self.need("exec_dir"), f"checkpoint-{step}")
