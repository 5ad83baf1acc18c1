"""The campaign's deterministic trainer: its state is a pure function of the steps applied
and of the saves it resumed from.

Step ``k`` consumes the next item(s) of a seeded data order (a fresh permutation of a small
dataset per data epoch) and sets ``h_k = sha256(h_{k-1} : k : items)``, so repeating a
step, skipping one, or resuming from a save whose files disagree ends in another final
hash than the uninterrupted run's (``chain``), which a checker recomputes on its own.
Each resume also folds in the id of the save it loaded (``resumed``: its writer's execution
and step, which the save records), as real training diverges after a restart: two
lineages that reach one step hold different states there, so a resume from the wrong
lineage ends in another final state even when the step is right. The checker recomputes
the state of the right lineage (``chain`` up to each right resume, ``resumed``, on).

Saves are ``checkpoint-<step>/`` in the Hugging Face layout: ``model.bin`` (the hash and a
payload, so a save takes time and space), ``data.json`` (the data cursor and the save's id), one
``rank-<r>.bin`` per other rank, and ``trainer_state.json`` last, once every rank's file
is written (what ``dispatch-slurm watch`` waits for). The trainer rotates like
``save_total_limit`` and resumes from ``--resume-from`` or, with ``--naive``, from the
highest-numbered ``checkpoint-*`` of its folder, as ``get_last_checkpoint`` does.

Every step applied, save, rotation, resume and stop is a JSON line in ``--log`` (the
trainer's own record, beside the job's output). How it meets SIGTERM (``--trap``):

- ``handler``: dispatch-slurm's preemption handler (``defer=True``): saves the last whole
  step, publishes it, prints the sentinel, exits 0;
- ``own``: its own handler, as a user writes one: saves at the step's end, prints
  ``dispatch-checkpoint-complete`` and exits 0 (``watch`` publishes);
- ``none``: the signal kills it.

``--crash-at-step K`` (``--crash-rank R``): rank R raises in the middle of step K, as a trainer
with a bug does; with ``--crash-abort`` it first asks the step's PMI server to abort the step,
as ``MPI_Abort`` does (``srun --mpi=pmi2``; Slurm 26.05 then sends the other ranks SIGTERM,
KillWait before SIGKILL; earlier releases SIGKILL).

Several ranks (``srun -n2``) step in lock-step through files under ``--barrier-dir`` (a
stand-in for the all-reduce of each step): a stopped rank stalls the others, a signal seen
by any rank stops every rank at the same step. A script run by path on the nodes (stdlib
only, dispatch-slurm imported only for ``--trap handler``), and a module the checker
imports for ``chain``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import sys
import time
from functools import lru_cache
from typing import Optional

STATE = "trainer_state.json"
SENTINEL = "dispatch-checkpoint-complete"
DATASET = 97  # items in the dataset; a prime, so data epochs and save intervals do not line up
_CKPT = re.compile(r"checkpoint-(\d+)")


def start_hash(seed: int) -> str:
    return hashlib.sha256(f"dettrain seed {seed}".encode()).hexdigest()


@lru_cache(maxsize=64)
def _order(seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(DATASET))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


def item(seed: int, cursor: int) -> tuple[int, int]:
    """(data epoch, item) at position ``cursor`` of the seeded data order."""
    epoch, pos = divmod(cursor, DATASET)
    return epoch, _order(seed, epoch)[pos]


def step_hash(h: str, step: int, seed: int, ranks: int) -> str:
    """The state after step ``step`` (1-based) from the state ``h`` before it: each rank
    consumes one item, so the data cursor is ``(step - 1) * ranks + rank``."""
    items = [item(seed, (step - 1) * ranks + r) for r in range(ranks)]
    return hashlib.sha256(f"{h}:{step}:{items}".encode()).hexdigest()


def save_id(attempt: str, step: int) -> str:
    """The id a save records of itself: the execution that wrote it and its step."""
    return f"{attempt}:{step}"


def resumed(h: str, sid: str) -> str:
    """The state after loading the save ``sid`` whose state is ``h``: a restart diverges."""
    return hashlib.sha256(f"{h}:resumed:{sid}".encode()).hexdigest()


def chain(seed: int, ranks: int, steps: int) -> list[str]:
    """``h_0 .. h_steps`` of the uninterrupted run: the oracle."""
    out = [start_hash(seed)]
    for k in range(1, steps + 1):
        out.append(step_hash(out[-1], k, seed, ranks))
    return out


class Log:
    """JSON lines, one O_APPEND write each."""

    def __init__(self, path: str, fields: dict):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.fields = fields

    def __call__(self, op: str, **more) -> None:
        os.write(self.fd, (json.dumps({"t": time.time(), **self.fields, "op": op, **more}) + "\n").encode())


def last_checkpoint(folder: str) -> Optional[str]:
    """What transformers' ``get_last_checkpoint`` returns: the highest-numbered folder,
    whoever wrote it and whether or not it is complete."""
    try:
        found = [(int(m[1]), e) for e in os.listdir(folder)
                 if (m := _CKPT.fullmatch(e)) and os.path.isdir(os.path.join(folder, e))]
    except FileNotFoundError:
        return None
    return os.path.join(folder, max(found)[1]) if found else None


class Trainer:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.rank = int(os.environ.get("SLURM_PROCID", "0"))
        self.ranks = int(os.environ.get("SLURM_NTASKS", "1")) if a.ranks is None else a.ranks
        job, restart = os.environ.get("SLURM_JOB_ID", str(os.getpid())), os.environ.get("SLURM_RESTART_COUNT", "0")
        self.attempt = os.environ.get("DISPATCH_ATTEMPT") or f"naive.{job}.{restart or 0}"
        self.log = Log(a.log, {"attempt": self.attempt, "job": job, "restart": int(restart or 0), "rank": self.rank,
                               "host": socket.gethostname(), "pid": os.getpid()})
        self.step, self.h = 0, start_hash(a.seed)
        self.signalled: list[int] = []
        self.barrier = os.path.join(a.barrier_dir, self.attempt) if a.barrier_dir else None
        if self.ranks > 1 and not self.barrier:
            sys.exit("dettrain: several ranks need --barrier-dir")

    # -- several ranks ---------------------------------------------------------------------

    def sync(self, tag: str, flag: bool = False) -> bool:
        """Wait until every rank reached ``tag``; True when any rank raised its flag."""
        if self.ranks == 1:
            return flag
        assert self.barrier is not None
        os.makedirs(self.barrier, exist_ok=True)
        mine = os.path.join(self.barrier, f"{tag}.{self.rank}")
        with open(mine + ".tmp", "w") as f:
            f.write("1" if flag else "0")
        os.replace(mine + ".tmp", mine)
        deadline = time.monotonic() + self.a.barrier_timeout
        any_flag = flag
        for r in range(self.ranks):
            path = os.path.join(self.barrier, f"{tag}.{r}")
            while True:
                try:
                    with open(path) as f:
                        any_flag |= f.read() == "1"
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        self.log("barrier_timeout", tag=tag)
                        sys.exit(f"dettrain: rank {r} never reached {tag}")
                    time.sleep(0.005)
        return any_flag

    # -- saves -----------------------------------------------------------------------------

    def save(self) -> Optional[str]:
        """Write checkpoint-<step>; rank 0 returns its path once every rank's file is written."""
        step, path = self.step, os.path.join(self.a.output_dir, f"checkpoint-{self.step}")
        self.log("save_begin", step=step, path=path)
        try:
            os.makedirs(path, exist_ok=True)  # as the Trainer does: an existing folder is reused
            if self.rank == 0:
                with open(os.path.join(path, "model.bin"), "w") as f:
                    f.write(self.h + "\n" + "x" * self.a.payload)
                with open(os.path.join(path, "data.json"), "w") as f:
                    json.dump({"cursor": step * self.ranks, "save_id": save_id(self.attempt, step)}, f)
            else:
                with open(os.path.join(path, f"rank-{self.rank}.bin"), "w") as f:
                    f.write(self.h + "\n")
            self.sync(f"save-{step}")
            if self.rank == 0:
                with open(os.path.join(path, STATE), "w") as f:
                    json.dump({"global_step": step}, f)
        except OSError as e:  # a full disk: a real trainer's save raises, and the run crashes
            self.log("save_failed", step=step, path=path, error=str(e))
            raise
        self.log("save", step=step, path=path, h=self.h)
        if self.rank == 0:
            self.rotate()
            return path
        return None

    def rotate(self) -> None:
        """save_total_limit: keep the newest ``--keep`` checkpoint folders of the output folder."""
        found = sorted((int(m[1]), e) for e in os.listdir(self.a.output_dir) if (m := _CKPT.fullmatch(e)))
        for step, name in found[:-self.a.keep] if self.a.keep else []:
            shutil.rmtree(os.path.join(self.a.output_dir, name), ignore_errors=True)
            self.log("delete", step=step, path=os.path.join(self.a.output_dir, name))

    def resume(self, path: str) -> None:
        try:
            with open(os.path.join(path, STATE)) as f:
                step = int(json.load(f)["global_step"])
            with open(os.path.join(path, "model.bin")) as f:
                h = f.readline().strip()
            with open(os.path.join(path, "data.json")) as f:
                data = json.load(f)
            cursor, sid = int(data["cursor"]), str(data["save_id"])
            if self.rank:
                with open(os.path.join(path, f"rank-{self.rank}.bin")) as f:
                    if f.readline().strip() != h:
                        raise ValueError(f"rank-{self.rank}.bin is of another state than model.bin")
            if cursor != step * self.ranks:
                raise ValueError(f"data cursor {cursor} is not step {step}'s")
        except (OSError, ValueError, KeyError) as e:  # a half-written, mixed or deleted save
            self.log("resume_failed", path=path, error=str(e))
            sys.exit(f"dettrain: cannot resume from {path}: {e}")
        self.step, self.h = step, resumed(h, sid)
        self.log("resume", path=path, step=step, h=h, save_id=sid)

    # -- the loop --------------------------------------------------------------------------

    def stop(self) -> None:
        """A signal stopped training: save this whole step and exit 0 (own handler)."""
        self.log("stop", step=self.step, h=self.h)
        self.save()
        print(SENTINEL, flush=True)
        self.log("exit", code=0)
        os._exit(0)

    def run(self) -> None:
        a = self.a
        os.makedirs(a.output_dir, exist_ok=True)
        src = a.resume_from or (last_checkpoint(a.output_dir) if a.naive else None)
        self.log("start", resume_from=src, max_steps=a.max_steps, save_every=a.save_every,
                 step_time=a.step_time, trap=a.trap, ranks=self.ranks, seed=a.seed, lineage=True)
        if src:
            self.resume(src)
        if a.trap == "own":
            signal.signal(signal.SIGTERM, lambda s, _: self.signalled.append(s))
        elif a.trap == "handler":
            from dispatch_slurm import install_preemption_handler
            from dispatch_slurm.runtime.preempt import stop_requested
            install_preemption_handler(lambda left: self.save(), defer=True)
        time.sleep(a.warmup)  # loading the model and the data
        while self.step < a.max_steps:
            time.sleep(a.step_time)  # "training"
            if self.step + 1 == a.crash_at_step and self.rank == a.crash_rank:
                self.crash()
            self.step += 1
            self.h = step_hash(self.h, self.step, a.seed, self.ranks)
            if self.rank == 0:
                self.log("step", step=self.step, h=self.h)
            mine = bool(self.signalled) or (a.trap == "handler" and stop_requested())
            stop = self.sync(f"step-{self.step}", mine) if a.trap != "none" else self.sync(f"step-{self.step}")
            self._forget(self.step - 2)
            if stop:
                self.log("signal", step=self.step, own=mine)
                if a.trap == "handler" and mine:
                    from dispatch_slurm import preemption_point
                    preemption_point()  # saves (self.save), publishes on rank 0, prints the sentinel, exits 0
                self.stop()
            if self.step % a.save_every == 0 and self.step < a.max_steps:
                self.save()
        self.save()  # the final save, as the Trainer makes one at the end of training
        self.log("done", step=self.step, h=self.h)

    def crash(self) -> None:
        """A bug in the middle of a step (the module doc: ``--crash-at-step``)."""
        self.log("crash", step=self.step + 1, abort=self.a.crash_abort)
        if self.a.crash_abort:  # PMI-1's wire protocol on $PMI_FD, what libpmi's PMI_Abort sends
            fd = int(os.environ["PMI_FD"])
            os.write(fd, b"cmd=init pmi_version=1 pmi_subversion=1\n")
            os.read(fd, 64)  # cmd=response_to_init rc=0 ...
            os.write(fd, b"cmd=abort exitcode=1\n")  # MPI_Abort(comm, 1): libpmi sends its code
        raise RuntimeError(f"dettrain: a bug in step {self.step + 1} on rank {self.rank}")

    def _forget(self, step: int) -> None:
        if self.barrier and step > 0:
            for tag in (f"step-{step}", f"save-{step}"):
                try:
                    os.unlink(os.path.join(self.barrier, f"{tag}.{self.rank}"))
                except FileNotFoundError:
                    pass


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--resume-from")
    ap.add_argument("--naive", action="store_true", help="resume from the folder's highest checkpoint-*")
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--step-time", type=float, default=0.25)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--keep", type=int, default=2, help="save_total_limit")
    ap.add_argument("--payload", type=int, default=65536, help="bytes of model.bin beyond the hash")
    ap.add_argument("--trap", choices=["handler", "own", "none"], default="none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranks", type=int, help="default: $SLURM_NTASKS")
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds before the first step (loading)")
    ap.add_argument("--barrier-dir", help="several ranks: where they meet each step")
    ap.add_argument("--barrier-timeout", type=float, default=600.0)
    ap.add_argument("--crash-at-step", type=int, help="raise in the middle of this step (on --crash-rank)")
    ap.add_argument("--crash-rank", type=int, default=0)
    ap.add_argument("--crash-abort", action="store_true", help="PMI abort first, as MPI_Abort does")
    ap.add_argument("--log", required=True)
    return ap


def main(argv=None) -> None:
    Trainer(parser().parse_args(argv)).run()


if __name__ == "__main__":
    main()
