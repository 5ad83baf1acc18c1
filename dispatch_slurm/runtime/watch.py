"""Publish each save of an execution as soon as it is complete.

    dispatch-slurm watch                    # Hugging Face: checkpoint-<step>/trainer_state.json
    dispatch-slurm watch --marker COMPLETE  # other frameworks: <save>/COMPLETE marks a save

A trainer that cannot publish itself writes into ``$DISPATCH_EXEC_DIR``; `watch` runs
beside it and publishes every complete save in step order, at the execution's epoch.
Completeness: Hugging Face writes ``trainer_state.json`` last in ``checkpoint-<step>/``
(after weights, optimizer, scheduler, RNG), so the save is complete once that file
exists *and parses* (a half-written file does not, which also covers polling, which
cannot see a close). Marker mode: a folder is complete once ``<save>/<marker>`` exists
beside something else (a marker alone vouches for nothing yet); a file save once its
sibling ``<save>.<marker>`` exists. A folder holding ``.dispatch-complete`` (written by
``dispatch_slurm.saving`` before the save got its name) is complete in either mode. Before
publishing, every file and folder of the save is fsynced and checked whole
(store/whole.py), so a publication never outlives its data in a crash, and a torn file is
never published: such a save stays unfinished (it may still be being written).

No save is left unpublished silently: a save unfinished for ``incomplete_after`` seconds is
said once, with what it lacks and how a trainer makes its saves complete; at the end the
caller names every unfinished save (``Watcher.summary``) and fails when one lies above the
last step published (``Watcher.stranded``): the trainer ended and its progress is not kept.
The exec folder is checked at start (store/execdir.py): one none of whose saves could be
published (a symlink to node-local storage, another epoch) is refused before the first save.

Waking: inotify (ctypes on libc) on the exec folder and on each unfinished save folder,
for IN_CREATE, IN_MOVED_TO and IN_CLOSE_WRITE; every batch of events triggers a full
rescan of the exec folder (a rescan is a listdir and a few stats, and it cannot miss
what an event-by-event bookkeeping could). A new save folder is checked before its
watch exists, so every new watch is followed by one more scan: a file written in
between is seen by that scan, one written later wakes us. inotify sees only this node's
writes, so a slow rescan (``rescan``) runs anyway; without inotify, or with ``poll``,
the folder is rescanned every ``interval`` seconds. ``until_pid`` uses a pidfd, so the
trainer's exit wakes the watch at once.

On an S3 root (``s3://...``) the exec folder is a prefix: each scan is one delimited
ListObjectsV2 of it (paginated to the end) and one HEAD or GET per unfinished save, every
``interval`` seconds (no inotify for S3); a scan that does not finish within
``timeout`` ends the watch with an error, as on POSIX.
"""

import ctypes
import errno
import json
import os
import select
import signal
import struct
import sys
import threading
import time
from dataclasses import dataclass

from .. import store
from ..contract import names
from ..contract.env import Execution
from ..errors import BadPath, DispatchError, TornSave
from ..store import execdir

HF_STATE = "trainer_state.json"
IN_CREATE, IN_CLOSE_WRITE, IN_MOVED_TO = 0x100, 0x08, 0x80
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_DIR_MASK = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE


class ScanTimeout(DispatchError):
    """A scan did not finish within the timeout (a hung filesystem, or a huge fsync)."""


