"""The supervisor: follow a job through Slurm and apply the recovery rules.

`dispatch-slurm run ROOT -- SBATCH_ARGS` submits the job (allocating N under
``<root>/sub/``), follows it with the Slurm client (CLI JSON), and when an execution
ends applies a rule: rules.TABLE is the one table of them (done, continue after a time
limit, resubmit, stop, requeue, fail), which the loop, ``plan`` and docs/supervisor.md share.

For a shared checkpoint (``--shared-checkpoint``: the job cannot isolate its writes)
every recovery rule is replaced by a *hold* for a person: a new execution must not
start while the old one may still write into the one folder. While a hold stands the
cessation signal (a site command) is asked every ``--cessation-interval``; "ceased"
lifts the hold and the replaced rule applies; so does ``dispatch-slurm release ROOT``.
A hold that expires unanswered leaves the job held (exit 3).

Everything the supervisor learns or decides is a *fact* appended to
``<root>/record.jsonl`` (record.py), and its state is a pure replay of those facts
(state.py), so a restarted supervisor continues exactly where the record stops. One
writer at a time: supervisors claim the root (claim.py). People talk to it through
request entries (requests.py). The rules (rules.py) are applied by each root's supervisor
(loop.py: a state machine with one step), which the fleet (fleet.py) steps: the one loop,
of one root or many.

Submission is crash-safe: the intent (G, N and a tag) is recorded before sbatch runs
and the job carries the tag as ``--comment``; a restarted supervisor that finds an
intent without a job id asks Slurm for a job with that tag before submitting again.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from .. import store
from ..contract import epoch as epochmod
from ..contract import names
from ..contract.layout import RECORD
from ..contract.signals import JobSignal
from ..errors import DispatchError
from ..slurm.client import Slurm, SlurmError
from . import requests, sweep
from .claim import DEFAULT_POLL, Claim
from .fleet import Fleet, follow, outcome
from .loop import EXIT_DONE, EXIT_ERROR, EXIT_FAILED, EXIT_HELD, Finished, Supervisor, job_signal_of, lead_refusal
from .record import Record
from .render import render_plan
from .rules import (DEFAULT_CESSATION_CMD, DEFAULTS, STALLS, check_resume, make_defn, plan,
                    resolve_via, sbatch_argv, submission_tag)
from .state import State


class NoHold(DispatchError):
    """`release` found no hold to answer (exit 1: a negative answer, not an error)."""


def normalize(root: str) -> str:
    """ROOT as the supervisor records it; refused unless its store can hold the record."""
    if not store.backend(root).appendable:
        raise store.at(root).not_appendable("the supervisor", "its record is appended and fsynced")
    root = names.normalize_root(root)
    if "%a" in root:
        raise DispatchError(f"checkpoint root {root!r}: %a is expanded by `run` only (with --array among "
                            "sbatch's arguments); name one task's root here")
    if not os.path.isdir(root):
        raise DispatchError(f"checkpoint root {root} does not exist (create it first)")
    return root


def plugin_options(slurm: Slurm) -> Optional[set[str]]:
    """The SPANK plugin options sbatch has here, or None when sbatch cannot be asked."""
    try:
        return slurm.plugin_options()
    except SlurmError:
        return None


def signal_warning(root: store.Root, defn: dict) -> Optional[str]:
    """With --signal: a warning when the saves measured under ROOT do not fit the grace."""
    if defn.get("signal") is None:
        return None
    from ..contract.signals import fit_warning, slowest_save
    warning = fit_warning(defn["grace"], slowest_save(store.events.read(root)))
    return warning and warning.removeprefix("warning: ")


def submission_signal(defn: dict, root: str) -> JobSignal:
    """The job's --signal as its next submission would read it (what `plan` states)."""
    return job_signal_of(defn, *sbatch_argv(defn, root, defn["g"], 1, submission_tag(root, defn["g"], 1)))


def signal_refusal(defn: dict, root: str) -> Optional[str]:
    """Why this job's --signal cannot tell a stop from a finish (refused before anything is
    submitted: `run`; a warning in `plan`), or None."""
    return lead_refusal(defn, *sbatch_argv(defn, root, defn["g"], 1, submission_tag(root, defn["g"], 1)))


