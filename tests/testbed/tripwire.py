"""Run a script with a tripwire on published saves: the first time the program starts to
write a file inside a save that ``pub/`` names, the process is SIGKILLed there, the file
left as the write's own open leaves it (truncated, nothing written back yet). That is the
worst moment of a rewrite of a published save for a kill to land (a short grace, torchrun's
SIGKILL), made to happen on every run instead of by chance.

    python tests/testbed/tripwire.py SCRIPT ARGS...                       # one process
    python tests/testbed/tripwire.py -m MODULE ARGS...                    # python -m MODULE
    python -m torch.distributed.run --nproc-per-node 2 tests/testbed/tripwire.py SCRIPT ARGS...

What it sees: every write-mode ``open`` Python makes (an audit hook: builtins.open, io.open,
os.open; DCP's and fsspec's writers, json files), and the two native writers that bypass it,
torch.save's zip writer (``torch._C.PyTorchFileWriter``) and safetensors' ``save_file``,
wrapped before the script imports anything. Before the kill it appends one JSON line (pid,
path, publication) to ``$TRIPWIRE_LOG``, if set.
"""

import json
import os
import runpy
import signal
import sys
import threading

_local = threading.local()
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND


def published_saves() -> list[tuple[str, str]]:
    from dispatch_slurm import store
    root = os.environ["DISPATCH_CHECKPOINT"]
    return [(os.path.realpath(os.path.join(root, p.path)), p.name) for p in store.publications(root)]


def publication_of(path) -> str | None:
    real = os.path.realpath(os.fsdecode(path))
    for save, name in published_saves():
        if real == save or real.startswith(save + os.sep):
            return name
    return None


def check(path, truncates: bool) -> None:
    """Trip if ``path`` is inside a published save: log, leave the file as the writer's open
    would (truncated when it truncates), SIGKILL."""
    if getattr(_local, "busy", False) or not isinstance(path, (str, bytes, os.PathLike)):
        return
    _local.busy = True
    try:
        name = publication_of(path)
    finally:
        _local.busy = False
    if name is None:
        return
    log = os.environ.get("TRIPWIRE_LOG")
    if log:
        line = json.dumps({"pid": os.getpid(), "path": os.fsdecode(path), "publication": name}) + "\n"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, line.encode())
        os.close(fd)
    if truncates and os.path.exists(path):
        os.truncate(path, 0)
    os.kill(os.getpid(), signal.SIGKILL)


def audit(event: str, args) -> None:
    if event != "open":
        return
    path, mode, flags = (tuple(args) + (None, None))[:3]
    if isinstance(mode, str):
        if any(c in mode for c in "wax+"):
            check(path, "w" in mode)
    elif isinstance(flags, int) and flags & _WRITE_FLAGS:
        check(path, bool(flags & os.O_TRUNC))


def wrap_native_writers() -> None:
    try:
        import torch
    except ImportError:
        return
    real_writer = torch._C.PyTorchFileWriter

    def writer(name, *args, **kwargs):
        check(name, True)
        return real_writer(name, *args, **kwargs)
    torch._C.PyTorchFileWriter = writer  # type: ignore[misc,assignment]
    try:
        import safetensors.torch
    except ImportError:
        return
    real_save_file = safetensors.torch.save_file

    def save_file(tensors, filename, *args, **kwargs):
        check(filename, True)
        return real_save_file(tensors, filename, *args, **kwargs)
    safetensors.torch.save_file = save_file


def main() -> None:
    wrap_native_writers()
    sys.addaudithook(audit)
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
