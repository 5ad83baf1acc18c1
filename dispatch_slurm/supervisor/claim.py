"""Who writes the record: one supervisor at a time, without a lock.

``<root>/supervisor/<NNNNNN>`` entries are O_EXCL-created in increasing order, each
holding the claimant's host, pid and poll interval; the highest one is the writer.
The writer touches its entry (mtime) every poll as a heartbeat and checks before every
append that no higher entry exists; when one appears it stops writing, creates
``<NNNNNN>.exited`` and exits. A new supervisor takes over only from a claimant that
exited, whose pid is gone (same host), or whose heartbeat stood still for three of its
polls (another host; compared on the file server's clock only). Telling a heartbeat stood
still takes that long: it is a waiting state, looked at again at every poll, never a wait
inside one (one process supervises many roots). No lock: locks are unreliable on the
parallel filesystems a root lives on."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from typing import Optional

from .. import store
from ..contract.layout import CLAIMS
from ..errors import DispatchError

DEFAULT_POLL = 10.0
_CLAIM = re.compile(r"[0-9]{6}")
_EXITED = re.compile(r"([0-9]{6})\.exited")


def _pid_is_supervisor(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"dispatch" in cmd


#: how often a claim in doubt (another host's claimant, its heartbeat not yet read) is looked at again
LOOK = 1.0


class Claim:
    """One supervisor's claim on ``root`` (see the module doc), through the root's store the
    supervisor keeps (or, given a name, one of its own). Nothing here waits: a claimant on
    another host is "unknown" until its heartbeat is seen to move (alive) or to stand still
    for three of its polls (gone), each look one call of ``holder`` (``attempt`` for the
    claim itself) at the caller's pace."""

    def __init__(self, root: store.Root, poll: float, purpose: str, *, clock=time.monotonic):
        self.store = store.at(root)
        self.root = self.store.root
        self.poll, self.purpose = poll, purpose
        self.seq: Optional[int] = None
        self._clock = clock
        self._prev: Optional[int] = None  # the claimant a takeover waits for
        self._watch: Optional[tuple[int, Optional[float], float]] = None  # (claim, heartbeat seen, deadline)

    def entries(self) -> tuple[list[int], set[int]]:
        """(claims in order, the claims that said they exited)."""
        items = self.store.listing(CLAIMS)
        claims = sorted(int(e) for e in items if _CLAIM.fullmatch(e))
        exited = {int(m[1]) for e in items if (m := _EXITED.fullmatch(e))}
        return claims, exited

    def _info(self, seq: int) -> dict:
        try:
            info = json.loads(self.store.read(CLAIMS, f"{seq:06d}") or b"{}")
        except (ValueError, DispatchError):
            return {}
        return info if isinstance(info, dict) else {}

    def _mtime(self, seq: int) -> Optional[float]:
        return self.store.mtime(CLAIMS, f"{seq:06d}")

    def holder(self, seq: int, exited: set[int]) -> str:
        """What one look says of claimant ``seq``: "gone" (it said it exited; its pid on this
        host is no supervisor; its heartbeat stood still for three of its polls since the
        first look), "alive" (a supervisor's pid on this host; a heartbeat that moved since
        the last look) or "unknown" (another host's, neither yet: look again)."""
        if seq in exited:
            return "gone"
        info = self._info(seq)
        if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
            return "alive" if _pid_is_supervisor(info["pid"]) else "gone"
        beat, now = self._mtime(seq), self._clock()
        watched = self._watch
        if watched is None or watched[0] != seq or beat != watched[1]:
            self._watch = (seq, beat, now + 3 * float(info.get("poll") or DEFAULT_POLL) + 5)
            return "unknown" if watched is None or watched[0] != seq else "alive"
        return "gone" if now >= watched[2] else "unknown"

    def attempt(self, takeover: bool = False) -> Optional[float]:
        """One look at becoming the writer: None once this is the writer, else the seconds
        until the next look. ``takeover`` (supersede): claim first, then look until the
        previous writer has noticed and stopped; otherwise refused while it is alive."""
        if self.seq is None:
            claims, exited = self.entries()
            prev = claims[-1] if claims else None
            if prev is not None and not takeover:
                holder = self.holder(prev, exited)
                if holder == "alive":
                    raise self._running(prev)
                if holder == "unknown":
                    return LOOK
            self._create((prev or 0) + 1)
            self._prev = prev if takeover else None
        if self._prev is None:
            return None
        # the previous writer sees our higher claim at its next poll and exits; on another
        # host, a heartbeat that stands still for three polls also ends the wait
        if self.holder(self._prev, self.entries()[1]) != "gone":
            return LOOK
        self._prev = None
        return None

    def _running(self, prev: int) -> DispatchError:
        info = self._info(prev)
        return DispatchError(
            f"a supervisor is already running for {self.root} "
            f"(claim {prev:06d}: host {info.get('host', '?')}, pid {info.get('pid', '?')}, "
            f"{info.get('purpose', '?')}); stop it first (`dispatch-slurm stop {self.root}`), "
            "or use `dispatch-slurm supersede`")

    def _create(self, seq: int) -> None:
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "poll": self.poll,
                           "purpose": self.purpose, "t": time.time()}).encode()
        if not self.store.create(CLAIMS, f"{seq:06d}", body, mode=0o644):
            raise DispatchError(f"another supervisor is claiming {self.root} right now "
                                f"(claim {seq:06d} exists); try again")
        self.seq = seq

    def mine(self) -> bool:
        claims, _ = self.entries()
        return self.seq is not None and bool(claims) and claims[-1] == self.seq

    def heartbeat(self) -> None:
        if self.seq is not None:
            try:
                self.store.touch(CLAIMS, f"{self.seq:06d}")
            except (OSError, DispatchError):
                pass  # a missed heartbeat only makes a successor wait longer

    def exit(self) -> None:
        """Say this claimant stopped, so a successor need not wait for a stale heartbeat."""
        if self.seq is None:
            return
        try:
            self.store.create(CLAIMS, f"{self.seq:06d}.exited", mode=0o644)
        except (OSError, DispatchError):
            pass  # already said, or the root is gone: a successor falls back to the heartbeat
        self.seq = None
