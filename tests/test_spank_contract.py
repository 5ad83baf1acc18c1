"""The SPANK plugin's contract code (spank_env/contract.c, siteconf.c) against the shared
vectors: the C side must give byte-identical values to the Python side for every case,
and both site.conf parsers must read every tests/vectors/siteconf.json case alike."""

import base64
import re
import shutil
import subprocess
import tomllib

import pytest

from dispatch_slurm import view
from dispatch_slurm.contract import layout, names, siteconf
from dispatch_slurm.errors import EnvError
from dispatch_slurm.slurm import sitefile
from support import REPO, build_spank, cli, vectors

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="no C compiler or make")


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """Build test_contract from the sources into a temp dir and run it as a server."""
    out = build_spank("test_contract", tmp_path_factory.mktemp("spank"))
    proc = subprocess.Popen([str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(*fields, multiline=False):
        proc.stdin.write("\t".join(map(str, fields)) + "\n")
        proc.stdin.flush()
        if not multiline:
            return proc.stdout.readline().rstrip("\n")
        lines = []
        while (line := proc.stdout.readline().rstrip("\n")) != "end":
            lines.append(line)
        return lines

    yield ask
    proc.stdin.close()
    proc.wait(10)


def test_epochs(contract):
    v = vectors("epochs.json")
    for case in v["valid"]:
        assert contract("epoch", case["g"], case["n"], case["r"]) == str(case["epoch"])
    for case in v["invalid"]:
        got = contract("epoch", case["g"], case["n"], case["r"])
        assert got.startswith("error: ") and case["part"] in got, (case, got)


def test_names(contract):
    for case in vectors("names.json")["valid"]:
        assert contract("name", case["epoch"], case["step"], case["path"]) == case["name"]


def test_tokens(contract):
    v = vectors("tokens.json")
    for case in v["valid"]:
        assert contract("token", case["cluster"], case["job_id"], case["epoch"]) == case["token"]
    for case in v["invalid"][:4]:  # the last one is an invalid epoch, which C never formats
        assert contract("token", case["cluster"], case["job_id"], case["epoch"]).startswith("error: ")


def _env_request(case):
    fields = [f"{k}={v}" for k, v in case["env"].items()]
    if site := case.get("site"):
        fields.append(f"site.grace={site['grace']}")
        fields += [f"site.account.{a}={g}" for a, g in site["account_grace"].items()]
    return fields


@pytest.mark.parametrize("case", vectors("env.json")["valid"], ids=lambda c: c["name"])
def test_env(contract, case):
    lines = contract("env", *_env_request(case), multiline=True)
    assert dict(line.split("=", 1) for line in lines) == case["expect"]
    assert [line.split("=", 1)[0] for line in lines] == list(case["expect"])  # same order


@pytest.mark.parametrize("case", vectors("env.json")["errors"], ids=lambda c: c["error"])
def test_env_errors(contract, case):
    lines = contract("env", *_env_request(case), multiline=True)
    assert len(lines) == 1 and lines[0].startswith("error: ") and case["error"] in lines[0], lines


# ---- site.conf: one language, two parsers ------------------------------------------

SITECONF = vectors("siteconf.json")


def _bytes(segments) -> bytes:
    return b"".join((base64.b64decode(s["base64"]) if "base64" in s else s["text"].encode())
                    * s.get("times", 1) for s in segments)


def _python(path: str) -> dict | str:
    """sitefile.load's answer in the vectors' terms: the parsed result or the message."""
    try:
        site = sitefile.load(path)
    except siteconf.SiteConfError as e:
        return str(e)
    got = {"grace": site.grace, "exec_mode": f"{site.exec_mode:04o}", "accounts": site.account_grace}
    return {**got, **{k: v for k, v in (("view", site.view), ("dispatch_slurm", site.dispatch_slurm)) if v}}


def _c(contract, path: str, must_exist: bool = True) -> dict | str:
    """dsp_site_load's answer (what the plugin reads), in the same terms."""
    lines = contract("site", path, int(must_exist), multiline=True)
    if lines[0].startswith("error: "):
        assert len(lines) == 1, lines
        return lines[0][len("error: "):]
    got = {"accounts": {}}
    for line in lines:
        key, value = line.split("=", 1)
        if key == "account":
            name, grace = value.rsplit("=", 1)
            got["accounts"][name] = int(grace)
        elif key in ("view", "dispatch_slurm"):
            got[key] = value
        else:
            got[key] = int(value) if key == "grace" else value
    return got


@pytest.mark.parametrize("impl", ["python", "c"])
@pytest.mark.parametrize("case", SITECONF["valid"] + SITECONF["errors"], ids=lambda c: c["name"])
def test_siteconf_vectors(contract, tmp_path, case, impl):
    path = tmp_path / "site.conf"
    path.write_bytes(_bytes(case["input"]))
    got = _python(str(path)) if impl == "python" else _c(contract, str(path))
    want = case["expect"] if "expect" in case else case["error"].replace("{path}", str(path))
    assert got == want


def test_siteconf_files_both_parsers(contract, tmp_path, monkeypatch):
    """What is not in a file's bytes: a missing file (an error only when named), a directory."""
    monkeypatch.delenv("DISPATCH_SITE_CONF", raising=False)
    missing, directory = str(tmp_path / "nope.conf"), str(tmp_path)
    monkeypatch.setattr(siteconf, "DEFAULT_PATH", missing)
    defaults = {"grace": 60, "exec_mode": "0700", "accounts": {}}
    assert _c(contract, missing, must_exist=False) == defaults
    site = sitefile.load()
    assert (site.grace, site.exec_mode, site.account_grace) == (60, 0o700, {})
    for impl in (_python, _c):
        args = (contract,) if impl is _c else ()
        assert impl(*args, missing) == f"site config {missing} does not exist"
        assert impl(*args, directory) == f"site config {directory}: Is a directory"


def test_plugin_version_is_the_package_version():
    """The plugin logs and embeds spank_env/Makefile's VERSION: the release it ships with."""
    makefile = (REPO / "spank_env" / "Makefile").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"\nVERSION = {project['version']}\n" in makefile


def test_check_site_report(tmp_path, monkeypatch):
    """The report `dispatch-slurm check-site` prints: the settings as read, or the error."""
    monkeypatch.delenv("DISPATCH_SITE_CONF", raising=False)
    conf = tmp_path / "site.conf"
    conf.write_text("grace = 1000\ngrace.ml = 90\r\nexec_mode = 750  # group\n")
    assert sitefile.check(str(conf)).splitlines() == [
        f"{conf}: OK", "grace = 300  (site default, seconds; values above 300 read as 300)", "grace.ml = 90",
        "exec_mode = 0750"]
    monkeypatch.setattr(siteconf, "DEFAULT_PATH", str(tmp_path / "absent.conf"))
    assert sitefile.check().splitlines()[:2] == [f"{tmp_path / 'absent.conf'}: not present, built-in defaults",
                                                  "grace = 60  (site default, seconds; values above 300 read as 300)"]
    conf.write_text("grace = 1\ngrace = 2\n")
    with pytest.raises(siteconf.SiteConfError, match=re.escape(f"{conf}:2: grace is already set on line 1")):
        sitefile.check(str(conf))
    monkeypatch.setenv("DISPATCH_SITE_CONF", str(conf))  # a user's variable: not what the hooks read
    assert sitefile.check().startswith(f"{tmp_path / 'absent.conf'}: not present")
    bad = cli("check-site", conf)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and f"{conf}:2: grace is already set" in bad.stderr
    assert cli("check-site", conf.with_name("absent.conf")).returncode == 2


# ---- the view (--dispatch-view): one rule in Python and C --------------------------------

VIEW = vectors("view.json")


def _view_c(contract, root: str, view: str) -> str:
    got = contract("view", root.encode().hex(), view.encode().hex())
    return got[len("error: "):] if got.startswith("error: ") else got


@pytest.mark.parametrize("impl", ["python", "c"])
def test_view_vectors(contract, impl):
    def answer(root, view):
        if impl == "c":
            return _view_c(contract, root, view)
        try:
            return names.view_relpath(names.normalize_root(root), view)
        except EnvError as e:
            return str(e)
    for case in VIEW["valid"]:
        assert answer(case["root"], case["view"]) == case["rel"], case
    for case in VIEW["errors"]:
        assert answer(case["root"], case["view"]) == case["error"], case


def test_the_roots_own_folders_are_one_list_in_python_c_and_the_vectors(contract):
    own = sorted(layout.VIEW_REFUSED)
    assert VIEW["own"] == own and contract("protocol") == ", ".join(own)
    assert {e["view"].split("/")[3] for e in VIEW["errors"] if "dispatch-slurm's own" in e["error"]} == set(own)


@pytest.mark.parametrize("root, attempt", [("/ckpt/run1", "linux.42.1000000"), ("/scratch/me/a\tb/é", "c.7.2000001"),
                                           ("/" + "x" * 4000, "a.1.1")])
def test_the_publishers_claim_names_agree_in_python_and_c(contract, root, attempt):
    """The plugin asks for the batch step's publisher by the name view.py binds: one hash, two
    implementations (a root may hold any byte but NUL, and be long)."""
    for batch in (False, True):
        want = view.claim_name(root, attempt, batch)
        assert contract("view-claim", root.encode().hex(), attempt, str(int(batch))) == want
        assert len(want) < 107, "an abstract socket's name fits sun_path"
    assert view.claim_name(root, attempt) != view.claim_name(root + "x", attempt) != view.claim_name(root, attempt + "1")


def _execution(contract, **extra):
    base = {"SLURM_JOB_ID": "42", "SLURM_CLUSTER_NAME": "linux", "DISPATCH_CHECKPOINT": "/ckpt/run1",
            "DISPATCH_SUBMISSION": "1"}
    lines = contract("env", *(f"{k}={v}" for k, v in {**base, **extra}.items()), multiline=True)
    return lines[0] if lines[0].startswith("error: ") else dict(line.split("=", 1) for line in lines)


def test_which_view_an_execution_has(contract):
    """--dispatch-view, else site.conf's view; `none` turns the site's off; a shared checkpoint
    has none and refuses one asked for; an array task's view is under its own root."""
    assert "DISPATCH_VIEW" not in _execution(contract)
    assert _execution(contract, DISPATCH_VIEW="/ckpt/run1/out")["DISPATCH_VIEW"] == "/ckpt/run1/out"
    assert _execution(contract, **{"site.view": "runs/out"})["DISPATCH_VIEW"] == "/ckpt/run1/runs/out"
    mine = _execution(contract, DISPATCH_VIEW="/ckpt/run1//mine/", **{"site.view": "out"})
    assert mine["DISPATCH_VIEW"] == "/ckpt/run1/mine"
    assert "DISPATCH_VIEW" not in _execution(contract, DISPATCH_VIEW="none", **{"site.view": "out"})
    assert "DISPATCH_VIEW" not in _execution(contract, DISPATCH_SHARED_CHECKPOINT="1", **{"site.view": "out"})
    assert _execution(contract, DISPATCH_SHARED_CHECKPOINT="1", DISPATCH_VIEW="/ckpt/run1/out") == (
        "error: DISPATCH_VIEW cannot be used with DISPATCH_SHARED_CHECKPOINT: a view gives every execution its "
        "own folder, which a shared checkpoint cannot have")
    array = _execution(contract, DISPATCH_CHECKPOINT="/ckpt/sweep/task-%a", SLURM_ARRAY_TASK_ID="3",
                       DISPATCH_VIEW="/ckpt/sweep/task-%a/out")
    assert (array["DISPATCH_CHECKPOINT"], array["DISPATCH_VIEW"]) == ("/ckpt/sweep/task-3", "/ckpt/sweep/task-3/out")
    assert _execution(contract, DISPATCH_VIEW="/ckpt/run1/pub").startswith("error: DISPATCH_VIEW '/ckpt/run1/pub' is in")


def test_check_site_shows_the_view_settings(tmp_path):
    conf = tmp_path / "site.conf"
    conf.write_text("view = out\ndispatch_slurm = /usr/bin/dispatch-slurm\n")
    assert sitefile.check(str(conf)).splitlines()[-2:] == [
        "view = out  (every job's view folder below its root, unless --dispatch-view)",
        "dispatch_slurm = /usr/bin/dispatch-slurm"]
