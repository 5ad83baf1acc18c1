"""The VM test bed: Slurm on a real kernel (its own unified cgroup v2 hierarchy) under QEMU.

This host is cgroup v1 hybrid, and Slurm's cgroup/v2 plugin refuses a hybrid hierarchy, so
docker-slurm can only run cgroup v1 (or linuxproc) tracking. A VM has its own kernel. Two
VMs make a small cluster: ``c1`` (slurmctld and slurmd) and ``c2`` (slurmd), linked by a
datagram socket pair on this host (no host network at all), each with a user-mode NIC
(``restrict=on``: the guest reaches nothing) whose only door is an ssh forward on
127.0.0.1. ``/checkpoints`` is a host directory shared into both (virtio-9p), so tests and
trials read what jobs wrote, as with docker-slurm.

QEMU runs TCG only (``-accel tcg,thread=multi -cpu qemu64``): this host's /dev/kvm is a
paravirtual nested one on which a Debian kernel dies ("KVM internal error"). Everything is
slow under TCG, so the images are built once (``build``, ``docker-slurm/vm/build-vm-image``),
cached under a hash of every input like the container images, and each session restores a
snapshot taken when both nodes were idle (``savevm``/``loadvm``): seconds, not a boot.

Build, per suite (Debian's packages, nothing else):
1. a root filesystem: ``debootstrap --variant=minbase``, then the kernel (Debian's generic
   one: the cloud kernel has no 9p, and virtiofs cannot be snapshotted), systemd, Slurm,
   munge, ssh, Python and the SPANK plugin's build tools with apt in the chroot, and
   docker-slurm/vm/setup-rootfs (cached as a tar, key: suite, packages, that script);
2. the image: the project installed as a site installs it (docker-slurm/vm/install-site,
   THE place to swap for ``dpkg -i`` of the Debian package), slurm.conf and cgroup.conf
   rendered from docker-slurm's templates (cgroup/v2), a munge key, ssh keys; ``mkfs.ext4
   -d`` into a qcow2; both VMs booted from overlays of it until both nodes are idle, then
   ``savevm ready`` (key: the rootfs key, the project's sources, this file).

A restore (``VMCluster.start``) copies the two small overlays (the snapshot is in them),
starts QEMU with the identical command line plus ``-loadvm ready`` in its own session, sets
the guests' clocks from this host (a restored guest keeps its saved clock, and munge refuses
credentials from the past), mounts /checkpoints, and waits for both nodes to be idle.
``stop`` asks QEMU to quit through its monitor socket.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

from dispatch_slurm.slurm.client import CommandResult

from . import wait
from .bed import CONTROLLER, Bed, ClusterError
from .cluster import SUITES, source_root

__all__ = ["NODES", "VMCluster", "build", "image_dir"]

NODES = ("c1", "c2")
#: the VMs' hosts by the names the tests use: the controller runs on c1
HOSTS = {CONTROLLER: "c1", "c1": "c1", "c2": "c2"}
MAC = {"c1": "52:54:00:00:76:01", "c2": "52:54:00:00:76:02"}
SSH_MAC = "52:54:00:00:76:10"
MEMORY_MB = 1024  # ~175 MB used idle; Slurm's RealMemory=1000 is declared (config_overrides)
SNAPSHOT = "ready"
PACKAGES = [
    "systemd-sysv", "udev", "kmod", "linux-image-amd64", "initramfs-tools",
    "slurmctld", "slurmd", "slurm-client", "munge", "openssh-server",
    "python3", "python3-click", "python3-pip", "python3-setuptools",
    "gcc", "make", "libc6-dev", "libslurm-dev",
    "procps", "iproute2", "iptables",
]
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
OWNER = ".owner"
FROZEN = "munged|slurmd|slurmctld"  # stopped (SIGSTOP) in the snapshot, thawed after the clocks are set  # in a run directory: "<host>:<pid>" of the process that started its VMs


def cache_root() -> Path:
    """Where images live: DISPATCH_VM_CACHE, else ~/.cache/dispatch-slurm/vm."""
    env = os.environ.get("DISPATCH_VM_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dispatch-slurm" / "vm"
    return base


def _vm_dir() -> Path:
    return source_root() / "docker-slurm" / "vm"


def _log_default(msg: str) -> None:
    print(f"build-vm-image: {msg}", file=sys.stderr, flush=True)


def _hash(parts: Sequence[Union[str, bytes]]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def _rootfs_key(suite: str) -> str:
    return _hash([f"suite={suite}", f"mirror={MIRROR}", " ".join(PACKAGES),
                  (_vm_dir() / "setup-rootfs").read_bytes()])


def _project_files() -> list[str]:
    """The files of this checkout that go into the image (relative, sorted): what
    docker-slurm/build-images hashes, plus the VM's own."""
    root = source_root()
    out: list[str] = []
    for d, pats in (("docker-slurm", ("*.in", "*.env", "entrypoint.sh")),
                    ("docker-slurm/vm", ("*",)), ("spank_env", ("*.c", "*.h", "*.map", "Makefile")),
                    ("prolog", ("*",)), ("epilog", ("*",)), ("admin", ("*",)), ("admin/man", ("*",))):
        for pat in pats:
            out += [str(p.relative_to(root)) for p in (root / d).glob(pat) if p.is_file()]
    out += [str(p.relative_to(root)) for p in (root / "dispatch_slurm").rglob("*.py") if "__pycache__" not in p.parts]
    # the trials' trainer, run by path in the jobs (the rest of the test bed stays outside)
    # (not README.md: `make install` does not read it, so the prose never rebuilds an image)
    out += [f for f in ("tests/testbed/workload.py", "pyproject.toml", "Makefile") if (root / f).is_file()]
    return sorted(set(out))


