"""Retention rules: which saves a gc keeps and why, as pure functions (no I/O).

The store reads a root into an ``Inventory`` (store/inventory.py) and gc (removal.py) removes
what ``decide`` says; slurm/cessation/ says which executions have ceased. A save is kept, in
this order of reasons, when it is

1. the latest publication's save (never removed, its publication never retired);
2. not inside an execution's folder (``exec/<attempt>/``), or behind a symlink;
3. pinned (``pinned/``: the save, a folder holding it, or something inside it);
4. a save of an execution not shown to have ceased: its processes may still write,
   read or rotate there;
5. in an exec folder modified less than ``min_age`` seconds ago: still being written
   (a second line of defence behind 4; a save already retired is exempt: its removal
   was decided before, and the gc's own removals touch the folder);
6. one of the ``keep_last`` newest saves that still exist, or the first save of a
   ``keep_every``-step window (step // N), by publication order.

Everything else of a ceased execution goes: published saves past the policy (their
publications retired first), unpublished leftovers (entries of the exec folder named
like a save, e.g. a save cut short by the end of the execution), and the rest of a
retired save whose removal was interrupted or whose publication a person retired.

Who retired a publication is its ``retired/`` marker's content (store/inventory.py): gc's
markers are empty, a person's say who and why. Only gc's prove that an execution ceased
(gc retires nothing of an execution before that); a person's says only that the
publication is not to be resumed from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from ..contract import layout, names
from ..contract.names import STEP_PATTERN, Publication
from ..errors import DispatchError
from ..store import Inventory, Save

KEEP, REMOVE, GONE = "keep", "remove", "gone"
#: what the report and `ls` call each action
STATES = {KEEP: "kept", REMOVE: "reclaimable", GONE: "retired"}
#: a kept publication whose save no longer exists (the trainer's rotation removed it): not retired, not kept
VANISHED = "gone"
# a save whose every publication is retired shows as retired, whether its files are gone or, retired by a
# person, wait for their execution to cease
#: every state a save can be shown in, in the report's order
SHOWN = (*STATES.values(), VANISHED)


@dataclass(frozen=True)
class Policy:
    """``keep_last``: how many of the newest existing saves to keep (None: all, for a
    view without a policy); ``keep_every``: also keep the first save of every window
    of that many steps; ``min_age``: seconds an exec folder must have been quiet."""

    keep_last: Optional[int] = None
    keep_every: Optional[int] = None
    min_age: float = 60.0
    pattern: str = STEP_PATTERN

    def __post_init__(self):
        if self.keep_last is not None and self.keep_last < 1:
            raise DispatchError(f"--keep-last must be 1 or more (the latest save is always kept), "
                                f"got {self.keep_last}")
        if self.keep_every is not None and self.keep_every < 1:
            raise DispatchError(f"--keep-every must be 1 or more steps, got {self.keep_every}")
        if self.min_age < 0:
            raise DispatchError(f"--min-age must be 0 or more seconds, got {self.min_age}")
        names.step_regex(self.pattern)


@dataclass
class Verdict:
    save: Save
    action: str
    why: str
    waiting: bool = False  # kept only until its execution is shown to have ceased and goes quiet
    freed: int = 0

    def as_dict(self, latest: Optional[Publication] = None) -> dict:
        s = self.save
        done = bool(s.retired) and all(p.name in s.retired for p in s.pubs)
        state = STATES[REMOVE] if self.action == REMOVE else STATES[GONE] if done else \
            VANISHED if not s.exists else STATES[KEEP]  # retired by a person, still on disk: retired
        return {"path": s.path, "attempt": s.attempt, "state": state, "action": self.action,
                "why": self.why, "waiting": self.waiting, "size": s.size, "exists": s.exists,
                "held_only": s.held_only, "freed": self.freed,
                "publications": [p.name for p in s.pubs], "retired": list(s.retired),
                "latest": latest is not None and latest.path == s.path, "step": s.step,
                "unfinished": s.unfinished, "copy": s.copy}


def pinned(path: str, pins: Iterable[str]) -> bool:
    """A pin covers the save it names, every save inside a folder it names, and the
    save holding a pinned file (removing the save would remove the file)."""
    return any(path == p or path.startswith(p + "/") or p.startswith(path + "/") for p in pins)


def keep_set(inv: Inventory, policy: Policy) -> dict[str, str]:
    """path -> why the policy keeps it, among published saves that still exist and
    whose publications are not retired, newest first."""
    pubs = sorted((p for s in inv.saves.values() for p in s.pubs), key=lambda p: p.name, reverse=True)
    live = [p for p in pubs if p.name not in inv.retired and inv.saves[p.path].exists]
    keep: dict[str, str] = {}
    if policy.keep_last is None:
        return {p.path: "no --keep-last given: every published save is kept" for p in live}
    for p in live:
        if len(keep) == policy.keep_last:
            break
        keep.setdefault(p.path, f"one of the {policy.keep_last} newest saves (--keep-last)")
    if policy.keep_every:
        first: dict[int, Publication] = {}
        for p in live:  # newest epoch first, so a tie on the step keeps the newest lineage's save
            w = p.step // policy.keep_every
            if w not in first or p.step < first[w].step:
                first[w] = p
        for w, p in first.items():
            keep.setdefault(p.path, f"first save of steps {w * policy.keep_every}.."
                                    f"{(w + 1) * policy.keep_every - 1} (--keep-every {policy.keep_every})")
    return keep


def ceased_by_retirement(inv: Inventory) -> dict[str, str]:
    """Executions gc already retired a save of: it did so only after their cessation was
    shown, and an execution that ceased stays ceased. A person's retirement is no such
    evidence (a person may retire the save of a running execution)."""
    return {s.attempt: "gc retired its saves earlier, once its cessation was shown"
            for s in inv.saves.values() if s.attempt and any(n not in inv.by_person for n in s.retired)}


def _by_whom(s: Save, inv: Inventory) -> str:
    """'retired by <user> (<reason>)' when a person retired the save's publications, else ''."""
    people = [inv.by_person[n] for n in s.retired if n in inv.by_person]
    if not people:
        return ""
    reason = f" ({people[0]['reason']})" if people[0]["reason"] else ""
    return f"retired by {people[0]['by']}{reason}"


