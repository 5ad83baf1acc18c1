"""sbatch --signal from the grace (contract/signals.py) and `submit --signal`."""

import json
import os
import stat

import pytest

from dispatch_slurm.contract.signals import fit_warning, signal_option, slowest_save
from dispatch_slurm.errors import DispatchError
from support import cli


@pytest.mark.parametrize("spec, grace, option", [("TERM", 90, "--signal=TERM@90"), ("B:USR2", 60, "--signal=B:USR2@60"),
                                                 ("SIGUSR1", 5, "--signal=SIGUSR1@5"), ("10", 300, "--signal=10@300")])
def test_signal_option_is_the_grace_before_the_limit(spec, grace, option):
    assert signal_option(spec, grace) == option


@pytest.mark.parametrize("spec, grace", [("TERM@90", 90), ("X:TERM", 60), ("term", 60), ("", 60), ("TERM", 0)])
def test_bad_signal_specs_are_refused(spec, grace):
    with pytest.raises(DispatchError, match="--signal"):
        signal_option(spec, grace)


def test_measured_saves_that_do_not_fit_the_grace_warn():
    evs = [{"type": "checkpoint_complete", "elapsed": 12.0}, {"type": "checkpoint_complete", "source": "epilog"},
           {"type": "checkpoint_complete", "elapsed": 41.5}, {"type": "published", "elapsed": 99}]
    assert slowest_save(evs) == 41.5 and slowest_save([]) is None
    assert fit_warning(60, 41.5) is None and fit_warning(60, None) is None
    assert "close to the grace of 50 s: raise --grace (e.g. 52)" in fit_warning(50, 41.5)
    assert "more than the grace of 30 s" in fit_warning(30, 41.5)


def test_submit_passes_the_signal_to_sbatch_and_warns(root, tmp_path):
    """A recording `sbatch` on PATH stands in for Slurm: this checks the argv submit builds
    (Slurm's handling of --signal is Slurm's)."""
    sbatch = tmp_path / "bin" / "sbatch"
    sbatch.parent.mkdir()
    sbatch.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/argv\necho 4242\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)
    (root / "events").mkdir()
    (root / "events" / "a.h.1.jsonl").write_text(json.dumps({"v": 1, "t": 1.0, "type": "checkpoint_complete",
                                                             "elapsed": 70.0}) + "\n")
    env = {"PATH": f"{sbatch.parent}:{os.environ['PATH']}"}
    proc = cli("submit", root, "--signal", "B:TERM@60", "--", "job.sh", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "argv").read_text().splitlines()[-2:] == ["--signal=B:TERM@60", "job.sh"]
    assert "took up to 70.0 s after the signal, more than the grace of 60 s" in proc.stderr
    assert "DISPATCH_GRACE" in (tmp_path / "argv").read_text()  # the signal's time is the job's grace

    proc = cli("submit", root, "--signal", "term", "--", "job.sh", env=env)  # sbatch's default time, 60 s
    assert proc.returncode == 0 and (tmp_path / "argv").read_text().splitlines()[-2] == "--signal=TERM@60"
    proc = cli("submit", root, "--grace", "60", "--signal", "TERM@30", "--", "job.sh", env=env)
    assert proc.returncode == 2 and "--signal TERM@30 and --grace 60 disagree" in proc.stderr
    assert sorted(os.listdir(root / "sub")) == ["000001", "000002"]  # refused input spent no submission number
