"""The site's settings, one small file shared by every integration path.

    /etc/dispatch-slurm/site.conf   (or $DISPATCH_SITE_CONF)

        # comments and blank lines are ignored
        grace = 60                 # site default grace, seconds
        grace.<account> = 300      # per-project (Slurm account) default
        exec_mode = 0700           # mode of exec/<attempt>/ (e.g. 0750 for a group)

The Prolog, the TaskProlog, `dispatch-slurm env` and the SPANK plugin (its
`conf=` argument) read this same file, so all three ways in compute identical
values. A malformed line is an error naming the file and line: a silently
ignored setting would make the paths disagree."""

import os
import re
from dataclasses import dataclass, field

from ..errors import DispatchError

DEFAULT_PATH = "/etc/dispatch-slurm/site.conf"
GRACE_DEFAULT = 60
GRACE_CAP = 300  # a stuck checkpoint must not pin a node indefinitely
_LINE = re.compile(r"(grace|grace\.[A-Za-z0-9_.-]+|exec_mode)\s*=\s*([0-9]+)")


class SiteConfError(DispatchError):
    pass


@dataclass(frozen=True)
class Site:
    grace: int = GRACE_DEFAULT
    account_grace: dict[str, int] = field(default_factory=dict)
    exec_mode: int = 0o700

    def default_grace(self, account: str | None) -> int:
        """Per-project default > site default, capped at GRACE_CAP."""
        return min(self.account_grace.get(account or "", self.grace), GRACE_CAP)


def load(path: str | None = None, *, env: bool = True) -> Site:
    """The site config at `path` (default: $DISPATCH_SITE_CONF if ``env``, else DEFAULT_PATH);
    a missing default file means built-in defaults, a missing explicit file is an error.
    The hooks pass ``env=False``: a job's environment must not choose the site's settings."""
    explicit = path or (os.environ.get("DISPATCH_SITE_CONF") if env else None)
    path = explicit or DEFAULT_PATH
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if explicit:
            raise SiteConfError(f"site config {path} does not exist") from None
        return Site()
    return parse(text, path)


def parse(text: str, path: str = "<site.conf>") -> Site:
    grace, accounts, mode = GRACE_DEFAULT, {}, 0o700
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise SiteConfError(f"{path}:{no}: cannot parse {raw.strip()!r} "
                                "(expected grace = S, grace.<account> = S or exec_mode = 0NNN)")
        key, value = m[1], m[2]
        if key == "exec_mode":
            if value.lstrip("0") not in ("700", "710", "750"):
                raise SiteConfError(f"{path}:{no}: exec_mode {value} must be 0700, 0710 or 0750 "
                                    "(owner rwx; group at most r-x; never world)")
            mode = int(value, 8)
        elif key == "grace":
            grace = int(value)
        else:
            accounts[key[len("grace."):]] = int(value)
    return Site(grace, accounts, mode)
