"""The rules: what the supervisor submits and what it does when an execution ends.

Pure functions of a job definition (the ``job`` fact), the state and what was observed
(Slurm's answer, the latest publication, sbatch's): the plan a person reads (``plan``),
the supervisor's loop (supervisor/loop.py, which only reads the inputs, records the facts
these return and acts) and docs/supervisor.md apply the same rules. The hold's part of
the table is holds.py."""

from __future__ import annotations

import os
import re
import shlex
from typing import Any, NamedTuple, Optional

from ..contract import epoch, names
from ..contract.signals import JobSignal, signal_option
from ..errors import DispatchError
from ..contract.durations import fmt_duration
from . import ends, holds
from .ends import Own, signal_rule
from .state import State

DEFAULT_CESSATION_CMD = "dispatch-slurm ceased {job} --restart {restart} --root {root} --json"
DEFAULTS: dict[str, Any] = {"resubmit": 0, "continuations": 100, "shared": False, "via": "auto", "hold_for": 24 * 3600.0,
            "cessation_interval": 60.0, "cessation_cmd": DEFAULT_CESSATION_CMD, "grace": None, "signal": None,
            "keep_last": None}
SUBMIT_TRIES = 3  # consecutive sbatch failures before a resubmission is given up
STALLS = 3  # consecutive continuations that published no higher step before a chain is stopped
PLACEHOLDERS = ("job", "restart", "root", "generation", "submission", "epoch", "attempt", "cluster",
                "nodes", "started")


def make_defn(options: dict, args: list[str], base: Optional[dict] = None) -> dict:
    """A job definition from CLI options (None = not given: from ``base``, else the default)."""
    base = base or {}
    d = {k: (options[k] if options.get(k) is not None else base.get(k, DEFAULTS[k])) for k in DEFAULTS}
    if d["resubmit"] < 0:
        raise DispatchError(f"--resubmit must be 0 or more, got {d['resubmit']}")
    if d["continuations"] < 0:
        raise DispatchError(f"--continuations must be 0 or more, got {d['continuations']}")
    if d["keep_last"] is not None and d["keep_last"] < 1:
        raise DispatchError(f"--keep-last must be 1 or more, got {d['keep_last']}")
    if d["via"] not in ("auto", "spank", "env"):
        raise DispatchError(f"--via must be auto, spank or env, got {d['via']!r}")
    try:
        parts = shlex.split(d["cessation_cmd"])
        for p in parts:
            p.format(**{k: "" for k in PLACEHOLDERS})
    except (ValueError, KeyError, IndexError) as e:
        raise DispatchError(f"--cessation-cmd {d['cessation_cmd']!r}: {e!r} (placeholders: "
                            f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)})") from None
    if not parts:
        raise DispatchError("--cessation-cmd is empty")
    if d["signal"] is not None:
        if d["grace"] is None:
            raise DispatchError("--signal needs --grace: the seconds the save needs before the time limit")
        signal_option(d["signal"], d["grace"])  # refuses a malformed signal here, not at the first sbatch
    d["args"] = list(args) or list(base.get("args", []))
    if base.get("array_root"):  # an array task's %a root (sweep.py): every generation names it
        d["array_root"] = base["array_root"]
    check_sbatch_args(d["args"], d)
    d["cwd"] = os.getcwd()
    return d


def check_resume(options: dict, args: list[str], defn: dict) -> None:
    """On resume the record's definition stands: a different value given now is refused."""
    for k, v in options.items():
        if v is not None and k in DEFAULTS and v != defn.get(k):
            raise DispatchError(f"the record of this root has {k.replace('_', '-')}={defn.get(k)!r} for "
                                f"generation {defn['g']}, not {v!r}: omit it to resume (or supersede the job)")
    if args and list(args) != defn["args"]:
        raise DispatchError(f"the record of this root submits `{shlex.join(defn['args'])}`, not "
                            f"`{shlex.join(args)}`: omit the sbatch arguments to resume (or supersede the job)")



def resolve_via(via: str, plugin_options: Optional[set[str]]) -> tuple[str, Optional[str]]:
    """(the way G and N reach the job, a warning or None). ``auto`` takes the SPANK
    plugin's options where sbatch has them (``plugin_options``; None: could not ask),
    else exported variables; ``spank`` where sbatch lacks them is refused at `run`."""
    has = None if plugin_options is None else "--dispatch-checkpoint" in plugin_options
    if via == "auto":
        return ("spank" if has else "env"), (None if has is not None else
                                             "could not ask sbatch for its plugin options; assuming --via env")
    if via == "spank" and has is False:
        return via, ("--via spank, but sbatch here has no --dispatch-checkpoint option (the SPANK plugin is "
                     "not installed): use --via env, with `eval \"$(dispatch-slurm env)\"` in the job script")
    return via, None


