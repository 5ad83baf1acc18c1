"""On the cluster: the image installed dispatch-slurm from its Debian package
(docker-slurm/Dockerfile), and here an admin's steps are run on it. The admin guide's lines
(docs/admin.md), copied as written (the Debian recipe's symlink, the hand-written plugstack line, the
slurm.conf lines), load: a `--dispatch-checkpoint` job is accepted and gets its
environment. Removal never breaks Slurm: refused while a plugstack file or slurm.conf still
uses the package, and once they do not, a purge leaves sbatch and srun working. An upgrade
under a running job drains no node, and that job's Epilog, the upgraded one, still records
its cessation."""

from __future__ import annotations

import re

import pytest

from testbed.cluster import CONTROLLER, Cluster
from test_spank_site import make_root, no_node_drained  # the same helpers, one home
from support import REPO

pytestmark = pytest.mark.cluster

ADMIN = (REPO / "docs" / "admin.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", ADMIN, re.S)
DEB = "/src/debs/dispatch-slurm_0.1.0_amd64.deb"  # what the image installed (docker-slurm/Dockerfile)
DROPIN = "/etc/slurm/plugstack.conf.d/dispatch-slurm.conf"
HOOK_LINE = re.compile(r"^(Prolog|Epilog|TaskProlog)=", re.M)


def readme_block(needle: str) -> str:
    (block,) = [text for _, text in BLOCKS if needle in text]
    return block


def hosts(c: Cluster) -> list[str]:
    return [CONTROLLER, *c.node_names]



def dispatch_job_runs(c: Cluster, cdir: str, hdir, name: str) -> str:
    """A --dispatch-checkpoint job is accepted, runs, and sees its DISPATCH_ATTEMPT."""
    root = make_root(c, f"{cdir}/{name}")
    job = c.submit("alice", args=[f"--dispatch-checkpoint={root}", "-w", "c1", "-o", f"{cdir}/{name}.out",
                                  "--wrap", "echo attempt=$DISPATCH_ATTEMPT"])
    c.wait_job(job, "COMPLETED", timeout=90)
    out = (hdir / f"{name}.out").read_text()
    assert re.fullmatch(r"attempt=\S+\n", out), out
    return out.split("=", 1)[1].strip()


def enable(c: Cluster) -> None:
    """The image's (and README.Debian's) enabling step, on every host."""
    for h in hosts(c):
        c.exec(h, f"ln -sfn /usr/share/dispatch-slurm/plugstack.conf {DROPIN}")


def test_the_image_runs_the_package(slurm_cluster: Cluster):
    """What `dpkg -L` lists on a node (the modules aside): the layout of admin/README.md, the plugin
    0644, the two configuration files conffiles, and nothing of dispatch-slurm outside it."""
    c = slurm_cluster
    listed = c.exec("c1", ["dpkg", "-L", "dispatch-slurm"]).stdout.split()
    info = "/usr/lib/python3/dist-packages/dispatch_slurm-0.1.0.dist-info/"
    # the dist-info's other files are pybuild's to choose (RECORD on bookworm, INSTALLER later)
    assert {info + "METADATA", info + "entry_points.txt"} <= set(listed), listed
    files = {p for p in listed if not p.startswith(("/usr/lib/python3/dist-packages/dispatch_slurm/", info))
             and c.exec("c1", ["test", "-d", p], check=False).returncode}
    assert files == {
        "/etc/default/dispatch-slurm", "/etc/dispatch-slurm/site.conf", "/usr/bin/dispatch-slurm",
        "/usr/lib/x86_64-linux-gnu/slurm/dispatch_env.so",
        *(f"/usr/libexec/dispatch-slurm/{h}" for h in ("prolog", "taskprolog", "epilog", "unplug")),
        "/usr/share/dispatch-slurm/plugstack.conf", "/usr/share/lintian/overrides/dispatch-slurm",
        *(f"/usr/share/doc/dispatch-slurm/{f}" for f in ("README.Debian", "README.md.gz", "changelog.gz", "copyright")),
        "/usr/share/man/man1/dispatch-slurm.1.gz", "/usr/share/man/man5/dispatch-slurm-site.conf.5.gz",
        "/usr/share/man/man8/dispatch_env.8.gz"}, sorted(files)
    modes = c.exec("c1", ["stat", "-c", "%a %U", "/usr/lib/x86_64-linux-gnu/slurm/dispatch_env.so",
                          "/usr/libexec/dispatch-slurm/prolog"]).stdout.split("\n")
    assert modes[:2] == ["644 root", "755 root"], modes
    conffiles = c.exec("c1", ["dpkg-query", "-W", "-f", "${Conffiles}", "dispatch-slurm"]).stdout.split()[::2]
    assert sorted(conffiles) == ["/etc/default/dispatch-slurm", "/etc/dispatch-slurm/site.conf"], conffiles
    assert c.exec("c1", ["readlink", DROPIN]).stdout.strip() == "/usr/share/dispatch-slurm/plugstack.conf"
    # the image's Python finds the package Debian's way, not through a pip install or a copy
    where = c.exec("c1", ["python3", "-c", "import dispatch_slurm as d; print(d.__file__)"]).stdout.strip()
    assert where == "/usr/lib/python3/dist-packages/dispatch_slurm/__init__.py", where
    print(f"dpkg -L dispatch-slurm on {c.suite} (Slurm {c.slurm_release}):", *sorted(files),
          f"... and {len(listed) - len(files)} directories and modules", sep="\n  ")


