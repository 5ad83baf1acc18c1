"""The admin install. `make install` (DESTDIR, PREFIX) lays out exactly the files
the packages ship, at their modes; `make uninstall` removes every one of them, and refuses
(removing nothing) while plugstack.conf or a plugstack.conf.d/ file still loads the plugin;
the hook wrappers take the interpreter, site file and log from /etc/default/dispatch-slurm;
dispatch-slurm(1) is what the click commands say; the versions agree. Runs on a copy of
the tree (the plugin is built there, once, against the installed slurm/spank.h)."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

pytestmark = pytest.mark.skipif(not Path("/usr/include/slurm/spank.h").exists(),
                                reason="no slurm/spank.h: apt-get install libslurm-dev (tools/setup-host does)")
TREE = ["Makefile", "pyproject.toml", "README.md", "admin", "debian", "spank_env", "prolog", "epilog", "dispatch_slurm"]
PYDIR = "/usr/lib/python3/dist-packages"  # given, so the layout does not depend on this interpreter
# every file `make install` writes but the Python modules, and its mode (PREFIX=/usr/local)
LAYOUT = {
    "etc/default/dispatch-slurm": 0o644,
    "etc/dispatch-slurm/site.conf": 0o644,
    "usr/local/bin/dispatch-slurm": 0o755,
    "usr/local/lib/slurm/dispatch_env.so": 0o644,
    "usr/local/libexec/dispatch-slurm/prolog": 0o755,
    "usr/local/libexec/dispatch-slurm/taskprolog": 0o755,
    "usr/local/libexec/dispatch-slurm/epilog": 0o755,
    "usr/local/libexec/dispatch-slurm/unplug": 0o755,
    "usr/local/share/dispatch-slurm/plugstack.conf": 0o644,
    "usr/local/share/man/man1/dispatch-slurm.1": 0o644,
    "usr/local/share/man/man5/dispatch-slurm-site.conf.5": 0o644,
    "usr/local/share/man/man8/dispatch_env.8": 0o644,
    f"{PYDIR[1:]}/dispatch_slurm-0.1.0.dist-info/METADATA": 0o644,
    f"{PYDIR[1:]}/dispatch_slurm-0.1.0.dist-info/INSTALLER": 0o644,
    f"{PYDIR[1:]}/dispatch_slurm-0.1.0.dist-info/entry_points.txt": 0o644,
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of what the install reads, with the plugin built in it."""
    t = tmp_path_factory.mktemp("tree")
    for name in TREE:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, t / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o", "test_contract", "test_contexts"))
        else:
            shutil.copy(src, t / name)
    make(t, "-C", "spank_env", "WERROR=1")
    return t


def make(tree, *args, check=True):
    r = subprocess.run(["make", "-s", *args], cwd=tree, capture_output=True, text=True)
    assert not check or r.returncode == 0, f"make {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode)
            for p in sorted(root.rglob("*")) if not p.is_dir()}


def install(tree, dest, *extra):
    make(tree, "install", f"DESTDIR={dest}", f"PYTHONDIR={PYDIR}", "INSTALL_PYTHON=/usr/bin/python3", *extra)


def test_install_lays_out_the_packages_files_and_uninstall_removes_them(tree, tmp_path):
    dest = tmp_path / "dest"
    install(tree, dest)
    got = files(dest)
    modules = {f"{PYDIR[1:]}/{p.relative_to(tree)}": 0o644 for p in (tree / "dispatch_slurm").rglob("*.py")}
    typed = {f"{PYDIR[1:]}/dispatch_slurm/py.typed": 0o644}  # a user's mypy reads the package's annotations
    assert got == {**LAYOUT, **modules, **typed}
    assert len(modules) > 40, modules
    drop_in = (dest / "usr/local/share/dispatch-slurm/plugstack.conf").read_text()
    active = [line for line in drop_in.splitlines() if line and not line.startswith("#")]
    assert active == ["required /usr/local/lib/slurm/dispatch_env.so"]  # conf=: the default, /etc/dispatch-slurm
    # every key of the site file and of the defaults file is commented out: nothing set by the install
    for conf in ("etc/dispatch-slurm/site.conf", "etc/default/dispatch-slurm"):
        lines = [line for line in (dest / conf).read_text().splitlines() if line.strip()]
        assert lines and all(line.startswith("#") for line in lines), conf
    launcher = subprocess.run([sys.executable, dest / "usr/local/bin/dispatch-slurm", "--version"], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(dest / PYDIR[1:])})
    assert launcher.returncode == 0 and "0.1.0" in launcher.stdout, launcher

    make(tree, "uninstall", f"DESTDIR={dest}", f"PYTHONDIR={PYDIR}")
    assert files(dest) == {}