def check_sbatch_args(args: list[str], defn: dict) -> None:
    """Refuse what the supervisor sets itself or cannot supervise, naming the argument."""
    if not args:
        raise DispatchError("no sbatch arguments: put the batch script (and sbatch options) after `--`")
    for a in args:
        opt = a.split("=", 1)[0]
        if opt == "--comment":
            raise DispatchError(f"sbatch argument {a!r}: the supervisor sets --comment itself "
                                "(it tags each submission to find it again after a crash)")
        if opt.startswith("--dispatch-"):
            raise DispatchError(f"sbatch argument {a!r}: the supervisor sets the --dispatch-* options "
                                "itself (use run's own options: --shared-checkpoint, --grace)")
        one_task = re.fullmatch(r"--array=\d+", a)  # a task of a %a root, as `run` submits it (sweep.py)
        if not one_task and (opt in ("--array", "-a") or (a.startswith("-a") and len(a) > 2 and not a.startswith("--"))):
            raise DispatchError(f"sbatch argument {a!r}: every task of an array needs its own root; name the "
                                "root with %a, e.g. run 'ROOT/task%a' -- --array=0-9 job.sh (one root and one "
                                "job per task, in one supervisor)")
        if defn.get("signal") is not None and opt == "--signal":
            raise DispatchError(f"sbatch argument {a!r}: --signal is set from run's own --signal and --grace")
        if defn["via"] == "env" and opt == "--export":
            raise DispatchError(f"sbatch argument {a!r}: --via env sets --export itself")
        if defn["shared"] and opt == "--requeue":
            raise DispatchError(f"sbatch argument {a!r}: a shared-checkpoint job is submitted with "
                                "--no-requeue, so that Slurm cannot restart it behind the hold")


def sbatch_argv(defn: dict, root: str, g: int, n: int, tag: str) -> tuple[list[str], dict[str, str]]:
    """The sbatch arguments and the environment additions of one submission."""
    argv = [f"--comment={tag}"]
    env: dict[str, str] = {}
    if defn.get("signal") is not None:
        argv.append(signal_option(defn["signal"], defn["grace"]))
    if defn["shared"]:
        # Slurm's own requeue (node failure with JobRequeue=1, PreemptMode=REQUEUE,
        # `scontrol requeue`) would start a new execution with no decision of ours: the
        # very recovery the hold must stand in for. --no-requeue makes those end the job,
        # so the supervisor sees the end and holds.
        argv.append("--no-requeue")
    named = defn.get("array_root") or root  # an array task names the %a root, expanded to ``root`` in the job
    if defn["via"] == "spank":
        argv += [f"--dispatch-checkpoint={named}", f"--dispatch-generation={g}", f"--dispatch-submission={n}"]
        if defn["shared"]:
            argv.append("--dispatch-shared-checkpoint")
        if defn.get("grace") is not None:
            argv.append(f"--dispatch-grace={defn['grace']}")
    else:
        env = {"DISPATCH_CHECKPOINT": named, "DISPATCH_GENERATION": str(g), "DISPATCH_SUBMISSION": str(n)}
        if defn["shared"]:
            env["DISPATCH_SHARED_CHECKPOINT"] = "1"
        if defn.get("grace") is not None:
            env["DISPATCH_GRACE"] = str(defn["grace"])
        argv.append("--export=ALL," + ",".join(env))
    return argv + list(defn["args"]), env


def submission_tag(root: str, g: int, n: int) -> str:
    return f"dispatch-slurm:{root}:g{g}:n{n}"


def give_up(st: State) -> Optional[str]:
    """Why the next submission is not tried (the finish's message), or None: SUBMIT_TRIES
    sbatch failures in a row, or one when `sbatch --test-only` refused the generation's
    first submission (the sbatch arguments are wrong)."""
    first_and_bad = st.submitted_in_g == 0 and st.refused_by_test
    if st.submit_failures >= (1 if first_and_bad else SUBMIT_TRIES):
        return f"sbatch failed {st.submit_failures} time(s): {st.last_submit_error}"
    return None