def new_defn(options: dict, args: list[str], slurm: Slurm) -> dict:
    """Generation 0's definition, with ``--via auto`` resolved here and now; `--via spank`
    where the plugin is missing is refused before anything is submitted."""
    defn = {"g": 0, **make_defn(options, args)}
    defn["via"], warning = resolve_via(defn["via"], plugin_options(slurm))
    if warning and defn["via"] == "spank":
        raise DispatchError(warning)
    return defn


def open_root(root: str, options: dict, args: list[str], poll: float, slurm: Slurm, once: bool = False,
              template: Optional[str] = None, say: Optional[Callable[[str], None]] = None) -> Supervisor:
    """A supervisor of ROOT for a fleet: a new root's arguments checked now, before anything
    is written; its first steps (``joining``) take the root's claim, however long a claim
    in doubt takes to tell (supervisor/claim.py: a waiting state, the other roots step
    meanwhile), replay its record and, for a new root, record the job's definition (with
    ``template``, an array task's ``%a`` root). ``say``: where its lines go (one of many
    roots: each line names it)."""
    root = normalize(root)
    if not os.path.exists(os.path.join(root, RECORD)):  # a new root's bad arguments: refused before its claim writes anything
        refused = signal_refusal({"g": 0, **make_defn(options, args)}, root)
        if refused:
            raise DispatchError(refused)
    sup = Supervisor(root, slurm, poll=poll, say=say)
    sup.joining = lambda: _joining(sup, options, args, once, template)
    return sup


def _joining(sup: Supervisor, options: dict, args: list[str], once: bool, template: Optional[str]) -> float:
    """One joining step of ``sup`` (open_root): the seconds until the next look at its
    claim, or 0 once it joined (the next step is its first as a supervisor)."""
    wait = sup.claim_root("run --once" if once else "run")
    if wait is not None:
        return wait
    st = sup.state
    if st.facts:
        check_resume(options, args, st.defn)
        defn = None
    else:
        defn = new_defn(options, args, sup.slurm)
        if template:
            defn["array_root"] = template
    if (warning := signal_warning(sup.store, defn or st.defn)):
        sup.say(f"warning: {warning}")
    sup.start(defn)
    sup.joining = None
    return 0


def run(roots: str | list[str], options: dict, args: list[str], poll: float, slurm: Optional[Slurm] = None,
        once: bool = False, max_poll: Optional[float] = None, roots_from: Optional[str] = None) -> Finished:
    """Supervise each root (a ``%a`` root: one per array task; ``roots_from``: also the
    roots that folder or list file names, now and later), all in one loop sharing one
    Slurm read per poll (fleet.py). One root's error is its own: the others go on."""
    roots = [roots] if isinstance(roots, str) else list(roots)
    slurm = slurm or Slurm()
    tasks = list({normalize(t.root): t for t in sweep.expand(roots, args)}.values())  # a bad root: refused, none run
    if roots_from is not None:
        list(sweep.listed(roots_from))  # unreadable now: refused before anything is submitted
    if len(tasks) == 1 and roots_from is None:  # one root: its errors are the command's
        sup = open_root(normalize(tasks[0].root), options, tasks[0].args, poll, slurm, once, tasks[0].template)
        try:
            return follow(sup, once=once, max_poll=max_poll)
        finally:
            sup.close()
    fleet = Fleet(slurm, poll=poll, max_poll=max_poll, clock=time.time, sleep=time.sleep, name_roots=True,
                  discover=(lambda: _discovered(fleet, roots_from, options, args, poll, slurm, once)) if roots_from
                  else None)
    for t in tasks:
        _join(fleet, normalize(t.root), options, t.args, poll, slurm, once, t.template)
    fleet.run(once)
    return outcome(fleet.results)


def _join(fleet: Fleet, root: str, options: dict, args: list[str], poll: float, slurm: Slurm, once: bool,
          template: Optional[str] = None) -> None:
    say = (lambda m: fleet.say(f"{root}: {m}")) if fleet.name_roots else None
    try:
        fleet.add(open_root(root, options, args, poll, slurm, once, template, say))
    except (DispatchError, OSError) as e:
        fleet.fail(root, e)


def _discovered(fleet: Fleet, source: str, options: dict, args: list[str], poll: float, slurm: Slurm,
                once: bool) -> None:
    """Roots ``--roots-from`` names that the fleet does not know yet, joined (or failed)."""
    for root in sweep.listed(source):
        root = names.normalize_root(store.backend(root).absolute(root, False))
        if root not in fleet.members and root not in fleet.results:
            _join(fleet, root, options, args, poll, slurm, once)