def image_key(suite: str) -> str:
    root = source_root()
    # what of this file makes the image: the snapshot holds the devices of the QEMU command
    # line; the rest (driving the VMs) changes no image
    import inspect
    made_by = (_qemu_argv, _render_conf, build, _snapshot)
    parts: list[Union[str, bytes]] = [f"rootfs={_rootfs_key(suite)}", f"memory={MEMORY_MB} frozen={FROZEN}",
                                      *(inspect.getsource(f) for f in made_by)]
    for f in _project_files():
        parts += [f"== {f}", (root / f).read_bytes()]
    return _hash(parts)


def image_dir(suite: str) -> Path:
    """The image's directory for this checkout (built or not); DISPATCH_VM_IMAGE_<SUITE>
    names another (an image built from another tree, while debugging)."""
    if suite not in SUITES:
        raise ClusterError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
    forced = os.environ.get(f"DISPATCH_VM_IMAGE_{suite.upper()}")
    return Path(forced) if forced else cache_root() / f"{suite}-{image_key(suite)}"


def _run(argv: Sequence[str], *, log: Callable[[str], None], what: str, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kw)
    if p.returncode != 0:
        raise ClusterError(f"{what} failed (exit {p.returncode}): {' '.join(map(str, argv))[:300]}\n"
                           f"{(p.stdout + p.stderr)[-3000:]}")
    return p


class _Chroot:
    """/proc, /sys, /dev mounted into a root filesystem while apt and scripts run there."""

    def __init__(self, root: Path):
        self.root, self.mounted = root, []

    def __enter__(self) -> "_Chroot":
        for src, dst, args in (("proc", "proc", ["-t", "proc"]), ("sysfs", "sys", ["-t", "sysfs"]),
                               ("/dev", "dev", ["--bind"]), ("/dev/pts", "dev/pts", ["--bind"])):
            target = self.root / dst
            target.mkdir(exist_ok=True)
            subprocess.run(["mount", *args, src, str(target)], check=True)
            self.mounted.append(target)
        policy = self.root / "usr/sbin/policy-rc.d"  # no service starts while packages install
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        return self

    def run(self, argv: Sequence[str], *, log, what: str, env: Optional[Mapping[str, str]] = None):
        full = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8", "HOME": "/root", **(env or {})}
        return _run(["chroot", str(self.root), *argv], log=log, what=what, env=full)

    def __exit__(self, *exc) -> None:
        (self.root / "usr/sbin/policy-rc.d").unlink(missing_ok=True)
        for target in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(target)], check=False)