class Layout:
    """Which entries of the exec folder are saves, their step, and when one is complete."""

    def __init__(self, marker: str | None = None, pattern: str = names.STEP_PATTERN):
        self.regex = names.step_regex(pattern)
        if marker is not None and (not marker or "/" in marker or marker in (".", "..")):
            raise DispatchError(f"--marker {marker!r} must be a plain file name")
        self.marker = marker

    def step(self, entry: str) -> int | None:
        m = self.regex.fullmatch(entry)
        if m is None:
            return None
        if not m[1].isdigit():
            raise DispatchError(f"--pattern group matched {m[1]!r} in {entry!r}, not a step number")
        return int(m[1])

    def complete(self, path: str, is_dir: bool, fs: store.Store) -> bool:
        return self.missing(path, is_dir, fs) is None

    def listing(self, fs: store.Store, exec_dir: str):
        """The entries of the exec folder that may be saves: (name under it, is a folder). Here
        its own entries; the view's layout (view.py) also looks into the trainer's subfolders."""
        return fs.entries(exec_dir)

    def folders(self) -> set[str]:
        """The subfolders the last listing looked into (watched besides the exec folder)."""
        return set()

    def missing(self, path: str, is_dir: bool, fs: store.Store) -> str | None:
        """What the save still lacks to be complete, or None when it is. On a store whose PUTs
        are all or nothing (S3) a marker object is never seen half-written; a
        trainer_state.json is complete once it parses. A save ``saving`` made is complete
        once it has its name, whatever the mode."""
        if is_dir and fs.exists(os.path.join(path, names.COMPLETE_MARKER)):
            return None
        if self.marker is not None:
            if is_dir and not fs.exists(os.path.join(path, self.marker)):
                return f"no {self.marker} in it"
            if is_dir:  # a marker written first: nothing else to vouch for yet
                others = any(name != self.marker for name, _ in fs.entries(path))
                return None if others else f"nothing but its {self.marker} in it yet"
            return None if fs.exists(f"{path}.{self.marker}") else f"no {os.path.basename(path)}.{self.marker} beside it"
        if not is_dir:
            return f"a file, not a folder holding {HF_STATE}"
        data = fs.read_path(os.path.join(path, HF_STATE))
        if data is None:
            return f"no {HF_STATE}"
        try:
            json.loads(data)
            return None
        except ValueError:  # still being written
            return f"{HF_STATE} does not parse (still being written?)"

    def rule(self) -> str:
        """What makes a save complete to this watch, and how a trainer meets it."""
        helper = "or save with dispatch_slurm.saving(step), whose saves are complete when they appear"
        if self.marker is not None:
            m = self.marker
            return (f"watch --marker {m} takes a save as complete once <save>/{m} exists (a file save: <save>.{m}): "
                    f"write it after every other file of the save, {helper}")
        return (f"watch takes a save as complete once checkpoint-<step>/{HF_STATE} parses (Hugging Face writes it "
                "last); a trainer that is not Hugging Face's writes a marker file last in each save and runs "
                f"watch --marker NAME, {helper}")


@dataclass
class Unfinished:
    """A save this watch saw but could not publish: not complete, or holding a torn file."""

    step: int
    is_dir: bool
    why: str
    since: float  # time.monotonic() when this watch first saw it unfinished
    said: bool = False


