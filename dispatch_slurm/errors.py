"""Every error the toolkit raises on purpose derives from DispatchError, so the
CLI can print it as one line and exit 2 without a traceback."""


class DispatchError(Exception):
    """A refusal with a message that names what was wrong."""


class EpochError(DispatchError, ValueError):
    """An epoch or one of its parts is outside the contract's bounds."""


class BadName(DispatchError, ValueError):
    """A publication, submission or token name that does not parse.

    Never skipped by readers: a skipped entry could be the latest one."""

    def __init__(self, name: str, reason: str, where: str | None = None):
        self.name, self.reason, self.where = name, reason, where
        place = f" in {where}" if where else ""
        super().__init__(f"bad entry {name!r}{place}: {reason}")


class BadPath(DispatchError, ValueError):
    """A path refused by the contract (absolute, '..', outside the root...)."""


class TornSave(BadPath):
    """A save holding a file that is not whole (cut short: still being written, or torn by
    a crash): never published, since no resume could load it. ``detail`` names the file
    and what is missing."""

    def __init__(self, save, detail: str):
        self.detail = detail
        super().__init__(f"refusing to publish {save}: {detail}; a save is published only once every file of it "
                         "is whole")


class StoreError(DispatchError):
    """The checkpoint root is unusable (missing, not a directory, I/O error)."""


class EnvError(DispatchError, ValueError):
    """The job environment cannot give a valid execution (missing or bad input)."""
