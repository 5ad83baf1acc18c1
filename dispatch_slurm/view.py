"""The view: the folder an unmodified trainer already uses, made each execution's own.

    #SBATCH --dispatch-checkpoint=/scratch/me/run1 --dispatch-view=/scratch/me/run1/out
    srun python train.py --output-dir /scratch/me/run1/out     # the trainer as its user wrote it

The SPANK plugin binds the execution's ``exec/<attempt>/`` over the view folder in a private
mount namespace of every task, and on each node, before each step's tasks, runs as the job user
``dispatch-slurm view prepare`` (``prepare``: exit 0, or 2 with one line naming the fix, which
fails the tasks) and, detached, ``dispatch-slurm view publish`` (``publisher``). Those two are
this module; what it reuses: the resume copy (store/copies.py), the watch's scan and end
(runtime/watch.py), the execution's processes on this node (slurm/cessation/node.py).

``prepare``: once per execution (its record ``exec/<attempt>/dispatch-view`` makes every later
step's, and every other node's, a no-op), the latest publication is placed under the path its
trainer looks for (its path in the folder of the execution that wrote it: ``checkpoint-N``,
``global_stepN``, ``iter_NNNNNNN``, ``checkpoint/step-N``, ``ckpts/epoch=E-step=N.ckpt``), made
as a resume copy is: clones, else hard links to the publication's read-only files (a write into
one fails: the published save is never changed), for root a copy of the data. The framework's
pointer is written fresh beside it, a real file the framework may rewrite: DeepSpeed's
``latest`` (the tag), Megatron's ``latest_checkpointed_iteration.txt`` (the iteration); for
Lightning's ``ckpt_path="last"`` (the newest file named ``last*.ckpt``) a second name of the
placed file, ``last-v0.ckpt``, which Lightning never writes itself: its own ``last.ckpt`` is
rewritten through a temporary file moved into place, a rename on one filesystem but, when the
temporary folder is on another, a copy into the existing file whose refusal fsspec swallows
(a ``last.ckpt`` linked to the published file would silently stay the resumed one). So the
framework's own resume finds exactly the latest publication, and its own rotation removes only
names in the execution's folder. Nothing published: nothing placed, said once.

``publisher``: one per node and execution publishes (a later step's finds it running and waits
as its standby, taking over if it ends first; the plugin starts none for an srun step on a node
where the batch step's publisher runs, which it asks by the second name that one binds), it
publishes each save of the execution's folder once its framework completed it, the rule told
from the save's layout (``KINDS``), and never what prepare placed. It lasts as long as the
execution's processes on this node (ignoring SIGTERM, so a save made in the grace window is
published), names the saves it leaves unpublished (stderr, a ``warning`` event the report shows)
and the Epilog runs it once more (``--once``) when they are gone. One per node, not per job: a
save's files are made durable by an fsync on each node that wrote them (a shared filesystem
flushes only the caller's writes), and a node cut off from the others must go on publishing its
own execution's late saves, at its own, lower epoch.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
from typing import Callable, NamedTuple, Optional

from . import store
from .contract import layout, names
from .contract.env import Execution
from .errors import DispatchError
from .runtime import watch
from .slurm.cessation import node as cessation
from .store import execdir, whole
from .store.copies import placed_in, view_record

HF_STATE = watch.HF_STATE
DS_LATEST = "latest"  # DeepSpeed's pointer: the tag, rewritten in place by rank 0 after its own files
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-LM's: the iteration, once finalized
DCP_METADATA = ".metadata"  # DCP's coordinator writes it last (torchtitan, Megatron's torch_dist)
MEGATRON_CONFIG = "metadata.json"  # dist_checkpointing's save config, rank 0, after every rank's shards
LAST = "last-v0.ckpt"  # Lightning's ckpt_path="last" finds it; its own versions start at last-v1
DEPTH = 4  # a trainer's own subfolders: Lightning's lightning_logs/version_0/checkpoints/<file>.ckpt
BUDGET = 5000  # entries one scan lists at most: a view is a checkpoint folder, not a log tree
FIRST_S = 120.0  # how long the publisher waits for the first of the execution's processes on its node
RECORD_S = 60.0  # how long it waits for prepare's record (another node's prepare may still place)
TRIES = 5  # placements taken again while an older execution's rotation removes under them
_OWN = frozenset({layout.VIEW, layout.RESUMES, layout.PROBES})  # the package's own entries of the folder
_CLAIMS: list[socket.socket] = []  # the publisher's claim on this node (_claim), open until it exits


class Kind(NamedTuple):
    """One framework's save: its name (the one group is the step), folder or file, and the
    pointer file beside it through which the framework resumes (None: it scans names)."""
    framework: str
    regex: re.Pattern
    folder: bool
    pointer: Optional[str]


KINDS = (
    Kind("Hugging Face", re.compile(r"checkpoint-([0-9]+)"), True, None),
    Kind("torchtitan (DCP)", re.compile(r"step-([0-9]+)"), True, None),
    Kind("DeepSpeed", re.compile(r"global_step([0-9]+)"), True, DS_LATEST),
    Kind("Megatron", re.compile(r"iter_([0-9]{7})"), True, MEGATRON_TRACKER),
    Kind("Lightning", re.compile(r"(?!last)[^/]*\bstep=([0-9]+)[^/]*\.ckpt"), False, LAST),
    Kind("torch.save", re.compile(r"checkpoint-([0-9]+)\.(?:pt|pth|bin)"), False, None),
)
_DS_MODEL = re.compile(r"(?:zero_pp_rank_[0-9]+_)?mp_rank_([0-9]+)_model_states\.pt")
_DS_OPTIM = re.compile(r"(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_optim_states\.pt")


def kind_of(name: str) -> Optional[tuple[Kind, int]]:
    """The framework a save of this name is (and its step), or None: not a save."""
    for kind in KINDS:
        m = kind.regex.fullmatch(name)
        if m is not None:
            return kind, int(m[1])
    return None


def _say(text: str) -> None:
    print(f"dispatch-slurm view: {text}", file=sys.stderr, flush=True)


# ---- prepare -----------------------------------------------------------------------------------

def prepare(ex: Execution, say: Callable[[str], None] = _say) -> int:
    """Before the execution's first task: its folder holds the latest publication under the
    name its trainer looks for, and the framework's pointer (the module doc). 0, or raises
    DispatchError (one line, exit 2: the plugin fails the tasks with it)."""
    root, exec_dir, epoch, attempt = ex.need("root", "exec_dir", "epoch", "attempt")
    view = ex.view or exec_dir
    st = _posix(root)
    rel = execdir.check(exec_dir, root, epoch, attempt)
    if st.read_path(os.path.join(exec_dir, layout.VIEW)) is not None:
        return 0  # prepared: by an earlier step of this execution, or on another node
    for _ in range(TRIES):
        pub, _where = store.located(root)  # a vanished latest save is an error naming the fix
        if pub is None:
            store.unpublished.check(root, by="view prepare", attempt=attempt, say=lambda t: say(t.split(": ", 1)[-1]))
            say(f"nothing published under {root}/{layout.PUB} yet: {view} starts empty (the trainer starts from "
                "step 0)")
            _record(st, rel, None, None, None, {})
            store.resumed(root, None, "view prepare")
            return 0
        where = _inside(pub.path)
        if pub.path == f"{rel}/{where}":  # this execution's own save (published before any view step)
            _record(st, rel, pub.name, None, None, {})
            return 0
        try:
            return _place(st, ex, rel, pub, where, view, say)
        except store.SaveMoved:
            continue  # the older execution's rotation removed it under us: a newer one is near
    raise DispatchError(f"the latest save under {root}/{layout.PUB} changed {TRIES} times while it was placed into "
                        f"{exec_dir}: an older execution still running keeps removing its saves; requeue the job, "
                        "or stop that execution first")


def _posix(root: str) -> store.Store:
    st = store.at(root)
    if not st.local:
        raise DispatchError(f"the view binds a folder of a POSIX root, not {root}: an S3 root has no folders to bind "
                            "(use the job script of the README: eval \"$(dispatch-slurm env)\", latest --resume, watch)")
    return st


def _inside(rel: str) -> str:
    """A save's path inside its execution's folder (exec/<attempt>/<this>), else its last name."""
    parts = rel.split("/")
    return "/".join(parts[2:]) if parts[0] == layout.EXEC and len(parts) > 2 else parts[-1]


def _place(st: store.Store, ex: Execution, rel: str, pub: names.Publication, where: str, view: str,
           say: Callable[[str], None]) -> int:
    """Place the publication ``pub`` under ``where`` in the execution's folder ``rel``, its
    pointer beside it, then the record; one line says what was made."""
    attempt = rel.split("/", 1)[1]
    why, made = st.place(pub.path, attempt, pub.name, where)
    if why is not None or made is None:
        raise DispatchError(f"cannot prepare {view}: {why}; the trainer would start from step 0 (check the root's "
                            "filesystem: the view needs hard links or clones within it)")
    found = kind_of(where.rsplit("/", 1)[-1])
    pointer = _pointer(st, attempt, rel, pub, where, found[0] if found else None)
    counts = {"cloned": made.cloned, "linked": made.linked, "copied_bytes": made.copied}
    _record(st, rel, pub.name, where, pointer, counts)
    store.resumed(st.root, pub, "view prepare", os.path.join(view, where))
    how = ("clones of its files (a write lands in the clone)" if made.cloned else
           f"a copy of its data ({made.copied} bytes: root, whom a file's mode does not stop)" if made.copied else
           "hard links to its read-only files (a write into them fails)")
    also = f"; {os.path.join(view, pointer)} written fresh" if pointer else ""
    say(f"{os.path.join(view, where)} is step {pub.step} of {st.root}/{pub.path} (the latest publication, epoch "
        f"{pub.epoch}): {how}{also}")
    return 0


def _pointer(st: store.Store, attempt: str, rel: str, pub: names.Publication, where: str,
             kind: Optional[Kind]) -> Optional[str]:
    """The framework's pointer beside the placed save, written fresh (its path in the folder)."""
    if kind is None or kind.pointer is None:
        return None
    folder, _, leaf = where.rpartition("/")
    path = f"{folder}/{kind.pointer}" if folder else kind.pointer
    if kind.pointer == LAST:  # a second name of the placed file: Lightning finds it, and never writes it
        why, _ = st.place(pub.path, attempt, pub.name, path)
        if why is not None:
            raise DispatchError(f"cannot prepare {path} for Lightning's ckpt_path=\"last\": {why}")
        return path
    text = leaf if kind.pointer == DS_LATEST else str(pub.step)
    st.write_new(f"{rel}/{path}", text.encode())
    return path