class Watcher:
    """The state of one watch: the exec folder, and the saves already published. It opens
    the root's store once (``fs``) and publishes through it, each publication in one
    session of the root."""

    def __init__(self, exec_dir: str, root: str, epoch: int, layout: Layout, sync: bool = True,
                 on_publish=None, by: str = "watch"):
        self.exec_dir, self.root, self.epoch, self.layout, self.by = exec_dir, root, epoch, layout, by
        self.sync, self.on_publish = sync, on_publish or (lambda pub: None)
        self.fs = store.at(root)
        if not self.fs.local:  # a prefix exists once something is written under it
            self.exec_dir, root = exec_dir.rstrip("/"), self.fs.root
        elif not os.path.isdir(exec_dir) and not os.path.islink(exec_dir):
            raise DispatchError(f"exec folder {exec_dir} does not exist or is not a folder")
        self.rel = execdir.check(self.exec_dir, root, epoch, Execution.current().attempt, local=self.fs.local)
        self.root = root
        self.done: set[str] = set()  # filled by the first scan, within its timeout
        self.kept: set[str] = set()  # the published saves still in the folder
        self._first = True
        self.unfinished: dict[str, Unfinished] = {}  # saves seen but not publishable yet
        self.top: int | None = None  # the highest step of this folder published at this epoch
        self.published = 0  # by this watch

    @property
    def pending(self) -> list[str]:
        """The unfinished saves that are folders: watched for what is written into them."""
        return [n for n, u in self.unfinished.items() if u.is_dir]

    def watched(self) -> set[str]:
        """The folders whose changes wake the watch: the exec folder, the subfolders its layout
        looked into, each unfinished save folder."""
        return {self.exec_dir} | {os.path.join(self.exec_dir, n) for n in [*self.layout.folders(), *self.pending]}

    def describe(self) -> str:
        """What this watch does, in one line (watch says it when it starts)."""
        m = self.layout.marker
        done = f"<save>/{m} exists, for a file save <save>.{m}" if m else f"<save>/{HF_STATE} parses"
        return (f"watching {self.exec_dir} for saves named {self.layout.regex.pattern} (complete when {done}, or "
                f"<save>/{names.COMPLETE_MARKER} exists; each file whole); publishing each at epoch {self.epoch} "
                f"into {self.root}/pub")

    def _published_before(self) -> None:
        """Saves this execution published before (an earlier watch, the trainer)."""
        mine = [p for p in self.fs.publications() if p.epoch == self.epoch and p.path.startswith(f"{self.rel}/")]
        self.done = {p.path[len(self.rel) + 1:] for p in mine}
        self.kept = set(self.done)
        self.top = max((p.step for p in mine), default=None)

    def scan(self) -> list[names.Publication]:
        """Publish every complete, unpublished save in step order; the first error raises.
        A complete save holding a torn file stays unfinished: it may still be being written."""
        if self._first:
            self._published_before()
            self._first = False
        found, seen, here = [], {}, set()
        for name, is_dir in self.layout.listing(self.fs, self.exec_dir):
            here.add(name)
            if name in self.done or (step := self.layout.step(name)) is None:
                continue
            why = self.layout.missing(os.path.join(self.exec_dir, name), is_dir, self.fs)
            if why is None:
                found.append((step, name, is_dir))
            else:
                seen[name] = (step, is_dir, why)
        out = []
        for step, name, is_dir in sorted(found):
            pub = self._publish(name, step)
            if isinstance(pub, str):
                seen[name] = (step, is_dir, pub)
            elif pub is not None:
                out.append(pub)
        self._removed(here)
        now = time.monotonic()
        old = self.unfinished
        self.unfinished = {n: Unfinished(step, is_dir, why, old[n].since if n in old else now,
                                         old[n].said if n in old else False)
                           for n, (step, is_dir, why) in seen.items()}
        return out

    def _removed(self, here: set[str]) -> None:
        """Record each published save gone from the folder (its trainer's rotation, an rm): the
        report says who removed what, and when; the publication's held links still keep it."""
        for name in sorted(self.kept - here):
            self.kept.discard(name)
            store.events.record("removed", root=self.fs, path=f"{self.rel}/{name}", by=self.by)

    def _publish(self, name: str, step: int) -> names.Publication | str | None:
        """Publish one complete save: its publication (None: published before, or rotated
        away meanwhile), or why it cannot be yet (a torn file)."""
        path = os.path.join(self.exec_dir, name)
        try:
            res = store.publish(path, step, root=self.fs, epoch=self.epoch, by=self.by, sync=self.sync)
        except TornSave as e:
            return e.detail
        except BadPath as e:
            if self.fs.present(path) and not isinstance(e, store.SaveGone):
                raise
            res = None  # rotated away before we got to it: never the latest, nothing to do
        self.done.add(name)
        if res is None:
            return None
        self.top = step if self.top is None else max(self.top, step)
        self.kept.add(name)
        if res.existed:
            return None
        self.published += 1
        self.on_publish(res.publication)
        return res.publication

    def overdue(self, after: float) -> list[str]:
        """A line for each save unfinished for ``after`` seconds, once per save."""
        now, out = time.monotonic(), []
        for name, u in sorted(self.unfinished.items(), key=lambda kv: kv[1].step):
            if not u.said and now - u.since >= after:
                u.said = True
                out.append(f"{name} is not complete after {now - u.since:.0f} s ({u.why}); {self.layout.rule()}")
        return out

    def stranded(self) -> list[str]:
        """The unfinished saves above the highest step published here: progress nothing keeps."""
        return [n for n, u in sorted(self.unfinished.items(), key=lambda kv: kv[1].step)
                if self.top is None or u.step > self.top]

    def summary(self) -> str | None:
        """At the end: the saves never published, why, and what to do; None when there is none."""
        if not self.unfinished:
            return None
        each = "; ".join(f"{n} ({u.why})" for n, u in sorted(self.unfinished.items(), key=lambda kv: kv[1].step))
        lost = self.stranded()
        after = (f"none published after them: the progress since step {self.top if self.top is not None else 0} "
                 "is not kept" if lost else f"step {self.top} was published after them")
        return (f"{len(self.unfinished)} save{'s' if len(self.unfinished) != 1 else ''} in {self.exec_dir} never "
                f"became publishable: {each}; {after}. {self.layout.rule()}; a whole save can be published by hand: "
                "dispatch-slurm publish PATH")


