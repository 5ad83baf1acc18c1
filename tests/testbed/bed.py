"""What every test bed offers the tests and the trials: Slurm driven through ``exec``.

A bed (docker-slurm's containers, ``cluster.Cluster``; the QEMU VMs, ``vm.VMCluster``) runs a
command on one of its hosts (``exec``) and shares ``/checkpoints`` with this machine
(``checkpoints``, ``path``); everything else here (submit, wait, cancel, preempt, partition)
is built on those two, so a test or a trial written against a ``Bed`` runs on either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, TypeVar, Union

from dispatch_slurm.errors import DispatchError
from dispatch_slurm.slurm.client import CommandResult, JobInfo, NodeInfo, Slurm, SlurmError

from . import wait
from .wait import WaitTimeout

CONTROLLER = "ctl"

T = TypeVar("T")


class ClusterError(DispatchError):
    """The test cluster could not be built, started or driven, or a wait ran out."""


def base_state(node: NodeInfo) -> str:
    """The node's one base state (IDLE, ALLOCATED, MIXED, DOWN...), for tests that name it;
    the package reads the state set (``NodeInfo.responding``)."""
    base = node.state & {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"}
    return next(iter(sorted(base)), "UNKNOWN")


@dataclass
class _Partition:
    interfaces: list[str]


class Bed:
    """The small interface both beds implement (``exec``, ``checkpoints``, ``id``,
    ``node_names``, ``profile``, ``tracking``) and what is built on it."""

    id: str
    profile: str
    tracking: Optional[str]
    node_names: list[str]
    _slurm: Optional[Slurm] = None
    _partitioned: dict[str, _Partition]

    @property
    def checkpoints(self) -> Path:  # pragma: no cover - each bed has its own
        raise NotImplementedError

    def exec(self, host: str, cmd: Union[str, Sequence[str]], *, user: Optional[str] = None,
             env: Optional[Mapping[str, str]] = None, input: Optional[str] = None,
             workdir: Optional[str] = None, check: bool = True) -> CommandResult:  # pragma: no cover
        """Run ``cmd`` (a string goes to ``bash -c``) on ``host`` as ``user`` (default root)."""
        raise NotImplementedError

    def runner(self, host: str = CONTROLLER, user: Optional[str] = None):
        """A ``dispatch_slurm.slurm`` runner that runs commands in ``host`` as ``user``."""

        def run(
            argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, input: Optional[str] = None
        ) -> CommandResult:
            return self.exec(host, list(argv), user=user, env=env, input=input, check=False)

        return run

    @property
    def slurm(self) -> Slurm:
        """The package's Slurm client, running commands in the controller as root."""
        if self._slurm is None:
            self._slurm = Slurm(self.runner(CONTROLLER))
        return self._slurm

    def slurm_as(self, user: str, host: str = CONTROLLER) -> Slurm:
        """The Slurm client as ``user`` (alice, bob) on ``host``."""
        return Slurm(self.runner(host, user))

    def read(self, path: Union[str, Path]) -> str:
        """A file of the shared volume, read on the host: ``read('x/out.txt')`` or
        ``read('/checkpoints/x/out.txt')``."""
        return self.path(path).read_text()

    def path(self, path: Union[str, Path]) -> Path:
        """Host path of a path under /checkpoints (refuses anything outside it)."""
        p = Path(path)
        if p.is_absolute():
            try:
                p = p.relative_to("/checkpoints")
            except ValueError:
                raise ClusterError(f"{path} is not under /checkpoints") from None
        full = (self.checkpoints / p).resolve()
        if full != self.checkpoints.resolve() and self.checkpoints.resolve() not in full.parents:
            raise ClusterError(f"{path} leaves /checkpoints")
        return full

    def pids(self, host: str, pattern: str, user: Optional[str] = None) -> list[int]:
        """PIDs of processes on ``host`` whose command line matches ``pattern`` (pgrep -f)."""
        cmd = ["pgrep", "-f", pattern] if user is None else ["pgrep", "-u", user, "-f", pattern]
        res = self.exec(host, cmd, check=False)
        if res.returncode not in (0, 1):
            raise ClusterError(f"{host}: pgrep failed: {res.stderr.strip()}")
        return [int(x) for x in res.stdout.split()]

    # -- jobs -------------------------------------------------------------------------------

    def submit(
        self,
        user: str,
        script: Optional[str] = None,
        *,
        args: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
    ) -> int:
        """Submit as ``user`` from the controller: ``script`` (text, fed to sbatch on stdin)
        and/or sbatch ``args`` (e.g. ``['-p', 'high', '--wrap', 'sleep 60']``). The job id."""
        if script is None and not args:
            raise ClusterError("submit needs a script or sbatch args")
        return self.slurm_as(user).submit(list(args), env, script=script)

    def job(self, job_id: int) -> JobInfo:
        return self.slurm.job(job_id)

    def nodes(self) -> list[NodeInfo]:
        return self.slurm.nodes()

    def node(self, name: str) -> NodeInfo:
        for n in self.slurm.nodes():
            if n.name == name:
                return n
        raise SlurmError(["scontrol", "show", "node", name], None, f"node {name} is not known", what="found no node")

    def wait_until(
        self, probe: Callable[[], Optional[T]], *, timeout: float, what: str, poll: float = 0.5
    ) -> T:
        """Call ``probe`` until it returns a truthy value, at most ``timeout`` seconds.
        A SlurmError while polling (controller busy) is retried; the last one is reported."""
        try:
            return wait.until(probe, timeout=timeout, what=what, every=poll, retry=(SlurmError,))
        except WaitTimeout as e:
            raise ClusterError(f"{self.id}: {e}") from None

    def wait_job(
        self,
        job_id: int,
        until: Union[str, Iterable[str], Callable[[JobInfo], bool]],
        *,
        timeout: float = 120.0,
        poll: float = 0.5,
    ) -> JobInfo:
        """Poll the job until ``until`` holds: a state name or set of names (matched against
        the base state and the flags) or a predicate on JobInfo. Returns the JobInfo seen;
        on timeout raises ClusterError with every distinct state observed on the way."""
        if callable(until):
            pred, what = until, getattr(until, "__name__", "predicate")
        else:
            wanted = {until} if isinstance(until, str) else set(until)
            pred, what = (lambda j: bool(j.states & wanted)), f"state in {sorted(wanted)}"
        seen: list[str] = []
        last: list[JobInfo] = []

        def probe() -> Optional[JobInfo]:
            j = self.slurm.job(job_id)
            last[:] = [j]
            desc = f"{'+'.join(sorted(j.states))} reason={j.reason} restarts={j.restart_count} nodes={','.join(j.nodes)}"
            if not seen or seen[-1] != desc:
                seen.append(desc)
            return j if pred(j) else None

        try:
            return self.wait_until(probe, timeout=timeout, poll=poll, what=f"job {job_id} {what}")
        except ClusterError as e:
            raise ClusterError(f"{e}; observed: {' -> '.join(seen) or 'nothing'}") from None

    def wait_nodes(
        self,
        until: Callable[[list[NodeInfo]], bool],
        *,
        timeout: float = 120.0,
        poll: float = 1.0,
        what: str = "nodes",
    ) -> list[NodeInfo]:
        """Poll every node until ``until(nodes)`` holds."""
        seen: list[str] = []

        def probe() -> Optional[list[NodeInfo]]:
            ns = self.slurm.nodes()
            desc = " ".join(f"{n.name}:{'+'.join(sorted(n.state))}" for n in ns)
            if not seen or seen[-1] != desc:
                seen.append(desc)
            return ns if until(ns) else None

        try:
            return self.wait_until(probe, timeout=timeout, poll=poll, what=what)
        except ClusterError as e:
            raise ClusterError(f"{e}; observed: {' -> '.join(seen) or 'nothing'}") from None

    def wait_node(
        self, name: str, until: Union[str, Callable[[NodeInfo], bool]], *, timeout: float = 120.0, poll: float = 1.0
    ) -> NodeInfo:
        """Poll node ``name`` until its state set contains ``until`` (or the predicate holds)."""
        pred = until if callable(until) else (lambda n: until in n.state)
        what = f"node {name} " + (getattr(until, "__name__", "predicate") if callable(until) else f"state {until}")
        found = self.wait_nodes(
            lambda ns: any(n.name == name and pred(n) for n in ns), timeout=timeout, poll=poll, what=what
        )
        return next(n for n in found if n.name == name)

    def set_prolog_flags(self, flags: str, *, timeout: float = 180.0) -> None:
        """slurm.conf's PrologFlags on every host, then ``scontrol reconfigure`` (24.11 on it
        restarts the daemons, which read it again); returns once slurmctld shows them and every
        node is idle."""
        for host in sorted({CONTROLLER, *self.node_names}):
            self.exec(host, f"sed -i 's/^PrologFlags=.*/PrologFlags={flags}/' /etc/slurm/slurm.conf")
        self.exec(CONTROLLER, ["scontrol", "reconfigure"])
        want = set(flags.split(","))
        self.wait_until(lambda: want <= set(self.slurm.config().get("PrologFlags", "").split(",")),
                        timeout=timeout, what=f"slurmctld with PrologFlags {flags}")
        self.wait_nodes(lambda ns: len(ns) == len(self.node_names) and all(n.state == {"IDLE"} for n in ns),
                        timeout=timeout, what=f"every node idle with PrologFlags {flags}")

    def cancel(self, job_id: int, signal: Optional[str] = None, *, user: Optional[str] = None) -> None:
        """scancel, as ``user`` (default root)."""
        (self.slurm_as(user) if user else self.slurm).cancel(job_id, signal)

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue`` as root: back to PENDING, restart count +1 (what an operator does)."""
        self.slurm.run(["scontrol", "requeue", str(int(job_id))])

    def set_time_limit(self, job_id: int, minutes: int, *, timeout: float = 120.0) -> None:
        """``scontrol update TimeLimit`` as root, once slurmctld takes it: it refuses a new limit
        ("Job has already finished") while a preempted job's requeue completes, since the job
        keeps its preempt_time until its nodes are done (the Epilog); so this waits for the job
        to be pending or running and not COMPLETING first."""
        self.wait_job(job_id, lambda j: j.state in ("PENDING", "RUNNING") and "COMPLETING" not in j.states,
                      timeout=timeout)
        self.slurm.run(["scontrol", "update", f"jobid={int(job_id)}", f"TimeLimit={int(minutes)}"])

    def preempt(self, job_id: int, *, user: str = "bob", hold: str = "sleep 300", timeout: float = 60.0) -> int:
        """Preempt a running job the way a site does: submit a job to the higher-tier
        partition ``high`` that needs the victim's whole nodes. The victim's partition
        decides what happens (``normal``: REQUEUE, ``scavenger``: CANCEL, after GraceTime).
        Returns the preemptor's job id (cancel it when done to free the nodes)."""
        victim = self.wait_job(job_id, "RUNNING", timeout=timeout)
        return self.submit(
            user,
            args=[
                "-p", "high", "-w", ",".join(victim.nodes), "-N", str(len(victim.nodes)), "--exclusive",
                "-o", "/dev/null", "-J", f"preemptor-of-{job_id}", "--wrap", hold,
            ],
        )

    # -- network faults ---------------------------------------------------------------------

    def _interfaces(self, host: str) -> list[str]:
        out = self.exec(host, ["ip", "-o", "-4", "addr", "show", "scope", "global"]).stdout
        ifaces = sorted({line.split()[1].split("@")[0] for line in out.splitlines() if line.strip()})
        if not ifaces:
            raise ClusterError(f"{host}: no network interface with an address")
        return ifaces

    def partition(self, host: str) -> list[str]:
        """Cut ``host`` off the network: all traffic on its interfaces is dropped inside its
        network namespace, so it keeps its address and its processes keep running (slurmd
        too, talking into the void). Returns the interfaces cut."""
        if host in self._partitioned:
            raise ClusterError(f"{host} is already partitioned")
        ifaces = self._interfaces(host)
        rules = "; ".join(f"iptables -A INPUT -i {i} -j DROP && iptables -A OUTPUT -o {i} -j DROP" for i in ifaces)
        self.exec(host, f"set -e; {rules}")
        self._partitioned[host] = _Partition(ifaces)
        self._log(f"{self.id}: partitioned {host} ({', '.join(ifaces)})")
        return ifaces

    def heal(self, host: str) -> None:
        """Undo ``partition``: remove exactly the rules it added."""
        part = self._partitioned.pop(host, None)
        if part is None:
            raise ClusterError(f"{host} is not partitioned")
        rules = "; ".join(
            f"iptables -D INPUT -i {i} -j DROP && iptables -D OUTPUT -o {i} -j DROP" for i in part.interfaces
        )
        self.exec(host, f"set -e; {rules}")
        self._log(f"{self.id}: healed {host}")

