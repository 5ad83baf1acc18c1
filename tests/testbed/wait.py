"""Bounded polling of real state: the one way the test bed, the trials and the tests wait.

A sleep is never the synchronisation: the probe reads the real thing (Slurm, a file,
a process) and the deadline turns a hang into an error naming what never happened."""

import time
from typing import Callable, Optional, TypeVar

from dispatch_slurm.errors import DispatchError

T = TypeVar("T")


class WaitTimeout(DispatchError, TimeoutError):
    """A bounded wait for real state ran out; the message names what never happened."""


def until(probe: Callable[[], Optional[T]], *, timeout: float, what: str, every: float = 0.25,
          retry: tuple[type[BaseException], ...] = ()) -> T:
    """Call `probe` until it returns a truthy value and return that value.

    Exceptions of the `retry` types count as "not yet" (a busy controller); the
    last one is named if the deadline passes."""
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    while True:
        try:
            got = probe()
            if got:
                return got
            last = None
        except retry as e:
            last = e
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"waited {timeout:g} s for {what}" + (f"; last error: {last}" if last else ""))
        time.sleep(every)
