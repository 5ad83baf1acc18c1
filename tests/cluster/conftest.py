"""Session fixtures for the docker-slurm cluster tests.

One cluster per Slurm version (Debian suite) for the whole session: pytest runs
every test with the bookworm (22.05) cluster, tears it down, then with trixie
(24.11). DISPATCH_CLUSTER_SUITES=trixie narrows the set. Without a reachable
Docker engine the tests are skipped, except under CI (CI=true) or
DISPATCH_REQUIRE_CLUSTER=1, where that is a failure.
"""

from __future__ import annotations

import os
import time

import pytest

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # the reaper image cannot be pulled

SUITES = [s for s in os.environ.get("DISPATCH_CLUSTER_SUITES", "bookworm,trixie").split(",") if s]
PROFILE = os.environ.get("DISPATCH_CLUSTER_PROFILE", "fast")
USERS = ("alice", "bob")

_timings: list[tuple[str, dict[str, float]]] = []


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


@pytest.fixture(scope="session", params=SUITES)
def cluster(request):
    """A running docker-slurm cluster (controller ctl + nodes c1..c3), all nodes idle."""
    problem = _docker_problem()
    if problem:
        if os.environ.get("CI") or os.environ.get("DISPATCH_REQUIRE_CLUSTER") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    from testbed.cluster import Cluster
    from support import host_torch

    c = Cluster(request.param, PROFILE, log=lambda s: print(s, flush=True), volumes=host_torch(request.param))
    c.start()
    _timings.append((f"{request.param} (Slurm {c.slurm_release}, {PROFILE})", c.timings))
    try:
        yield c
    finally:
        c.stop()


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


def pytest_terminal_summary(terminalreporter):
    if not _timings:
        return
    terminalreporter.section("docker-slurm timings")
    for name, t in _timings:
        terminalreporter.write_line(
            f"{name}: image build/check {t.get('build_s', 0):.1f} s, boot to all nodes idle {t.get('boot_s', 0):.1f} s"
        )
