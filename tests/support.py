"""Shared test helpers (importable as `support`: pytest's pythonpath includes tests/)."""

import json
import os
import pathlib
import subprocess
import sys

VECTORS = pathlib.Path(__file__).parent / "vectors"
REPO = pathlib.Path(__file__).parent.parent


def vectors(name: str):
    return json.loads((VECTORS / name).read_text())


def cli(*args, env=None, check=False, cwd=None):
    """Run the real `dispatch-slurm` CLI in a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "dispatch_slurm", *map(str, args)],
                          env={**os.environ, **(env or {})}, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"dispatch-slurm {args} exited {proc.returncode}: {proc.stderr}")
    return proc


HOST_SITE = "/opt/host-site"  # where a cluster sees this machine's torch, if it can use it


def host_torch(suite: str) -> dict[str, str]:
    """Mount this machine's site-packages read-only when its torch can run in the suite's
    containers: the same Python minor (bookworm's 3.11) and glibc. No image carries torch
    (the only wheel on disk is cp311; a download would be GBs)."""
    try:
        import torch
    except ImportError:
        return {}
    if suite != "bookworm" or sys.version_info[:2] != (3, 11):
        return {}
    return {os.path.dirname(os.path.dirname(torch.__file__)): HOST_SITE}