def recovered(st: State, found: list[int], refused: bool) -> tuple[tuple[tuple[str, dict], ...], bool]:
    """The facts for an intent without a job id, given the jobs Slurm holds with its tag
    (``found``), and whether to wait a poll before the next step. None found: the intent
    is lost, and its N is used again only when sbatch itself ``refused`` it (no job used
    it); after a crash a fresh N, since a job that ran with it may have been purged."""
    ref = {"g": st.g, "n": st.n, "tag": st.tag}
    if not found:
        return (("intent_lost", {**ref, "reuse": refused}),), bool(st.submit_failures)
    first, *extra = sorted(found)
    notes = tuple(("note", {"text": f"job {j} also carries tag {st.tag}; following {first} only"}) for j in extra)
    return (("submitted", {"g": st.g, "n": st.n, "job": first, "tag": st.tag, "recovered": True}), *notes), False


def supersession(st: State, defn: dict, state: Optional[str]) -> Optional[dict]:
    """The rule fact a supersession records after generation G's (``st``, ``state``:
    Slurm's state of its job, None when it had none) when G or G+1 (``defn``) shares the
    checkpoint and G's job ran: the old execution may still write into the one folder,
    so G+1's first submission is a recovery like any other, held. None otherwise."""
    started = st.started
    if not (st.defn.get("shared") or defn["shared"]) or started is None or state is None:
        return None
    return {"rule": "supersede", "cause": "supersession", "held": True, "job": st.job, "r": started["r"],
            "execution": {k: started.get(k) for k in ("g", "n", "epoch", "attempt", "nodes", "start_time")}}


# -- what an ended execution leads to ------------------------------------------------------
#
# One table, read three ways: ends.cause_of + ``decide`` (the loop), ``plan`` (what a person
# reads before the job starts) and the rules table of docs/supervisor.md (tests/test_docs.py).
# The cause comes from facts tied to the execution, never from an output path (ends.py).
CONTINUE = ("the next execution at once, with a new N, while the `--continuations` budget lasts (default "
            f"{DEFAULTS['continuations']}), else fail (exit 1); a chain whose last {STALLS} executions published no "
            "higher step is stopped (exit 1)")
RESUBMIT = "resubmit with a new N while the `--resubmit` budget lasts (default 0), else fail (exit 1)"
REPEATED = ("; FAILED before its trainer started (no resume resolved: `latest --resume` refused, `env` exited) the same "
            "way as the execution before it, nothing published since: fail at once (exit 1), naming the cause")
SIGNAL_TIME = "its --signal time (start + time limit - T - 30 s: Slurm checks time limits every 30 s)"
#: (cause, when, in Slurm's words; the rule; what follows)
TABLE = (
    ("finished", "COMPLETED with the execution's `training_finished` event (an integration's, or `dispatch-slurm "
     "mark finished`) and no signal event", "done", "exit 0"),
    ("completed", f"COMPLETED before {SIGNAL_TIME}, or with no --signal, and no event or preempt_time says "
     "otherwise", "done", "exit 0"),
    ("time_limit", "TIMEOUT", "continue", CONTINUE),
    ("signalled", "COMPLETED after a signal: the execution's `preempt_signal` or `checkpoint_complete` event (the "
     "preemption handler's, an integration's, or `dispatch-slurm mark saved`)", "continue", CONTINUE),
    ("preempted", "COMPLETED with Slurm's preempt_time set (22.05 records a preempted job that exited 0 so)",
     "continue", CONTINUE),
    ("signal_time", f"COMPLETED at or after {SIGNAL_TIME}: if training had finished, the next execution ends at "
     "once and is done", "continue", CONTINUE),
    ("killed_at_signal", f"FAILED at or after {SIGNAL_TIME}, by that signal (killed by it, or exit status 128 + its "
     "number): a trainer that does not trap it (no `preempt_signal` event)", "continue", CONTINUE),
    ("unsure", "COMPLETED, and a fact that would tell is missing (the --signal, the times: the rule names it)",
     "continue", CONTINUE + "; the safe side: never done on a guess"),
    ("failure", "FAILED, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE", "resubmit", RESUBMIT + REPEATED),
    ("preemption", "PREEMPTED", "resubmit", RESUBMIT),
    ("node_failure", "NODE_FAIL", "resubmit", RESUBMIT),
    ("cancel", "CANCELLED by someone else (an admin, as sacct says)", "resubmit", RESUBMIT),
    ("user_cancel", "CANCELLED by the job's own user (or by someone sacct cannot name)", "stop",
     "exit 0: a user's scancel means stop"),
    ("stop", "`dispatch-slurm stop ROOT`", "stop", "cancel the job, wait until it ended; exit 0"),
    ("requeue", "requeued by Slurm (node failure with JobRequeue, PreemptMode=REQUEUE)", "requeue",
     "Slurm restarts the job itself (same N, R+1): recorded, no budget used"),
    ("unknown", "UNKNOWN (known neither to slurmctld nor to sacct)", "fail",
     "exit 1: how it ended cannot be told, so nothing is resubmitted blindly"),
)
RULE_OF = {cause: rule for cause, _, rule, _ in TABLE}


