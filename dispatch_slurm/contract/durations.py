"""Durations as people write them: one grammar for every option that takes one (``--poll``,
``--grace``, ``--hold-for``, ``--timeout``...), and the one way they are printed back.

A duration is a number of seconds, or a number with a unit: ``90``, ``90s``, ``1.5m``,
``2h``, ``1d``. A bare number is seconds, as every option read it before, so no spelling an
earlier release took changes meaning. What Python's float() also read there (``1e3``,
``+5``, ``1_000``) is no part of the grammar; it is still read, as seconds, and said to be
an old spelling (``legacy``), so a script that wrote it keeps working."""

import math
import re
from typing import NamedTuple

from ..errors import DispatchError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
EXAMPLES = "90, 90s, 1.5m, 2h, 1d"
_GRAMMAR = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([smhd]?)\s*")


class Duration(NamedTuple):
    seconds: float
    legacy: bool  # read as an earlier release read it, outside the grammar


def parse_duration(text: str) -> Duration:
    """``text`` in seconds; DispatchError naming it when it is no duration (or no finite one)."""
    m = _GRAMMAR.fullmatch(text)
    if m:
        return Duration(float(m[1]) * UNITS[m[2] or "s"], False)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise DispatchError(f"{text.strip()!r} is not a duration: seconds, or a number with a unit "
                            f"(s, m, h, d), e.g. {EXAMPLES}")
    return Duration(seconds, True)


def fmt_duration(seconds: float) -> str:
    """``seconds`` as the grammar writes it: the largest unit it is a whole number of (days
    from 3 days on), else seconds; parse_duration reads it back to the same value."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0 and not (unit == "d" and seconds < 3 * 86400):
            return f"{int(seconds // n)}{unit}"
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"
