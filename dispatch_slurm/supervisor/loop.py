"""One root's supervisor: a state machine that follows a job through Slurm and applies
the rules.

``Supervisor.step()`` does at most one thing (records a fact and acts on Slurm) and
returns how long to wait before the next; the fleet (fleet.py) is the loop that steps
every root's supervisor, one root or many. Every decision is a fact in the record
*before* it is acted on, so a crash at any point is resumed by replaying the record."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Callable, Optional

from .. import store
from ..contract import epoch as epochmod
from ..contract import names
from ..contract.signals import JobSignal, job_signal, job_time_limit, lead_problem, sbatch_options
from ..errors import DispatchError
from ..retention import Collector
from ..slurm.client import JobInfo, Slurm, SlurmError
from ..store import events
from . import ends, holds, requests, rules
from .claim import DEFAULT_POLL, Claim
from .question import Asker, Question
from .record import Record
from .render import describe
from .rules import sbatch_argv, stopped_message, submission_tag
from .state import State

# Exit codes of `run` / `supersede`.
EXIT_DONE, EXIT_FAILED, EXIT_ERROR, EXIT_HELD = 0, 1, 2, 3


class Finished(Exception):
    """The supervisor stops: ``code`` is the process exit code, ``message`` says why."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def _say(msg: str) -> None:
    print(f"dispatch-slurm: {msg}", file=sys.stderr, flush=True)


#: how a step reads the job: ``Slurm.find_job``, or the fleet's one read of every followed
#: job (fleet.Snapshot.find_job, which may answer NOT_ASKED: look at the next poll)
Lookup = Callable[[int], object]