def table() -> str:
    """The rules as docs/supervisor.md shows them (a Markdown table; tests/test_docs.py checks it)."""
    rows = ["| the execution ended | rule | then |", "|---|---|---|"]
    rows += [f"| {when} | {rule} | {then} |" for _, when, rule, then in TABLE]
    return "\n".join(rows)


def hold_table() -> str:
    """The hold's stages as docs/supervisor.md shows them (tests/test_docs.py checks it)."""
    rows = ["| while a hold stands | then |", "|---|---|"]
    rows += [f"| {r['when']} | {r['then']} |" for r in holds.stages(
        f"`--cessation-interval` (default {fmt_duration(DEFAULTS['cessation_interval'])})",
        f"`--hold-for` (default {fmt_duration(DEFAULTS['hold_for'])})")]
    return "\n".join(rows)


def next_action(st: State, quiet: bool = False) -> Optional[str]:
    """What the supervisor does next, from the state (None: nothing, a bug) and ``quiet``:
    Slurm was just asked about the job and said nothing new, the `run --keep-last`
    collection's turn (its second chance while the job runs; ``gc`` is the one after an
    execution ended, before its rule)."""
    if st.stopping is not None and not st.intent_open and not st.pending_decision and \
            (st.job is None or st.need_submit or st.hold or st.hold_needed or st.pending_apply):
        return "stopped"
    collects = bool(st.defn.get("keep_last"))
    for due, action in ((st.hold_needed, "open_hold"), (st.hold, "hold"), (st.gc_pending, "gc"),
                        (st.pending_decision, "decide"), (st.pending_apply, "apply_release"),
                        (st.intent_open, "recover_intent"), (st.need_submit, "submit"),
                        (st.job is not None and quiet and collects, "gc_again"), (st.job is not None, "follow")):
        if due:
            return action
    return None


def execution_fields(st: State, r: int, nodes: list[str], start_time: Optional[int]) -> dict:
    """What the record says of execution R of the current job (the cessation signal's input)."""
    assert st.g is not None and st.n is not None  # an execution is of a submitted job
    e = epoch.compose(st.g, st.n, r)
    attempt = names.attempt_token(st.cluster, str(st.job), e) if st.cluster else None
    return {"g": st.g, "n": st.n, "job": st.job, "r": r, "epoch": e, "attempt": attempt,
            "nodes": nodes, "start_time": start_time}


def observe(st: State, j) -> Optional[tuple[str, dict]]:
    """The one fact Slurm's answer about the current job adds (``j``: its JobInfo, None when
    neither slurmctld nor sacct knows it), or None when nothing changed. An ended CANCELLED
    execution still needs who cancelled it (one more Slurm call: the loop's)."""
    if j is None:
        r = st.started["r"] if st.started else 0
        if r in st.ended:
            return None
        return "ended", {**execution_fields(st, r, (st.started or {}).get("nodes", []),
                                            (st.started or {}).get("start_time")),
                         "state": "UNKNOWN", "reason": "known neither to slurmctld (purged after MinJobAge) nor to sacct"}
    r = j.restart_count
    if st.started and r > st.started["r"] and st.started["r"] not in st.ended:
        s = st.started
        return "ended", {**execution_fields(st, s["r"], s["nodes"], s.get("start_time")), "state": "REQUEUED",
                         "requeued": True, "reason": j.reason, "flags": sorted(j.flags),
                         "now": f"{j.state} restart_count={r}"}
    running = j.state in ("RUNNING", "SUSPENDED")
    if r not in st.ended and (st.started is None or r > st.started["r"]) and \
            (running or (j.ended and j.start_time and j.nodes)):  # or it ran between two polls
        return "started", {**execution_fields(st, r, j.nodes, j.start_time), "late": not running}
    if j.ended and r not in st.ended:
        return "ended", {**execution_fields(st, r, j.nodes, j.start_time), "state": j.state, "reason": j.reason,
                         "exit_code": j.exit_code, "signal": j.exit_signal, "flags": sorted(j.flags), **_times(j),
                         **({"via": "sacct"} if j.source == "sacct" else {})}
    return None


