"""The site's settings, one small file shared by every integration path.

    /etc/dispatch-slurm/site.conf   (or $DISPATCH_SITE_CONF)

        # comments and blank lines are ignored
        grace = 60                 # site default grace, seconds
        grace.<account> = 300      # per-project (Slurm account) default
        exec_mode = 0700           # mode of exec/<attempt>/ (e.g. 0750 for a group)
        view = out                 # the SPANK plugin's view folder below every job's root
        dispatch_slurm = /usr/bin/dispatch-slurm   # the command the view runs (default: PATH)

The Prolog, the TaskProlog, `dispatch-slurm env` and the SPANK plugin (its
`conf=` argument; spank_env/siteconf.c) read this same file, so all three ways in
compute identical values. Both parsers implement one language, checked by
tests/vectors/siteconf.json, on bytes whatever their encoding:

- lines end at LF; one CR right before it (or at the end of the file) is dropped;
- `#` starts a comment wherever it is, up to the end of the line (any bytes);
- spaces and tabs around a line and around `=` are ignored; empty lines are skipped;
- every other line is `KEY = VALUE`, KEY one of `grace`, `grace.<account>` (account:
  `[A-Za-z0-9_.-]+`) and `exec_mode`, whose VALUE is digits, or `view` and `dispatch_slurm`,
  whose VALUE is a path of `[A-Za-z0-9._/+-]`; any other byte (non-ASCII, NUL, lone CR) is an error;
- each setting may appear once; grace values above GRACE_CAP are read as GRACE_CAP;
  exec_mode is 0700, 0710 or 0750 (leading zeros ignored);
- view is a folder below every job's root (relative, canonical, not one of the root's own
  folders); dispatch_slurm an absolute path;
- no limit on line length or on the accounts; the file is at most SIZE_MAX bytes.

A malformed line is an error naming the file and line: a silently ignored setting
would make the paths disagree. The plugin does not fail on it (that would fail every
srun on the site): it refuses only the jobs that use --dispatch-* options.

This module parses and shows; slurm/sitefile.py reads the file (contract/ does no I/O)."""

import re
from dataclasses import dataclass, field

from ..errors import DispatchError
from .layout import VIEW_REFUSED

DEFAULT_PATH = "/etc/dispatch-slurm/site.conf"
GRACE_DEFAULT = 60
GRACE_CAP = 300  # a stuck checkpoint must not pin a node indefinitely
SIZE_MAX = 1 << 20  # the one fixed limit, DSP_SITE_MAX in C: slurmstepd reads the file per step
_LINE = re.compile(rb"([A-Za-z0-9_.-]+)[ \t]*=[ \t]*([A-Za-z0-9._/+-]+)")
_EXPECTED = "(expected grace = S, grace.<account> = S, exec_mode = 0NNN, view = DIR or dispatch_slurm = PATH)"
_PATHS = (b"view", b"dispatch_slurm")
_SHOW_MAX = 60


class SiteConfError(DispatchError):
    pass


@dataclass(frozen=True)
class Site:
    grace: int = GRACE_DEFAULT
    account_grace: dict[str, int] = field(default_factory=dict)
    exec_mode: int = 0o700
    view: str | None = None  # every job's view folder below its root (the SPANK plugin's)
    dispatch_slurm: str | None = None  # the command the plugin runs for the view; None: on the job's PATH

    def default_grace(self, account: str | None) -> int:
        """Per-project default > site default, capped at GRACE_CAP."""
        return min(self.account_grace.get(account or "", self.grace), GRACE_CAP)


def _shown(b: bytes) -> str:
    """User bytes quoted in a message, as siteconf.c's shown(): at most _SHOW_MAX bytes,
    printable ASCII as is, tab as \\t, any other byte as \\xNN, "..." when cut."""
    out = "".join(chr(c) if 0x20 <= c < 0x7F else "\\t" if c == 9 else f"\\x{c:02x}" for c in b[:_SHOW_MAX])
    return out + "..." if len(b) > _SHOW_MAX else out


