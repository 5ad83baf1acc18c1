"""One process for many roots: every supervisor keeps its own record and rules, and they
share one Slurm read per poll.

Why: one ``scontrol show job ID`` per poll per job is two slurmctld RPCs every 10 s per
job (100 supervised jobs: ~1,200 RPCs a minute from one user, the pattern Slurm's rate
limiting throttles). Here a poll reads every followed job in one call
(``Slurm.find_jobs``: one read of slurmctld's memory, and one ``sacct`` for jobs it
forgot), and the Slurm read itself is paced (``pace``): every poll while an execution
is starting, pending or ending, at most every ``max_poll`` while everything runs. What
needs no Slurm RPC still happens every poll for every root: the claim's heartbeat, a
person's stop or release, a hold's cessation question, and a look at the root's
``ceased/`` and ``events/`` folders, whose change (the Epilog's evidence, a handler that
caught the signal) makes the next poll read Slurm at once.

A single ``run ROOT`` is a fleet of one (``follow``): this is the one loop. Each root's
supervisor is a state machine (loop.py) the fleet steps until it has to wait; the step
keeps the root's claim itself. No step waits inside: a root joining the fleet whose claim
is in doubt (another host's claimant, supervisor/claim.py) and a hold's cessation command
(supervisor/question.py) are states a later poll looks at again, so one slow root never
holds up another's poll."""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from ..contract.layout import CEASED, EVENTS
from ..errors import DispatchError
from ..slurm.client import JobInfo, Slurm, SlurmError
from .loop import EXIT_DONE, EXIT_ERROR, EXIT_FAILED, EXIT_HELD, Finished, Supervisor

#: how many times slower than the poll Slurm is read while every followed job runs
SLOW_FACTOR = 6
#: Slurm sends ``--signal`` at its first 30 s tick inside the warning time, so up to 30 s early
SIGNAL_SLACK = 30
#: a full filesystem or quota under a root: waited out (its job runs on), tried again this often
FULL = (errno.ENOSPC, errno.EDQUOT)
FULL_RETRY = 30.0


class NotAsked:
    """``Snapshot.find_job``'s answer for a job this poll did not read: look next poll."""


NOT_ASKED = NotAsked()


class Snapshot:
    """What one Slurm read said about every followed job, for one poll."""

    def __init__(self, jobs: Optional[dict[int, JobInfo]] = None, error: Optional[SlurmError] = None,
                 asked: Iterable[int] = ()):
        self.jobs, self.error, self.asked = jobs or {}, error, set(asked)

    def find_job(self, job_id: int):
        """As ``Slurm.find_job``: the job, None when neither slurmctld nor sacct knows it,
        SlurmError when the read failed; NOT_ASKED for a job this read did not cover."""
        if job_id not in self.asked:
            return NOT_ASKED
        if self.error is not None:
            raise self.error
        return self.jobs.get(job_id)


NO_READ = Snapshot()


def hot(sup: Supervisor, now: float) -> bool:
    """Whether this supervisor's job needs Slurm read at the next poll: it was never seen,
    it is not running (pending, starting, completing, requeued), it started in the last
    three polls, or its time limit (less the ``--signal`` lead) is near."""
    st, seen = sup.state, sup.seen
    if seen is None or seen.job_id != st.job or seen.state != "RUNNING":
        return True
    if st.started is None or st.started.get("r") != seen.restart_count:
        return True
    if seen.start_time and now - seen.start_time < 3 * sup.poll:
        return True
    end = seen.end_time
    lead = (st.defn.get("grace") or 0) + SIGNAL_SLACK if st.defn.get("signal") else 0
    return end is not None and end > 0 and now >= end - lead - 2 * sup.poll


def disk_mark(root: str) -> tuple:
    """The mtimes of ``ceased/`` and ``events/``: a new entry (the Epilog's, a handler's)
    changes them. One stat each, no Slurm RPC."""
    marks: list[Optional[int]] = []
    for sub in (CEASED, EVENTS):
        try:
            marks.append(os.stat(os.path.join(root, sub)).st_mtime_ns)
        except OSError:
            marks.append(None)
    return tuple(marks)