LAUNCH_HELD = "launch failed requeued held"  # Slurm's state_description after a failed batch launch
LAUNCH_RELEASES = 3  # releases of such a hold per submission before the run stops held


def launch_held(j) -> bool:
    """Slurm holds the job because its launch failed on a node (that node is drained: a
    prolog that failed, "Duplicate jobid" when a cut-off node came back still running it).
    The job itself is fine: released, it starts elsewhere. Its reason reads JobHeldUser, as
    for `scontrol hold`; only the description tells the two apart."""
    return j.state == "PENDING" and LAUNCH_HELD in str(j.raw.get("state_description") or "").lower()


def launch_hold(st: State, j, root: str) -> tuple[str, dict]:
    """The fact for a job Slurm holds after a failed launch: ``launch_released`` (the loop
    releases it) while fewer than LAUNCH_RELEASES of this submission were, else ``finished``
    held, naming what to look at and how to go on."""
    n = st.launch_releases + 1
    if n <= LAUNCH_RELEASES:
        return "launch_released", {"job": j.job_id, "n": n, "restarts": j.restart_count,
                                   "why": f"Slurm held job {j.job_id} after its launch failed ({LAUNCH_HELD}); "
                                          f"released ({n} of {LAUNCH_RELEASES})"}
    return "finished", {"g": st.g, "outcome": "held", "message": (
        f"Slurm holds job {j.job_id}: its launch failed again after {LAUNCH_RELEASES} releases ({LAUNCH_HELD}). "
        f"The nodes it failed on are drained (`sinfo -R` says why); once they are fixed: `scontrol release "
        f"{j.job_id}`, then `dispatch-slurm run {shlex.quote(root)}` to supervise it again")}


def _times(j) -> dict:
    """Slurm's times of an ended execution that the end rule reads (ends.py): its end, its
    time limit (or that it has none) and when Slurm preempted it, as far as Slurm says."""
    times = {"end_time": j.end_time, "time_limit": j.time_limit, "preempt_time": j.preempt_time}
    return {**{k: v for k, v in times.items() if v is not None}, **({"time_limit_unlimited": True} if j.unlimited else {})}


class Decision(NamedTuple):
    """The rule fact to record (``fact``) and, when the job is over, (outcome, message);
    ``slurm_hold``: `scontrol hold` the job first, and record the fact ``held_in_slurm``
    makes of the outcome (Slurm requeued a shared-checkpoint job anyway)."""
    fact: dict
    finish: Optional[tuple[str, str]] = None
    slurm_hold: bool = False


def held_in_slurm(fact: dict, error: Optional[str]) -> dict:
    """The requeue rule fact once `scontrol hold` was tried: ``error`` None when it held
    the job (the hold applies as to any recovery), else what Slurm said."""
    if error is None:
        return {**fact, "held": True, "slurm_held": True}
    return {**fact, "held": False, "warning": f"Slurm requeued this shared-checkpoint job and it could not be "
                                              f"held ({error}); its executions may overlap"}


def wants_latest(cause: str) -> bool:
    """Whether the rule for ``cause`` weighs progress: the latest published step, read for ``decide``."""
    return RULE_OF[cause] in ("continue", "resubmit")


def stopped_message(stopping: dict, job: Optional[int]) -> str:
    """Why a supervisor stopped: ``stopping`` the person's stop request, ``job`` the job it ended."""
    by = stopping.get("user") or "a person"
    return (f"stopped by {by}" + (f" ({stopping['message']})" if stopping.get("message") else "") +
            f"; job {job} ended" * (job is not None) + "; nothing is resubmitted")


