"""``<root>/record.jsonl``: the supervisor's facts, one JSON object per line.

Every fact type the supervisor writes is declared in ``FACTS`` with the fields a
reader relies on and their types; a line that is not such a fact is an error naming
the file, line and field (a record edited by hand, or a bug), never a traceback and
never skipped: the state is a replay of every fact."""

from __future__ import annotations

import json
import os
import time
from typing import Callable

from .. import store
from ..contract.layout import RECORD
from ..errors import DispatchError
from ..slurm.cessation.executions import executions

SCHEMA = 1
_NUM = (int, float)


class ListOf:
    """A field that is a list of ``kind`` (node names, sbatch arguments)."""

    def __init__(self, kind: type):
        self.kind = kind

    def holds(self, value) -> bool:
        return isinstance(value, list) and all(isinstance(x, self.kind) for x in value)


def _is(value, want) -> bool:
    if isinstance(want, ListOf):
        return want.holds(value)
    return isinstance(value, want) and (want is bool or not isinstance(value, bool))
#: fact type -> {field: type(s)}: what a replay may rely on (a fact may carry more)
FACTS: dict[str, dict[str, type | tuple[type, ...] | ListOf]] = {
    "supervisor": {"host": str, "pid": int},
    "job": {"g": int, "resubmit": int, "shared": bool, "via": str, "hold_for": _NUM,
            "cessation_interval": _NUM, "cessation_cmd": str, "args": ListOf(str)},
    "intent": {"g": int, "n": int, "tag": str},
    "submit_failed": {"g": int, "error": str},
    "intent_lost": {"g": int, "n": int},
    "submitted": {"g": int, "n": int, "job": int},
    "started": {"job": int, "r": int, "nodes": ListOf(str)},
    "ended": {"job": int, "r": int, "state": str},
    "rule": {"rule": str},
    "hold": {"hold": int, "replaces": str, "job": int, "r": int, "until": _NUM, "interval": _NUM,
             "cessation_cmd": str},
    "cessation": {"hold": int, "answer": str},
    "release": {"hold": int, "by": str},
    "hold_expired": {"hold": int},
    "superseded": {"from_g": int, "to_g": int},
    "stop": {"g": int, "by": str},
    "finished": {"outcome": str},
    "note": {"text": str},
    "launch_released": {"job": int, "n": int},
    "torn_tail_dropped": {"bytes": str},
    "gc": {"removed": int, "freed": int},
}
_COMMON = {"type": str, "t": _NUM}


def check_fact(fact, where: str) -> dict:
    """The fact itself, or DispatchError naming ``where`` and what is wrong with it."""
    if not isinstance(fact, dict):
        raise DispatchError(f"{where}: not a record fact (a JSON object), got {type(fact).__name__}")
    kind = fact.get("type")
    if kind not in FACTS:
        raise DispatchError(f"{where}: unknown fact type {kind!r} (one of {', '.join(sorted(FACTS))})")
    for name, want in {**_COMMON, **FACTS[kind]}.items():
        value = fact.get(name)
        if value is None or not _is(value, want):
            got = "missing" if name not in fact else f"{type(value).__name__} {value!r}"[:80]
            raise DispatchError(f"{where}: {kind} fact field {name!r} is {got}; the record was edited or "
                                "written by another version")
    return fact


class Record:
    """The record of one root. Appends are one write() each, fsynced before the caller
    acts on the fact (a decision the record does not hold would be taken again,
    differently, after a crash). A crash mid-write leaves a line without its newline:
    readers ignore such a tail, and the next writer cuts it off (it was never
    acknowledged) and records that it did."""

    def __init__(self, root: store.Root, clock: Callable[[], float] = time.time):
        self.store = store.at(root)  # the supervisor's own, when it passes it
        self.root = self.store.root
        self.path = os.path.join(self.root, RECORD)
        self._clock = clock
        self._seq = 0
        self._writer = False

    def _raw(self) -> bytes:
        """The record as it is (b"" on a store that cannot hold one: the supervisor refuses it)."""
        return self.store.read_all(RECORD)

    def read(self) -> list[dict]:
        """Every complete fact, in order (a torn last line is not a fact)."""
        return self._parse(self._raw())[0]

    def _parse(self, data: bytes) -> tuple[list[dict], bytes]:
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        facts = []
        for no, line in enumerate(lines, 1):
            try:
                fact = json.loads(line)
            except ValueError as e:
                raise DispatchError(f"{self.path}:{no}: not a record fact ({e}): {line[:120]!r}") from None
            facts.append(check_fact(fact, f"{self.path}:{no}"))
        return facts, tail

    def open_for_append(self) -> list[dict]:
        """Become the writer: cut a torn tail, return the facts so far."""
        data = self._raw()
        facts, tail = self._parse(data)
        self._seq, self._writer = len(facts), True
        if tail:
            self.store.truncate(RECORD, len(data) - len(tail))
            self.append({"type": "torn_tail_dropped", "bytes": tail.decode("utf-8", "replace")})
            facts = self.read()
        return facts

    def append(self, fact: dict) -> dict:
        if not self._writer:
            raise DispatchError("record not opened for appending (a bug)")
        fact = check_fact({"v": SCHEMA, "seq": self._seq + 1, "t": round(self._clock(), 3), **fact},
                          f"new fact for {self.path} (a bug)")
        self.store.append(RECORD, (json.dumps(fact, separators=(",", ":")) + "\n").encode())
        self._seq += 1
        return fact


def execution(root: store.Root, job_id: int, restart: int) -> dict:
    """What the record says about execution (job, R), and the cluster; what the
    cessation signal needs when asked by hand."""
    facts = Record(root).read()
    info = executions(facts).get((job_id, restart), {})
    for f in facts:
        if f["type"] == "supervisor" and f.get("cluster"):
            info["cluster"] = f["cluster"]
    return info