def _record(st: store.Store, rel: str, pub: Optional[str], placed: Optional[str], pointer: Optional[str],
            made: dict) -> None:
    st.write_new(f"{rel}/{layout.VIEW}", view_record(pub, placed, pointer, made))


def in_place(view: str, exec_dir: str) -> bool:
    """Whether the view folder is, in this process's mount namespace, the execution's own."""
    try:
        a, b = os.stat(view), os.stat(exec_dir)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def no_view_line(view: str, exec_dir: str, local: bool) -> Optional[str]:
    """The one line for a job that names a view no plugin made (None: the view is in place)."""
    if in_place(view, exec_dir):
        return None
    where = "env --local runs without Slurm" if local else "plain sbatch on a site without the plugin, or no privilege"
    return (f"DISPATCH_VIEW={view} is not this execution's folder here ({where}: no mount namespace binds "
            f"{exec_dir} over it), so a trainer writing there shares one folder with every other execution: use the "
            "README's job script instead (eval \"$(dispatch-slurm env)\", latest --resume, the trainer on "
            "$DISPATCH_EXEC_DIR, watch)")


# ---- publish -----------------------------------------------------------------------------------

class _Stub:
    """Whatever a pickled object is, when only a plain dict at its top is read (``_world``)."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


class _Shallow(pickle.Unpickler):
    """Reads a torch.save archive's pickle without building a single object of its classes
    (every class is _Stub, every tensor's storage None): nothing of the file runs."""

    def find_class(self, module, name):
        return _Stub

    def persistent_load(self, pid):
        return None


def _world(path: str) -> Optional[tuple[int, int]]:
    """(data-parallel, model-parallel) world size DeepSpeed recorded in a model-states file,
    or None when it cannot be read (another layout: the ranks' files are then counted)."""
    import zipfile  # here: a save of that layout is rare, and every step's publisher starts

    try:
        with zipfile.ZipFile(path) as z:
            member = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            with z.open(member) as f:
                top = _Shallow(f).load()
        dp, mp = top.get("dp_world_size"), top.get("mp_world_size")
    except Exception:  # noqa: BLE001 -- any unreadable file: fall back to counting
        return None
    return (dp, mp) if isinstance(dp, int) and isinstance(mp, int) and dp > 0 and mp > 0 else None


def _small(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("utf-8", "replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _deepspeed(path: str, step: int) -> Optional[str]:
    """DeepSpeed: its ``latest`` names this tag (written by rank 0 after its own files, with no
    barrier before it) or a later one (every rank passed this save's last barrier), and every
    rank's files are there: the model states of each model-parallel rank (each rank's with
    ZeRO-3), the optimizer states of each rank."""
    tag = os.path.basename(path)
    latest = _small(os.path.join(os.path.dirname(path), DS_LATEST))
    if latest is None:
        return f"no {DS_LATEST} beside it (DeepSpeed writes it once rank 0's files are written)"
    later = re.fullmatch(r"global_step([0-9]+)", latest)
    if latest != tag:
        return None if later and int(later[1]) > step else f"{DS_LATEST} names {latest!r}, not this tag yet"
    files = os.listdir(path)
    models = [f for f in files if _DS_MODEL.fullmatch(f)]
    optims = [f for f in files if _DS_OPTIM.fullmatch(f)]
    if not models:
        return "no mp_rank_*_model_states.pt in it yet"
    world = _world(os.path.join(path, sorted(models)[0]))
    if world is None:
        ranks = sorted(int(m[1]) for f in optims if (m := _DS_OPTIM.fullmatch(f)))
        return None if ranks == list(range(len(ranks))) else f"optimizer states of ranks {ranks} only"
    dp, mp = world
    want_models = dp * mp if any(f.startswith("zero_pp_rank_") for f in models) else mp
    if len(models) < want_models:
        return f"model states of {len(models)} of {want_models} ranks"
    if optims and len(optims) < dp * mp:
        return f"optimizer states of {len(optims)} of {dp * mp} ranks"
    return None


def _megatron(path: str, step: int) -> Optional[str]:
    """Megatron-LM's tracker names this iteration or a later one (rank 0 writes it once every
    rank finalized the save); without a tracker (megatron-core alone), dist_checkpointing's
    ``metadata.json``, written last."""
    tracker = _small(os.path.join(os.path.dirname(path), MEGATRON_TRACKER))
    if tracker is not None:
        if tracker.isdigit() and int(tracker) >= step:
            return None
        return f"{MEGATRON_TRACKER} names {tracker!r}, not this iteration or a later one yet"
    if os.path.exists(os.path.join(path, MEGATRON_CONFIG)):
        return None
    return f"no {MEGATRON_TRACKER} naming it and no {MEGATRON_CONFIG} in it yet"


def _whole_file(path: str) -> Optional[str]:
    """A single-file save (Lightning's .ckpt, a torch.save checkpoint): whole when its zip ends."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        return e.strerror
    try:
        if os.fstat(fd).st_size == 0:
            return "empty (still being written)"
        return whole.problem(os.path.basename(path), fd)
    finally:
        os.close(fd)


def _hf(path: str) -> Optional[str]:
    try:
        with open(os.path.join(path, HF_STATE), "rb") as f:
            json.loads(f.read())
        return None
    except FileNotFoundError:
        return (f"no {HF_STATE} (Hugging Face writes it last; another trainer's checkpoint-<step> folder: save with "
                f"dispatch_slurm.saving(step), or write a marker file last and set DISPATCH_MARKER to its name)")
    except ValueError:
        return f"{HF_STATE} does not parse (still being written?)"


def _dcp(path: str) -> Optional[str]:
    return None if os.path.exists(os.path.join(path, DCP_METADATA)) else f"no {DCP_METADATA} (DCP writes it last)"


RULES: dict[str, Callable[[str, int], Optional[str]]] = {
    "Hugging Face": lambda path, step: _hf(path), "torchtitan (DCP)": lambda path, step: _dcp(path),
    "DeepSpeed": _deepspeed, "Megatron": _megatron,
    "Lightning": lambda path, step: _whole_file(path), "torch.save": lambda path, step: _whole_file(path),
}


class ViewLayout(watch.Layout):
    """The saves of a view: any of KINDS in the execution's folder or its subfolders (up to
    DEPTH), complete by its framework's rule, or holding ``dispatch_slurm.saving``'s marker (or
    DISPATCH_MARKER); never ``skip`` (what prepare placed)."""

    def __init__(self, skip: set[str], marker: Optional[str] = None):
        super().__init__(marker)
        self.skip = skip
        self._folders: set[str] = set()

    def step(self, entry: str) -> Optional[int]:
        found = kind_of(entry.rsplit("/", 1)[-1])
        return None if found is None else found[1]

    def listing(self, fs, exec_dir: str):
        out: list[tuple[str, bool]] = []
        folders: set[str] = set()
        budget = [BUDGET]

        def walk(rel: str, depth: int) -> None:
            try:
                entries = sorted(fs.entries(os.path.join(exec_dir, rel) if rel else exec_dir))
            except OSError:
                return  # removed meanwhile (a rotation), or unreadable: nothing to publish there
            for name, is_dir in entries:
                budget[0] -= 1
                path = f"{rel}/{name}" if rel else name
                if budget[0] < 0 or name.startswith(".") or path in self.skip or (not rel and name in _OWN):
                    continue
                if kind_of(name) is not None:
                    out.append((path, is_dir))
                elif is_dir and depth < DEPTH:
                    folders.add(path)
                    walk(path, depth + 1)
        walk("", 1)
        self._folders = folders
        return out

    def folders(self) -> set[str]:
        return self._folders

    def missing(self, path: str, is_dir: bool, fs) -> Optional[str]:
        found = kind_of(os.path.basename(path))
        if found is None:
            return "not named like a save"
        kind, step = found
        if kind.folder != is_dir:
            return f"a {'folder' if is_dir else 'file'} named like a {kind.framework} save, which is a " \
                   f"{'folder' if kind.folder else 'file'}"
        if is_dir and fs.exists(os.path.join(path, names.COMPLETE_MARKER)):
            return None
        if self.marker is not None and is_dir and fs.exists(os.path.join(path, self.marker)):
            return None if any(n != self.marker for n, _ in fs.entries(path)) else f"nothing but {self.marker} yet"
        return RULES[kind.framework](path, step)

    def rule(self) -> str:
        return ("the view publishes a save once its framework completed it: Hugging Face's checkpoint-<step>/ once "
                f"{HF_STATE} parses, DCP's step-<step>/ once {DCP_METADATA} exists, DeepSpeed's global_step<step>/ "
                f"once {DS_LATEST} names it (or a later tag) and every rank's files are there, Megatron's "
                f"iter_<step>/ once {MEGATRON_TRACKER} names it (or {MEGATRON_CONFIG} is in it), a .ckpt named "
                "step=<step> (Lightning) or checkpoint-<step>.pt once its zip is whole; any other save with "
                f"dispatch_slurm.saving(step) ({names.COMPLETE_MARKER}), or a marker file written last and named by "
                "DISPATCH_MARKER. Lightning's last.ckpt is rewritten at every save and never published: keep "
                "save_top_k >= 1")


def publisher(ex: Execution, once: bool = False, say: Callable[[str], None] = _say) -> int:
    """Publish the execution's saves while its processes on this node live (``once``: one scan,
    the Epilog's); 1 when it leaves saves unpublished above the last one published, else 0."""
    root, exec_dir, epoch, attempt = ex.need("root", "exec_dir", "epoch", "attempt")
    st = _posix(root)
    told = None if once or not ex.view_step_end else sys.stdin.fileno()  # the plugin's pipe
    claim = None if once else _claim(attempt, root, say, batch=ex.view_batch)
    if claim is False:
        claim = _standby(st, ex, say, told)
        if claim is False:
            return 0  # the execution's processes here are gone: the claim's holder published them
    rel = execdir.check(exec_dir, root, epoch, attempt)
    placed = _prepared(st, exec_dir, rel, 0 if once else RECORD_S)
    if placed is None:
        if once:
            return 0  # not a view's execution: nothing of the view to publish
        raise DispatchError(f"{exec_dir}/{layout.VIEW} does not exist: `dispatch-slurm view prepare` has not run for "
                            "this execution, so what it would place could be taken for this execution's own save")
    w = watch.Watcher(exec_dir, root, epoch, ViewLayout(placed, ex.marker), by="view",
                      on_publish=lambda pub: say(f"published step {pub.step}: {pub.path}"))
    if not once:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Slurm signals the step: its last save comes after
    linger = None if once else cessation.lingering(w.fs, attempt, root, ex.node, mine={os.getpid()})
    watch.run(w, once=once, linger=linger, first_within=FIRST_S, every=30.0, say=say, told=told)
    return 1 if watch.unfinished(w, say) else 0


def _prepared(st: store.Store, exec_dir: str, rel: str, wait: float) -> Optional[set[str]]:
    """What prepare placed (the paths its record names), None when it has not run: waited for
    ``wait`` seconds (prepare on another node may be placing while this one starts)."""
    deadline = time.monotonic() + wait
    while True:
        data = st.read_path(os.path.join(exec_dir, layout.VIEW))
        if data is not None:
            return {p for p in placed_in(data) if p is not None}
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def _standby(st: store.Store, ex: Execution, say: Callable[[str], None], told: Optional[int]) -> Optional[bool]:
    """Another step's publisher holds the claim on this node: wait as its standby, and take the
    claim once it went while the execution's processes here live (the step that claimed first
    may end first: an srun step inside the batch script). False once they are gone (the first
    of them awaited ``FIRST_S``, unless ``told`` said this step's tasks here are gone)."""
    attempt, root = ex.need("attempt", "root")
    linger = cessation.lingering(st, attempt, root, ex.node, mine={os.getpid()})
    quiet_by = time.monotonic() + FIRST_S  # the first of them may not have started yet
    say(f"another step's publisher of {attempt} runs on this node: standing by while the execution's processes "
        "here live, to publish if it ends first")
    while True:
        if told is not None and select.select([told], [], [], 1.0)[0] and watch.told_over(told):
            told, quiet_by = None, 0.0
        elif told is None:
            time.sleep(1.0)
        claim = _claim(attempt, root, say)
        if claim is not False:
            return claim
        if linger is None or (time.monotonic() >= quiet_by and not linger()):
            return False


def claim_name(root: str, attempt: str, batch: bool = False) -> str:
    """The abstract socket's name by which the publisher of (root, attempt) holds its claim on
    a node (``batch``: the second name the batch step's binds, which the plugin asks before it
    starts one for an srun step). FNV-1a 64 of ``root NUL attempt``: the plugin computes the same
    in C (spank_env/layout.c, tests/test_spank_contract.py)."""
    h = 0xCBF29CE484222325
    for byte in os.fsencode(root) + b"\0" + os.fsencode(attempt):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"dispatch-slurm-view-{h:016x}" + (".batch" if batch else "")


def _bind(name: str) -> bool:
    """Bind the abstract ``name`` for this process's life (the kernel lets it go with the
    process: nothing left to clean); False when another process holds it. Each probe of it is
    accepted and dropped at once, so no asker ever waits on a full queue."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(f"\0{name}")
        sock.listen(8)
    except OSError as e:
        sock.close()
        if e.errno != errno.EADDRINUSE:
            raise
        return False
    _CLAIMS.append(sock)
    threading.Thread(target=_answer, args=(sock,), name=f"claim {name}", daemon=True).start()
    return True


def _answer(sock: socket.socket) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        conn.close()


def _claim(attempt: str, root: str, say: Callable[[str], None], batch: bool = False) -> Optional[bool]:
    """One publisher per node and execution: an abstract socket bound in its name. True: this
    one publishes (``batch``: the batch step's, which binds the batch name too); False: another
    process of this user holds it. A name held by another user is said and ignored (it cannot
    stop the publishing)."""
    name = claim_name(root, attempt)
    if _bind(name):
        if batch:
            _bind(claim_name(root, attempt, batch=True))
        return True
    peer = _holder(name)
    if peer in (None, os.getuid()):
        return False
    say(f"the publisher's claim for {attempt} on this node is held by uid {peer}, not this job's user: publishing "
        "anyway")
    return None


def _holder(name: str) -> Optional[int]:
    """The uid of the process holding the claim ``name`` (None: it went meanwhile, or does not
    answer within a second)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        # blocking, bounded as the plugin's probe is: a holder's full queue is waited for (a
        # non-blocking connect would be refused at once), one that never answers is none
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 1, 0))
        try:
            probe.connect(f"\0{name}")
        except OSError:
            return None
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]
