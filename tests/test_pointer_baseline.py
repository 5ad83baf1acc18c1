"""The design review's reproduction in CI: with the old run really stalled (SIGSTOP)
between its check and its rename, the pointer baseline loses, append-only never does."""

import importlib.util

from support import REPO


def load():
    spec = importlib.util.spec_from_file_location("pointer_vs_append", REPO / "benchmarks" / "pointer_vs_append.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pointer_loses_append_only_never(tmp_path):
    res = load().run(trials=40, seed=7, base=str(tmp_path))
    assert res["pointer"]["losses"] >= 1, res           # the test can see a loss
    assert res["append-only"]["losses"] == 0, res
    assert res["append-only"]["stalls_with_replacement_saves"] >= 1, res  # and had the chance to lose