@dataclass
class Member:
    sup: Supervisor
    due: float
    mark: tuple = ()
    read: int = 0  # the last Slurm read this member was given (Fleet.reads)
    full: Optional[str] = None  # why its root's filesystem took no write, while it does not


def outcome(results: dict[str, Finished]) -> Finished:
    """One exit code for many roots: error (2) before failed (1) before held (3) before
    done (0); the message lists every root's."""
    if len(results) == 1:
        return next(iter(results.values()))
    order = (EXIT_ERROR, EXIT_FAILED, EXIT_HELD, EXIT_DONE)
    code = min((f.code for f in results.values()), key=lambda c: order.index(c) if c in order else 0,
               default=EXIT_DONE)
    lines = [f"{root}: {f.message}" for root, f in sorted(results.items())]
    counts = {c: sum(f.code == c for f in results.values()) for c in order}
    head = (f"{len(results)} roots: {counts[EXIT_DONE]} done, {counts[EXIT_FAILED]} failed, "
            f"{counts[EXIT_HELD]} held, {counts[EXIT_ERROR]} error")
    return Finished(code, "\n".join([head, *lines]))


class Fleet:
    """Supervisors of many roots in one loop (see the module doc). ``discover`` is called
    every poll to add (``add``) or fail (``fail``) the roots that appeared since."""

    def __init__(self, slurm: Slurm, *, poll: float, max_poll: Optional[float] = None,
                 clock: Callable[[], float], sleep: Callable[[float], None],
                 say: Callable[[str], None] = lambda m: print(f"dispatch-slurm: {m}", file=sys.stderr, flush=True),
                 discover: Optional[Callable[[], None]] = None, name_roots: bool = False):
        self.slurm, self.poll = slurm, poll
        self.max_poll = max(poll, max_poll if max_poll is not None else SLOW_FACTOR * poll)
        self.clock, self.sleep, self.say, self.discover = clock, sleep, say, discover
        self.name_roots = name_roots  # many roots: each line says whose
        self.members: dict[str, Member] = {}
        self.results: dict[str, Finished] = {}
        self.errors: dict[str, Exception] = {}
        self.last_read: Optional[float] = None
        self.snap = NO_READ  # the last read's answer
        self.reads = 0  # Slurm reads (one per poll that needed one): the benchmark's and tests' count
        self.once = False  # run(once=True): a root that cannot go on now ends this run

    def add(self, sup: Supervisor) -> None:
        self.members[sup.root] = Member(sup, self.clock(), disk_mark(sup.root))

    def fail(self, root: str, error: Exception) -> None:
        """A root that cannot be supervised (a corrupt record, a lost claim...): its result is
        the error; the others go on."""
        self.results[root], self.errors[root] = Finished(EXIT_ERROR, f"{error}"), error
        if self.name_roots:
            self.say(f"{root}: error: {error} (the other roots go on)")

    def run(self, once: bool = False) -> dict[str, Finished]:
        """Poll until every root's job is finished; with ``once``, until every root would
        have to wait (then each is "still running": scrontab runs it again)."""
        waiting: set[str] = set()
        self.once = once
        while True:
            self._discover()
            live = {r: m for r, m in self.members.items() if r not in waiting}
            if not live:
                return self.results
            now = self.clock()
            due = [r for r, m in live.items() if m.due <= now]
            if not due:
                self.sleep(max(0.0, min(m.due for m in live.values()) - now))
                continue
            self._read(due, now)
            for r in due:
                wait = self._step(r, self._unseen(r))
                if wait is not None and once and wait > 0 and self.members[r].sup.joining is None:
                    sup = self.members.pop(r).sup
                    sup.close()
                    self.results[r] = Finished(EXIT_DONE, f"{sup.state.summary()}; nothing more to do for "
                                                          f"{wait:g} s (run again, e.g. from scrontab, to continue)")

    def _discover(self) -> None:
        if self.discover is None:
            return
        try:
            self.discover()
        except DispatchError as e:  # the list itself (unreadable): the roots already known go on
            self.say(f"error: {e} (the roots already followed go on)")

    def _following(self) -> list[Member]:
        return [m for m in self.members.values() if m.sup.state.job is not None and m.sup.action == "follow"]

    def _read(self, due: list[str], now: float) -> None:
        """One Slurm read for every followed job, when any due one needs it (``hot``, a
        change on disk) or the last read is ``max_poll`` old; else no read this poll."""
        following = self._following()
        if not any(self.members[r] in following for r in due):
            return
        changed = False
        for m in following:
            mark = disk_mark(m.sup.root)
            changed |= mark != m.mark
            m.mark = mark
        stale = self.last_read is None or now - self.last_read >= self.max_poll - 0.5 * self.poll
        if not (changed or stale or any(hot(m.sup, now) for m in following)):
            return
        ids = {job for m in following if (job := m.sup.state.job) is not None}
        self.last_read, self.reads = now, self.reads + 1
        try:
            self.snap = Snapshot(self.slurm.find_jobs(ids), asked=ids)
        except SlurmError as e:
            self.snap = Snapshot(error=e, asked=ids)

    def _unseen(self, root: str) -> Snapshot:
        """The last read, once per member: members fall due a little apart, and one that was
        not due when the read was made must still be given it (else it waits for a read made
        while it is due, which the pacing may put off for ever)."""
        m = self.members[root]
        if m.read == self.reads:
            return NO_READ
        m.read = self.reads
        return self.snap

    def _step(self, root: str, snap: Snapshot) -> Optional[float]:
        """Step one supervisor until it has to wait (each step at most one thing); the wait,
        or None when it finished (its result recorded)."""
        m = self.members[root]
        sup = m.sup
        try:
            if m.full is not None:
                sup.reopen()  # the record as the disk holds it: what could not be written is not taken as written
                m.full = None
                self.say(f"there is space again under {root}: supervision goes on")
            for _ in range(1000):  # a record that never asks to wait would be a bug: stop, named
                # this poll's read, again after a step that changed something (it may say the job
                # both started and ended); a job submitted in this poll is NOT_ASKED until the next
                joining = sup.joining is not None
                wait = sup.step(snap.find_job)
                if joining and sup.joining is None:  # joined: due again at once, its job in that poll's read
                    m.due = self.clock()
                    return 0.0
                if wait:
                    m.due = self.clock() + min(wait, self.poll)
                    return wait
            raise DispatchError(f"{sup.record.path}: 1000 steps without a wait ({sup.state.summary()}); a bug?")
        except Finished as f:
            self.results[root] = f
        except OSError as e:
            if e.errno in FULL and not self.once and sup.joining is None:
                return self._full(m, e)
            self.fail(root, e)
        except DispatchError as e:
            self.fail(root, e)
        sup.close()
        del self.members[root]
        return None

    def _full(self, m: Member, e: OSError) -> float:
        """The root's filesystem is full (or its quota): not a broken root, and nothing to
        give up on a job that runs on. Said once; tried again every ``FULL_RETRY`` s, each
        try reading the record afresh (a torn line cut, as at any start)."""
        if m.full is None:
            self.say(f"the filesystem of {m.sup.root} is full ({e.strerror}): its job goes on, but nothing is "
                     f"recorded or submitted until there is space; trying again every {FULL_RETRY:g} s")
        m.full = e.strerror or str(e)
        wait = max(FULL_RETRY, self.poll)
        m.due = self.clock() + wait
        return wait


def follow(sup: Supervisor, once: bool = False, max_poll: Optional[float] = None) -> Finished:
    """Step one root's supervisor in the fleet's loop (a fleet of one) until its job is
    finished; with ``once``, only until the next step would have to wait (then exit 0: a
    cron or scrontab entry runs it again later). The root's error is raised, as the
    command's own."""
    fleet = Fleet(sup.slurm, poll=sup.poll, max_poll=max_poll, clock=sup.clock, sleep=sup.sleep, say=sup.say)
    fleet.add(sup)
    result = fleet.run(once)[sup.root]
    if result.code == EXIT_ERROR and fleet.errors.get(sup.root):
        raise fleet.errors[sup.root]
    return result
