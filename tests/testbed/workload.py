"""The trial trainer: a stand-in for a Hugging Face Trainer run, in plain Python.

It saves like the Trainer (``checkpoint-<step>/`` with ``trainer_state.json``
written last), rotates like ``save_total_limit``, resumes like
``get_last_checkpoint`` (naive: one shared folder) or from the latest publication
(dispatch), and keeps saving after SIGTERM, as a trainer that checkpoints in the
grace window does. Every write, delete, publication and resume is a JSON line with a
timestamp and the lineage id, so an overlap can be measured afterwards.

    python3 tests/testbed/workload.py --mode naive --dir /ckpt/shared --log-dir /ckpt/logs
    python3 tests/testbed/workload.py --mode dispatch --log-dir /ckpt/logs   (reads DISPATCH_*)

A script, not a module of the test bed's package: jobs run it by path on the nodes,
where only dispatch_slurm is installed.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import time

from dispatch_slurm import store
from dispatch_slurm.contract.names import STEP_PATTERN

STATE = "trainer_state.json"  # written last: a folder without it is incomplete
_CKPT = re.compile(STEP_PATTERN)


def hf_last_checkpoint(folder: str) -> str | None:
    """What transformers' get_last_checkpoint() returns: the highest-numbered
    ``checkpoint-<step>`` folder, whoever wrote it and whether or not it is complete."""
    try:
        steps = [(int(m[1]), e) for e in os.listdir(folder)
                 if (m := _CKPT.fullmatch(e)) and os.path.isdir(os.path.join(folder, e))]
    except FileNotFoundError:
        return None
    return os.path.join(folder, max(steps)[1]) if steps else None


class Log:
    """JSON lines, one O_APPEND write each, flushed by the kernel at every line."""

    def __init__(self, path: str, lineage: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lineage = lineage

    def __call__(self, op: str, **fields):
        rec = {"t": time.time(), "lineage": self.lineage, "op": op, **fields}
        os.write(self.fd, (json.dumps(rec) + "\n").encode())


def safetensors(data: bytes) -> bytes:
    """A whole safetensors file holding ``data`` as one uint8 tensor: its 8-byte header
    length, the JSON header, the data (publish refuses one whose lengths disagree)."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    return len(header).to_bytes(8, "little") + header + data


def save(folder: str, step: int, lineage: str, log: Log, payload: int = 4096, shards: int = 0) -> str:
    path = os.path.join(folder, f"checkpoint-{step}")
    os.makedirs(path, exist_ok=True)  # as the Trainer does: an existing folder is reused
    for name in ("model.safetensors", "optimizer.pt", *(f"shard-{i:05d}.bin" for i in range(shards)), STATE):
        body = (json.dumps({"global_step": step, "lineage": lineage}).encode() if name == STATE
                else lineage.encode().hex().encode() * (payload // (2 * len(lineage)) + 1))
        with open(os.path.join(path, name), "wb") as f:
            f.write(safetensors(body) if name.endswith(".safetensors") else body)
        log("write", path=os.path.join(path, name), step=step)
    return path


def rotate(folder: str, keep: int, log: Log) -> None:
    """save_total_limit: keep the `keep` highest-numbered checkpoint folders."""
    found = sorted((int(m[1]), e) for e in os.listdir(folder) if (m := _CKPT.fullmatch(e)))
    for step, name in found[:-keep] if keep else []:
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
        log("delete", path=os.path.join(folder, name), step=step)


def resume_point(mode: str, folder: str, root: str | None) -> str | None:
    if mode == "naive":
        return hf_last_checkpoint(folder)
    pub = store.latest(root)
    return os.path.join(root, pub.path) if pub else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["naive", "dispatch"], required=True)
    ap.add_argument("--dir", help="naive: the one shared output folder")
    ap.add_argument("--log-dir", required=True, help="where <lineage>.jsonl goes")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between saves")
    ap.add_argument("--keep", type=int, default=2, help="save_total_limit")
    ap.add_argument("--steps", type=int, default=10, help="steps per save")
    ap.add_argument("--max-saves", type=int, default=0, help="exit 0 after this many saves (0: never)")
    ap.add_argument("--shards", type=int, default=0, help="extra files per save (a sharded save)")
    ap.add_argument("--handler", action="store_true",
                    help="dispatch mode: dispatch-slurm's preemption handler (save and publish the last "
                         "whole step on SIGTERM, then exit) instead of saving on through the grace window")
    ap.add_argument("--no-publish", action="store_true",
                    help="dispatch mode without publishing: `dispatch-slurm watch` publishes beside it")
    ap.add_argument("--payload", type=int, default=4096, help="bytes of each data file of a save")
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="seconds between choosing the resume point and the first step (model loading)")
    ap.add_argument("--start-after", metavar="FILE",
                    help="wait for FILE to exist before choosing the resume point: a replacement "
                         "scheduled ahead, let go when the old execution is reported ended")
    a = ap.parse_args(argv)
    if a.mode == "dispatch":
        root, folder = os.environ["DISPATCH_CHECKPOINT"], os.environ["DISPATCH_EXEC_DIR"]
        lineage, epoch = os.environ["DISPATCH_ATTEMPT"], int(os.environ["DISPATCH_EPOCH"])
        os.makedirs(folder, exist_ok=True)
    else:
        if not a.dir:
            ap.error("--mode naive needs --dir")
        root, folder, epoch = None, a.dir, 0
        lineage = f"{os.environ.get('SLURM_JOB_ID', os.getpid())}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"
        os.makedirs(folder, exist_ok=True)
    os.makedirs(a.log_dir, exist_ok=True)
    log = Log(os.path.join(a.log_dir, f"{lineage}.jsonl"), lineage)
    term = []
    signal.signal(signal.SIGTERM, lambda *_: term.append(time.time()) or log("sigterm"))
    if a.handler:
        from dispatch_slurm import install_preemption_handler, preemption_point
        install_preemption_handler(lambda left: save(folder, step, lineage, log), defer=True)
    if a.start_after:
        log("ready", job=os.environ.get("SLURM_JOB_ID"))
        while not os.path.exists(a.start_after):
            time.sleep(0.02)
    log("start", host=socket.gethostname(), pid=os.getpid(), mode=a.mode, folder=folder, epoch=epoch,
        job=os.environ.get("SLURM_JOB_ID"), restart=int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    step, src = 0, resume_point(a.mode, folder, root)
    if src:
        try:
            with open(os.path.join(src, STATE)) as f:
                state = json.load(f)
            step = state["global_step"]
            log("resume", path=src, step=step, from_lineage=state["lineage"])
        except (OSError, ValueError, KeyError) as e:  # a half-written or deleted folder
            log("resume_failed", path=src, error=str(e))
            raise SystemExit(f"cannot resume from {src}: {e}")
    time.sleep(a.warmup)  # loading the model and data, after the resume point was chosen
    saves = 0
    while not a.max_saves or saves < a.max_saves:
        time.sleep(a.interval)  # "training"
        step += a.steps
        path = save(folder, step, lineage, log, a.payload, shards=a.shards)
        if root is not None and not a.no_publish:
            pub = store.publish(path, step, root=root, epoch=epoch, by="trial").publication
            log("publish", path=path, step=step, name=pub.name)
        rotate(folder, a.keep, log)
        saves += 1
        if a.handler:
            preemption_point()  # a pending SIGTERM: save this whole step, publish it, exit 0
    log("end")


if __name__ == "__main__":
    main()