def unfinished(w: Watcher, say) -> bool:
    """Name the saves the watch leaves unpublished (``say``, and a ``warning`` event the report
    shows); whether any of them is above the last step published (progress nothing keeps)."""
    text = w.summary()
    if text is None:
        return False
    lost = w.stranded()
    say(f"{'error' if lost else 'warning'}: {text}")
    store.events.record("warning", root=w.fs, kind="never_complete", by=w.by, message=text,
                        paths=[f"{w.rel}/{n}" for n in sorted(w.unfinished)][:20], count=len(w.unfinished))
    return bool(lost)


class Inotify:
    """The three libc calls we need, through ctypes (no third-party package)."""

    def __init__(self):
        try:
            self.libc = ctypes.CDLL(None, use_errno=True)
            init = self.libc.inotify_init1
        except (OSError, AttributeError) as e:
            raise OSError(errno.ENOSYS, f"libc has no inotify: {e}") from None
        self.fd = init(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.wds: dict[str, int] = {}

    def add(self, path: str, mask: int = _DIR_MASK) -> bool:
        """Watch ``path``; True if this is a new watch."""
        if path in self.wds:
            return False
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR):
                return False  # gone already (rotated): nothing to watch
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        self.wds[path] = wd
        return True

    def watch_only(self, paths: set[str]) -> int:
        """Watch exactly ``paths``; how many watches are new."""
        for path in [p for p in self.wds if p not in paths]:
            self.libc.inotify_rm_watch(self.fd, self.wds.pop(path))  # EINVAL if gone: fine
        return sum(self.add(p) for p in sorted(paths))

    def drain(self) -> int:
        """Read and discard every queued event; how many there were."""
        n = 0
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return n
            off = 0
            while off < len(buf):
                _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf, off)
                off += 16 + length
                n += 1

    def close(self) -> None:
        os.close(self.fd)


class _Expired(BaseException):
    """The scan's time ran out. A BaseException, like KeyboardInterrupt, because it
    interrupts library code: boto3 wraps any Exception raised while it waits for an
    answer into a retryable HTTPClientError and waits again; this one passes through."""


def _alarm(signum, frame):
    raise _Expired


def _open_inotify(w: Watcher, interval: float, say) -> Inotify | None:
    try:
        return Inotify()
    except OSError as e:
        say(f"dispatch-slurm {w.by}: inotify unavailable ({e}); polling every {interval}s")
        return None


def _open_pidfd(pid: int | None) -> tuple[int | None, bool]:
    """(pidfd or None, alive). No pidfd (an old kernel): os.kill(pid, 0) at each wake."""
    if pid is None:
        return None, True
    try:
        return os.pidfd_open(pid), True
    except ProcessLookupError:
        return None, False
    except (AttributeError, OSError):
        return None, True