def test_uninstall_refuses_while_a_plugstack_file_loads_the_plugin(tree, tmp_path):
    dest = tmp_path / "dest"
    install(tree, dest)
    before = files(dest)
    (dest / "etc/slurm/plugstack.conf.d").mkdir(parents=True)
    loads = dest / "etc/slurm/plugstack.conf.d/dispatch-slurm.conf"
    shutil.copy(dest / "usr/local/share/dispatch-slurm/plugstack.conf", loads)
    (dest / "etc/slurm/plugstack.conf").write_text("include /etc/slurm/plugstack.conf.d/*\n")
    refused = make(tree, "uninstall", f"DESTDIR={dest}", f"PYTHONDIR={PYDIR}", check=False)
    assert refused.returncode != 0 and f"{loads} still loads dispatch_env.so" in refused.stderr, refused
    assert files(dest) == {**before, "etc/slurm/plugstack.conf": 0o644,
                           "etc/slurm/plugstack.conf.d/dispatch-slurm.conf": 0o644}
    # plugstack.conf itself is read too; a commented line is not a load
    loads.unlink()
    (dest / "etc/slurm/plugstack.conf").write_text("optional dispatch_env.so\n")
    refused = make(tree, "uninstall", f"DESTDIR={dest}", f"PYTHONDIR={PYDIR}", check=False)
    assert refused.returncode != 0 and "plugstack.conf still loads" in refused.stderr, refused
    (dest / "etc/slurm/plugstack.conf").write_text("# required /usr/local/lib/slurm/dispatch_env.so\n")
    # the documented enabling step, a symlink to the shipped line: uninstall removes it first
    os.symlink("/usr/local/share/dispatch-slurm/plugstack.conf", loads)
    r = make(tree, "uninstall", f"DESTDIR={dest}", f"PYTHONDIR={PYDIR}")
    assert f"removed {loads}" in r.stdout, r
    assert set(files(dest)) == {"etc/slurm/plugstack.conf"}


def test_the_admins_configuration_survives_install_and_uninstall(tree, tmp_path):
    dest = tmp_path / "dest"
    install(tree, dest)
    site = dest / "etc/dispatch-slurm/site.conf"
    site.write_text("grace = 120\n")
    install(tree, dest)  # a reinstall (an upgrade from source) keeps it
    assert site.read_text() == "grace = 120\n"
    r = make(tree, "uninstall", f"DESTDIR={dest}", f"PYTHONDIR={PYDIR}")
    assert "site.conf kept (changed by the admin)" in r.stdout
    assert set(files(dest)) == {"etc/dispatch-slurm/site.conf"}


def test_the_wrappers_read_the_defaults_file_not_the_jobs_environment(tree, tmp_path):
    """A source install elsewhere (PREFIX, SYSCONFDIR, another interpreter): the defaults file it
    writes names them, the wrappers read it, and a job's PYTHON/SITE_CONF/LOG change nothing."""
    etc, prefix, seen = tmp_path / "etc", tmp_path / "opt", tmp_path / "argv"
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" >{seen}\n')
    stub.chmod(0o755)
    make(tree, "install", f"PREFIX={prefix}", f"SYSCONFDIR={etc}", f"INSTALL_PYTHON={stub}", f"PYTHONDIR={prefix}/py")
    defaults = (etc / "default/dispatch-slurm").read_text()
    assert f"\nPYTHON={stub}\n" in defaults and f"\nSITE_CONF={etc}/dispatch-slurm/site.conf\n" in defaults
    drop_in = (prefix / "share/dispatch-slurm/plugstack.conf").read_text().splitlines()[-1]
    assert drop_in == f"required {prefix}/lib/slurm/dispatch_env.so conf={etc}/dispatch-slurm/site.conf"
    with open(etc / "default/dispatch-slurm", "a") as f:
        f.write(f"LOG={tmp_path}/hooks.log\n")
    job = {"PATH": os.environ["PATH"], "PYTHON": "/bin/false", "SITE_CONF": "/home/u/mine", "LOG": "/home/u/log",
           "DEFAULTS": "/home/u/defaults"}
    cases = {"prolog": ({"SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_checkpoint": "/r"}, ["prolog", "--site-conf"]),
             "taskprolog": ({"DISPATCH_CHECKPOINT": "/r"}, ["task-prolog", "--site-conf"]),
             "epilog": ({"SPANK__SLURM_SPANK_OPTION_dispatch_env_dispatch_checkpoint": "/r"}, ["epilog"])}
    for hook, (env, argv) in cases.items():
        seen.unlink(missing_ok=True)
        r = subprocess.run([prefix / "libexec/dispatch-slurm" / hook], env={**job, **env}, capture_output=True)
        assert r.returncode == 0, r
        want = [str(stub), "-m", "dispatch_slurm.slurm.hooks", *argv]
        if "--site-conf" in argv:
            want.append(f"{etc}/dispatch-slurm/site.conf")
        assert seen.read_text().splitlines() == [*want, "--log", f"{tmp_path}/hooks.log"], hook
        # a job without dispatch options: nothing started
        seen.unlink()
        assert subprocess.run([prefix / "libexec/dispatch-slurm" / hook], env=job).returncode == 0
        assert not seen.exists(), hook


