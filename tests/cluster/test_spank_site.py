"""The SPANK plugin as the cluster image builds and loads it (Slurm 22.05 and 24.11):
hardened (RELRO, BIND_NOW, no executable stack), versioned, installable and
uninstallable; and site.conf, read by the plugin exactly as tests/vectors/siteconf.json
says, never takes the site down: a bad file refuses only the jobs that use
--dispatch-* options, and a large valid one works end to end."""

from __future__ import annotations

import re

import pytest

from testbed.cluster import CONTROLLER, Cluster, slurm_at_least
from support import REPO

pytestmark = pytest.mark.cluster

PLUGIN = "/usr/lib/x86_64-linux-gnu/slurm/dispatch_env.so"  # the Debian package's (the images are amd64)
DROPIN = "/etc/slurm/plugstack.conf.d/dispatch-slurm.conf"  # the package's enabling symlink
SITE = "/etc/dispatch-slurm/site.conf"
ACCOUNT71 = "a" * 35 + "-" + "b" * 20 + "." + "c" * 13 + "_x"  # as in the vectors
CHECK = ["dispatch-slurm", "check-site"]  # the admin's check of /etc/dispatch-slurm/site.conf


def makefile_version() -> str:
    return re.search(r"^VERSION = (\S+)$", (REPO / "spank_env" / "Makefile").read_text(), re.M)[1]


def test_plugin_is_hardened_and_versioned(cluster: Cluster):
    c = cluster
    program = c.exec("c1", ["readelf", "-lW", PLUGIN]).stdout
    dynamic = c.exec("c1", ["readelf", "-dW", PLUGIN]).stdout
    shown = [line.strip() for line in (program + dynamic).splitlines()
             if re.search(r"GNU_RELRO|GNU_STACK|\(FLAGS(_1)?\)", line)]
    print(f"readelf on {c.suite} (Slurm {c.slurm_release}):", *shown, sep="\n  ")
    assert any(line.startswith("GNU_RELRO") for line in shown), program
    stack = [line.split() for line in shown if line.startswith("GNU_STACK")]
    assert len(stack) == 1 and "E" not in "".join(stack[0][6:-1]), f"executable stack: {stack}"
    assert re.search(r"\(FLAGS\)\s+.*\bBIND_NOW\b", dynamic), dynamic
    assert re.search(r"\(FLAGS_1\)\s+Flags:.*\bNOW\b", dynamic), dynamic
    assert makefile_version() in c.exec("c1", ["strings", PLUGIN]).stdout.split()
    symbols = c.exec("c1", ["nm", "-D", "--defined-only", PLUGIN]).stdout
    # Slurm >= 25.05 reads it (fail the job, not the node); older ones must not be handed it
    assert ("slurm_spank_init_failure_mode" in symbols) == (slurm_at_least(c, "25.05"))
    # _FORTIFY_SOURCE in effect at the package build's own level (never lowered): fortified calls
    assert re.search(r"\b__\w+_chk\b", c.exec("c1", ["nm", "-D", "--undefined-only", PLUGIN]).stdout)
    # `sbatch --help` lists every option, its help (on the option's line or the next) saying whose
    helps = re.findall(r"(--dispatch-[a-z-]+)(?:=\S+)?\s+(\S[^\n]*)", c.exec(CONTROLLER, ["sbatch", "--help"]).stdout)
    print("sbatch --help:", *helps, sep="\n  ")
    assert [o for o, _ in helps] == ["--dispatch-checkpoint", "--dispatch-generation", "--dispatch-submission",
                                     "--dispatch-shared-checkpoint", "--dispatch-grace", "--dispatch-view"], helps
    assert all(h.startswith("[dispatch] ") for _, h in helps), helps


def test_make_install_uninstall(cluster: Cluster):
    """DESTDIR/PREFIX/LIBDIR are respected; uninstall refuses while a plugstack.conf.d file loads the plugin."""
    c = cluster
    src, stage = "/tmp/spank-make", "/tmp/spank-stage"
    make = ["make", "-s", "-C", src]
    try:
        c.exec("c1", f"rm -rf {src} {stage} && cp -r /src/dispatch-slurm/spank_env {src} && make -s -C {src} clean")
        # built here against this release's slurm/spank.h and compiler: CI's build, every warning fails it
        c.exec("c1", [*make, "WERROR=1", "install", f"DESTDIR={stage}", "PREFIX=/opt/x"])
        assert c.exec("c1", ["test", "-f", f"{stage}/opt/x/lib/slurm/dispatch_env.so"], check=False).returncode == 0
        c.exec("c1", [*make, "install", f"DESTDIR={stage}", "LIBDIR=/plugins"])
        c.exec("c1", [*make, "uninstall", f"DESTDIR={stage}", "PREFIX=/opt/x"])
        c.exec("c1", [*make, "uninstall", f"DESTDIR={stage}", "LIBDIR=/plugins"])
        assert c.exec("c1", ["find", stage, "-type", "f"]).stdout == ""
        # the real one: plugstack.conf.d/dispatch-slurm.conf still says `required .../dispatch_env.so`
        refused = c.exec("c1", [*make, "uninstall"], check=False)
        assert refused.returncode != 0 and f"{DROPIN} still loads dispatch_env.so" in refused.stderr, refused
        assert c.exec("c1", ["test", "-f", PLUGIN], check=False).returncode == 0
    finally:
        c.exec("c1", ["rm", "-rf", src, stage])


# ---- site.conf on the cluster --------------------------------------------------------

def make_root(c: Cluster, path: str) -> str:
    c.exec("c1", f"mkdir -p {path} && chmod 700 {path}", user="alice")
    return path