def decide(st: State, ended: dict, cause: str, latest_step: Optional[int], root: str, why: str = "",
           own: Optional[Own] = None) -> Decision:
    """The rule for an ended execution (``cause`` and ``why`` from ends.cause_of), given the
    state, the step of the latest publication now (None: nothing published, or unreadable)
    and what the execution wrote itself (``own``: its events). Progress is a latest step
    above the one recorded at the previous decision; a chain of STALLS continuations
    without it is stopped (a trainer that never advances would otherwise be continued for
    ever), and so is a failure before the trainer started that repeats the one before it
    (``repeated``: resubmitting it would spend the budget in seconds)."""
    defn, job = st.defn, ended["job"]
    ref = {"job": job, "r": ended["r"], "cause": cause, **({"why": why} if why else {})}
    if st.stopping is not None:
        return Decision({"rule": "stop", **ref, "cause": "stop"}, ("stopped", stopped_message(st.stopping, st.job)))
    rule = RULE_OF[cause]
    if rule == "stop":
        who = "you" if ended.get("cancelled_by") is not None else \
            "its user, or by someone Slurm's accounting does not name (no sacct here)"
        return Decision({"rule": "stop", **ref}, ("stopped", f"job {job} was cancelled by {who}: a cancel by the "
                        f"job's own user means stop, so nothing is resubmitted (`dispatch-slurm supersede {root}` "
                        "starts it again)"))
    if rule == "requeue":
        return Decision({"rule": "requeue", **ref}, slurm_hold=bool(defn["shared"]))
    if rule == "done":
        return Decision({"rule": "done", **ref}, ("done", f"job {job} completed: {why or cause}"))
    if rule == "fail":
        return Decision({"rule": "fail", **ref}, ("failed", f"job {job} is known neither to slurmctld nor to "
                        "sacct, so how it ended cannot be told; not resubmitting blindly (supersede to go on)"))
    progress = latest_step is not None and (st.last_step is None or latest_step > st.last_step)
    stalls = 0 if progress else st.stalls + (rule == "continue")
    seen: dict[str, Any] = {"latest_step": latest_step, "progress": progress, "stalls": stalls}
    if rule == "continue":
        left = defn.get("continuations", DEFAULTS["continuations"]) - st.continued
        if left <= 0:
            return Decision({"rule": "fail", **ref, **seen, "budget_left": 0}, ("failed", f"job {job} would be "
                            f"continued ({why or cause}), but no continuation is left (--continuations "
                            f"{defn.get('continuations')})"))
        if stalls >= STALLS:
            return Decision({"rule": "fail", **ref, **seen}, ("failed", f"job {job} would be continued "
                            f"({why or cause}), but "
                            f"the last {STALLS} executions published no step above "
                            f"{st.last_step if st.last_step is not None else 'none'}: not continuing a run that "
                            "makes no progress (is the trainer resuming and saving? `dispatch-slurm report "
                            f"{root}`)"))
        return Decision({"rule": "continue", **ref, **seen, "budget_left": left - 1, "held": defn["shared"]})
    return resubmission(st, ended, {**ref, **seen}, own, root)


def resubmission(st: State, ended: dict, fact: dict, own: Optional[Own], root: str) -> Decision:
    """The resubmit rule's decision (``fact``: the rule fact so far): resubmit while budget
    lasts, unless the execution failed before its trainer started as the one before it did
    (``repeated``); else fail, naming such a failure."""
    defn = st.defn
    before = ends.before_training(ended, own) if own is not None else None
    if before is not None:
        fact = {**fact, "before_training": before}
    left = defn["resubmit"] - st.used
    if left > 0 and (again := repeated(st, before, fact["progress"], left, root)):
        return Decision({"rule": "fail", **fact, "budget_left": left, "repeated": True}, ("failed", again))
    if left > 0:
        return Decision({"rule": "resubmit", **fact, "budget_left": left - 1, "held": defn["shared"]})
    named = f": it {ends.failed_before(before)}" if before is not None else ""
    return Decision({"rule": "fail", **fact, "budget_left": 0}, ("failed", f"job {ended['job']} ended "
                    f"{ended['state']} and no resubmission is left (--resubmit {defn['resubmit']}){named}"))


def repeated(st: State, before: Optional[dict], progress: bool, left: int, root: str) -> Optional[str]:
    """Why the failure before the trainer started (``before``: ends.before_training) is not
    resubmitted again: the previous execution failed before its trainer started with the
    same fingerprint, and nothing was published since (None: resubmit). One resubmission
    is spent on a failure first, in case it passes."""
    prev = st.repeat
    if before is None or prev is None or progress or prev.get("before_training") != before:
        return None
    return (f"job {st.job} {ends.failed_before(before)}; job {prev['job']} failed the same way before it, so it is "
            f"not resubmitted again ({left} of --resubmit {st.defn['resubmit']} left). Once that is fixed, "
            f"`dispatch-slurm supersede {shlex.quote(root)}` starts it again")