def _rootfs(suite: str, log) -> Path:
    """Stage 1, cached: the suite's root filesystem with every package, as a tar."""
    tar = cache_root() / f"rootfs-{suite}-{_rootfs_key(suite)}.tar"
    if tar.exists():
        log(f"rootfs {tar.name} present")
        return tar
    for tool in ("debootstrap", "chroot", "tar"):
        if shutil.which(tool) is None:
            raise ClusterError(f"building the VM image needs {tool} (tools/setup-host installs it)")
    t0 = time.monotonic()
    tar.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"vm-rootfs-{suite}-", dir=tar.parent))
    try:
        rootfs = work / "root"
        log(f"debootstrap --variant=minbase {suite} ({MIRROR})")
        # sid's Release file may be past its Valid-Until: debootstrap does not check that
        # date (only the signature); apt does, so apt is told not to for sid below.
        _run(["debootstrap", "--variant=minbase", suite, str(rootfs), MIRROR], log=log, what="debootstrap")
        apt = ["-o", "Acquire::Check-Valid-Until=false"] if suite == "sid" else []
        with _Chroot(rootfs) as ch:
            log(f"apt-get install {len(PACKAGES)} packages in the chroot")
            ch.run(["apt-get", *apt, "update"], log=log, what="apt-get update")
            ch.run(["apt-get", *apt, "install", "-y", "--no-install-recommends", *PACKAGES], log=log,
                   what="apt-get install")
            shutil.copy(_vm_dir() / "setup-rootfs", rootfs / "tmp/setup-rootfs")
            ch.run(["sh", "/tmp/setup-rootfs"], log=log, what="setup-rootfs")
            ch.run(["apt-get", "clean"], log=log, what="apt-get clean")
        for junk in ("tmp/setup-rootfs",):
            (rootfs / junk).unlink(missing_ok=True)
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        partial = tar.with_suffix(f".tar.{os.getpid()}")
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(partial), "."], log=log,
             what="tar the rootfs")
        partial.rename(tar)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    log(f"rootfs {tar.name} built in {time.monotonic() - t0:.0f} s")
    return tar