def test_the_man_page_is_what_the_click_commands_say():
    """`make man` regenerates admin/man/dispatch-slurm.1: run it when a command changes."""
    out = subprocess.run([sys.executable, REPO / "admin/man/gen_cli_man.py"], capture_output=True, text=True, check=True)
    committed = (REPO / "admin/man/dispatch-slurm.1").read_text()
    assert out.stdout == committed, "admin/man/dispatch-slurm.1 is out of date: run `make man`"
    for cmd in ("submit", "env", "check-site", "latest", "gc", "run"):
        assert re.search(rf'^\.SS "{re.escape(cmd.replace("-", chr(92) + "-"))} ', committed, re.M), cmd


@pytest.mark.skipif(shutil.which("rpmbuild") is None, reason="no rpmbuild: apt-get install rpm (tools/setup-host does)")
def test_make_rpm_ships_the_same_files_at_rhels_paths(tree):
    """The spec installs through `make install`: the RPM holds what a source install does, at
    RHEL's paths, the two configuration files marked %config(noreplace), and erases through unplug."""
    make(tree, "rpm", "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
    rpm = next((tree / "dist").glob("dispatch-slurm-0.1.0-1.*.rpm"))
    listed = subprocess.run(["rpm", "-qlp", rpm], capture_output=True, text=True, check=True).stdout.split()
    site = next(p for p in listed if p.endswith("-packages/dispatch_slurm"))[:-len("/dispatch_slurm")]
    assert re.fullmatch(r"/usr/lib/python3\.\d+/site-packages", site), site
    others = {p for p in listed if not p.startswith(f"{site}/dispatch_slurm/")}
    assert others == {
        "/etc/dispatch-slurm", "/etc/dispatch-slurm/site.conf", "/etc/sysconfig/dispatch-slurm",
        "/usr/bin/dispatch-slurm", f"{site}/dispatch_slurm", f"{site}/dispatch_slurm-0.1.0.dist-info",
        *(f"{site}/dispatch_slurm-0.1.0.dist-info/{f}" for f in ("INSTALLER", "METADATA", "entry_points.txt")),
        "/usr/lib64/slurm/dispatch_env.so", "/usr/libexec/dispatch-slurm",
        *(f"/usr/libexec/dispatch-slurm/{h}" for h in ("prolog", "taskprolog", "epilog", "unplug")),
        "/usr/share/dispatch-slurm", "/usr/share/dispatch-slurm/plugstack.conf",
        "/usr/share/doc/dispatch-slurm-0.1.0", "/usr/share/doc/dispatch-slurm-0.1.0/README.md",
        "/usr/share/man/man1/dispatch-slurm.1", "/usr/share/man/man5/dispatch-slurm-site.conf.5",
        "/usr/share/man/man8/dispatch_env.8"}, sorted(others)
    modules = {p for p in listed if p.startswith(f"{site}/dispatch_slurm/") and p.endswith(".py")}
    assert {m[len(site) + 1:] for m in modules} == {str(p.relative_to(tree)) for p in (tree / "dispatch_slurm").rglob("*.py")}
    conf = subprocess.run(["rpm", "-qpc", rpm], capture_output=True, text=True, check=True).stdout.split()
    assert conf == ["/etc/dispatch-slurm/site.conf", "/etc/sysconfig/dispatch-slurm"]
    scripts = subprocess.run(["rpm", "-qp", "--scripts", rpm], capture_output=True, text=True, check=True).stdout
    assert "/usr/libexec/dispatch-slurm/unplug /etc/slurm/plugstack.conf /usr/share/dispatch-slurm/plugstack.conf" in scripts
    print("rpm -qlp:", *sorted(others), f"... and {len(modules)} modules", sep="\n  ")


def test_every_version_says_the_same():
    version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)[1]
    assert re.search(rf"^VERSION = {re.escape(version)}$", (REPO / "spank_env/Makefile").read_text(), re.M)
    assert (REPO / "debian/changelog").read_text().startswith(f"dispatch-slurm ({version}) ")
    spec = (REPO / "admin/dispatch-slurm.spec").read_text()
    assert f"%global pkg_version {version}}}" in spec and re.search(rf"^\* .* - {re.escape(version)}-1$", spec, re.M)
    for page in ("dispatch_env.8", "dispatch-slurm-site.conf.5", "dispatch-slurm.1"):
        assert f'"dispatch-slurm {version}"' in (REPO / "admin/man" / page).read_text().splitlines()[0], page