def no_node_drained(c: Cluster) -> None:
    reasons = c.exec(CONTROLLER, ["sinfo", "-R", "-h"]).stdout.strip()
    assert reasons == "", f"a node was drained: {reasons}"


# the 71-character account of the vectors, made invalid by one character
BROKEN = f"grace = 90\ngrace.{ACCOUNT71}! = 120\n"
BROKEN_AT = f"{SITE}:2: cannot parse 'grace.{ACCOUNT71[:54]}...'"


def only_dispatch_jobs_refused(c: Cluster, workdir, problem: str) -> None:
    """Jobs that do not use the plugin run (a batch job with an srun step, srun from
    outside); jobs that do are refused at submission, naming problem and whom to ask."""
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    steps = c.exec(CONTROLLER, ["srun", "-N3", "hostname"], user="alice")
    assert sorted(steps.stdout.split()) == ["c1", "c2", "c3"] and not steps.stderr, steps
    plain = c.submit("alice", args=["-N2", "-o", f"{cdir}/plain.out", "--wrap", "srun -N2 hostname"])
    c.wait_job(plain, "COMPLETED", timeout=90)
    hosts = (hdir / "plain.out").read_text().split()
    assert len(hosts) == 2 and set(hosts) <= {"c1", "c2", "c3"}, hosts
    for cmd in (["sbatch", "--parsable", f"--dispatch-checkpoint={root}", "--wrap", "true"],
                ["srun", "-N1", f"--dispatch-checkpoint={root}", "true"],
                ["sbatch", "--parsable", "--dispatch-grace=5", "--wrap", "true"]):
        res = c.exec(CONTROLLER, cmd, user="alice", check=False)
        assert res.returncode != 0 and not res.stdout.strip(), f"{cmd} was accepted: {res.stdout}"
        assert problem in res.stderr and "cluster admin" in res.stderr, f"{cmd}: {res.stderr!r}"
    assert not (hdir / "root" / "sub").exists(), "a refused job spent a submission number"
    no_node_drained(c)


def test_broken_site_conf_refuses_only_dispatch_jobs(slurm_cluster: Cluster, workdir, etc):
    c = slurm_cluster
    etc(SITE, BROKEN)
    # the admin's check names the problem exactly as the plugin does
    check = c.exec(CONTROLLER, CHECK, check=False)
    assert check.returncode != 0 and BROKEN_AT in check.stderr, check
    only_dispatch_jobs_refused(c, workdir, BROKEN_AT)


def test_unreadable_site_conf_or_bad_plugstack_argument(slurm_cluster: Cluster, workdir, etc):
    """conf= naming a missing file, then an unknown argument: the same, never a broken site."""
    c = slurm_cluster
    etc(DROPIN, f"required {PLUGIN} conf=/nowhere/site.conf\n")
    only_dispatch_jobs_refused(c, workdir, "site config /nowhere/site.conf does not exist")
    etc(DROPIN, f"required {PLUGIN} grace=5\n")
    cdir, hdir = workdir
    only_dispatch_jobs_refused(c, (f"{cdir}/again", hdir / "again"),
                               "plugstack.conf: unknown argument 'grace=5' for dispatch_env (only conf=PATH)")


def test_site_conf_broken_on_the_nodes_fails_the_task_not_the_node(slurm_cluster: Cluster, workdir, etc):
    """sbatch (valid site.conf on the login node) queues the job; slurmstepd cannot use the
    nodes' file: the task fails with the reason in its stderr, the node stays in service."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    etc(SITE, BROKEN, on=c.node_names)
    job = c.submit("alice", args=[f"--dispatch-checkpoint={root}", "-o", f"{cdir}/job.out", "-e",
                                  f"{cdir}/job.err", "--wrap", f"touch {cdir}/ran"])
    ended = c.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}, timeout=90)
    assert "FAILED" in ended.states, ended
    assert not (hdir / "ran").exists(), "the job ran although its nodes' site.conf is unusable"
    err = (hdir / "job.err").read_text()
    assert BROKEN_AT in err and "cluster admin" in err, err
    no_node_drained(c)


ACCOUNTS = "".join(f"grace.proj{i:03d} = {i}\n" for i in range(1, 66))
LARGE = f"# 65 + 1 accounts\ngrace = 77\n{ACCOUNTS}grace.{ACCOUNT71} = 123\nexec_mode = 0750\n"


def test_many_and_long_accounts_work_end_to_end(slurm_cluster: Cluster, workdir, etc):
    """Once refused by the C parser (at most 64 accounts of 63 characters): now read alike
    by check-site, the plugin and the per-account grace of a job's --account."""
    c = slurm_cluster
    cdir, hdir = workdir
    root = make_root(c, f"{cdir}/root")
    etc(SITE, LARGE)
    report = c.exec(CONTROLLER, CHECK).stdout
    assert f"{SITE}: OK" in report and f"grace.{ACCOUNT71} = 123" in report and "grace.proj065 = 65" in report
    jobs = {}
    for account in (None, "proj065", ACCOUNT71):
        name = account or "default"
        jobs[name] = c.submit("alice", args=[f"--dispatch-checkpoint={root}", *([f"--account={account}"] if account else []),
                                             "-o", f"{cdir}/{name}.out", "--wrap",
                                             "echo $SLURM_JOB_ACCOUNT $DISPATCH_GRACE_S; stat -c %a $DISPATCH_EXEC_DIR"])
    for name, job in jobs.items():
        c.wait_job(job, "COMPLETED", timeout=90)
    seen = {name: (hdir / f"{name}.out").read_text().split() for name in jobs}
    assert seen["default"][-2:] == ["77", "750"], seen
    assert seen["proj065"] == ["proj065", "65", "750"], seen
    assert seen[ACCOUNT71] == [ACCOUNT71, "123", "750"], seen
    no_node_drained(c)
