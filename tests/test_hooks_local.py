"""The hooks' logic on this machine (the cluster tests run them under Slurm)."""

import io
import json
import os
import pathlib
import shutil
import stat
import tempfile

import pytest

from dispatch_slurm import store
from dispatch_slurm.slurm import hostlist
from dispatch_slurm.slurm.cessation import node as evidence
from dispatch_slurm.slurm.client import SlurmError
from dispatch_slurm.slurm.hooks import epilog, job, node, prolog, taskprolog
from support import allocate

OPT = job.SPANK_OPT


def job_env(root, **extra):
    return {"SLURM_JOB_ID": "42", "SLURM_CLUSTER_NAME": "linux", "DISPATCH_CHECKPOINT": str(root),
            "DISPATCH_SUBMISSION": "3", "DISPATCH_SITE_CONF": "", **extra}


def test_task_prolog_prints_verbatim_exports_and_makes_the_folder(root):
    allocate(root, 3)
    out, err = io.StringIO(), io.StringIO()
    assert taskprolog.run(job_env(root, SLURM_RESTART_COUNT="2"), out, err) == 0
    lines = out.getvalue().splitlines()
    assert "export DISPATCH_ATTEMPT=linux.42.3000002" in lines
    assert f"export DISPATCH_EXEC_DIR={root}/exec/linux.42.3000002" in lines  # no shell quotes
    assert stat.S_IMODE((root / "exec" / "linux.42.3000002").stat().st_mode) == 0o700


