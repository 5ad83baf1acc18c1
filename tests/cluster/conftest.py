"""Session fixtures for the docker-slurm cluster tests.

One cluster per entry of DISPATCH_CLUSTER_SUITES for the whole session, one after the
other: ``suite[:tracking]``, default ``bookworm,trixie:cgroup,sid:cgroup`` = Slurm 22.05
with linuxproc tracking, 24.11 and 26.05 with cgroup tracking (the tracking left out is
the profile's: linuxproc for fast). Which tests run on which cluster:

- unmarked tests check what differs per release (the contract, the hooks, parsing, the
  cessation evidence, Slurm's own behaviour): every cluster;
- ``@pytest.mark.one_release`` (trials, long supervisor scenarios): only the last cluster
  of the list (default: 26.05 with cgroup tracking) that the other markers allow, so adding
  a release costs only what differs between releases;
- ``@pytest.mark.only_on("bookworm")``: only the clusters of those suites;
- ``@pytest.mark.tracking("linuxproc")``: only the clusters with that process tracking (a
  process that escapes its job by double-forking outlives the job only without cgroups).

The VM test bed (tests/testbed/vm.py: two QEMU VMs, Slurm's cgroup/v2 tracking on their own
kernel) is a cluster of this list too, after the docker ones: ``vm:<suite>`` for each suite of
DISPATCH_VM_SUITES (default ``trixie``; empty: none). Only tests marked ``@pytest.mark.vm``
run there (TCG is slow: a small set); ``@pytest.mark.vm("full")`` ones only with
DISPATCH_VM_FULL=1. ``one_release`` picks among the docker clusters. The VM image is built
before the tests (``make test`` runs docker-slurm/vm/build-vm-image first); a missing one is
a skip, or a failure under CI.

Without a reachable Docker engine the tests are skipped, except under CI (CI=true) or
DISPATCH_REQUIRE_CLUSTER=1, where that is a failure.
"""

from __future__ import annotations

import json
import os
import time

import pytest

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # the reaper image cannot be pulled

DOCKER_CLUSTERS = [s for s in os.environ.get("DISPATCH_CLUSTER_SUITES", "bookworm,trixie:cgroup,sid:cgroup").split(",")
                   if s]
VM_SUITES = [s for s in os.environ.get("DISPATCH_VM_SUITES", "trixie").split(",") if s]
VM_FULL = os.environ.get("DISPATCH_VM_FULL") == "1"
CLUSTERS = DOCKER_CLUSTERS + [f"vm:{s}" for s in VM_SUITES]
PROFILE = os.environ.get("DISPATCH_CLUSTER_PROFILE", "fast")
USERS = ("alice", "bob")


def _is_vm(entry: str) -> bool:
    return entry.startswith("vm:")


def _suite(entry: str) -> str:
    return entry.partition(":")[2] if _is_vm(entry) else entry.partition(":")[0]


def pytest_configure(config):
    config.addinivalue_line("markers", "one_release: runs on one cluster: the last of DISPATCH_CLUSTER_SUITES "
                                       "that the test's other markers allow")
    config.addinivalue_line("markers", "only_on(*suites): runs on the clusters of these Debian suites only")
    config.addinivalue_line("markers", "tracking(mode): runs on the clusters with this process tracking only "
                                       "(linuxproc, cgroup; an entry without one is the profile's)")
    config.addinivalue_line("markers", "vm(set='ci'): runs on the VM test bed (cgroup v2) too; set 'full': only "
                                       "with DISPATCH_VM_FULL=1")
    config.addinivalue_line("markers", "vm_only: runs on the VM test bed only (what needs cgroup v2)")


def _tracking(entry: str) -> str:
    if _is_vm(entry):
        return "cgroup"
    return entry.partition(":")[2] or {"fast": "linuxproc", "site": "cgroup"}[PROFILE]


def _vm_allows(item) -> bool:
    marks = list(item.iter_markers("vm"))  # a parameter's vm("full") counts beside its function's vm
    if not marks:
        return item.get_closest_marker("vm_only") is not None
    return VM_FULL or not any(m.args and m.args[0] == "full" for m in marks)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads xdist_group marks into node ids
def pytest_collection_modifyitems(config, items):
    """Drop the (test, cluster) pairs the markers exclude (see the module docstring)."""
    keep, drop = [], []
    for item in items:
        entry = getattr(item, "callspec", None) and item.callspec.params.get("cluster")
        if entry is None:
            keep.append(item)
            continue
        only, tracking = item.get_closest_marker("only_on"), item.get_closest_marker("tracking")
        allowed = [e for e in CLUSTERS if (not only or _suite(e) in only.args)
                   and (not tracking or _tracking(e) == tracking.args[0])]
        docker = [] if item.get_closest_marker("vm_only") else [e for e in allowed if not _is_vm(e)]
        if item.get_closest_marker("one_release"):
            docker = docker[-1:]
        allowed = docker + ([e for e in allowed if _is_vm(e)] if _vm_allows(item) else [])
        (keep if entry in allowed else drop).append(item)
        item.add_marker(pytest.mark.xdist_group(f"cluster-{entry}"))  # one worker boots each cluster once
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _docker_problem() -> str | None:
    try:
        import docker
        import testcontainers  # noqa: F401
    except ImportError as e:
        return f"missing the cluster test dependencies ({e}): pip install 'dispatch-slurm[cluster]'"
    try:
        client = docker.from_env()
        client.ping()
        client.close()
    except Exception as e:  # any failure to talk to the engine
        return f"no Docker engine reachable ({e})"
    return None