class Supervisor:
    """One root's supervisor. It opens the root's store once and keeps it: its record, its
    claim, the requests people make and its gc work through that store, each step in one
    session of it. ``step()`` does at most one thing (records facts and acts on Slurm) and
    returns how long to wait before the next; no step waits for anything itself (a claim in
    doubt, the cessation command: each is a state a later step looks at again). ``slurm``,
    ``clock``, ``sleep`` and ``ask`` (a hold -> the cessation signal's answer, at once: a
    stand-in for the site's command) are injectable for tests."""

    def __init__(self, root: store.Root, slurm: Optional[Slurm] = None, *, poll: float = DEFAULT_POLL,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 ask: Optional[Callable[[dict], dict]] = None, say: Optional[Callable[[str], None]] = None):
        self.store = store.at(root)
        self.root = self.store.root
        self.slurm = slurm or Slurm()
        self.poll = poll
        self.clock, self.sleep, self.say = clock, sleep, say or _say
        self.ask: Asker = (lambda h: Question.answered(h, ask(h))) if ask else \
            (lambda h: Question.start(h, self.root, self.state.cluster, self.clock()))
        self.record = Record(self.store, clock)
        self.state = State()
        self.claim: Optional[Claim] = None
        self.joining: Optional[Callable[[], float]] = None  # set by supervisor.open_root: the steps that join a fleet
        self.asking: Optional[Question] = None  # the cessation signal asked, not answered yet
        self.asked_this_run = False
        self._slurm_warned = False
        self._announce: Optional[dict] = None
        self.gc = Collector(self.store, self.slurm, clock, self.record.read)  # run --keep-last K
        self.seen: Optional[JobInfo] = None  # Slurm's last answer about the job (fleet.hot)
        self.quiet = False  # that answer said nothing new (rules.next_action: the gc's second chance)

    @property
    def action(self) -> Optional[str]:
        """What the supervisor does next (rules.next_action of its state; None: nothing, a
        bug): the one place the rules are asked, by ``step`` and by the fleet."""
        return rules.next_action(self.state, self.quiet)

    # -- record ---------------------------------------------------------------------------

    def claim_root(self, purpose: str, takeover: bool = False) -> Optional[float]:
        """One look at claiming the root (Claim.attempt): None once it is this supervisor's
        and its record replayed, else the seconds until the next look (a claimant on another
        host whose heartbeat is not yet seen to move or to stand still)."""
        with self.store:
            if self.claim is None:
                self.claim = Claim(self.store, self.poll, purpose, clock=self.clock)
            wait = self.claim.attempt(takeover)
            if wait is not None:
                return wait
            facts = self.record.open_for_append()
        self.state = State.replay(facts)
        return None

    def open(self, purpose: str, takeover: bool = False) -> State:
        """Claim the root and replay its record, waiting for the claim here (one root's
        command; a fleet joins a root by its steps instead: supervisor.open_root)."""
        while (wait := self.claim_root(purpose, takeover)) is not None:
            self.sleep(wait)
        return self.state

    def reopen(self) -> None:
        """Replay the record as the disk holds it, as a supervisor started afresh would (a torn
        tail cut): after a step that could not write (a full filesystem), a fact it could not
        write is not taken as written, and the step that wanted it is taken again."""
        with self.store:
            facts = self.record.open_for_append()
        self.state = State.replay(facts)
        self.quiet = False

    def fact(self, type_: str, **fields) -> dict:
        if self.claim is not None and not self.claim.mine():
            self._lost_claim()
        if self._announce is not None and type_ != "supervisor":
            announce, self._announce = self._announce, None
            self.fact("supervisor", **announce)  # who writes what follows (only if something does)
        f = self.record.append({"type": type_, **fields})
        self.state.apply(f)
        self.say(describe(f))
        return f

    def _upkeep(self) -> None:
        """Before each step: stop if another supervisor claimed the root since, else beat
        the claim's heartbeat (a successor waits for it to stand still)."""
        if self.claim is not None:
            if not self.claim.mine():
                self._lost_claim()
            self.claim.heartbeat()

    def _lost_claim(self):
        me = self.claim
        nxt = None if self.state.g is None else self.state.g + 1
        superseded = nxt is not None and requests.read(self.store, f"supersede.{nxt}") is not None
        if me is not None:
            me.exit()
        if superseded:
            raise Finished(EXIT_DONE, f"superseded by generation {nxt}; that supervisor "
                                      "cancels this generation's job and carries on")
        raise Finished(EXIT_ERROR, "another supervisor took over this root; stopping without writing")

    def close(self) -> None:
        if self.asking is not None:
            self.asking.close()
            self.asking = None
        if self.claim is not None:
            self.claim.exit()

    # -- start ----------------------------------------------------------------------------

    def start(self, defn: Optional[dict]) -> None:
        """After open(): record who we are; for a new root, the job's definition."""
        with self.store:
            self._start(defn)

    def _start(self, defn: Optional[dict]) -> None:
        try:
            cluster = self.slurm.cluster_name()
        except SlurmError as e:
            if self.state.cluster is None:
                raise DispatchError(f"cannot ask Slurm for the cluster name: {e}") from None
            cluster = self.state.cluster
        resumed = self.state.facts > 0
        self._announce = {"incarnation": self.claim.seq if self.claim else None, "host": socket.gethostname(),
                          "pid": os.getpid(), "cluster": cluster, "resumed": resumed, "poll": self.poll}
        self.state.cluster = cluster
        if not resumed:
            if defn is None:
                raise DispatchError(f"{self.root} has no record yet: give the sbatch arguments after `--`")
            self.fact("job", **defn)

    # -- the step ----------------------------------------------------------------------------

    def step(self, lookup: Optional[Lookup] = None) -> float:
        """The claim's upkeep, then the next thing the state calls for (``action``), in one
        session of the root; the seconds to wait before the next step. ``lookup``: how the
        job is read (default: Slurm itself). A root still joining its fleet takes its
        joining steps first (``joining``)."""
        if self.joining is not None:
            return self.joining()
        with self.store:
            self._upkeep()
            return self._next(lookup or self.slurm.find_job)

    def _next(self, lookup: Lookup) -> float:
        st = self.state
        if st.finished and st.finished["outcome"] != "held":
            raise self._outcome(st.finished)
        if st.stopping is None and st.g is not None:
            req = requests.read(self.store, f"stop.{st.g}")
            if req is not None:
                self._stop(req)
                return 0
        action = self.action
        if action == "stopped" and st.stopping is not None:  # next_action stops only when asked to
            self.finish("stopped", stopped_message(st.stopping, st.job))
        if action is None:
            raise DispatchError(f"{self.record.path}: the record leaves nothing to do ({st.summary()}); a bug?")
        if action == "follow":
            return self._follow(lookup)
        return {"open_hold": self._open_hold, "hold": self._look_at_hold, "gc": self._gc, "decide": self._decide,
                "apply_release": self._apply_release, "recover_intent": self._recover_intent,
                "submit": self._submit, "gc_again": self._gc_again}[action]() or 0

    def _open_hold(self) -> None:
        needed = self.state.hold_needed
        assert needed is not None  # next_action's "open_hold"
        h = self._record(None, "hold", holds.opened(self.state, needed, self.clock()))
        self.say(holds.announcement(h, self.root))

    def _record(self, h: Optional[dict], type_: str, fields: dict) -> dict:
        """Record a fact of hold ``h`` (None: the hold fact itself) and write the event it
        is also (holds.event)."""
        f = self.fact(type_, **fields)
        h = h or f
        ev = holds.event(f)
        if ev is not None:
            events.record(type_, root=self.store, attempt=h.get("attempt") or "supervisor", hold=h["hold"], **ev)
        return f

    def _apply_release(self) -> None:
        pending = self.state.pending_apply
        assert pending is not None  # next_action's "apply_release"
        fact, release = holds.applied(self.state, pending)
        if release is not None:  # the requeue Slurm was told to hold
            try:
                self.slurm.release(release)
            except SlurmError as e:
                self.fact("note", text=f"scontrol release {release} failed: {e}")
        self.fact("rule", **fact)

    def _look_at_hold(self) -> float:
        """One look at the standing hold (holds.look): the inputs are a person's release
        entry, the clock and the cessation signal's question: started when the rules ask
        for it, its answer collected by a later look once it exited (a look never waits
        for it); the seconds until the next look."""
        h = self.state.hold
        assert h is not None  # next_action's "hold"
        req = requests.read(self.store, f"release.{h['hold']}")
        answer = self._answer(h)
        look = holds.look(self.state, self.clock(), self.poll, self.root, req, answer, self.asked_this_run,
                          asking=self.asking is not None)
        if look.ask:
            self.asking, self.asked_this_run = self.ask(h), True
            answer = self._answer(h)  # a stand-in's, at once; the site's command: at a later look
            look = holds.look(self.state, self.clock(), self.poll, self.root, req, answer, True,
                              asking=self.asking is not None)
        if look.stage not in ("ask", "asking") and self.asking is not None:  # a person's release came first
            self.asking.close()
            self.asking = None
        for type_, fields in look.facts:
            self._record(h, type_, fields)
        if look.finish:
            self.finish(*look.finish)
        return look.wait

    def _answer(self, h: dict) -> Optional[dict]:
        """The question's answer once it has one (the question is done then), else None."""
        q = self.asking
        if q is None or q.hold != h["hold"]:
            if q is not None:
                q.close()
            self.asking = None
            return None
        answer = q.answer(self.clock())
        if answer is not None:
            self.asking = None
        return answer

    def _stop(self, req: dict) -> None:
        """A person asked to stop: record it, cancel the job if it may still run, then
        follow it until Slurm says it ended (the loop finishes "stopped" then)."""
        who = {k: req[k] for k in ("user", "uid", "host", "message", "entry") if k in req}
        self.fact("stop", g=self.state.g, by="person", job=self.state.job, **who)
        if self.state.job is not None:
            try:
                self.slurm.cancel(self.state.job)
            except SlurmError as e:  # already over, most likely; following it tells
                self.fact("note", text=f"scancel {self.state.job}: {e}")

    @staticmethod
    def _outcome(f: dict) -> Finished:
        code = {"done": EXIT_DONE, "superseded": EXIT_DONE, "stopped": EXIT_DONE, "failed": EXIT_FAILED,
                "held": EXIT_HELD}
        return Finished(code.get(f["outcome"], EXIT_ERROR), f.get("message") or f["outcome"])

    def finish(self, outcome: str, message: str) -> None:
        f = self.fact("finished", g=self.state.g, outcome=outcome, message=message)
        raise self._outcome(f)

    # -- submission -----------------------------------------------------------------------

    def _submit(self) -> float:
        """Submit the next execution. ``sbatch --test-only`` first, so a job Slurm would
        refuse spends no submission number; an N that sbatch then refused anyway (Slurm
        has no job with its tag) is used again, never a fresh one. sbatch runs where the job
        was defined (``cwd``): it finds the script there, and the job starts there."""
        st, defn = self.state, self.state.defn
        g = st.g
        assert g is not None  # a job is defined: next_action submits within a generation
        cwd = defn["cwd"] if defn.get("cwd") and os.path.isdir(defn["cwd"]) else None
        why = rules.give_up(st)
        if why is not None:
            self.finish("failed", why)
        n = st.retry_n
        if n is None:
            argv, env = sbatch_argv(defn, self.root, g, 1, submission_tag(self.root, g, 1))
            # Without the plugin's options: it refuses an N that sub/ does not hold, and
            # this N is allocated only once the test passed. A refusal of the plugin's own
            # comes at the real sbatch, whose N is then used again (retry_n), never lost.
            argv = [a for a in argv if not a.startswith("--dispatch-")]
            try:
                self.slurm.test_submit(argv, env or None, cwd=cwd)
            except SlurmError as e:
                self.fact("submit_failed", g=st.g, error=str(e)[-1000:], test_only=True)
                return self.poll
            # an array task's N comes from the folder of the task roots, as for any array submission
            array = defn.get("array_root")
            n = (store.at(names.submission_dir(array)) if array else self.store).allocate_submission()
        tag = submission_tag(self.root, g, n)
        argv, env = sbatch_argv(defn, self.root, g, n, tag)
        warning = job_signal_of(defn, argv, env)  # what the rule needs to tell a signalled end
        self.fact("intent", g=st.g, n=n, tag=tag, epoch=epochmod.compose(g, n, 0), warning=warning.as_fact())
        try:
            job = self.slurm.submit(argv, env or None, cwd=cwd)
        except SlurmError as e:
            self.fact("submit_failed", g=st.g, n=n, error=str(e)[-1000:])
            return self._recover_intent(refused=True)
        self.fact("submitted", g=st.g, n=n, job=job, tag=tag)
        return 0

    def _recover_intent(self, refused: bool = False) -> float:
        """An intent without a job id: sbatch may or may not have queued the job. Slurm
        knows (the tag is the job's comment): record what rules.recovered makes of its
        answer (``refused``: right after sbatch itself refused). sacct is asked too, for a
        job that ended and left slurmctld's memory while no supervisor ran; the minute of
        slack covers clocks that disagree."""
        st = self.state
        assert st.tag is not None  # an intent records its tag
        try:
            found = [j.job_id for j in self.slurm.jobs_with_comment(st.tag, since=(st.intent_t or 0) - 60)]
        except SlurmError as e:
            self._slurm_trouble(e)
            return self.poll
        got, wait = rules.recovered(st, found, refused)
        for type_, fields in got:
            self.fact(type_, **fields)
        return self.poll if wait else 0

    # -- following the job ----------------------------------------------------------------

    def _slurm_trouble(self, e: Exception) -> None:
        if not self._slurm_warned:
            self.say(f"warning: Slurm did not answer ({e}); retrying every {self.poll:g} s")
            self._slurm_warned = True

    def _follow(self, lookup: Lookup) -> float:
        """Ask Slurm about the job and record what changed (rules.observe); when nothing
        did, say so (``quiet``: rules.next_action may call for the gc's second chance)."""
        st, job = self.state, self.state.job
        assert job is not None  # next_action follows a submitted job
        self.quiet = False
        try:
            j = lookup(job)
        except SlurmError as e:
            self._slurm_trouble(e)
            return self.poll
        if j is not None and not isinstance(j, JobInfo):  # the fleet did not read Slurm this poll
            return self.poll
        self._slurm_warned = False
        self.seen = j
        seen = rules.observe(st, j)
        if seen is not None:
            type_, fields = seen
            if type_ == "ended" and fields["state"] == "CANCELLED":
                fields["cancelled_by"] = self.slurm.cancelled_by(job)  # j is None once slurmctld forgot it
            self.fact(type_, **fields)
            return 0
        if j is not None and rules.launch_held(j):
            return self._launch_held(j)
        self.quiet = True
        return 0 if self.action == "gc_again" else self.poll

    def _launch_held(self, j: JobInfo) -> float:
        """Slurm held the job after its launch failed on a node (rules.launch_held): release it
        (it starts elsewhere), a few times per submission; then the run ends held."""
        type_, fields = rules.launch_hold(self.state, j, self.root)
        if type_ == "finished":
            self.finish(fields["outcome"], fields["message"])
        self.fact(type_, **fields)
        try:
            self.slurm.release(j.job_id)
        except SlurmError as e:  # released by someone meanwhile, most likely: the next poll tells
            self.fact("note", text=f"scontrol release {j.job_id}: {e}")
        return self.poll

    # -- `run --keep-last K` ----------------------------------------------------------------

    def _gc(self) -> None:
        """After an execution ended, before its rule: gc before the next execution writes more."""
        self.fact("gc", **self.gc.run(self.state.defn["keep_last"]))

    def _gc_again(self) -> float:
        """The collection's second chance while the job runs (retention.Collector.again
        says whether a gc is due), then wait a poll."""
        self.quiet = False
        again = self.gc.again(self.state.defn)
        if again:
            self.fact("gc", **again)
        return self.poll

    # -- rules ----------------------------------------------------------------------------

    def _decide(self) -> None:
        """Record the rule for the ended execution (ends.cause_of, rules.decide), then act on it."""
        st = self.state
        ended = st.pending_decision
        assert ended is not None  # next_action's "decide"
        own = self._own(ended)
        cause, why = ends.cause_of(ended, own, JobSignal.from_fact(st.warning), os.geteuid())
        d = rules.decide(st, ended, cause, self._latest_step() if rules.wants_latest(cause) else None, self.root,
                         why, own)
        fact = d.fact
        if d.slurm_hold:  # keep it from starting: the hold applies
            fact = rules.held_in_slurm(fact, self._slurm_hold(ended["job"]))
        self.fact("rule", **fact)
        if d.finish:
            self.finish(*d.finish)

    def _slurm_hold(self, job: int) -> Optional[str]:
        """`scontrol hold` the job: None when it did, else Slurm's error."""
        try:
            self.slurm.hold(job)
        except SlurmError as e:
            return str(e)
        return None

    def _own(self, ended: dict) -> ends.Own:
        """What the ended execution wrote itself (its events), for the rule; only a COMPLETED
        end asks (a time-limit save exits 0, a finished trainer too), and a FAILED one (did
        its trainer start: ends.before_training)."""
        if ended["state"] not in ("COMPLETED", "FAILED"):
            return ends.Own()
        if not ended.get("attempt"):
            return ends.Own(error="the record names no attempt for it")
        try:
            return ends.own_events(events.read(self.store, attempt=ended["attempt"], strict=False))
        except (OSError, DispatchError) as e:
            return ends.Own(error=f"{ended['attempt']}: {e}")

    def _latest_step(self) -> Optional[int]:
        """The latest publication's step: a continuation's progress (None: none, or unreadable)."""
        try:
            pub = self.store.latest()
        except (OSError, DispatchError) as e:
            self.fact("note", text=f"cannot read the latest publication ({e}); the next execution will "
                                   "fail on it too until it is fixed")
            return None
        return None if pub is None else pub.step

    # -- supersession ---------------------------------------------------------------------

    def supersede(self, defn: dict) -> None:
        """After open(takeover=True) and start(None): end generation G, begin G+1."""
        with self.store:
            self._supersede(defn)

    def _supersede(self, defn: dict) -> None:
        st = self.state
        old_g, old_job = st.g, st.job
        if old_g is None:
            raise DispatchError(f"{self.root} defines no job yet: there is nothing to supersede")
        cancelled, state = False, None
        if old_job is not None:
            try:
                j = self.slurm.find_job(old_job)
            except SlurmError as e:
                raise DispatchError(f"cannot ask Slurm about job {old_job}: {e}") from None
            state = j.state if j else "UNKNOWN"
            if j is not None and not j.ended:
                self.slurm.cancel(old_job)
                cancelled = True
        held = rules.supersession(st, defn, state)  # from G's state, before G+1's facts replace it
        self.fact("superseded", from_g=old_g, to_g=old_g + 1, job=old_job, state=state, cancelled=cancelled)
        self.fact("job", **{**defn, "g": old_g + 1})
        if held is not None:
            self.fact("rule", **held)


