"""Shared test helpers (importable as `support`: pytest's pythonpath includes tests/)."""

import json
import os
import pathlib
import subprocess
import sys

VECTORS = pathlib.Path(__file__).parent / "vectors"
REPO = pathlib.Path(__file__).parent.parent
#: each docker-slurm cluster's timings, one JSON line per cluster, appended by whichever
#: process ran it (an xdist worker, or pytest itself); tests/conftest.py prints them
TIMINGS = pathlib.Path(os.environ.get("DISPATCH_TIMINGS_FILE", REPO / ".pytest_cache" / "docker-slurm-timings.jsonl"))


def vectors(name: str):
    return json.loads((VECTORS / name).read_text())


def build_spank(driver: str, out_dir, cppflags: str = "") -> pathlib.Path:
    """Build a test driver of spank_env/ (test_contract, test_contexts) into out_dir through
    its Makefile, so the tests compile what the plugin's build compiles, with its flags and
    its source lists; WERROR=1 there: the tests are CI's build, where a warning fails."""
    out = pathlib.Path(out_dir) / driver
    flags = [f"CPPFLAGS={cppflags}"] if cppflags else []
    subprocess.run(["make", "-s", "-C", str(REPO / "spank_env"), "WERROR=1", f"OUT={out_dir}", *flags, str(out)],
                   check=True)
    return out


def cli(*args, env=None, check=False, cwd=None):
    """Run the real `dispatch-slurm` CLI in a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "dispatch_slurm", *map(str, args)],
                          env={**os.environ, **(env or {})}, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"dispatch-slurm {args} exited {proc.returncode}: {proc.stderr}")
    return proc


def allocate(root, n: int = 1) -> int:
    """Allocate submission numbers under ``root`` (as `dispatch-slurm submit` does, O_EXCL
    under sub/) until N=n exists: a job env with DISPATCH_SUBMISSION=n is then one a real
    submission gives. `env` and the hooks refuse an N never allocated."""
    from dispatch_slurm import store
    got = 0
    while got < n:
        got = store.allocate_submission(str(root))
    return got


def claim(root, attempt: str) -> None:
    """Claim the epoch of ``attempt`` under ``root`` (as env and the hooks do), so a test
    that counts a publish's syscalls sees only the publication's own."""
    from dispatch_slurm import store
    from dispatch_slurm.store import epochs
    epochs.claim(store.at(str(root)), attempt)


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


def run_script(text: str, tmp_path, root, attempt: str, epoch: int, *args, nproc: int = 1):
    """Write ``text`` as a script and start it as one execution; OUT is a fresh folder of its own
    (the script drops ready-<pid> files there). Returns (process, OUT)."""
    script = tmp_path / "script.py"
    script.write_text(text)
    out = tmp_path / f"out-{attempt}"
    out.mkdir()
    from testbed.ranks import dispatch_env, launch
    proc = launch([script, *args], nproc=nproc, env=dispatch_env(str(root), attempt, epoch, OUT=str(out)),
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, out


def output(proc, timeout: float = 180) -> str:
    """Everything the process printed; killed (its whole session) if not done by the deadline."""
    import signal
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def preempt_one(proc, out, nproc: int, what: str) -> str:
    """Once every process dropped its ready-<pid> file in ``out``, SIGTERM one of them (under
    torchrun: one rank only, the others must learn it from the protocol); all it printed."""
    import signal
    from testbed import wait
    try:
        ready = wait.until(lambda: proc.poll() is None and len(os.listdir(out)) == nproc and os.listdir(out),
                           timeout=180, what=what)
        os.kill(max(int(n.split("-")[1]) for n in ready), signal.SIGTERM)
    finally:
        text = output(proc)
    return text


def local_run(root, script: str, wait: bool = True):
    """`eval "$(dispatch-slurm env --local)"` then ``script``, in bash, as the Quickstart runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(DISPATCH_CHECKPOINT=str(root), PATH=f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin")
    full = f'eval "$({sys.executable} -m dispatch_slurm env --local)"\n{script}'
    p = subprocess.Popen(["bash", "-euo", "pipefail", "-c", full], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    if wait:
        assert p.wait(timeout=120) == 0
    return p


LOCAL_SAVE = 'mkdir -p "$DISPATCH_EXEC_DIR/checkpoint-$1" && echo w >"$DISPATCH_EXEC_DIR/checkpoint-$1/model.bin" && ' \
    'python -m dispatch_slurm publish "$DISPATCH_EXEC_DIR/checkpoint-$1" >/dev/null'


def doc_snippet(page: str, name: str) -> str:
    """The code block under ``<!-- snippet: NAME ... -->`` in docs/PAGE, as written."""
    import re
    text = (REPO / "docs" / page).read_text()
    m = re.search(rf"<!-- snippet: {name}[;\s].*?-->\n```\w*\n(.*?)^```", text, re.S | re.M)
    assert m, f"docs/{page} has no snippet {name}"
    return m[1]


# -- no published save is ever written again (tests/testbed/tripwire.py) ----------------

def tripped(log: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def late_files(root, pub) -> list[str]:
    """Files of the publication's save modified after the publication was created."""
    published = os.stat(os.path.join(root, "pub", pub.name)).st_mtime_ns
    save = os.path.join(root, pub.path)
    found = [save] if os.path.isfile(save) else [os.path.join(d, f) for d, _, fs in os.walk(save) for f in fs]
    return sorted(os.path.relpath(f, save) for f in found if os.stat(f).st_mtime_ns > published)


def same(a, b, where="") -> list[str]:
    """Where the two nested states differ (tensors bitwise, with their dtype)."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and torch.equal(a, b)
        return [] if ok else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in a for d in same(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same(x, y, f"{where}[{i}]")]
    if type(a) is type(b) and hasattr(a, "__dict__") and a != b:  # an object without __eq__: its fields
        return same(vars(a), vars(b), where)
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def assert_intact(root, trips, *, load, saved):
    """Nothing tripped; the latest publication's files are older than it; ``load(path)``
    reads it back equal to ``saved(pub)``, what the trainer handed its framework."""
    from dispatch_slurm import store
    assert not trips, f"a published save was opened for writing (the trainer was SIGKILLed there): {trips}"
    pub = store.latest(str(root))
    assert pub is not None
    assert late_files(root, pub) == [], f"files of {pub.name} modified after its publication"
    diff = same(load(os.path.join(root, pub.path)), saved(pub))
    assert not diff, f"{pub.path} differs from what was saved at step {pub.step}: {diff[:5]}"
    return pub


def held_copy(root, attempt: str, save) -> str:
    """The path `latest --resume` and `resume_point` give execution ``attempt`` for the
    published ``save`` (absolute): its copy in exec/<attempt>/dispatch-resume/<publication>/."""
    from dispatch_slurm import store
    rel = os.path.relpath(save, root)
    pub = max((p for p in store.publications(str(root)) if p.path == rel), key=lambda p: p.name)
    return os.path.join(str(root), "exec", attempt, "dispatch-resume", pub.name, os.path.basename(rel))


def fill(path):
    """Take every free block of the filesystem holding ``path`` (the campaign's ENOSPC fault;
    on the ``small_fs`` fixture's tmpfs)."""
    with open(path, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass  # full is what was wanted