def stop(root: str, message: Optional[str] = None, poll: float = DEFAULT_POLL,
         slurm: Optional[Slurm] = None) -> Finished:
    """Ask the supervisor of ROOT to stop: it cancels the job and finishes "stopped",
    resubmitting nothing. Without a running supervisor, this process is it, until the
    job has ended."""
    root = normalize(root)
    where = store.at(root)
    st = State.replay(Record(where).read())
    if st.g is None:
        raise DispatchError(f"{root} has no record of a job: nothing to stop")
    if st.finished and st.finished["outcome"] != "held":
        return Finished(EXIT_DONE, f"nothing to stop: {st.summary()}")
    try:
        requests.make(where, f"stop.{st.g}", {**requests.who(), "message": message or ""})
    except FileExistsError:
        pass  # asked already: wait for it like the first time
    claim = Claim(where, poll, "stop")
    claims, exited = claim.entries()
    if claims and claim.holder(claims[-1], exited) != "gone":  # one look: possibly alive is alive
        return Finished(EXIT_DONE, f"asked the running supervisor of {root} to stop (it cancels the job "
                                   "and finishes at its next poll)")
    return run(root, {}, [], poll, slurm)


def supersede(root: str, options: dict, args: list[str], poll: float, slurm: Optional[Slurm] = None) -> Finished:
    root = normalize(root)
    where = store.at(root)
    st = State.replay(Record(where).read())
    if st.g is None:
        raise DispatchError(f"{root} has no record of a job to supersede: start one with `dispatch-slurm run`")
    new_g = st.g + 1
    if new_g > epochmod.G_MAX:
        raise DispatchError(f"generation {new_g} is over the maximum {epochmod.G_MAX:,}")
    defn = make_defn(options, args, base=st.defn)
    try:
        requests.make(where, f"supersede.{new_g}", {**requests.who(), "args": args})
    except FileExistsError:
        raise DispatchError(f"generation {new_g} of {root} was already requested "
                            f"({requests.path(root, f'supersede.{new_g}')})") from None
    sup = Supervisor(where, slurm, poll=poll)
    try:
        st = sup.open("supersede", takeover=True)
        if st.g is None or st.g + 1 != new_g:
            raise DispatchError(f"the record moved to generation {st.g} meanwhile; not superseding")
        sup.start(None)
        sup.supersede(defn)
        return follow(sup)
    except Finished as f:
        return f
    finally:
        sup.close()


def release(root: str, message: Optional[str] = None) -> dict:
    """A person's answer to the standing hold: an O_EXCL entry the supervisor picks up."""
    root = normalize(root)
    where = store.at(root)
    st = State.replay(Record(where).read())
    if st.hold is None:
        raise NoHold(f"no hold stands on {root} ({st.summary()})")
    h = st.hold
    body = {**requests.who(), "message": message or ""}
    name = f"release.{h['hold']}"
    try:
        path = requests.make(where, name, body)
    except FileExistsError:
        raise DispatchError(f"hold #{h['hold']} of {root} is already released ({requests.path(root, name)}); "
                            "the supervisor applies it at its next poll") from None
    claim = Claim(where, DEFAULT_POLL, "release")
    claims, exited = claim.entries()
    running = bool(claims) and claim.holder(claims[-1], exited) != "gone"  # one look: possibly alive is alive
    return {"hold": h["hold"], "job": h["job"], "r": h["r"], "replaces": h["replaces"], "entry": path,
            "supervisor_running": running}


def load_state(root: str) -> State:
    return State.replay(Record(normalize(root)).read())


__all__ = ["Record", "Claim", "State", "Supervisor", "Finished", "plan", "render_plan", "run", "supersede",
           "release", "stop", "open_root", "Fleet", "follow", "NoHold", "signal_warning", "submission_signal", "signal_refusal",
           "lead_refusal", "load_state", "new_defn", "plugin_options", "resolve_via", "normalize", "make_defn", "check_resume", "DEFAULTS", "STALLS",
           "DEFAULT_CESSATION_CMD", "DEFAULT_POLL", "EXIT_DONE", "EXIT_FAILED", "EXIT_ERROR", "EXIT_HELD"]