def _render_conf(rootfs: Path, log) -> None:
    """slurm.conf and cgroup.conf from docker-slurm's templates and the vm profile (fast,
    with KillWait and GraceTime 30 s: docker-slurm/vm/profile-vm.env),
    rendered by docker-slurm's own entrypoint: two nodes, cgroup/v2 tracking, no
    accounting host (slurmctld keeps ended jobs for MinJobAge; sacct is not used here)."""
    src = source_root() / "docker-slurm"
    conf = rootfs / "etc/docker-slurm"
    conf.mkdir(exist_ok=True)
    for f in list(src.glob("*.conf.in")) + list(src.glob("profile-*.env")) + [src / "vm" / "profile-vm.env"]:
        shutil.copy(f, conf / f.name)
    entry = rootfs / "usr/local/sbin/docker-slurm-entrypoint"
    shutil.copy(src / "entrypoint.sh", entry)
    entry.chmod(0o755)
    env = {"DOCKER_SLURM_PROFILE": "vm", "DOCKER_SLURM_TRACKING": "cgroup", "DOCKER_SLURM_CGROUP": "cgroup/v2",
           "DOCKER_SLURM_CONTROLLER": "c1", "DOCKER_SLURM_NODES": "c[1-2]", "DOCKER_SLURM_NODE_CPUS": "2",
           "DOCKER_SLURM_CLUSTER_NAME": "vm", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    for name in ("slurm.conf", "cgroup.conf"):
        text = _run(["chroot", str(rootfs), "/usr/local/sbin/docker-slurm-entrypoint", "render", name], log=log,
                    what=f"render {name}", env=env).stdout
        if name == "slurm.conf":
            lines = []
            for line in text.splitlines():
                if line.startswith(("AccountingStorageType=", "AccountingStorageHost=")):
                    continue
                if line.startswith("TaskPlugin="):  # each VM has one vCPU: no binding to CPUs it lacks
                    line = "TaskPlugin=task/cgroup"
                lines.append(line)
            lines += ["# VM test bed: no accounting host.", "AccountingStorageType=accounting_storage/none",
                      "# Under TCG on a loaded host the Prolog (Python) and the launch can take longer than",
                      "# Slurm's 10 s: slurmctld then takes the batch job for missing and requeues it.",
                      "BatchStartTimeout=120"]
            text = "\n".join(lines) + "\n"
        (rootfs / "etc/slurm" / name).write_text(text)
        (rootfs / "etc/slurm" / name).chmod(0o644)


def build(suite: str, *, log: Callable[[str], None] = _log_default) -> Path:
    """Build (or find up to date) the image of ``suite``; its directory."""
    out = image_dir(suite)
    if (out / "ready.json").exists():
        log(f"skipped: {out} is up to date")
        return out
    for tool in ("qemu-system-x86_64", "qemu-img", "mkfs.ext4", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise ClusterError(f"the VM test bed needs {tool} (tools/setup-host installs it)")
    t0 = time.monotonic()
    tar = _rootfs(suite, log)
    t1 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"{out.name}.build-", dir=out.parent))
    try:
        rootfs = work / "root"
        rootfs.mkdir()
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-xpf", str(tar)], log=log,
             what="untar the rootfs")
        src = rootfs / "src/dispatch-slurm"
        root = source_root()
        for f in _project_files():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, src / f)
        with _Chroot(rootfs) as ch:
            log("installing dispatch-slurm as a site does (docker-slurm/vm/install-site)")
            ch.run(["sh", "/src/dispatch-slurm/docker-slurm/vm/install-site", "/src/dispatch-slurm"], log=log,
                   what="install-site")
            ch.run(["ssh-keygen", "-A"], log=log, what="ssh host keys")
        _render_conf(rootfs, log)
        # A loaded 2-core host can stretch a TCG boot past systemd's watchdogs and start
        # timeouts (journald was killed once): none of them in these guests.
        for path, text in (("etc/systemd/system.conf.d/10-testbed.conf",
                            "[Manager]\nDefaultTimeoutStartSec=infinity\nRuntimeWatchdogSec=off\n"),
                           ("etc/systemd/system/systemd-journald.service.d/10-testbed.conf",
                            "[Service]\nWatchdogSec=0\n"),
                           ("etc/systemd/system/systemd-udevd.service.d/10-testbed.conf",
                            "[Service]\nWatchdogSec=0\n")):
            (rootfs / path).parent.mkdir(parents=True, exist_ok=True)
            (rootfs / path).write_text(text)
        key = rootfs / "etc/munge/munge.key"  # this image's own (the VMs reach nothing)
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        st = (rootfs / "etc/munge").stat()
        os.chown(key, st.st_uid, st.st_gid)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dispatch-slurm-vm", "-f", str(work / "id_ed25519")],
             log=log, what="ssh-keygen")
        auth = rootfs / "root/.ssh/authorized_keys"
        auth.write_text((work / "id_ed25519.pub").read_text())
        auth.chmod(0o600)
        boot = rootfs / "boot"
        shutil.copy(max(boot.glob("vmlinuz-*")), work / "vmlinuz")
        shutil.copy(max(boot.glob("initrd.img-*")), work / "initrd.img")
        used_kb = int(_run(["du", "-sk", "-x", str(rootfs)], log=log, what="du").stdout.split()[0])
        size_mb = used_kb // 1024 + 1024
        raw = work / "root.raw"
        _run(["mkfs.ext4", "-q", "-L", "root", "-d", str(rootfs), str(raw), f"{size_mb}M"], log=log, what="mkfs.ext4 -d")
        subprocess.run(["rm", "-rf", "--one-file-system", str(rootfs)], check=False)
        _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "base.qcow2")], log=log, what="qemu-img convert")
        raw.unlink()
        t2 = time.monotonic()
        log("booting both VMs to take the ready snapshot")
        boot_s, save_s = _snapshot(work, log)
        info = {"suite": suite, "slurm": SUITES[suite], "key": out.name, "rootfs": tar.name,
                "rootfs_s": round(t1 - t0, 1), "image_s": round(t2 - t1, 1), "boot_s": round(boot_s, 1),
                "savevm_s": round(save_s, 1), "built": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (work / "ready.json").write_text(json.dumps(info, indent=1) + "\n")
        try:
            work.rename(out)
        except OSError:  # another build finished first: keep its image
            if not (out / "ready.json").exists():
                raise
    finally:
        if work.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    log(f"built {out} in {time.monotonic() - t0:.0f} s")
    _untag_old(suite, out, log)
    return out


def _untag_old(suite: str, keep: Path, log) -> None:
    """Older images of this suite go (each edit of the package makes one), unless
    DISPATCH_VM_KEEP_OLD=1 or a session uses them (its lock)."""
    if os.environ.get("DISPATCH_VM_KEEP_OLD") == "1" or os.environ.get("DOCKER_SLURM_KEEP_OLD") == "1":
        return
    import fcntl
    for d in keep.parent.glob(f"{suite}-" + "?" * 12):
        if d == keep or not d.is_dir():
            continue
        if not (d / "ready.json").exists():
            continue  # not an image (a build in progress names its directory otherwise)
        with open(d / "ready.json") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue
            log(f"removing the older image {d.name}")
            shutil.rmtree(d, ignore_errors=True)


# ---- QEMU -----------------------------------------------------------------------------------

def _qemu_argv(image: Path, run: Path, node: str, ssh_port: int, *, loadvm: bool) -> list[str]:
    """THE command line of a node's VM: the build's snapshot and every restore use this
    (``loadvm`` needs the identical devices; paths and ports may differ)."""
    peer = "c2" if node == "c1" else "c1"
    append = (f"root=LABEL=root rw console=ttyS0 quiet systemd.unified_cgroup_hierarchy=1 systemd.hostname={node} "
              "net.ifnames=0 fsck.mode=skip systemd.show_status=0 mitigations=off")
    argv = [
        "qemu-system-x86_64", "-name", f"dispatch-vm-{node}", "-nodefaults", "-no-user-config",
        "-accel", "tcg,thread=multi", "-cpu", "qemu64", "-smp", "1", "-m", str(MEMORY_MB),
        "-display", "none", "-serial", f"file:{run / f'{node}.console'}",
        "-monitor", f"unix:{run / f'{node}.monitor'},server=on,wait=off",
        "-pidfile", str(run / f"{node}.pid"),
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", append,
        "-drive", f"file={run / f'{node}.qcow2'},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
        "-netdev", f"user,id=ssh,restrict=on,hostfwd=tcp:127.0.0.1:{ssh_port}-:22",
        "-device", f"virtio-net-pci,netdev=ssh,mac={SSH_MAC}",
        "-netdev", (f"dgram,id=link,local.type=unix,local.path={run / f'{node}.link'},"
                    f"remote.type=unix,remote.path={run / f'{peer}.link'}"),
        "-device", f"virtio-net-pci,netdev=link,mac={MAC[node]}",
        "-fsdev", f"local,id=ckpt,path={run / 'checkpoints'},security_model=passthrough",
        "-device", "virtio-9p-pci,fsdev=ckpt,mount_tag=checkpoints",
        "-rtc", "base=utc",
    ]
    if loadvm:
        argv += ["-loadvm", SNAPSHOT]
    return argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _monitor(path: Path, command: str, timeout: float = 120.0) -> str:
    """One HMP command through the monitor socket; its output up to the next prompt."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        buf = b""
        while not buf.endswith(b"(qemu) "):
            chunk = s.recv(65536)
            if not chunk:
                return buf.decode(errors="replace")
            buf += chunk
        s.sendall(command.encode() + b"\n")
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            buf += chunk
            if buf.endswith(b"(qemu) "):
                break
    return buf.decode(errors="replace")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _qemu_pid(run: Path, node: str) -> Optional[int]:
    try:
        pid = int((run / f"{node}.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:  # the pid is QEMU's of this run directory, not a recycled one
        if str(run).encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
    except OSError:
        return None
    return pid


def remove_orphans() -> list[str]:
    """Stop VMs left by a process of this host that is gone (a killed test run); VMs
    of live processes are left alone."""
    gone = []
    for owner in Path(tempfile.gettempdir()).glob(f"dispatch-vm-*/{OWNER}"):
        host, _, pid = owner.read_text().strip().rpartition(":")
        if host != socket.gethostname() or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        run = owner.parent
        for node in NODES:
            qpid = _qemu_pid(run, node)
            if qpid:
                os.kill(qpid, signal.SIGKILL)
        shutil.rmtree(run, ignore_errors=True)
        gone.append(run.name)
    return gone


class _VM:
    """One QEMU process and the ssh master connection to its guest."""

    def __init__(self, image: Path, run: Path, node: str):
        self.image, self.run, self.node = image, run, node
        self.port = _free_port()
        self.proc: Optional[subprocess.Popen] = None

    def start(self, *, loadvm: bool) -> None:
        argv = _qemu_argv(self.image, self.run, self.node, self.port, loadvm=loadvm)
        err = open(self.run / f"{self.node}.qemu.log", "wb")
        # its own session: a ^C of the test run does not reach it; stop() ends it
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)
        err.close()

    def ssh_argv(self) -> list[str]:
        return ["ssh", "-F", "/dev/null", "-i", str(self.image / "id_ed25519"), "-p", str(self.port),
                "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "-o", "ControlMaster=auto", "-o", f"ControlPath={self.run / (self.node + '.ssh')}",
                "-o", "ControlPersist=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15",
                "root@127.0.0.1"]

    def ssh(self, remote: str, *, input: Optional[bytes] = None, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
        return subprocess.run([*self.ssh_argv(), remote], input=input or b"", capture_output=True, check=False,
                              timeout=timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ssh(self, timeout: float) -> None:
        def up():
            if not self.alive():
                raise ClusterError(f"QEMU for {self.node} exited {self.proc.returncode if self.proc else '?'}: "
                                   f"{self._tail('qemu.log')}")
            try:
                return self.ssh("true", timeout=30).returncode == 0
            except subprocess.TimeoutExpired:
                return False
        try:
            wait.until(up, timeout=timeout, what=f"ssh to {self.node}", every=0.3)
        except wait.WaitTimeout as e:
            raise ClusterError(f"{e}\n{self._tail('console')}") from None

    def _tail(self, what: str, n: int = 3000) -> str:
        try:
            return (self.run / f"{self.node}.{what}").read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def monitor(self, command: str, timeout: float = 120.0) -> str:
        return _monitor(self.run / f"{self.node}.monitor", command, timeout)

    def stop(self, timeout: float = 20.0) -> None:
        subprocess.run([*self.ssh_argv()[:-1], "-O", "exit", "root@127.0.0.1"], capture_output=True, check=False)
        if not self.alive():
            return
        try:
            self.monitor("quit", timeout=5)
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _snapshot(work: Path, log) -> tuple[float, float]:
    """Boot both nodes from overlays of base.qcow2, wait until Slurm shows both idle,
    and save the ready snapshot into each overlay."""
    (work / "checkpoints").mkdir(exist_ok=True)
    vms = {n: _VM(work, work, n) for n in NODES}
    t0 = time.monotonic()
    try:
        for node, vm in vms.items():
            # backing file by a relative name: a run directory links base.qcow2 to the image's
            _run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", "base.qcow2",
                  str(work / f"{node}.qcow2")], log=log, what="qemu-img create")
            vm.start(loadvm=False)
        for vm in vms.values():
            vm.wait_ssh(1800)  # 1.5 min on a quiet host; over 10 min seen with load average 25
        def idle():
            p = vms["c1"].ssh("sinfo -h -N -o '%N %T'", timeout=60)
            states = dict(line.split() for line in p.stdout.decode().splitlines() if line.strip())
            return states if states and all(states.get(n) == "idle" for n in NODES) else None
        try:
            wait.until(idle, timeout=900, what="both nodes idle in the freshly booted VMs", every=1)
        except wait.WaitTimeout as e:
            p = vms["c1"].ssh("sinfo -N; journalctl -b -u slurmd -u slurmctld --no-pager | tail -30")
            raise ClusterError(f"{e}\n{p.stdout.decode(errors='replace')}") from None
        boot_s = time.monotonic() - t0
        log(f"both nodes idle {boot_s:.0f} s after power-on; saving the snapshot")
        for vm in vms.values():
            # Slurm's daemons and munge are frozen in the snapshot: a restored guest resumes at
            # the saved time, and a daemon that ran before both clocks are set from the host
            # would see the other node's credentials from the future or the past (munge
            # refuses them: slurmctld once set c2 DOWN for it). start() thaws them after.
            p = vm.ssh(f"pkill -STOP -x '{FROZEN}'", timeout=60)
            if p.returncode != 0:
                raise ClusterError(f"cannot freeze the daemons on {vm.node}: {p.stderr.decode(errors='replace')}")
            # ssh masters closed before: the snapshot holds no session
            subprocess.run([*vm.ssh_argv()[:-1], "-O", "exit", "root@127.0.0.1"], capture_output=True, check=False)
        t1 = time.monotonic()
        for vm in vms.values():
            vm.monitor("stop")
        for node, vm in vms.items():
            out = vm.monitor(f"savevm {SNAPSHOT}", timeout=600)
            if "Error" in out or "error" in out:
                raise ClusterError(f"savevm on {node}: {out.strip()}")
        save_s = time.monotonic() - t1
    finally:
        for vm in vms.values():
            vm.stop()
    for name in ("checkpoints",):
        shutil.rmtree(work / name, ignore_errors=True)
    for f in work.glob("c?.*"):
        if f.suffix != ".qcow2":
            f.unlink(missing_ok=True)
    return boot_s, save_s


# ---- the bed ----------------------------------------------------------------------------------

class VMCluster(Bed):
    """Two VMs restored from the ready snapshot: ``VMCluster('trixie').start()`` ... ``.stop()``.

    Hosts: ``ctl`` and ``c1`` are the first VM (slurmctld runs beside its slurmd), ``c2`` the
    second. Process tracking is Slurm's cgroup/v2 (``tracking`` "cgroup", ``cgroup`` "v2").
    ``timings`` records the restore's seconds."""

    cgroup = "v2"

    def __init__(self, suite: str = "trixie", *, log: Optional[Callable[[str], None]] = None):
        if suite not in SUITES:
            raise ClusterError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
        self.suite, self.slurm_release = suite, SUITES[suite]
        self.profile, self.tracking = "vm", "cgroup"  # docker-slurm/vm/profile-vm.env
        self.node_names = list(NODES)
        self.id = f"vm-{suite}"
        self.timings: dict[str, float] = {}
        self._log = log or (lambda s: None)
        self._run: Optional[Path] = None
        self._lock = None
        self._vms: dict[str, _VM] = {}
        self._partitioned = {}
        self._slurm = None

    @property
    def checkpoints(self) -> Path:
        if self._run is None:
            raise ClusterError("the VMs are not started")
        return self._run / "checkpoints"

    def __enter__(self) -> "VMCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, timeout: float = 180.0) -> "VMCluster":
        """Restore both VMs from the ready snapshot; the image must have been built
        (``docker-slurm/vm/build-vm-image SUITE``: the test command does it first)."""
        if self._vms:
            raise ClusterError(f"{self.id} is already started")
        image = image_dir(self.suite)
        if not (image / "ready.json").exists():
            raise ClusterError(f"no VM image for {self.suite} at {image}: build it first with "
                               f"docker-slurm/vm/build-vm-image {self.suite}")
        remove_orphans()
        t0 = time.monotonic()
        import fcntl
        # held for the session: a build of a newer image removes this one only when no
        # session holds it (_untag_old)
        self._lock = open(image / "ready.json")
        fcntl.flock(self._lock, fcntl.LOCK_SH)
        self._run = Path(tempfile.mkdtemp(prefix=f"dispatch-vm-{self.suite}-"))
        self.id = self._run.name
        (self._run / OWNER).write_text(f"{socket.gethostname()}:{os.getpid()}")
        try:
            self.checkpoints.mkdir()
            self.checkpoints.chmod(0o1777)
            (self._run / "base.qcow2").symlink_to(image / "base.qcow2")  # read-only: the backing file
            for node in NODES:  # the snapshot lives in the overlay: each run restores its own copy
                shutil.copyfile(image / f"{node}.qcow2", self._run / f"{node}.qcow2")
            self.timings["copy_s"] = time.monotonic() - t0
            for node in NODES:
                self._vms[node] = _VM(image, self._run, node)
                self._vms[node].start(loadvm=True)
            for vm in self._vms.values():
                vm.wait_ssh(timeout)
            self.timings["loadvm_s"] = time.monotonic() - t0
            for node in NODES:  # the daemons are frozen in the snapshot: clocks first, then thaw
                self._set_clock(node)
            for node in NODES:
                self.exec(node, f"pkill -CONT -x '{FROZEN}' && mount -t 9p -o trans=virtio,version=9p2000.L,"
                                "msize=262144,cache=none checkpoints /checkpoints")
            self.wait_nodes(lambda ns: len(ns) == len(NODES) and all(n.state == {"IDLE"} for n in ns),
                            timeout=timeout, what="both nodes IDLE after the restore")
        except Exception as e:
            logs = self._tail_logs()
            self.stop()
            raise ClusterError(f"{self.suite}: the VMs did not come up: {type(e).__name__}: {e}\n{logs}") from e
        except BaseException:
            self.stop()
            raise
        self.timings["restore_s"] = time.monotonic() - t0
        self._log(f"{self.id}: restored in {self.timings['restore_s']:.1f} s (image {image.name})")
        return self

    def _set_clock(self, node: str) -> None:
        """The guest resumes at the snapshot's time: set it from this host, then measure
        the offset that remains (the ssh round trip's half at most)."""
        vm = self._vms[node]
        vm.ssh(f"date -u -s @{time.time():.3f} >/dev/null && hwclock --systohc 2>/dev/null; true")
        t_send = time.time()
        out = vm.ssh("date +%s.%N").stdout.decode().strip()
        t_back = time.time()
        offset = float(out) - (t_send + t_back) / 2
        if abs(offset) > 0.05:  # once more, corrected by what was measured
            vm.ssh(f"date -u -s @{time.time() + (t_back - t_send) / 2:.3f} >/dev/null")
            t_send = time.time()
            out = vm.ssh("date +%s.%N").stdout.decode().strip()
            t_back = time.time()
            offset = float(out) - (t_send + t_back) / 2
        self.timings[f"clock_offset_{node}_s"] = round(offset, 3)

    def stop(self) -> None:
        """Quit both QEMUs through their monitors (killed if they do not), remove the run."""
        for node, vm in list(self._vms.items()):
            try:
                vm.stop()
            except Exception as e:  # keep stopping the rest
                self._log(f"{self.id}: stopping {node}: {e}")
        self._vms.clear()
        if self._run is not None:
            shutil.rmtree(self._run, ignore_errors=True)
            self._run = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        self._slurm = None

    def _tail_logs(self, n: int = 2000) -> str:
        out = []
        for node, vm in self._vms.items():
            out.append(f"--- {node} console ---\n{vm._tail('console', n)}\n--- {node} qemu ---\n{vm._tail('qemu.log', n)}")
        return "\n".join(out)

    def exec(self, host: str, cmd: Union[str, Sequence[str]], *, user: Optional[str] = None,
             env: Optional[Mapping[str, str]] = None, input: Optional[str] = None,
             workdir: Optional[str] = None, check: bool = True) -> CommandResult:
        """Run ``cmd`` (a string goes to ``bash -c``) on VM ``host`` as ``user`` (root by
        default), through the VM's ssh master connection."""
        try:
            vm = self._vms[HOSTS.get(host, host)]
        except KeyError:
            raise ClusterError(f"no VM {host!r} in {self.id} (have: {', '.join(HOSTS)})") from None
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        environment = dict(env or {})
        user = user or "root"
        if user != "root":
            environment.update({"HOME": f"/home/{user}", "USER": user, "LOGNAME": user})
        wd = workdir or (f"/home/{user}" if user != "root" else "/")
        remote = f"cd {shlex.quote(wd)} && exec "
        if user != "root":
            remote += f"runuser -u {shlex.quote(user)} -- "
        remote += shlex.join(["env", *(f"{k}={v}" for k, v in environment.items()), *argv])
        p = vm.ssh(remote, input=(input or "").encode())
        res = CommandResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
        if p.returncode == 255 and not vm.alive():
            raise ClusterError(f"{self.id}-{host}: the VM is gone: {vm._tail('qemu.log')}")
        if check and res.returncode != 0:
            shown = cmd if isinstance(cmd, str) else " ".join(cmd)
            raise ClusterError(f"{self.id}-{host}: `{shown}` as {user} exited {res.returncode}: "
                               f"{(res.stderr or res.stdout).strip()[-2000:]}")
        return res

    def set_tracking(self, tracking: str, *, timeout: float = 300.0) -> None:
        """Switch both nodes to ``linuxproc`` (``ProctrackType=proctrack/linuxproc``,
        ``TaskPlugin=task/none``: the negative control, on the same kernel) or back to
        ``cgroup``; Slurm needs its daemons restarted for that."""
        conf = {"linuxproc": ("proctrack/linuxproc", "task/none"), "cgroup": ("proctrack/cgroup", "task/cgroup")}
        if tracking not in conf:
            raise ClusterError(f"unknown tracking {tracking!r}: linuxproc or cgroup")
        proctrack, task = conf[tracking]
        for node in NODES:
            self.exec(node, f"sed -i -e 's|^ProctrackType=.*|ProctrackType={proctrack}|' "
                            f"-e 's|^TaskPlugin=.*|TaskPlugin={task}|' /etc/slurm/slurm.conf")
        self.exec("c1", "systemctl restart slurmctld")
        for node in NODES:
            self.exec(node, "systemctl restart slurmd")
        self.wait_until(lambda: self.slurm.config().get("ProctrackType") == proctrack, timeout=timeout,
                        what=f"slurmctld with {proctrack}")
        self.wait_nodes(lambda ns: len(ns) == len(NODES) and all(n.state == {"IDLE"} for n in ns),
                        timeout=timeout, what=f"both nodes IDLE with {proctrack}")
        self.tracking = tracking

    def logs(self, host: str, lines: int = 200) -> str:
        """The Slurm daemons' and munge's journal on ``host`` (what `docker logs` is for a container)."""
        return self.exec(host, f"journalctl -b --no-pager -u slurmctld -u slurmd -u munge | tail -n {lines}",
                         check=False).stdout

    def _interfaces(self, host: str) -> list[str]:
        return ["eth1"]  # the VMs' own link; eth0 carries only this host's ssh

    def __repr__(self) -> str:
        return f"VMCluster({self.suite!r} = Slurm {self.slurm_release}, cgroup v2, {self.id})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="build-vm-image")
    ap.add_argument("cmd", choices=["build"])
    ap.add_argument("--check", action="store_true", help="print the image directories; exit 1 if one is missing")
    ap.add_argument("suites", nargs="*", default=["trixie"], metavar="SUITE")
    a = ap.parse_args(argv)
    suites = [s for x in a.suites for s in (SUITES if x == "all" else [x])]
    for s in suites:
        if s not in SUITES:
            print(f"build-vm-image: unknown suite {s!r} (bookworm, trixie, sid, all)", file=sys.stderr)
            return 2
    missing = False
    for s in suites:
        if a.check:
            d = image_dir(s)
            missing |= not (d / "ready.json").exists()
            print(d)
            continue
        try:
            print(build(s), flush=True)
        except ClusterError as e:
            print(f"build-vm-image: {s}: {e}", file=sys.stderr)
            return 1
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
