"""docker-slurm: a real Slurm cluster in containers, for tests and for `dispatch-slurm trial`.

One accounting host (``db``: slurmdbd with MariaDB, what ``sacct`` reads), one
controller (slurmctld) and N nodes (slurmd) from the image that
``docker-slurm/build-images`` makes, on an *internal* Docker network (the
containers reach nothing but each other), with ``/checkpoints`` bind-mounted from
a host directory so a test reads what jobs wrote without going through a container.
The munge key is made here, when the cluster starts, and never baked into an image.

Faults are the real ones, not mocks: ``cancel`` (scancel), ``preempt`` (a job in
the higher-tier partition ``high`` preempts; PreemptMode CANCEL in ``scavenger``,
REQUEUE in ``normal``), ``partition`` (the node's traffic is dropped with iptables
inside its network namespace: it keeps its address and its processes keep
running, as with a cut cable) and ``heal``.

This is the test bed, not the package: it lives beside the tests in a source checkout
(``tests/testbed/``), never in the wheel. ``docker`` and ``testcontainers`` come from
the ``cluster`` extra. The image build lives in one place, the
``docker-slurm/build-images`` script of this checkout; this module calls it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from dispatch_slurm.slurm.client import CommandResult

from .bed import CONTROLLER, Bed, ClusterError, _Partition, base_state

__all__ = [
    "CONTROLLER",
    "DBD",
    "PROFILES",
    "SUITES",
    "TRACKINGS",
    "Cluster",
    "ClusterError",
    "base_state",
    "build_image",
    "remove_orphans",
    "slurm_at_least",
    "slurm_release",
    "source_root",
]

#: Debian suite -> the Slurm release it ships.
SUITES = {"bookworm": "22.05", "trixie": "24.11", "sid": "26.05"}
#: Timing profiles (docker-slurm/profile-*.env): fast for CI, site = Slurm's defaults.
PROFILES = ("fast", "site")
#: Process tracking: by parent pid, or in cgroups (the profile's choice when not given).
TRACKINGS = ("linuxproc", "cgroup")
DBD = "db"
LABEL = "dispatch-slurm.cluster"
OWNER_LABEL = "dispatch-slurm.owner"


def slurm_release(text: str) -> tuple[int, ...]:
    """A Slurm release ("22.05", "24.11.5") as numbers: releases compare as versions, never
    as text ("9.05" would sort after "24.11")."""
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        raise ValueError(f"{text!r} is not a Slurm release (e.g. 24.11)") from None


def slurm_at_least(bed, release: str) -> bool:
    """Whether the test bed ``bed`` (a docker or VM cluster) runs Slurm ``release`` or later."""
    return slurm_release(bed.slurm_release) >= slurm_release(release)


def source_root() -> Path:
    """The source checkout this test bed belongs to (the image is built from its tree)."""
    return Path(__file__).resolve().parents[2]


def build_image(suite: str, *, log: Optional[Callable[[str], None]] = None) -> str:
    """Build (or find up to date) the cluster image for ``suite``; its content-hash tag."""
    if suite not in SUITES:
        raise ClusterError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
    script = source_root() / "docker-slurm" / "build-images"
    p = subprocess.run(["bash", str(script), suite], capture_output=True, text=True, check=False)
    if log:
        for line in p.stderr.splitlines():
            log(line)
    if p.returncode != 0:
        raise ClusterError(f"{script} {suite} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    lines = p.stdout.split()
    if not lines:
        raise ClusterError(f"{script} {suite} printed no image tag:\n{p.stderr[-2000:]}")
    return lines[-1]


def _docker():
    try:
        import docker  # noqa: F401
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.network import Network
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ClusterError(
            f"the docker-slurm cluster needs the 'cluster' extra: pip install 'dispatch-slurm[cluster]' ({e})"
        ) from e
    return docker, DockerContainer, Network


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphans() -> list[str]:
    """Remove clusters left by a process of this host that is gone (a killed test run:
    no reaper container can be pulled here). Clusters of live processes are kept."""
    docker, _, _ = _docker()
    client = docker.from_env()
    host = socket.gethostname()
    dead: set[str] = set()
    try:
        # Other processes' clusters come and go meanwhile: one removed between the listing
        # and its inspection is skipped (it was no orphan of ours), one removed twice is gone.
        for c in client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True):
            owner = c.labels.get(OWNER_LABEL, "")
            h, _, pid = owner.rpartition(":")
            if h == host and pid.isdigit() and not _pid_alive(int(pid)):
                dead.add(c.labels[LABEL])
                try:
                    c.remove(force=True)
                except docker.errors.NotFound:
                    pass
        for n in client.networks.list(filters={"label": LABEL}):
            if n.attrs.get("Labels", {}).get(LABEL) in dead:
                try:
                    n.remove()
                except docker.errors.NotFound:
                    pass
    finally:
        client.close()
    return sorted(dead)


class Cluster(Bed):
    """A docker-slurm cluster: ``Cluster('bookworm', 'fast').start()`` ... ``.stop()``.

    Containers are named ``<id>-db``, ``<id>-ctl``, ``<id>-c1`` ...; inside, hostnames are
    ``db``, ``ctl``, ``c1`` ... (the Slurm NodeNames). ``checkpoints`` is the host directory
    mounted at ``/checkpoints`` on every container. ``timings`` records build and boot
    seconds. ``tracking`` (linuxproc, cgroup; None: the profile's) is read back from
    slurmctld once the cluster is up."""

    def __init__(
        self,
        suite: str = "trixie",
        profile: str = "fast",
        *,
        nodes: int = 3,
        node_cpus: int = 2,
        image: Optional[str] = None,
        name: Optional[str] = None,
        log: Optional[Callable[[str], None]] = None,
        volumes: Optional[Mapping[str, str]] = None,
        tracking: Optional[str] = None,
        tmpfs: Optional[Mapping[str, int]] = None,
    ):
        if suite not in SUITES:
            raise ClusterError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
        if profile not in PROFILES:
            raise ClusterError(f"unknown profile {profile!r}: one of {', '.join(PROFILES)}")
        if not 1 <= nodes <= 9:
            raise ClusterError(f"nodes must be 1..9, not {nodes}")
        if tracking is not None and tracking not in TRACKINGS:
            raise ClusterError(f"unknown tracking {tracking!r}: one of {', '.join(TRACKINGS)}")
        self.suite = suite
        self.profile = profile
        self.tracking = tracking
        self.slurm_release = SUITES[suite]
        self.image = image
        self.id = name or f"dslurm-{suite}-{uuid.uuid4().hex[:6]}"
        self.node_names = [f"c{i}" for i in range(1, nodes + 1)]
        self.node_cpus = node_cpus
        self.timings: dict[str, float] = {}
        self._log = log or (lambda s: None)
        self._containers: dict[str, Any] = {}
        self._network: Any = None
        self._tmp: Optional[Path] = None
        self._partitioned: dict[str, _Partition] = {}
        self._slurm = None
        # extra read-only mounts, host path -> container path (e.g. a host's torch for tests)
        self.volumes = dict(volumes or {})
        # folders of /checkpoints that are a filesystem of their own, name -> MiB: a tmpfs
        # mounted here before the containers start (their bind mount of /checkpoints holds it),
        # so a test can fill it (ENOSPC on every node) without filling this machine's disk
        self.tmpfs = dict(tmpfs or {})

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def checkpoints(self) -> Path:
        """Host directory mounted at /checkpoints in every container."""
        if self._tmp is None:
            raise ClusterError("the cluster is not started")
        return self._tmp / "checkpoints"

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, suite: Optional[str] = None, profile: Optional[str] = None, *, timeout: float = 240.0) -> "Cluster":
        """Build or reuse the image, start controller + nodes, wait until every node is idle.
        ``suite``/``profile`` override the constructor's (``Cluster().start('bookworm', 'site')``)."""
        if self._containers:
            raise ClusterError(f"{self.id} is already started")
        if suite is not None and suite != self.suite:
            if suite not in SUITES:
                raise ClusterError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
            self.suite, self.slurm_release, self.image = suite, SUITES[suite], None
        if profile is not None:
            if profile not in PROFILES:
                raise ClusterError(f"unknown profile {profile!r}: one of {', '.join(PROFILES)}")
            self.profile = profile
        os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
        _, DockerContainer, Network = _docker()
        remove_orphans()
        t0 = time.monotonic()
        if self.image is None:
            self.image = build_image(self.suite, log=self._log)
        self.timings["build_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        try:
            self._tmp = Path(tempfile.mkdtemp(prefix=f"{self.id}-"))
            key_dir = self._tmp / "munge"
            key_dir.mkdir(mode=0o700)
            # The one munge key of this cluster, made now; the entrypoint installs it as
            # /etc/munge/munge.key owned by munge, mode 0400, in every container.
            key = key_dir / "munge.key"
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o400)
            self.checkpoints.mkdir()
            self.checkpoints.chmod(0o1777)
            for name, mib in self.tmpfs.items():
                (self.checkpoints / name).mkdir()
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(mib)}m,mode=1777", f"{self.id}-{name}",
                                str(self.checkpoints / name)], check=True, capture_output=True)

            labels = {LABEL: self.id, OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}"}
            self._network = Network(docker_network_kw={"internal": True, "labels": labels})
            self._network.name = self.id
            self._network.create()
            env = {
                "DOCKER_SLURM_PROFILE": self.profile,
                "DOCKER_SLURM_CONTROLLER": CONTROLLER,
                "DOCKER_SLURM_DBD": DBD,
                "DOCKER_SLURM_NODES": f"c[1-{len(self.node_names)}]" if len(self.node_names) > 1 else "c1",
                "DOCKER_SLURM_NODE_CPUS": str(self.node_cpus),
                "DOCKER_SLURM_CLUSTER_NAME": self.id.replace("-", "_")[:40],
                "DOCKER_SLURM_KEY_DIR": "/run/munge-key",
            }
            if self.tracking:
                env["DOCKER_SLURM_TRACKING"] = self.tracking
            # The controller starts once slurmdbd answers, the nodes once the controller does.
            for host in [DBD, CONTROLLER, *self.node_names]:
                role = {DBD: "db", CONTROLLER: "controller"}.get(host, "node")
                # NET_ADMIN: partition() drops traffic with iptables in the container's own
                # namespace. SYS_ADMIN (nodes): slurmd 24.11 loads a user's login environment
                # (sbatch --export=ALL,VAR or NONE sets SLURM_GET_USER_ENV) in a clone() with
                # new pid+mount namespaces; without the capability the clone fails and slurmd
                # exits ("fatal: clone: Operation not permitted"). AppArmor's docker-default
                # profile would refuse the /proc mount in that clone. A private cgroup
                # namespace (nodes): cgroup tracking makes the node's own cgroup mounts
                # writable and builds its hierarchy there, never in the host's view.
                # SYS_NICE: task/affinity binds the job user's tasks to their CPUs
                # (sched_setaffinity on another user's process). The view (--dispatch-view)
                # needs SYS_ADMIN and no AppArmor too: each task unshares its mount namespace
                # and bind-mounts (Docker's default seccomp profile allows both to SYS_ADMIN).
                node = role == "node"
                caps = ["NET_ADMIN"] + (["SYS_ADMIN", "SYS_NICE"] if node else [])
                security = ["apparmor=unconfined"] if node else []
                extra = {"cgroupns": "private"} if node else {}
                c = (
                    DockerContainer(self.image)
                    .with_name(f"{self.id}-{host}")
                    .with_command(role)
                    .with_network(self._network)
                    .with_network_aliases(host)
                    .with_volume_mapping(str(key_dir), "/run/munge-key", "ro")
                    .with_volume_mapping(str(self.checkpoints), "/checkpoints", "rw")
                    .with_envs(**env)
                    .with_kwargs(hostname=host, init=True, cap_add=caps, security_opt=security, labels=labels,
                                 **extra)
                )
                for src, dst in self.volumes.items():
                    c = c.with_volume_mapping(src, dst, "ro")
                self._containers[host] = c
                c.start()
            self._log(f"{self.id}: containers started, waiting for {len(self.node_names)} idle nodes")
            self.wait_nodes(lambda ns: len(ns) == len(self.node_names) and all(n.state == {"IDLE"} for n in ns),
                            timeout=timeout, what="every node IDLE")
            proctrack = self.slurm.config().get("ProctrackType", "")
            self.tracking = "cgroup" if proctrack == "proctrack/cgroup" else "linuxproc"
        except Exception as e:  # a wait ran out, a container died (docker refuses the exec): show why
            logs = self._tail_logs()
            self.stop()
            raise ClusterError(f"{e}\n{logs}") from e
        except BaseException:
            self.stop()
            raise
        self.timings["boot_s"] = time.monotonic() - t1
        self._log(f"{self.id}: up in {self.timings['boot_s']:.1f} s (image {self.image})")
        return self

    def stop(self) -> None:
        """Remove the containers, the network and the host directory (idempotent)."""
        for host, c in list(self._containers.items()):
            try:
                c.stop()
            except Exception as e:  # keep removing the rest
                self._log(f"{self.id}: removing {host}: {e}")
        self._containers.clear()
        if self._network is not None:
            try:
                self._network.remove()
            except Exception as e:
                self._log(f"{self.id}: removing network: {e}")
            self._network = None
        if self._tmp is not None:
            for name in self.tmpfs:
                subprocess.run(["umount", "-l", str(self._tmp / "checkpoints" / name)], capture_output=True)
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        self._slurm = None

    def network_info(self) -> dict[str, Any]:
        """The cluster network as the engine describes it now (``docker network inspect``)."""
        if self._network is None:
            raise ClusterError("the cluster is not started")
        net = self._network._unwrap_network
        net.reload()
        return dict(net.attrs)

    def _container(self, host: str) -> Any:
        try:
            return self._containers[host].get_wrapped_container()
        except KeyError:
            raise ClusterError(f"no container {host!r} in {self.id} (have: {', '.join(self._containers)})") from None

    def kill(self, host: str) -> None:
        """SIGKILL every process of ``host`` (a node's power cut: slurmd and the job's
        processes die at once); ``boot`` brings it back."""
        self._container(host).kill()
        self._log(f"{self.id}: killed {host}")

    def boot(self, host: str) -> None:
        """Start a killed host's container again: its entrypoint starts its daemons."""
        self._container(host).start()
        self._log(f"{self.id}: booted {host}")

    def restart(self, host: str, timeout: int = 10) -> None:
        """Stop ``host``'s daemon as an admin does (SIGTERM, then SIGKILL after ``timeout``
        seconds) and start it again."""
        self._container(host).restart(timeout=timeout)
        self._log(f"{self.id}: restarted {host}")

    def logs(self, host: str) -> str:
        """The container's output (the daemon logs to stderr)."""
        return self._container(host).logs().decode(errors="replace")

    def _tail_logs(self, lines: int = 30) -> str:
        out = []
        for host in list(self._containers):
            try:
                text = self.logs(host).splitlines()[-lines:]
            except Exception:
                continue
            out.append(f"--- {self.id}-{host} ---\n" + "\n".join(text))
        return "\n".join(out)

    # -- commands ---------------------------------------------------------------------------

    def exec(
        self,
        host: str,
        cmd: Union[str, Sequence[str]],
        *,
        user: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        input: Optional[str] = None,
        workdir: Optional[str] = None,
        check: bool = True,
    ) -> CommandResult:
        """Run ``cmd`` (a string goes to ``bash -c``) in container ``host``, as ``user``
        (default root). ``input`` is fed on stdin. ``check``: raise on a non-zero exit.

        Through the ``docker exec`` command, not the SDK: under load the SDK (7.x) reads an
        exec's multiplexed output short (an EWOULDBLOCK taken for the end: an sbatch whose
        job id never arrived) or misaligned ("44 is not a valid stream")."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        environment = dict(env or {})
        if user and user != "root":
            environment.update({"HOME": f"/home/{user}", "USER": user, "LOGNAME": user})
        docker = ["docker", "exec", "-u", user or "root",
                  "-w", workdir or (f"/home/{user}" if user and user != "root" else "/")]
        for k, v in environment.items():
            docker += ["-e", f"{k}={v}"]
        if input is not None:
            docker.append("-i")
        p = subprocess.run([*docker, self._container(host).name, *argv], input=(input or "").encode(),
                           capture_output=True, check=False)
        res = CommandResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
        if res.stderr.startswith("Error response from daemon") or (p.returncode in (125, 126, 127) and
                                                                   res.stderr.startswith("OCI runtime")):
            raise ClusterError(f"{self.id}-{host}: docker exec failed: {res.stderr.strip()[-500:]}")
        if check and res.returncode != 0:
            shown = cmd if isinstance(cmd, str) else " ".join(cmd)
            raise ClusterError(
                f"{self.id}-{host}: `{shown}` as {user or 'root'} exited {res.returncode}: "
                f"{(res.stderr or res.stdout).strip()[-2000:]}"
            )
        return res

    def __repr__(self) -> str:
        state = "running" if self._containers else "stopped"
        return (f"Cluster({self.suite!r} = Slurm {self.slurm_release}, {self.profile!r}, {self.tracking or 'default'} "
                f"tracking, {self.id}, {state})")
