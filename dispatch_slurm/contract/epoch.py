"""DISPATCH_EPOCH = G*10^12 + N*10^6 + R.

The epoch only increases across the executions of a job: a resubmission raises N,
a requeue raises R, a supersession raises G. An old run's late publication carries
its own lower epoch and can never outrank the replacement's. Parts out of range are
refused, never clamped or wrapped: a wrapped R would silently reorder lineages."""

from functools import lru_cache
from typing import NamedTuple

from ..errors import EpochError

G_MAX = 99_999_999  # so the epoch fits the 20 digits of a publication name
N_MIN, N_MAX = 1, 999_999
R_MIN, R_MAX = 0, 999_999
EPOCH_MAX = G_MAX * 10**12 + N_MAX * 10**6 + R_MAX


class Epoch(NamedTuple):
    generation: int
    submission: int
    restart: int

    @property
    def value(self) -> int:
        return compose(*self)


def _int(part: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EpochError(f"{part} must be an integer, got {value!r}")
    return value


def _check(part: str, value, lo: int, hi: int) -> int:
    value = _int(part, value)
    if not lo <= value <= hi:
        raise EpochError(f"{part} {value} is out of range {lo}..{hi:,}")
    return value


def compose(generation: int, submission: int, restart: int) -> int:
    """The epoch of (G, N, R); refuses any part outside its bounds."""
    g = _check("generation G", generation, 0, G_MAX)
    n = _check("submission N", submission, N_MIN, N_MAX)
    r = _check("restart R", restart, R_MIN, R_MAX)
    return g * 10**12 + n * 10**6 + r


def decompose(epoch: int) -> Epoch:
    """(G, N, R) of an epoch; refuses epochs no valid (G, N, R) composes."""
    if type(epoch) is not int:  # a bool, a str...: refused with its type named, never cached
        _int("epoch", epoch)
    return _decompose(epoch)


@lru_cache(maxsize=256)
def _decompose(epoch: int) -> Epoch:
    """A process asks about the same few epochs on every publication and name it reads."""
    epoch = _check("epoch", epoch, 0, EPOCH_MAX)
    g, rest = divmod(epoch, 10**12)
    n, r = divmod(rest, 10**6)
    if n < N_MIN:
        raise EpochError(f"epoch {epoch} has submission N=0; N must be {N_MIN}..{N_MAX:,}")
    return Epoch(g, n, r)


def parse_part(part: str, text: str, lo: int, hi: int) -> int:
    """Parse a decimal part from text (env var, CLI, SPANK option): digits only, no
    sign, no spaces, then bounds. The C plugin applies the same rule."""
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > 20:
        raise EpochError(f"{part} must be a decimal integer {lo}..{hi:,}, got {text!r}")
    return _check(part, int(text), lo, hi)
