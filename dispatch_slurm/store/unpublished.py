"""Saves under the root that nothing published: said loudly when a resume finds none.

When nothing is published, every resume starts from step 0. That is right for a new
run, and silent data loss when earlier executions did save: a framework's own
checkpoint (Lightning's ``hpc_ckpt_<N>.ckpt`` from ``SLURMEnvironment(auto_requeue=True)``,
written into the old execution's folder just before it requeued itself into a new,
empty one), ``checkpoint-<step>`` folders that ``watch`` never took as complete (a
trainer that is not Hugging Face's and writes no marker), any other checkpoint file.
``check`` is what `latest`, `env` and every integration's resume call run when nothing
is published: it lists what the exec folders hold (a bounded walk: only then, so a
resume that finds a publication costs nothing more) and, if they hold saves, says so on
stderr with the fix, and records a ``warning`` event the report shows. ``report`` runs
``find`` itself while nothing is published and no execution said so (a trainer that calls
no resume of dispatch-slurm)."""

from __future__ import annotations

import os
import re
import sys
from typing import Callable, NamedTuple

from ..contract import layout, names
from ..contract.env import Execution
from ..errors import DispatchError
from . import events
from .roots import Root, at, name_of

SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".distcp", ".pkl", ".npz", ".h5")
DEPTH = 4  # Lightning's own ModelCheckpoint: <exec>/lightning_logs/version_0/checkpoints/<file>.ckpt
BUDGET = 2000  # entries listed at most: a resume must not crawl a huge log folder
SHOWN = 5
NEVER_SAVES = (layout.PROBES, layout.RESUMES)  # the probe's records, the copies resumed from


class Found(NamedTuple):
    path: str  # relative to the root
    epoch: int  # of the execution whose folder holds it
    step: int | None  # from its name (checkpoint-<step>), when it has one


#: what makes a folder one save, not a folder of saves: DCP's ``.metadata`` and shards
#: (torchtitan's ``step-N``, Megatron's ``iter_N``), Megatron's ``common.pt`` and
#: ``metadata.json``, DeepSpeed's model states: publishing one file of it would make that file
#: the latest, which no resume can load
_FOLDER_SAVE = re.compile(r"\.metadata|metadata\.json|common\.pt|.*\.distcp|mp_rank_[0-9]+_model_states\.pt")


def _looks_like_a_save(name: str, is_dir: bool, regex) -> bool:
    return regex.fullmatch(name) is not None or (not is_dir and name.lower().endswith(SUFFIXES))


def _step(name: str, regex) -> int | None:
    m = regex.fullmatch(name)
    return int(m[1]) if m and m[1].isdigit() else names.named_step(name)


def find(root: Root, pattern: str = names.STEP_PATTERN) -> list[Found]:
    """What the executions' folders hold that looks like a save, oldest execution first."""
    st, regex = at(root), names.step_regex(pattern)
    base = f"{st.root.rstrip('/')}/{layout.EXEC}"
    budget, out = [BUDGET], []

    def walk(folder: str, rel: str, epoch: int, depth: int) -> None:
        try:
            listing = sorted(st.entries(folder))
        except OSError:  # removed meanwhile (gc), unreadable: nothing to name there
            return
        if depth > 1 and any(_FOLDER_SAVE.fullmatch(name) for name, is_dir in listing if not is_dir):
            out.append(Found(rel, epoch, _step(rel.rsplit("/", 1)[-1], regex)))  # the folder is the save
            return
        for name, is_dir in listing:
            budget[0] -= 1
            if budget[0] < 0:
                return
            if name.startswith(".") or (depth == 1 and name in NEVER_SAVES):
                continue  # an unfinished save of dispatch_slurm.saving (never whole), the package's own
            if _looks_like_a_save(name, is_dir, regex):
                out.append(Found(f"{rel}/{name}", epoch, _step(name, regex)))
            elif is_dir and depth < DEPTH:
                walk(f"{folder}/{name}", f"{rel}/{name}", epoch, depth + 1)
    try:
        attempts = sorted((names.attempt_epoch(a), a) for a, is_dir in st.entries(base) if is_dir)
    except FileNotFoundError:
        return []
    for epoch, attempt in attempts:
        if epoch is not None:
            walk(f"{base}/{attempt}", f"{layout.EXEC}/{attempt}", epoch, 1)
    return out


