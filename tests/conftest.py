import json
import os
import shutil
import subprocess

import pytest

from support import TIMINGS

S3_FIXTURES = {"moto_server", "s3_env", "s3_root", "ceph_server"}


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the reporting process: a fresh timings file per run
        TIMINGS.parent.mkdir(parents=True, exist_ok=True)
        TIMINGS.write_text("")


def pytest_terminal_summary(terminalreporter):
    rows = [json.loads(line) for line in TIMINGS.read_text().splitlines()] if TIMINGS.exists() else []
    if rows:
        terminalreporter.section("docker-slurm timings")
    for t in rows:
        if "restore_s" in t:  # the VM test bed: restored from a snapshot, not booted
            terminalreporter.write_line(
                f"{t['name']}: restore from the snapshot to both nodes idle {t['restore_s']:.1f} s (copy "
                f"{t.get('copy_s', 0):.1f} s, loadvm to ssh {t.get('loadvm_s', 0):.1f} s), the VMs' whole session "
                f"(their tests too) {t.get('session_s', 0):.0f} s")
            continue
        terminalreporter.write_line(
            f"{t['name']}: image build/check {t.get('build_s', 0):.1f} s, boot to all nodes idle "
            f"{t.get('boot_s', 0):.1f} s, the cluster's whole session (its tests too) {t.get('session_s', 0):.0f} s")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads xdist_group marks into node ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n`, `--dist loadgroup`), tests that share a
    session server run on one worker, so each server starts once: the S3 servers (moto,
    Ceph's RGW) here; each docker-slurm cluster in tests/cluster/conftest.py."""
    for item in items:
        server = getattr(item, "callspec", None) and item.callspec.params.get("server")  # test_s3.server's
        if S3_FIXTURES & set(getattr(item, "fixturenames", ())) or server in ("moto", "ceph"):
            item.add_marker(pytest.mark.xdist_group("s3"))


@pytest.fixture
def bed():
    """The view's bed (tests/testbed/viewbed.py): a root, a job user, mount namespaces."""
    from testbed import viewbed
    b = viewbed.Bed()
    yield b
    b.close()
    shutil.rmtree(b.base, ignore_errors=True)


@pytest.fixture
def root(tmp_path):
    """A real checkpoint root on a real filesystem (pytest's tmp dir)."""
    r = tmp_path / "root"
    r.mkdir()
    return r


@pytest.fixture
def small_fs(tmp_path):
    """A real filesystem of its own (a 1 MiB tmpfs) that a test can fill (support.fill):
    ENOSPC as write(2) gives it."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount tmpfs (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="session")
def moto_server():
    """moto's standalone S3 server on 127.0.0.1, for the whole session."""
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    import s3server
    server = s3server.start_moto()
    yield server
    server.stop()


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """This process (and the CLI it runs) talks to the moto server."""
    for key, value in moto_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return moto_server


@pytest.fixture
def s3_root(s3_env):
    """An S3 checkpoint root: s3://<a new bucket>/run1."""
    return f"s3://{s3_env.bucket()}/run1"


@pytest.fixture(scope="session")
def ceph_server(tmp_path_factory):
    """A one-node Ceph and its RADOS gateway (atomic conditional PUT), for the whole
    session; skipped where Ceph's packages are missing (tools/setup-host installs them)."""
    pytest.importorskip("boto3")
    import s3server
    server = s3server.start_ceph(str(tmp_path_factory.mktemp("ceph")))
    if server is None:  # CI installs it (tools/setup-host): there, missing is a failure
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "no radosgw on this machine (tools/setup-host installs ceph-mon ceph-osd radosgw)")
    yield server
    server.stop()