def _scan(w: Watcher, ino: Inotify | None, timeout: float | None) -> None:
    """One scan, bounded by ``timeout`` (SIGALRM, armed by the caller's handler). A save is
    checked before its watch exists; so whenever a watch is new, scan again: what was
    written in between is then seen either way."""
    if timeout is not None:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        while True:
            w.scan()
            if ino is None or not ino.watch_only(w.watched()):
                return
    except _Expired:
        raise ScanTimeout("a scan did not finish within --timeout (is the filesystem or the "
                          "S3 endpoint hung?)") from None
    finally:
        if timeout is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)


class Ending:
    """What ends the watch: ``until_pid``'s exit (None: nothing but ``once`` or an error), then
    the end of the execution's processes that run on after it, as ``linger()`` finds them: a
    step whose ``srun`` ended (slurmd frozen on a hung mount: the controller took the node for
    dead) while its tasks train, save and rotate on. The watch publishes until they are gone,
    woken by each one's exit (a pidfd) or the rescan. With ``linger`` and no ``pid`` (the
    view's publisher, which no job script starts beside a trainer) those processes are all it
    lasts for, from the start: it waits ``first_within`` seconds for the first of them to
    appear, and looks for new ones every ``every`` seconds (an exit is seen at once). ``told``:
    a descriptor whose end says the step's tasks here are gone (the plugin's, view.py), after
    which none is waited for: the step's end waits for this process's."""

    def __init__(self, pid: int | None, linger, say, first_within: float = 0.0, every: float = 1.0,
                 told: int | None = None):
        self.pid, self.linger, self.say, self.every, self.told = pid, linger, say, every, told
        self.step_over = False
        if told is not None and select.select([told], [], [], 0)[0] and told_over(told):
            self.told, self.step_over = None, True  # told before it began: a short step's publisher
        self.pidfd, self.alive = _open_pidfd(pid)
        if pid is None and linger is not None:
            self.alive = False
        self.first_by = time.monotonic() + first_within
        self.seen = False  # whether linger() ever found one
        self.pidfds: dict[int, int] = {}  # the processes that run on, once the trainer's ended
        self.said = pid is None  # the view's publisher has no trainer's end to speak of
        self.due = 0.0  # the next look for them (a /proc scan): at most once a second, or when one exits

    def over(self) -> bool:
        if self.alive:
            return False
        now = time.monotonic()
        if self.pidfds and now < self.due and not self.step_over:
            return False
        self.due = now + self.every
        if self._runs_on():
            self.seen = True
            return False
        return self.seen or self.step_over or now >= self.first_by

    def wait(self, wait: float) -> float:
        """How long to wait for a change: ``wait`` while the trainer lives, else 5 s at most
        (1 s while the first of the execution's processes is awaited)."""
        return wait if self.alive else min(wait, 5.0 if self.seen or self.pid is not None else 1.0)

    def fds(self) -> list[int]:
        told = [] if self.told is None else [self.told]
        if self.alive:
            return told + ([] if self.pidfd is None else [self.pidfd])
        return told + list(self.pidfds.values())

    def woken(self, ready: list) -> None:
        if self.told is not None and self.told in ready and told_over(self.told):
            self.told, self.step_over, self.due = None, True, 0.0
        self.alive = self.alive and _still_alive(self.pid, self.pidfd, ready)
        if any(fd in ready for fd in self.pidfds.values()):
            self.due = 0.0  # one of them exited: look again now

    def _runs_on(self) -> bool:
        pids = set(self.linger()) if self.linger is not None else set()
        for pid in [p for p in self.pidfds if p not in pids]:
            os.close(self.pidfds.pop(pid))
        live = set(self.pidfds)
        for pid in sorted(pids - live):
            fd, alive = _open_pidfd(pid)
            if fd is not None:
                self.pidfds[pid] = fd
            if alive:  # without a pidfd (an old kernel) it counts until a look finds it gone
                live.add(pid)
        if live and not self.said:
            self.said = True
            self.say(f"dispatch-slurm watch: the trainer's step ended, but its processes "
                     f"{', '.join(map(str, sorted(live)[:5]))} run on on this node: publishing until they are gone")
        return bool(live)

    def close(self) -> None:
        for fd in [*self.pidfds.values(), *([self.pidfd] if self.pidfd is not None else [])]:
            os.close(fd)
        self.pidfds.clear()
        self.pidfd = None