def _vm_problem(suite: str) -> str | None:
    import shutil

    from testbed.vm import image_dir
    if shutil.which("qemu-system-x86_64") is None:
        return "no qemu-system-x86_64 (tools/setup-host installs it)"
    if not (image_dir(suite) / "ready.json").exists():
        return f"no VM image for {suite}: docker-slurm/vm/build-vm-image {suite} (make test builds it first)"
    return None


def _start_vm(suite: str):
    problem = _vm_problem(suite)
    if problem:
        if os.environ.get("CI") or os.environ.get("DISPATCH_REQUIRE_CLUSTER") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    from testbed.vm import VMCluster
    t0 = time.monotonic()
    c = VMCluster(suite, log=lambda s: print(s, flush=True)).start()
    return c, t0


@pytest.fixture(scope="session", params=CLUSTERS, ids=lambda e: e.replace(":", "-"))
def cluster(request):
    """A running cluster, all nodes idle: docker-slurm (slurmdbd db, controller ctl, nodes
    c1..c3), or for a ``vm:`` entry the two VMs (ctl = c1, c2)."""
    from support import TIMINGS
    if _is_vm(request.param):
        c, t0 = _start_vm(_suite(request.param))
        name = f"{request.param} (Slurm {c.slurm_release}, two QEMU/TCG VMs, cgroup v2 tracking)"
        try:
            yield c
        finally:
            c.stop()
            c.timings["session_s"] = time.monotonic() - t0
            with open(TIMINGS, "a") as f:
                f.write(json.dumps({"name": name, **c.timings}) + "\n")
        return
    problem = _docker_problem()
    if problem:
        if os.environ.get("CI") or os.environ.get("DISPATCH_REQUIRE_CLUSTER") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    from testbed.cluster import Cluster
    from support import host_torch

    suite, _, tracking = request.param.partition(":")
    t0 = time.monotonic()
    c = Cluster(suite, PROFILE, tracking=tracking or None, log=lambda s: print(s, flush=True),
                volumes=host_torch(suite))
    c.start()
    try:
        yield c
    finally:
        c.stop()
        c.timings["session_s"] = time.monotonic() - t0
        with open(TIMINGS, "a") as f:
            f.write(json.dumps({"name": f"{request.param} (Slurm {c.slurm_release}, {PROFILE}, {c.tracking} "
                                        "tracking)", **c.timings}) + "\n")


@pytest.fixture
def slurm_cluster(cluster):
    """The session cluster, left clean after each test: no job of the test users
    remains and every node is idle again, so one test's leftovers never decide another's."""
    yield cluster
    for user in USERS:
        cluster.exec("ctl", ["scancel", "-u", user], check=False)
    cluster.wait_nodes(
        lambda ns: all(n.state == {"IDLE"} for n in ns), timeout=240, what="every node IDLE after the test"
    )


@pytest.fixture
def workdir(slurm_cluster, request):
    """A fresh folder on the shared volume for this test: (path in the containers, host path)."""
    name = f"{request.node.name}-{int(time.time() * 1000)}".replace("[", "-").replace("]", "")
    host = slurm_cluster.checkpoints / name
    host.mkdir()
    host.chmod(0o1777)
    return f"/checkpoints/{name}", host


@pytest.fixture
def etc(slurm_cluster):
    """put(path, text, on=hosts): write a file on those containers (default: all); afterwards
    every container gets back exactly what it had (usually no /etc/dispatch-slurm at all)."""
    from testbed.bed import CONTROLLER
    c = slurm_cluster
    saved: dict[tuple[str, str], str | None] = {}  # (host, path) -> what it held, None: nothing
    made: list[tuple[str, str]] = []  # (host, directory) created here

    def put(path: str, text: str, on: list[str] | None = None) -> None:
        folder = os.path.dirname(path)
        for h in on or [CONTROLLER, *c.node_names]:
            if (h, path) not in saved:
                old = c.exec(h, ["cat", path], check=False)
                saved[h, path] = old.stdout if old.returncode == 0 else None
                if c.exec(h, ["test", "-d", folder], check=False).returncode:
                    made.append((h, folder))
            c.exec(h, f"install -d -m 0755 {folder} && cat > {path}", input=text)

    yield put
    for (h, path), old in saved.items():
        if old is None:
            c.exec(h, ["rm", "-f", path])
        else:
            c.exec(h, f"cat > {path}", input=old)
    for h, folder in made:
        c.exec(h, ["rm", "-rf", folder])