def plan(defn: dict, root: str, state: Optional[State] = None, warnings: tuple[str, ...] = (),
         warning: Optional[JobSignal] = None) -> dict:
    """What each rule will do for this job, before it starts (or from where it stands);
    ``warning``: the job's --signal as its next submission would read it."""
    shared = defn["shared"]
    left = defn["resubmit"] - (state.used if state else 0)
    conts = defn.get("continuations", DEFAULTS["continuations"]) - (state.continued if state else 0)
    rows = []
    for cause, when, rule, then in TABLE:
        row = {"when": when, "cause": cause, "rule": rule, "then": then}
        budget = {"resubmit": (left, "resubmission"), "continue": (conts, "continuation")}.get(rule)
        if budget is not None:
            n, what = budget
            if n <= 0:
                row.update(rule="fail", then=f"no {what} left: exit 1")
            else:
                row["then"] = (f"submit the next execution at once with a new N ({n} left; stopped after "
                               f"{STALLS} without a higher published step)" if rule == "continue" else
                               f"resubmit with a new N ({n} left, then fail)" + REPEATED * (cause == "failure"))
                if shared:
                    row.update(rule="hold", replaces=rule, then=f"HOLD; when lifted, {row['then']}")
        if rule == "requeue" and shared:
            row.update(rule="hold", replaces="requeue",
                       then="cannot happen: submitted with --no-requeue, so Slurm ends the job and the other "
                            "rules apply; should Slurm requeue it anyway, `scontrol hold` and HOLD")
        rows.append(row)
    argv, env = sbatch_argv(defn, root, defn["g"], 1, submission_tag(root, defn["g"], 1))
    shown = ["sbatch", "--parsable", *(a.replace("=1", "=<N>") if a.startswith("--dispatch-submission")
                                       else a.replace(":n1", ":n<N>") for a in argv)]
    env = {k: ("<N>" if k == "DISPATCH_SUBMISSION" else v) for k, v in env.items()}
    notes = _notes(defn, root, warnings, warning)
    return {"root": root, "generation": defn["g"], "shared_checkpoint": shared,
            "resubmit_budget": defn["resubmit"], "budget_left": left,
            "continuations_budget": defn.get("continuations", DEFAULTS["continuations"]), "continuations_left": conts,
            "via": defn["via"], "signal": warning and warning.as_fact(),
            "sbatch": shown, "env": env, "rules": rows, "hold": _hold_plan(defn, root) if shared else None,
            "notes": notes,
            "state": state.summary() if state else "not started"}


def _notes(defn: dict, root: str, warnings: tuple[str, ...], warning: Optional[JobSignal]) -> list[str]:
    """The plan's notes: warnings, how an end is told with this job's --signal, gc, --via env."""
    notes = [f"WARNING: {w}" for w in warnings]
    if warning is not None:
        notes.append(f"how an end is told: {signal_rule(warning)}")
    if defn.get("keep_last"):
        notes.append(f"after each execution ends: `dispatch-slurm gc {root} --keep-last {defn['keep_last']}` "
                     "(saves of executions not shown to have ceased are kept)")
    if defn["via"] == "env" and defn["shared"]:
        notes.append("--via env: the Epilog sees only the plugin's options, so it records no cessation "
                     "evidence; holds lift by a person, or when every node rebooted")
    return notes


def _hold_plan(defn: dict, root: str) -> dict:
    """The plan's hold: the job's values and the stages a hold goes through (holds.STAGES)."""
    interval, hold_for = fmt_duration(defn["cessation_interval"]), fmt_duration(defn["hold_for"])
    return {"hold_for": defn["hold_for"], "cessation_interval": defn["cessation_interval"],
            "cessation_cmd": defn["cessation_cmd"],
            "text": f"the checkpoint is shared, so a new execution must not start while the old one may "
                    f"still write: each recovery waits up to {hold_for} for `dispatch-slurm release {root}` or a "
                    f"'ceased' answer of the cessation signal, asked every {interval}: {defn['cessation_cmd']}; "
                    f"unanswered, the job stays held and the supervisor exits 3",
            "stages": holds.stages(interval, hold_for)}