def told_over(fd: int) -> bool:
    """Whether the readable ``fd`` reached its end (what was written before it is dropped)."""
    try:
        return os.read(fd, 4096) == b""
    except OSError:
        return True


def run(w: Watcher, poll: bool = False, interval: float = 0.5, rescan: float = 30.0,
        once: bool = False, until_pid: int | None = None, timeout: float | None = 300.0,
        say=lambda text: print(text, file=sys.stderr), incomplete_after: float = 300.0, linger=None,
        first_within: float = 0.0, every: float = 1.0, told: int | None = None) -> None:
    """Scan, then wait for a change and scan again, until ``once`` or ``until_pid``'s exit
    (after one final scan) and, with ``linger`` (a callable: the pids of the execution's
    processes still on this node), until those are gone too (Ending, with ``first_within``,
    ``every`` and ``told``). Errors raise; a
    scan longer than ``timeout`` raises ScanTimeout (enforced with SIGALRM, so only from the
    main thread). A save unfinished for ``incomplete_after`` seconds is said once, with what
    it lacks (a save being written is not a problem; one that never completes is)."""
    end = Ending(until_pid, linger, say, first_within, every, told)
    # local writes only; none once the step is over (a short step's publisher, told before it
    # began): closing an inotify descriptor waits for the kernel's SRCU grace period (~10 ms),
    # and the step's end waits for this process
    ino = (_open_inotify(w, interval, say) if not poll and not once and w.fs.local and not end.step_over
           else None)
    if threading.current_thread() is not threading.main_thread():
        timeout = None
    old = signal.signal(signal.SIGALRM, _alarm) if timeout is not None else None
    wait = rescan if ino is not None else interval
    if until_pid is not None and end.pidfd is None:  # polling the pid
        wait = min(wait, interval)
    try:
        while True:
            _scan(w, ino, timeout)
            for line in w.overdue(incomplete_after):
                say(f"dispatch-slurm {w.by}: warning: {line}")
            if once or end.over():
                return
            ready, _, _ = select.select(([ino.fd] if ino else []) + end.fds(), [], [],
                                        _until_due(w, end.wait(wait), incomplete_after))
            if ino is not None and ino.fd in ready:
                ino.drain()
            end.woken(ready)
    finally:
        end.close()
        _close(old, ino)


def _until_due(w: Watcher, wait: float, after: float) -> float:
    """``wait``, or less when an unfinished save becomes overdue sooner."""
    now = time.monotonic()
    due = [u.since + after - now for u in w.unfinished.values() if not u.said]
    return max(0.01, min([wait, *due]))


def _still_alive(pid: int | None, pidfd: int | None, ready: list) -> bool:
    if pid is None:
        return True
    return pidfd not in ready if pidfd is not None else _alive(pid)


def _close(old_alarm, ino: Inotify | None) -> None:
    if old_alarm is not None:
        signal.signal(signal.SIGALRM, old_alarm)
    if ino is not None:
        ino.close()


def check_pid(pid: int) -> None:
    """Refuse to wait for a process that does not exist: a typo or a stale pid would
    end the watch after one scan, and nothing would be published while the trainer runs.
    (A trainer that exited but was not reaped yet still exists: the watch then makes its
    final scan at once.)"""
    if not _alive(pid):
        raise DispatchError(f"--until-pid {pid}: no such process (it has exited already, or the pid is wrong), "
                            "so nothing would be published while the trainer runs; start the watch right after "
                            "the trainer: T=$!; dispatch-slurm watch --until-pid $T; wait $T")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