def test_task_prolog_fails_the_task_with_a_message(root, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    assert taskprolog.run(job_env(tmp_path / "nope"), out, err) == 1
    assert "does not exist" in err.getvalue()
    assert out.getvalue() == f"print {err.getvalue()}", "Slurm shows a TaskProlog's `print` lines, not its stderr"
    allocate(root, 3)
    (root / "exec").symlink_to("/etc")
    err = io.StringIO()
    assert taskprolog.run(job_env(root), io.StringIO(), err) == 1
    assert "symlink" in err.getvalue()


def test_task_prolog_ignores_other_jobs():
    out = io.StringIO()
    assert taskprolog.run({"SLURM_JOB_ID": "1"}, out, io.StringIO()) == 0 and out.getvalue() == ""


def test_spank_inputs_map_options():
    env = {OPT + "checkpoint": "/ck", OPT + "submission": "4", OPT + "generation": "1",
           OPT + "shared_checkpoint": "(null)", "SLURM_JOB_ID": "9", "DISPATCH_CHECKPOINT": "/user/set"}
    got = job.spank_inputs(env)
    assert got["DISPATCH_CHECKPOINT"] == "/ck" and got["DISPATCH_SUBMISSION"] == "4"
    assert got["DISPATCH_GENERATION"] == "1" and got["DISPATCH_SHARED_CHECKPOINT"] == "1"
    assert job.spank_inputs({"SLURM_JOB_ID": "9"}) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")
def test_as_job_user_really_drops_privileges(tmp_path):
    """The child that touches the root runs as the job user: nobody cannot write a
    root-owned folder, and says so as a user error (never an exception in the hook)."""
    folder = tmp_path / "rootowned"
    folder.mkdir(mode=0o755)
    env = {"SLURM_JOB_UID": "65534", "SLURM_JOB_GID": "65534", "SLURM_JOB_USER": "nobody"}
    assert node.as_job_user(env, os.geteuid) == {"ok": 65534}
    res = node.as_job_user(env, lambda: open(folder / "x", "w"))
    assert "user_error" in res and "Permission denied" in res["user_error"]
    assert not (folder / "x").exists()


# ---- nothing a user controls makes a hook fail, hang or exhaust the node ------------------

NOBODY = {"SLURM_JOB_UID": "65534", "SLURM_JOB_GID": "65534", "SLURM_JOB_USER": "nobody"}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")


@pytest.fixture
def shared(tmp_path):
    """A folder the job user (nobody) can reach: pytest's own tmp tree is root's, 0700."""
    d = tempfile.mkdtemp(prefix="dispatch-hooks-")
    os.chmod(d, 0o755)
    yield pathlib.Path(d)
    shutil.rmtree(d)


@needs_root
def test_a_child_answer_over_a_pipe_buffer_does_not_deadlock(monkeypatch):
    monkeypatch.setattr(node, "CHILD_TIMEOUT", 20)  # a deadlock would end in "timed out"
    big = "x" * (300 << 10)  # 300 KiB: over the 64 KiB a pipe holds
    assert node.as_job_user(NOBODY, lambda: big) == {"ok": big}


@needs_root
@pytest.mark.parametrize("stdout", ["slurm-%j.out", "job.out"], ids=["unexpanded-pattern", "appended-literal"])
def test_the_epilog_never_reads_the_jobs_output(plugin_root, shared, tmp_path, monkeypatch, stdout):
    """Slurm hands the Epilog SLURM_JOB_STDOUT unexpanded (``slurm-%j.out``, 26.05), and a
    literal log under --open-mode=append holds older executions' lines: the sentinel found
    there is no fact of this execution. The Epilog records cessation and nothing else (it
    used to record a ``checkpoint_complete`` event, and the supervisor took a finished run for
    a signalled one)."""
    from dispatch_slurm.store import events
    out = shared / stdout  # readable by the job user
    out.write_text("an older execution's lines\ndispatch-checkpoint-complete\n")
    on_node(monkeypatch, tmp_path, "n1")
    env = {**spank_env(plugin_root, "n1", SLURM_JOB_NODELIST="n1", SLURM_JOB_NUM_NODES="1"),
           "SLURM_JOB_STDOUT": str(out)}
    assert prolog.run(env) == 0 and epilog.run(env) == 0
    kinds = sorted(e["type"] for e in events.read(str(plugin_root)))
    assert kinds == ["cessation", "execution_started"], kinds


@needs_root
@pytest.mark.parametrize("leaf", [b"a\nb", b"caf\xe9", b"\xff\xfe"], ids=["newline", "latin1", "non-utf8"])
def test_prolog_and_epilog_exit_0_and_record_for_any_root(tmp_path, shared, monkeypatch, leaf):
    """A root with a newline or a non-UTF-8 byte: the Prolog writes its files, the Epilog
    reads them back and records cessation; neither raises nor exits non-zero."""
    monkeypatch.setattr(node, "RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(node, "LOG", str(tmp_path / "hooks.log"))
    base = shared / "ck"
    base.mkdir()
    root = os.fsencode(base) + b"/" + leaf
    os.mkdir(root)
    os.chown(root, 65534, 65534)
    os.chown(base, 65534, 65534)
    env = {**NOBODY, "SLURM_JOB_ID": "77", "SLURM_CLUSTER_NAME": "linux", "SLURMD_NODENAME": "n1",
           OPT + "checkpoint": os.fsdecode(root), OPT + "submission": "1"}
    assert node.as_job_user(env, store.allocate_submission, os.fsdecode(root)) == {"ok": 1}  # as sbatch did
    assert prolog.run(env) == 0
    values = node.recorded_execution("77")
    assert values is not None and os.fsencode(values["DISPATCH_CHECKPOINT"]) == root
    assert os.path.isdir(os.fsencode(values["DISPATCH_EXEC_DIR"]))
    assert epilog.run(env) == 0
    assert os.listdir(root + b"/ceased") == [b"linux.77.1000000.n1"]
    assert node.recorded_execution("77") is None  # cleaned up
    assert epilog.run(env) == 0  # a second Epilog run (TERMINATE_JOB retry): nothing changes
    os.rmdir(os.path.join(root, b"exec", b"linux.77.1000000"))


@needs_root
@pytest.mark.parametrize("leaf", ["ck", "task-%a"], ids=["job", "array"])
def test_the_prolog_records_the_restart_count_for_the_batch_step_and_the_epilog_drops_it(
        tmp_path, shared, monkeypatch, leaf):
    """The plugin's user_init in a requeued batch step has no SLURM_RESTART_COUNT yet: it
    reads the Prolog's record (root's, 0644, "N\\n"; spank_env/remote.c), an array task's
    too. The plugin cannot write it in a job_prolog of its own: slurmd would then take the
    job's options out of these hooks' environment (plugin.c)."""
    monkeypatch.setattr(node, "RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(node, "LOG", str(tmp_path / "hooks.log"))
    root = shared / "ck"
    root.mkdir()
    os.chown(root, 65534, 65534)
    env = {**NOBODY, "SLURM_JOB_ID": "79", "SLURM_CLUSTER_NAME": "linux", "SLURMD_NODENAME": "n1",
           "SLURM_JOB_RESTART_COUNT": "2", OPT + "checkpoint": str(shared / leaf), OPT + "submission": "1"}
    assert node.as_job_user(env, store.allocate_submission, str(root)) == {"ok": 1}
    assert prolog.run(env) == 0
    record = tmp_path / "run" / "79.restart"
    st = record.stat()
    assert (record.read_bytes(), st.st_uid, st.st_mode & 0o777) == (b"2\n", 0, 0o644)
    assert epilog.run(env) == 0
    assert not record.exists()


@needs_root
def test_a_missing_root_with_a_non_utf8_byte_is_logged_not_raised(tmp_path, shared, monkeypatch):
    monkeypatch.setattr(node, "RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(node, "LOG", str(tmp_path / "hooks.log"))
    env = {**NOBODY, "SLURM_JOB_ID": "78", "SLURM_CLUSTER_NAME": "linux",
           OPT + "checkpoint": os.fsdecode(os.fsencode(str(shared)) + b"/gone\xff"), OPT + "submission": "1"}
    assert prolog.run(env) == 0
    logged = (tmp_path / "hooks.log").read_text()
    assert "does not exist" in logged and "\\udcff" in logged


def test_the_task_prolog_reads_the_admins_site_conf_not_the_jobs(root, tmp_path):
    mine = tmp_path / "mine.conf"
    mine.write_text("grace = 299\n")
    admins = tmp_path / "site.conf"
    admins.write_text("grace = 45\n")
    out = io.StringIO()
    env = job_env(root, DISPATCH_SITE_CONF=str(mine))
    allocate(root, 3)
    assert taskprolog.run(env, out, io.StringIO(), site_conf=str(admins)) == 0
    assert "export DISPATCH_GRACE_S=45" in out.getvalue().splitlines()


# ---- the Epilog's evidence names the execution's nodes; a rejoined node's Epilog ----------

def test_hostlists_expand_as_slurm_does_and_bad_ones_are_refused():
    assert hostlist.expand_hostlist("c[1-3,07-08],gpu[1-2]x,login") == \
        ["c1", "c2", "c3", "c07", "c08", "gpu1x", "gpu2x", "login"]
    assert hostlist.expand_hostlist("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]
    for bad in ("c[1-3", "c1-3]", "c[3-1]", "c[a-b]", "c[[1]]"):
        with pytest.raises(ValueError):
            hostlist.expand_hostlist(bad)
    assert hostlist.hostnames("c7") == ["c7"]  # no brackets, no comma: no scontrol started


def test_job_facts_keep_a_node_list_only_when_it_is_whole(monkeypatch, tmp_path):
    """A node list that misses a node would let the root claim cessation while that node
    still runs the job: kept only if it names this node and SLURM_JOB_NUM_NODES nodes."""
    monkeypatch.setattr(node, "LOG", str(tmp_path / "hooks.log"))
    monkeypatch.setattr(job, "hostnames", hostlist.expand_hostlist)  # no scontrol here
    base = {**NOBODY, "SLURMD_NODENAME": "n2"}
    assert job.facts({**base, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2",
                            "SLURM_JOB_START_TIME": "1800000000"})["nodes"] == ["n1", "n2"]
    f = job.facts({**base, "SLURM_NODELIST": "n[1-2]"})  # 22.05 names it SLURM_NODELIST only
    assert f["nodes"] == ["n1", "n2"] and "start_time" not in f and f["uid"] == 65534
    assert "nodes" not in job.facts({**base, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "3"})
    assert "nodes" not in job.facts({**base, "SLURM_JOB_NODELIST": "n[3-4]"})
    assert "nodes" not in job.facts({**base, "SLURM_JOB_NODELIST": "n[1-"})
    assert "not recorded" in (tmp_path / "hooks.log").read_text()


@pytest.fixture
def plugin_root(tmp_path, shared, monkeypatch):
    """A root of the job user (nobody) with N=1 allocated, and the hooks' files in tmp."""
    monkeypatch.setattr(node, "LOG", str(tmp_path / "hooks.log"))
    monkeypatch.setattr(job, "hostnames", hostlist.expand_hostlist)
    root = shared / "ck"
    root.mkdir()
    os.chown(root, 65534, 65534)
    assert node.as_job_user(NOBODY, store.allocate_submission, str(root)) == {"ok": 1}
    return root


def on_node(monkeypatch, tmp_path, name: str) -> None:
    """Each node has its own /run/dispatch-slurm."""
    monkeypatch.setattr(node, "RUN_DIR", str(tmp_path / f"run-{name}"))


def spank_env(root, name, r=0, **extra):
    return {**NOBODY, "SLURM_JOB_ID": "79", "SLURM_CLUSTER_NAME": "linux", "SLURMD_NODENAME": name,
            "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", OPT + "checkpoint": str(root),
            OPT + "submission": "1", **({"SLURM_RESTART_COUNT": str(r)} if r else {}), **extra}


@needs_root
def test_the_epilog_names_every_node_and_the_root_alone_shows_cessation(plugin_root, tmp_path, monkeypatch):
    from dispatch_slurm.store import ceased, events
    root, attempt = plugin_root, "linux.79.1000000"
    for name in ("n1", "n2"):
        on_node(monkeypatch, tmp_path, name)
        assert prolog.run(spank_env(root, name, SLURM_JOB_START_TIME="1800000000")) == 0
    started = [e for e in events.read(str(root)) if e["type"] == "execution_started"]
    assert {(e["node"], e["source"], tuple(e["nodes"]), e["start_time"]) for e in started} == \
        {(n, "prolog", ("n1", "n2"), 1800000000) for n in ("n1", "n2")}
    on_node(monkeypatch, tmp_path, "n1")
    assert epilog.run(spank_env(root, "n1")) == 0
    entry = json.loads((root / "ceased" / f"{attempt}.n1").read_text())
    assert entry == {"by": "process scan", "nodes": ["n1", "n2"]}
    ev = ceased.execution(str(root), attempt)
    assert (ev["ceased"], ev["nodes"], ev["missing"]) == (False, ["n1", "n2"], ["n2"])
    on_node(monkeypatch, tmp_path, "n2")
    assert epilog.run(spank_env(root, "n2")) == 0
    ev = ceased.execution(str(root), attempt)
    assert ev["ceased"] is True and ev["at"] is not None, ev


@needs_root
def test_a_rejoined_nodes_epilog_without_job_options_records_from_the_prologs_record(
        plugin_root, tmp_path, monkeypatch):
    """A node cut off past MinJobAge rejoins: slurmd kills the orphan and runs the Epilog
    with the job id alone (uid 0, no options, this node as the node list). The Prolog's
    root-owned record names the root, the attempt, the user and the nodes: the entry is
    written as the job user, never as root."""
    from dispatch_slurm.store import ceased, events
    root, attempt = plugin_root, "linux.79.1000000"
    on_node(monkeypatch, tmp_path, "n1")
    assert prolog.run(spank_env(root, "n1")) == 0
    bare = {"SLURM_JOB_ID": "79", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
            "SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n1", "SLURM_CLUSTER_NAME": "linux"}
    assert epilog.run(bare) == 0
    entry = root / "ceased" / f"{attempt}.n1"
    assert entry.stat().st_uid == 65534, "written as the job user"
    assert json.loads(entry.read_text())["nodes"] == ["n1", "n2"], "the Prolog's list, not the abort's"
    (ev,) = [e for e in events.read(str(root)) if e["type"] == "cessation"]
    assert ev["source"] == "epilog (rejoined)" and ev["node"] == "n1"
    assert node.recorded_execution("79") is None  # cleaned up
    assert ceased.execution(str(root), attempt)["missing"] == ["n2"]
    assert epilog.run(bare) == 0  # no record left: nothing, silently


@needs_root
def test_a_rejoined_epilog_refuses_a_record_without_a_user_or_another_users(plugin_root, tmp_path, monkeypatch):
    root = plugin_root
    on_node(monkeypatch, tmp_path, "n1")
    os.makedirs(node.RUN_DIR)
    old = {"DISPATCH_CHECKPOINT": str(root), "DISPATCH_ATTEMPT": "linux.79.1000000"}  # an older Prolog's
    node.write_root_file(node.record_file("79"), json.dumps(old).encode())
    bare = {"SLURM_JOB_ID": "79", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURMD_NODENAME": "n1"}
    assert epilog.run(bare) == 0
    assert "names no job user" in (tmp_path / "hooks.log").read_text()
    assert prolog.run(spank_env(root, "n1")) == 0
    assert epilog.run({**bare, "SLURM_JOB_UID": "2002"}) == 0  # Slurm names someone else
    assert "the Prolog recorded uid 65534" in (tmp_path / "hooks.log").read_text()
    assert not (root / "ceased").exists(), "nothing recorded, and nothing as root"


class _SlurmSays:
    """Stands in for slurmctld in the sweep: the job as Slurm shows it (None: forgotten),
    or an unreachable controller."""

    def __init__(self, job=None, error=None):
        self.asked, self._job, self._error = [], job, error

    def __call__(self):
        return self

    def find_job(self, job_id):
        self.asked.append(job_id)
        if self._error:
            raise SlurmError(["scontrol"], 1, self._error)
        return self._job


def _job_info(restart, state, *flags):
    from dispatch_slurm.slurm.client import JobInfo
    return JobInfo(job_id=79, state=state, flags=frozenset(flags), reason="", restart_count=restart, nodes=["n1"],
                   batch_host="n1", exit_code=None, exit_signal=None, partition="normal", user="nobody", name="j",
                   raw={})


@needs_root
def test_a_record_whose_root_its_user_removed_is_dropped_once(plugin_root, tmp_path, monkeypatch):
    """A user who removes a root before the sweep ran (a finished run cleaned up) leaves
    nothing to record into: the sweep says so once, naming the execution, and drops the
    node's record instead of asking Slurm and failing again at every later hook."""
    import shutil
    root, attempt = plugin_root, "linux.79.1000000"
    on_node(monkeypatch, tmp_path, "n1")
    assert prolog.run(spank_env(root, "n1")) == 0
    shutil.rmtree(root)
    other = {"SLURM_JOB_ID": "80", "SLURM_JOB_UID": "2002", "SLURM_JOB_GID": "2002", "SLURMD_NODENAME": "n1"}
    says = _SlurmSays(_job_info(1, "RUNNING"))
    monkeypatch.setattr(epilog, "Slurm", says)
    assert epilog.run(other) == 0 and node.recorded_execution("79") is None
    log = (tmp_path / "hooks.log").read_text()
    assert f"{attempt}: cessation not recorded" in log and "does not exist" in log and "dropped" in log, log
    assert epilog.run(other) == 0 and prolog.run(other) == 0 and says.asked == [79]
    assert (tmp_path / "hooks.log").read_text().count("cessation not recorded") == 1


@needs_root
def test_a_record_no_epilog_took_is_recorded_by_the_nodes_next_hook(plugin_root, tmp_path, monkeypatch):
    """An execution whose batch script ended while its node was cut off gets no Epilog
    (tests/cluster/test_submitit_on_slurm.py shows it): the node's next hook, any job's,
    records its cessation from the Prolog's record once Slurm says it is over, and only then."""
    from dispatch_slurm.store import events
    root, attempt = plugin_root, "linux.79.1000000"
    on_node(monkeypatch, tmp_path, "n1")
    assert prolog.run(spank_env(root, "n1")) == 0
    other = {"SLURM_JOB_ID": "80", "SLURM_JOB_UID": "2002", "SLURM_JOB_GID": "2002", "SLURMD_NODENAME": "n1"}

    # Slurm cannot be asked, or says execution R=0 still runs (an allocation before its first step)
    for says in (_SlurmSays(error="Unable to contact slurm controller"), _SlurmSays(_job_info(0, "RUNNING")),
                 _SlurmSays(_job_info(0, "COMPLETED", "COMPLETING"))):
        monkeypatch.setattr(epilog, "Slurm", says)
        assert epilog.run(other) == 0 and prolog.run(other) == 0
        assert says.asked == [79, 79] and not (root / "ceased").exists()
    assert "left for a later hook" in (tmp_path / "hooks.log").read_text()

    # a process of the execution is still here: Slurm is not even asked
    says = _SlurmSays(None)
    monkeypatch.setattr(epilog, "Slurm", says)
    monkeypatch.setattr(evidence, "processes_with", lambda attempt, job=None: [4242])
    assert epilog.run(other) == 0 and says.asked == [] and not (root / "ceased").exists()
    monkeypatch.undo()
    on_node(monkeypatch, tmp_path, "n1")
    monkeypatch.setattr(node, "LOG", str(tmp_path / "hooks.log"))

    # the job's own Epilog does not sweep its own record; another's does, once Slurm says requeued
    says = _SlurmSays(_job_info(1, "RUNNING"))
    monkeypatch.setattr(epilog, "Slurm", says)
    epilog.sweep({"SLURMD_NODENAME": "n1"}, skip="79")
    assert says.asked == [] and node.recorded_execution("79")
    assert epilog.run(other) == 0
    entry = root / "ceased" / f"{attempt}.n1"
    assert entry.stat().st_uid == 65534, "written as the job user the record names"
    assert json.loads(entry.read_text()) == {"by": "process scan", "nodes": ["n1", "n2"],
                                             "slurm": "Slurm requeued the job (now restart 1, RUNNING): R=0 ended"}
    (ev,) = [e for e in events.read(str(root)) if e["type"] == "cessation"]
    assert (ev["source"], ev["node"], ev["attempt"]) == ("sweep", "n1", attempt)
    assert node.recorded_execution("79") is None, "the record is gone: no hook asks Slurm again"
    assert epilog.run(other) == 0 and says.asked == [79]