SCRIPT_MAX = 1 << 20  # more of a batch script than sbatch itself would take is not read


def batch_script(defn: dict, argv: list[str]) -> tuple[Optional[str], Optional[str]]:
    """(the text of the batch script ``sbatch ARGV`` submits, or None when it is unreadable or
    there is none; its name, with why it could not be read). Read where the job was defined
    (``defn['cwd']``), else found on PATH, as sbatch finds it; ``--wrap`` is an empty script."""
    _, _, script, wrap = sbatch_options(argv)
    if wrap is not None:
        return "", "--wrap"
    if script is None:
        return None, None
    cwd = defn.get("cwd") or os.getcwd()
    candidates = [os.path.join(cwd, script)]
    if "/" not in script:
        candidates += [os.path.join(d, script) for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    error = "not found"
    for path in candidates:
        try:
            with open(path, "rb") as f:
                return f.read(SCRIPT_MAX).decode("utf-8", "replace"), script
        except OSError as e:
            error = e.strerror or str(e)
    return None, f"{script} ({error})"


def job_signal_of(defn: dict, argv: list[str], env: dict[str, str]) -> JobSignal:
    """The job's --signal as sbatch will read it for ``sbatch ARGV`` with ``env`` added to this
    process's environment (contract/signals.py)."""
    text, name = batch_script(defn, argv)
    return job_signal(argv, {**os.environ, **env}, text, name)


def lead_refusal(defn: dict, argv: list[str], env: dict[str, str]) -> Optional[str]:
    """Why ``sbatch ARGV`` asks for a --signal that cannot tell a stop from a finish (its lead
    as long as the time limit: contract/signals.lead_problem), or None."""
    text, name = batch_script(defn, argv)
    environ = {**os.environ, **env}
    return lead_problem(job_signal(argv, environ, text, name).signal, job_time_limit(argv, environ, text))