def test_make_deb_builds_with_debians_python3_whatever_python3_is_first_on_path(tree, tmp_path):
    """A venv's or conda's python3 first on PATH once failed `make deb` (pybuild and
    dh_python3 run the PATH's python3). The build runs with Debian's /usr/bin/python3 first
    (dpkg-buildpackage stood in for: it records the python3 it would run)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text("#!/bin/sh\necho 'not Debian python3' >&2\nexit 1\n")
    seen = tmp_path / "seen"
    (bin_ / "dpkg-buildpackage").write_text(
        f"#!/bin/sh\ncommand -v python3 >{seen}\narch=$(dpkg --print-architecture)\n"
        "for x in deb changes buildinfo; do touch ../dispatch-slurm_0.1.0_$arch.$x; done\n")
    for f in ("python3", "dpkg-buildpackage"):
        (bin_ / f).chmod(0o755)
    r = subprocess.run(["make", "-s", "deb", "LINTIAN=:", f"DPKG_BUILDPACKAGE={bin_}/dpkg-buildpackage"], cwd=tree,
                       capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert seen.read_text().strip() == "/usr/bin/python3"
    admin = " ".join((REPO / "docs" / "admin.md").read_text().split())
    assert "`make deb` builds with Debian's `/usr/bin/python3` whatever `python3` is first on PATH" in admin


ADMIN_DOCS = ["docs/admin.md", "debian/README.Debian", "admin/man/dispatch_env.8", "admin/plugstack.conf.in"]


def _text(path: str) -> str:
    """A doc's words on one line, roff escapes dropped."""
    return " ".join(re.sub(r"\\f[BIRP]|\\(?=-)", "", (REPO / path).read_text()).split())


def test_the_admin_docs_name_both_reasons_a_removal_is_refused():
    """admin/unplug refuses a removal while a plugstack file loads the plugin AND,
    on a slurmd node, while slurm.conf still runs the hooks; every page that tells the
    admin about removal names both."""
    unplug = (REPO / "admin" / "unplug").read_text()
    assert "still loads dispatch_env.so" in unplug and "still runs the hooks" in unplug
    for doc in ("docs/admin.md", "debian/README.Debian", "admin/man/dispatch_env.8"):
        text = _text(doc)
        assert "still loads" in text and re.search(r"slurm\.conf`? still names (these|the) hooks", text), doc


def test_the_plugstack_include_is_read_as_debian_ships_it():
    """Debian's plugstack.conf says `include /etc/slurm/plugstack.conf.d/*.conf`,
    so a file there not named *.conf is ignored: the docs say *.conf, and every link they
    tell the admin to make is named *.conf."""
    links = []
    for doc in ADMIN_DOCS + ["README.md", "admin/dispatch-slurm.spec"]:
        text = _text(doc)
        assert not re.search(r"plugstack\.conf\.d/\*(?!\.conf)", text), doc
        links += [(doc, link) for link in re.findall(r"plugstack\.conf\.d/([\w.%{}-]+)", text)]
    assert len({d for d, _ in links}) >= 4 and all(link.endswith(".conf") for _, link in links), links