def nothing_published(root: Root) -> bool:
    """Whether ``pub/`` is empty: one entry listed at most (a caller that need not know which
    publication is the latest, such as `env`, must not list a million of them)."""
    st = at(root)
    try:
        return next(iter(st.entries(f"{st.root.rstrip('/')}/{layout.PUB}")), None) is None
    except FileNotFoundError:
        return True


def _checkpoint(f: Found) -> bool:
    """Named ``checkpoint-<step>``, the name publish and watch read a step from."""
    return re.fullmatch(names.STEP_PATTERN, f.path.rsplit("/", 1)[-1]) is not None


def publish_command(root: str, found: list[Found]) -> str:
    """The command, run outside the job (a login node), that publishes the newest save found,
    so that the next execution resumes from it."""
    best = max(found, key=lambda f: (f.epoch, f.step if f.step is not None else -1, f.path))
    step = " --step STEP" if best.step is None else "" if _checkpoint(best) else f" --step {best.step}"
    return f"dispatch-slurm publish --root {root} --epoch {best.epoch}{step} {root}/{best.path}"


def message(root: str, found: list[Found]) -> str:
    """The warning: what was found, what happens now, and the fixes."""
    shown = ", ".join(f.path for f in found[-SHOWN:]) + (f" ({len(found)} in all)" if len(found) > SHOWN else "")
    command = publish_command(root, found)
    text = (f"nothing is published under {root}/{layout.PUB}, but earlier executions left saves: {shown}. This "
            "execution starts from step 0 and their progress is lost unless one is published. To resume from one, "
            f"publish it from outside the job (a login node), then start the job again: {command} (--epoch: the "
            "epoch of the execution that wrote it, its folder's last field"
            + ("; --step: its training step" if "--step STEP" in command else "") + ").")
    if any(_checkpoint(f) for f in found):
        text += (" checkpoint-<step> saves that watch did not publish were never complete to it: Hugging Face's "
                 "trainer_state.json, or with watch --marker NAME the marker, must be written last (or save with "
                 "dispatch_slurm.saving(step)).")
    if any(os.path.basename(f.path).startswith("hpc_ckpt_") for f in found):
        text += (" hpc_ckpt_*.ckpt is Lightning's: SLURMEnvironment(auto_requeue=True) saved it on SIGUSR1 in the "
                 "old execution's folder and requeued the job, whose next execution has a new, empty folder: use "
                 "plugins=dl.plugins() (dispatch_slurm.integrations.lightning: auto_requeue=False) and DispatchCheckpoint, "
                 "which publishes each save, with #SBATCH --signal=TERM@<seconds> (nothing traps USR1 then).")
    return text


def check(root: Root, by: str, attempt: str | None = None, say: Callable[[str], None] | None = None) -> list[Found]:
    """When nothing is published under ``root`` (the caller knows): the saves left in its
    exec folders, said on stderr (``say``) and, inside an execution (``attempt``, else
    $DISPATCH_ATTEMPT) by its first rank, recorded as a ``warning`` event (``by``: who
    looked: latest, env, resume)."""
    say = say or (lambda t: print(t, file=sys.stderr, flush=True))
    name = name_of(root) or ""
    try:
        found = find(root)
    except (OSError, DispatchError) as e:  # a warning's look must never stop the resume it warns about
        say(f"dispatch-slurm: warning: nothing is published under {name}/{layout.PUB}, and the exec folders could "
            f"not be listed to tell whether earlier executions left saves ({e})")
        return []
    if not found:
        return found
    text = message(name, found)
    say(f"dispatch-slurm: warning: {text}")
    ex = Execution.current()
    attempt = attempt or ex.attempt
    if attempt and ex.rank in (None, 0):  # said on every rank, recorded once per execution
        events.record("warning", root=root, attempt=attempt, kind="unpublished_saves", by=by, message=text,
                      paths=[f.path for f in found[-20:]], count=len(found))
    return found
