"""Unmodified trainers (tests/testbed/unmodified/: no dispatch import, no flag of it) under the
view, each overlapped by its own old execution, beside the same trainers in one shared folder:
the schedule of tests/testbed/viewbed.py (A saves 4 and is stopped, alive; B resumes, saves 6
and 8 and is killed; A runs on and saves 6, 8, 10 late; C resumes and trains to the end), in a
real mount namespace, as a real job user. ``PYTHONPATH=tests python -m testbed view`` prints the
table of both sides for every trainer.

With the view: B resumes from A's 4, C from B's 8 (never A's late 10: A's late saves are
published at A's lower epoch), nothing B saved is touched, and C ends with the uninterrupted
run's weights, bit for bit. In the shared folder (the harm, reproduced): C resumes from A's late
10, and A's writes and rotation take B's saves (Lightning's excepted: it versions the names it
finds taken, and rotates only what it wrote)."""

import os
import shutil

import pytest

from dispatch_slurm import store
from testbed import viewbed

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"),
                                reason="the view needs root for its mount namespace and a job user to drop to")

# DeepSpeed starts in ~1 min on CPU (its ops' check), 4 executions a side
KINDS = ["plain", "huggingface", "lightning", "torchtitan", pytest.param("deepspeed", marks=pytest.mark.slow),
         pytest.param("deepspeed-2", marks=pytest.mark.slow)]
# Lightning gives a save whose name exists already a version ("-v1") and rotates only the paths it
# wrote itself: in the shared folder the old execution's saves leave the replacement's files alone
REWRITES_BY_NAME = {"lightning": False}
NEEDS = {"huggingface": "transformers", "lightning": "lightning", "torchtitan": "torchtitan",
         "deepspeed": "deepspeed", "deepspeed-2": "deepspeed"}


@pytest.fixture(scope="module")
def digests(tmp_path_factory):
    """Each trainer's final weights, run once from start to end (computed when first asked)."""
    base, found = tmp_path_factory.mktemp("uninterrupted"), {}

    def of(kind: str) -> str:
        if kind not in found:
            found[kind] = viewbed.uninterrupted(base, kind)
        return found[kind]
    return of


@pytest.mark.parametrize("kind", KINDS)
def test_under_the_view_the_overlap_is_harmless(bed, digests, kind):
    if kind in NEEDS:
        pytest.importorskip(NEEDS[kind])
    got = viewbed.overlap(bed, kind, "view")
    assert got.rc == 0, bed.tail_of(f"{kind}-view-C")
    assert got.b_resumed == 4, "B resumed from A's latest publication"
    assert got.c_resumed == 8, "C resumed from B's newest save, the replacement's lineage"
    assert not got.late_resume and got.b_lost == [], got
    assert got.c_done == digests(kind), "C's final weights are the uninterrupted run's, bit for bit"
    pubs = store.publications(str(bed.root))
    a_epoch = min(p.epoch for p in pubs)
    assert {p.step for p in pubs if p.epoch == a_epoch} >= {6, 8, 10}, "A's late saves are published, at A's epoch"
    assert store.latest(str(bed.root)).step == 12 and store.latest(str(bed.root)).epoch == max(p.epoch for p in pubs)


@pytest.mark.parametrize("kind", KINDS)
def test_in_one_shared_folder_the_same_overlap_does_harm(bed, kind):
    if kind in NEEDS:
        pytest.importorskip(NEEDS[kind])
    got = viewbed.overlap(bed, kind, "naive")
    assert got.b_resumed == 4
    assert got.late_resume and got.c_resumed == 10, "C resumed from the old execution's late save"
    assert bool(got.b_lost) == REWRITES_BY_NAME.get(kind, True), \
        f"the old execution's writes and rotation took the replacement's saves: {got.b_lost}"
