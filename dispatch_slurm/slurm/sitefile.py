"""Reading the site's settings file: the I/O half of contract/siteconf.py, which parses
and shows the bytes with no I/O (contract/ reads nothing). The hooks and the CLI
(`env`, `submit`, `check-site`) read the file here, by one rule of which file."""

from ..contract import siteconf
from ..contract.env import site_conf
from ..contract.siteconf import SIZE_MAX, Site, SiteConfError


def _where(path: str | None, env: bool = True) -> tuple[str, bool]:
    """The file to read and whether it must exist (named by the caller or the env)."""
    explicit = path or (site_conf() if env else None)
    return explicit or siteconf.DEFAULT_PATH, bool(explicit)


def _read(path: str, must_exist: bool) -> bytes | None:
    """The file's bytes (one more than SIZE_MAX at most), or None for a missing default file."""
    try:
        with open(path, "rb") as f:
            return f.read(SIZE_MAX + 1)
    except FileNotFoundError:
        if must_exist:
            raise SiteConfError(f"site config {path} does not exist") from None
        return None
    except OSError as e:
        raise SiteConfError(f"site config {path}: {e.strerror}") from None


def load(path: str | None = None, *, env: bool = True) -> Site:
    """The site config at `path` (default: $DISPATCH_SITE_CONF if ``env``, else DEFAULT_PATH);
    a missing default file means built-in defaults, a missing explicit file is an error.
    The hooks pass ``env=False``: a job's environment must not choose the site's settings."""
    path, must_exist = _where(path, env)
    data = _read(path, must_exist)
    return Site() if data is None else siteconf.parse(data, path)


def check(path: str | None = None) -> str:
    """What `dispatch-slurm check-site [PATH]` prints: the settings exactly as the hooks
    (their --site-conf, else DEFAULT_PATH) and the SPANK plugin (its conf= argument,
    default DEFAULT_PATH) read them. A bad file raises SiteConfError naming file:line:
    the plugin then refuses every job that uses --dispatch-* options."""
    path, must_exist = _where(path, env=False)
    data = _read(path, must_exist)
    return siteconf.show(path, None if data is None else siteconf.parse(data, path))