def test_the_readmes_lines_load_as_written(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    (ln,) = [line for line in readme_block("make deb LINTIAN=:").splitlines() if line.startswith("ln -s ")]
    (line,) = [x for x in readme_block("required /").splitlines() if x.startswith("required ")]
    slurm_conf = {k: v.split("#")[0].strip() for k, v in
                  (x.split("=", 1) for x in readme_block("PrologFlags=Alloc").splitlines() if "=" in x)}
    try:
        # the Debian recipe's symlink, run as written
        for h in hosts(c):
            c.exec(h, ["rm", "-f", DROPIN])
            c.exec(h, ln)
        dispatch_job_runs(c, cdir, hdir, "symlink")
        # the plugstack line written by hand into a drop-in (no brackets: they would be an argument)
        for h in hosts(c):
            c.exec(h, ["rm", "-f", DROPIN])
            c.exec(h, "cat > /etc/slurm/plugstack.conf.d/by-hand.conf", input=line + "\n")
        dispatch_job_runs(c, cdir, hdir, "by-hand")
    finally:
        for h in hosts(c):
            c.exec(h, ["rm", "-f", "/etc/slurm/plugstack.conf.d/by-hand.conf"])
        enable(c)
    # the slurm.conf lines are the cluster's (docker-slurm/slurm.conf.in), and name the package's files
    config = c.exec(CONTROLLER, ["scontrol", "show", "config"]).stdout
    for key, value in slurm_conf.items():
        assert re.search(rf"^{key}(\[0\])?\s*=\s*{re.escape(value)}\s*$", config, re.M), (key, value)  # 24.11+: [0]
        if value.startswith("/"):
            owner = c.exec("c1", ["dpkg", "-S", value]).stdout
            assert owner.startswith("dispatch-slurm: "), owner
    no_node_drained(c)


def test_removal_refused_while_used_then_purge_leaves_slurm_working(slurm_cluster: Cluster, workdir):
    c = slurm_cluster
    cdir, hdir = workdir
    saved = {h: c.exec(h, ["cat", "/etc/slurm/slurm.conf"]).stdout for h in hosts(c)}
    try:
        # refused, nothing changed: slurm.conf runs the hooks on this slurmd host
        refused = c.exec("c1", ["dpkg", "--purge", "dispatch-slurm"], check=False)
        assert refused.returncode != 0 and "still runs the hooks in /usr/libexec/dispatch-slurm/" in refused.stderr, refused
        assert c.exec("c1", ["dpkg-query", "-W", "-f", "${Status}", "dispatch-slurm"]).stdout.endswith(" ok installed")
        assert c.exec("c1", ["test", "-L", DROPIN], check=False).returncode == 0
        # the admin takes the hooks out of slurm.conf, everywhere, and reconfigures
        for h in hosts(c):
            c.exec(h, "cat > /etc/slurm/slurm.conf", input=HOOK_LINE.sub(r"#\1=", saved[h]))
        reconfigured(c, hooks=False)
        # refused, nothing changed: a copy of the plugstack line in another file
        c.exec("c1", f"cp {DROPIN} /etc/slurm/plugstack.conf.d/copy.conf")
        refused = c.exec("c1", ["dpkg", "--purge", "dispatch-slurm"], check=False)
        assert refused.returncode != 0 and "plugstack.conf.d/copy.conf still loads dispatch_env.so" in refused.stderr
        assert c.exec("c1", ["dpkg-query", "-W", "-f", "${Status}", "dispatch-slurm"]).stdout.endswith(" ok installed")
        c.exec("c1", ["rm", "/etc/slurm/plugstack.conf.d/copy.conf"])
        # purged everywhere: the symlink went first, sbatch and srun work, the options are gone
        for h in hosts(c):
            purged = c.exec(h, ["dpkg", "--purge", "dispatch-slurm"])
            assert f"removed {DROPIN}" in purged.stdout, purged
            assert c.exec(h, ["dpkg-query", "-W", "-f", "${Status}", "dispatch-slurm"], check=False).stdout.strip() \
                in ("", "unknown ok not-installed"), h
            assert c.exec(h, ["ls", "-A", "/etc/slurm/plugstack.conf.d"]).stdout == "", h
            left = c.exec(h, ["ls", "-d", "/etc/dispatch-slurm", "/etc/default/dispatch-slurm"], check=False)
            assert left.stdout == "", f"{h}: the purge left {left.stdout}"
        plain = c.submit("alice", args=["-N2", "-o", f"{cdir}/plain.out", "--wrap", "srun -N2 hostname"])
        c.wait_job(plain, "COMPLETED", timeout=90)
        assert len((hdir / "plain.out").read_text().split()) == 2
        steps = c.exec(CONTROLLER, ["srun", "-N3", "hostname"], user="alice")
        assert sorted(steps.stdout.split()) == ["c1", "c2", "c3"] and not steps.stderr, steps
        gone = c.exec(CONTROLLER, ["sbatch", f"--dispatch-checkpoint={cdir}", "--wrap", "true"], user="alice",
                      check=False)
        assert gone.returncode != 0 and "dispatch-checkpoint" in gone.stderr, gone
        no_node_drained(c)
    finally:
        for h in hosts(c):
            c.exec(h, ["dpkg", "-i", DEB], check=False)
            c.exec(h, "cat > /etc/slurm/slurm.conf", input=saved[h])
        enable(c)
        reconfigured(c, hooks=True)
    dispatch_job_runs(c, cdir, hdir, "reinstalled")


def reconfigured(c: Cluster, hooks: bool) -> None:
    """scontrol reconfigure, then poll until slurmctld shows the package's Prolog (or none of it)."""
    c.exec(CONTROLLER, ["scontrol", "reconfigure"])
    # 24.11+ re-executes slurmctld on reconfigure and prints "Prolog[0] = ..."
    ours = re.compile(r"^Prolog(\[\d+\])?\s*=\s*/usr/libexec/dispatch-slurm/prolog\s*$", re.M)

    def shown() -> bool:
        r = c.exec(CONTROLLER, ["scontrol", "show", "config"], check=False)
        return r.returncode == 0 and bool(ours.search(r.stdout)) == hooks

    c.wait_until(shown, timeout=60, what=f"slurmctld {'with' if hooks else 'without'} the package's Prolog")
    c.wait_nodes(lambda ns: all(n.state == {"IDLE"} for n in ns), timeout=60, what="nodes idle")


def test_upgrade_under_a_running_job(slurm_cluster: Cluster, workdir):
    """A newer package (the same files, version 0.1.0+up1, its Epilog marked) installed on every
    host while a dispatch job runs: no node drains, the job ends COMPLETED, and its Epilog (the
    new one) records its cessation; a job after the upgrade works."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    job = c.submit("alice", args=[f"--dispatch-checkpoint={root}", "-w", "c1", "-o", f"{cdir}/job.out",
                                  "--wrap", f"echo attempt=$DISPATCH_ATTEMPT; while [ ! -e {cdir}/go ]; do sleep 1; done"])
    try:
        c.wait_job(job, "RUNNING", timeout=90)
        c.wait_until(lambda: (hdir / "job.out").exists() and (hdir / "job.out").read_text().strip(), timeout=30,
                     what="the job's first line")
        attempt = (hdir / "job.out").read_text().split("=", 1)[1].strip()
        for h in hosts(c):
            c.exec(h, f"rm -rf /tmp/up && dpkg-deb -R {DEB} /tmp/up"
                      " && sed -i 's/^Version: 0.1.0$/Version: 0.1.0+up1/' /tmp/up/DEBIAN/control"
                      " && echo '# upgraded' >> /tmp/up/usr/libexec/dispatch-slurm/epilog"
                      " && dpkg-deb -b /tmp/up /tmp/up.deb >/dev/null")
            up = c.exec(h, ["dpkg", "-i", "/tmp/up.deb"])
            assert "Unpacking dispatch-slurm (0.1.0+up1) over (0.1.0)" in up.stdout, up
            assert c.exec(h, ["dpkg-query", "-W", "-f", "${Version}", "dispatch-slurm"]).stdout == "0.1.0+up1"
            assert c.exec(h, ["test", "-L", DROPIN], check=False).returncode == 0, "the upgrade removed the symlink"
        assert c.job(job).states & {"RUNNING"}, c.job(job)
        (hdir / "go").touch()
        c.wait_job(job, "COMPLETED", timeout=90)
        entry = hdir / "root" / "ceased" / f"{attempt}.c1"
        c.wait_until(lambda: entry.exists(), timeout=60, what="the upgraded Epilog's cessation entry")
        assert c.exec("c1", ["tail", "-1", "/usr/libexec/dispatch-slurm/epilog"]).stdout == "# upgraded\n"
        no_node_drained(c)
        dispatch_job_runs(c, cdir, hdir, "after")
    finally:
        (hdir / "go").touch()
        for h in hosts(c):  # back to the image's package (a downgrade dpkg allows)
            c.exec(h, ["dpkg", "-i", DEB], check=False)
            c.exec(h, ["rm", "-rf", "/tmp/up", "/tmp/up.deb"])
