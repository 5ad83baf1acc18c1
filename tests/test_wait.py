"""wait.until: the one bounded poll (trials, the cluster driver and the tests use it)."""

import subprocess
import sys

import pytest

from dispatch_slurm.errors import DispatchError
from testbed import wait
from testbed.wait import WaitTimeout


def test_returns_the_probe_value_once_real_state_appears(tmp_path):
    flag = tmp_path / "flag"
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(flag)!r}, 'w').write('ready')"])
    try:
        assert wait.until(lambda: flag.exists() and flag.read_text(), timeout=30, what="the flag") == "ready"
    finally:
        proc.wait()


def test_deadline_names_what_never_happened(tmp_path):
    with pytest.raises(WaitTimeout, match=r"waited 0.2 s for the missing file") as e:
        wait.until((tmp_path / "missing").exists, timeout=0.2, what="the missing file", every=0.05)
    assert isinstance(e.value, DispatchError) and isinstance(e.value, TimeoutError)


def test_retried_errors_are_reported_others_propagate():
    def busy():
        raise ConnectionError("controller busy")
    with pytest.raises(WaitTimeout, match="last error: controller busy"):
        wait.until(busy, timeout=0.2, what="the controller", every=0.05, retry=(ConnectionError,))
    with pytest.raises(ConnectionError):
        wait.until(busy, timeout=5, what="the controller")