def _verdict(s: Save, inv: Inventory, policy: Policy, keep: dict[str, str],
             ceased: Mapping[str, tuple[bool, str]], now: float) -> tuple:
    if inv.latest is not None and s.path == inv.latest.path:
        return KEEP, "the latest publication's save"
    if s.problem or s.attempt is None:
        return KEEP, s.problem or "not inside an execution's folder (exec/<attempt>/): gc leaves it"
    done = bool(s.retired) and all(p.name in inv.retired for p in s.pubs)
    person = _by_whom(s, inv) if done else ""
    if not person:
        return _rules(s, s.attempt, inv, policy, keep, ceased, now, done)
    # a person retired it: the same rules, and the why says so first
    action, why, *waiting = _rules(s, s.attempt, inv, policy, keep, ceased, now, done)
    return (action, f"{person}: {why.removeprefix('retired: ')}", *waiting)


def _rules(s: Save, attempt: str, inv: Inventory, policy: Policy, keep: dict[str, str], ceased: Mapping[str, tuple[bool, str]],
           now: float, done: bool) -> tuple:
    if pinned(s.path, inv.pins):
        return KEEP, "pinned"
    if done and not s.exists:
        return GONE, "retired: its save is removed"
    ok, why = ceased[attempt] if attempt in ceased else (None, "not asked")
    if ok is False:
        return KEEP, f"execution {s.attempt} is not shown to have ceased: {why}", True
    if done and ok:
        return REMOVE, "retired: finishing its removal"
    age = now - inv.newest.get(attempt, 0.0)
    if age < policy.min_age:
        return KEEP, f"still being written: exec/{s.attempt} was modified {max(age, 0):.0f} s ago " \
                     f"(--min-age {policy.min_age:g})", True
    if s.path in keep:
        return KEEP, keep[s.path]
    if ok is None:
        return KEEP, f"execution {s.attempt} is not known to have ceased (not asked)"
    if s.copy and s.path.startswith(f"{layout.HELD}/"):
        return REMOVE, f"links a killed publish of execution {s.attempt} left (no publication names them); " \
                       f"it has ceased ({why})"
    if s.copy:
        return REMOVE, f"the copies execution {s.attempt} resumed from; it has ceased ({why})"
    if not s.pubs:
        return REMOVE, f"unpublished leftover of execution {s.attempt}, which has ceased ({why})"
    gone = "" if s.exists and not s.held_only else \
        "; its execution's folder no longer holds it (the trainer's own rotation)" + \
        (": the publication's held links go with it" if s.held_only else "")
    return REMOVE, f"published, not kept by the policy; execution {s.attempt} has ceased ({why}){gone}"


def decide(inv: Inventory, policy: Policy, ceased: Mapping[str, tuple[bool, str]], now: float) -> list[Verdict]:
    """Every save's verdict, in publication order (leftovers after). ``ceased``: attempt ->
    (ceased?, the evidence or why not); an attempt missing from it was not asked about."""
    keep = keep_set(inv, policy)
    known = {**ceased, **{a: (True, why) for a, why in ceased_by_retirement(inv).items()}}
    order = sorted(inv.saves.values(), key=lambda s: (not s.pubs, min(p.name for p in s.pubs) if s.pubs else "",
                                                      s.path))
    return [Verdict(s, *_verdict(s, inv, policy, keep, known, now)) for s in order]


def empty_folders(inv: Inventory, policy: Policy, ceased: Mapping[str, tuple[bool, str]], now: float) -> list[str]:
    """Empty exec folders gc removes: their execution has ceased (a gc killed between
    the last removal and the folder's leaves one) and they are quiet for ``min_age``."""
    known = {**ceased, **{a: (True, "") for a in ceased_by_retirement(inv)}}
    return sorted(a for a in inv.empty if known.get(a, (False,))[0] and now - inv.newest[a] >= policy.min_age)


def needs(inv: Inventory, policy: Policy, now: float) -> set[str]:
    """The executions whose cessation matters: those gc would remove something of if they
    had ceased (so gc asks Slurm about these only)."""
    every = {s.attempt: (True, "") for s in inv.saves.values() if s.attempt}
    asked = ceased_by_retirement(inv)
    return {v.save.attempt for v in decide(inv, policy, every, now)
            if v.action == REMOVE and v.save.attempt is not None and v.save.attempt not in asked}
