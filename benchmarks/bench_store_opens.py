"""Store objects and root sessions per supervised fact and per `watch` scan.

A layer above the store should be handed its root's store and keep it, not reopen the
root for every call: a supervisor polls every few seconds for days, a watch scans every
save. Counted, by wrapping the store in this process (nothing is timed):

  objects   store objects made (``store.at``: one per reopening of a root)
  sessions  times the POSIX store opened the root itself (its fd: one ``open`` and
            ``close`` of the root, under which a call works)
  by caller the objects by the first caller outside store/ (e.g. ``Claim.entries``)
  env       Execution.current: the execution's variables read again (watch)

Scenarios (the code measured is whatever ``dispatch_slurm`` imports: run it on another
checkout with ``PYTHONPATH=CHECKOUT:CHECKOUT/tests``, which also gives the stand-in
slurmctld of that checkout's tests/test_supervisor_rules.py):

  supervisor  `run --resubmit 1` through the supervisor's own loop: the first execution
              FAILS, the resubmission COMPLETES (13 facts); per fact
  watch       `watch --once` (the CLI, in this process) publishing one save; then one
              scan that publishes a save, and one scan with nothing new
  local       without Slurm, one execution published a save: `env --local` (a second
              execution), `resume_point()` in it, `gc` and `report` of the root (the CLI,
              in this process)

    PYTHONPATH=CHECKOUT:CHECKOUT/tests python benchmarks/bench_store_opens.py
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import sys
import tempfile
import traceback

from dispatch_slurm.store import base, posix

counts: collections.Counter = collections.Counter()
callers: collections.Counter = collections.Counter()
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(base.__file__)))
_STORE = os.path.join(_PKG, "store") + os.sep


def _caller() -> str:
    """The first frame outside store/ (and this file) that led to a store object."""
    for fs in reversed(traceback.extract_stack()[:-2]):
        if fs.filename.startswith(_STORE) or fs.filename == __file__:
            continue
        qual = getattr(fs, "name", "?")
        owner = os.path.splitext(os.path.basename(fs.filename))[0]
        return f"{owner}.{qual}"
    return "?"


def instrument() -> None:
    from dispatch_slurm.contract.env import Execution
    init, open_root, current = base.Store.__init__, posix.open_root, Execution.current.__func__

    def counted_current(cls, *a, **k):
        counts["env"] += 1
        return current(cls, *a, **k)

    def counted_init(self, *a, **k):
        counts["objects"] += 1
        callers[_caller()] += 1
        init(self, *a, **k)

    def counted_open_root(root):
        counts["sessions"] += 1
        return open_root(root)

    base.Store.__init__ = counted_init
    posix.open_root = counted_open_root
    Execution.current = classmethod(counted_current)


def reset() -> None:
    counts.clear()
    callers.clear()


def snapshot() -> dict:
    return {"objects": counts["objects"], "sessions": counts["sessions"], "env": counts["env"],
            "by_caller": dict(callers.most_common())}


def supervisor(tmp: str) -> dict:
    import test_supervisor_rules as t  # the stand-in slurmctld of the checkout measured
    from dispatch_slurm import supervisor as sv
    from dispatch_slurm.slurm.client import Slurm

    root = os.path.join(tmp, "sup")
    os.mkdir(root)
    fake, clock = t.FakeSlurm(), t.Clock()
    reset()
    sup = sv.Supervisor(root, Slurm(fake), poll=10.0, clock=clock, sleep=clock.sleep, say=lambda m: None)

    def sleep(s: float) -> None:  # the cluster moves on while the supervisor waits
        clock.sleep(s)
        st = sup.state
        if st.job is None or st.job not in fake.jobs:
            return
        state = fake.jobs[st.job]["job_state"][0]
        if state == "PENDING":
            fake.start(st.job)
        elif state == "RUNNING" and st.started is not None:
            fake.end(st.job, "FAILED" if st.job == 100 else "COMPLETED", code=1 if st.job == 100 else 0)
    sup.sleep = sleep
    sup.open("bench")
    sup.start(t.defn(resubmit=1))
    result = sv.follow(sup) if hasattr(sv, "follow") else sup.run()  # the fleet's loop; before: its own
    out = snapshot()
    facts = len(sv.Record(root).read())
    assert result.code == 0, result.message
    out.update(facts=facts, per_fact={k: round(out[k] / facts, 2) for k in ("objects", "sessions")})
    return out


def _hf_save(exec_dir: str, step: int) -> None:
    d = os.path.join(exec_dir, f"checkpoint-{step}")
    os.mkdir(d)
    data = b"w" * 1000
    header = json.dumps({"w": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + data)
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)


def watch(tmp: str) -> dict:
    from dispatch_slurm.cli import main as cli
    from dispatch_slurm.runtime import watch as watchmod
    from dispatch_slurm import store
    from dispatch_slurm.store import epochs

    root = os.path.join(tmp, "watch")
    attempt = "c.1.1000000"
    exec_dir = os.path.join(root, "exec", attempt)
    os.makedirs(exec_dir)
    # as env and the hooks do before the job runs (a checkout before stores were passed takes the root)
    takes_store = "st" in inspect.signature(epochs.claim).parameters
    epochs.claim(store.at(root) if takes_store else root, attempt)
    env = {"DISPATCH_CHECKPOINT": root, "DISPATCH_EXEC_DIR": exec_dir, "DISPATCH_EPOCH": "1000000",
           "DISPATCH_ATTEMPT": attempt}
    os.environ.update(env)
    _hf_save(exec_dir, 1)
    reset()
    try:
        cli(["watch", "--once"])
    except SystemExit as e:
        assert not e.code, e
    out = {"watch --once": snapshot()}
    w = watchmod.Watcher(exec_dir, root, 1_000_000, watchmod.Layout())
    w.scan()  # the first scan reads what was published before
    _hf_save(exec_dir, 2)
    reset()
    assert [p.step for p in w.scan()] == [2]
    out["scan publishing one save"] = snapshot()
    reset()
    assert w.scan() == []
    out["scan with nothing new"] = snapshot()
    return out


def _cli(argv: list[str]) -> str:
    import contextlib
    import io

    from dispatch_slurm.cli import main as cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            cli(argv)
        except SystemExit as e:
            assert not e.code, (argv, e, out.getvalue())
    return out.getvalue()


def local(tmp: str) -> dict:
    from dispatch_slurm import store

    root = os.path.join(tmp, "local")
    for k in [k for k in os.environ if k.startswith("DISPATCH_")]:  # the watch scenario's execution
        del os.environ[k]
    os.environ["DISPATCH_CHECKPOINT"] = root
    os.mkdir(root)
    first = json.loads(_cli(["env", "--local", "--format", "json"]))
    os.environ.update(first)
    _hf_save(first["DISPATCH_EXEC_DIR"], 10)
    _cli(["watch", "--once"])
    out = {}
    reset()
    second = json.loads(_cli(["env", "--local", "--format", "json"]))
    out["env --local"] = snapshot()
    os.environ.update(second)
    reset()
    found = store.resume_point()
    assert found is not None and found[1] == 10, found
    out["resume_point"] = snapshot()
    for name, argv in (("gc", ["gc", "--keep-last", "1", root]), ("report", ["report", root])):
        reset()
        _cli(argv)
        out[name] = snapshot()
    return out


def main() -> None:
    instrument()
    import dispatch_slurm
    print(f"dispatch_slurm from {os.path.dirname(dispatch_slurm.__file__)}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-store-opens-") as tmp:
        report = {"supervisor": supervisor(tmp), **watch(tmp), **local(tmp)}
    for name, r in report.items():
        extra = f"  facts {r['facts']}  per fact: {r['per_fact']}" if "facts" in r else ""
        print(f"{name:26} objects {r['objects']:4}  sessions {r['sessions']:4}  env {r['env']:3}{extra}")
        print(f"{'':26} by caller: {', '.join(f'{k} {v}' for k, v in r['by_caller'].items())}")


if __name__ == "__main__":
    main()