def _seconds(digits: bytes) -> int:
    """Any number of digits, capped (int() refuses strings over 4300 digits)."""
    significant = digits.lstrip(b"0")
    return GRACE_CAP if len(significant) > 3 else min(int(significant or b"0"), GRACE_CAP)


def parse(text: str | bytes, path: str = "<site.conf>") -> Site:
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    if len(data) > SIZE_MAX:
        raise SiteConfError(f"site config {path} is larger than {SIZE_MAX} bytes")
    grace, accounts, mode = GRACE_DEFAULT, {}, 0o700
    paths: dict[bytes, str] = {}
    first: dict[bytes, int] = {}  # key -> the line that set it
    for no, raw in enumerate(data.split(b"\n"), 1):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        line = line.split(b"#", 1)[0].strip(b" \t")
        if not line:
            continue
        m = _LINE.fullmatch(line)
        key = m[1] if m else b""
        number = key in (b"grace", b"exec_mode") or (key.startswith(b"grace.") and len(key) > 6)
        if m is None or not (key in _PATHS or number and m[2].isdigit()):
            raise SiteConfError(f"{path}:{no}: cannot parse '{_shown(line)}' {_EXPECTED}")
        if key in first:
            raise SiteConfError(f"{path}:{no}: {_shown(key)} is already set on line {first[key]} "
                                "(each setting may appear only once)")
        first[key] = no
        value = m[2]
        if key in _PATHS:
            paths[key] = _path_setting(key, value, f"{path}:{no}")
        elif key == b"exec_mode":
            if value.lstrip(b"0") not in (b"700", b"710", b"750"):
                raise SiteConfError(f"{path}:{no}: exec_mode {_shown(value)} must be 0700, 0710 or 0750 "
                                    "(owner rwx; group at most r-x; never world)")
            mode = int(value.lstrip(b"0"), 8)
        elif key == b"grace":
            grace = _seconds(value)
        else:
            accounts[key[len(b"grace."):].decode("ascii")] = _seconds(value)
    return Site(grace, accounts, mode, paths.get(b"view"), paths.get(b"dispatch_slurm"))


def _path_setting(key: bytes, value: bytes, where: str) -> str:
    """view: a canonical relative folder, none of the root's own; dispatch_slurm: absolute."""
    text = value.decode("ascii")
    if key == b"dispatch_slurm":
        if not text.startswith("/"):
            raise SiteConfError(f"{where}: dispatch_slurm {_shown(value)} must be an absolute path "
                                "(e.g. /usr/bin/dispatch-slurm)")
        return text
    parts = text.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] in VIEW_REFUSED:
        raise SiteConfError(f"{where}: view {_shown(value)} must name a folder inside every job's root: relative "
                            "(e.g. out), without empty, '.' or '..' components, and none of the root's own "
                            f"({', '.join(sorted(VIEW_REFUSED))})")
    return text


def show(path: str, site: Site | None) -> str:
    """The settings as `dispatch-slurm check-site` prints them; ``site`` None: the file
    at ``path`` is not there (built-in defaults). slurm/sitefile.py reads the file."""
    head = f"{path}: not present, built-in defaults" if site is None else f"{path}: OK"
    site = site or Site()
    lines = [head, f"grace = {site.grace}  (site default, seconds; values above {GRACE_CAP} read as {GRACE_CAP})"]
    lines += [f"grace.{a} = {g}" for a, g in site.account_grace.items()]
    lines.append(f"exec_mode = {site.exec_mode:04o}")
    if site.view:
        lines.append(f"view = {site.view}  (every job's view folder below its root, unless --dispatch-view)")
    if site.dispatch_slurm:
        lines.append(f"dispatch_slurm = {site.dispatch_slurm}")
    return "\n".join(lines) + "\n"
