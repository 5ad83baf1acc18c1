"""The view's plugin side on this machine's own kernel, as root: one step of a job with
--dispatch-view driven through the plugin's callbacks as slurmstepd calls them
(spank_env/test_contexts.c `view`: user_init with only the effective ids the job user's, then a
real task process that enters its own mount namespace), with tests/stubs/view-commands as
`dispatch-slurm view prepare|publish`. What the task sees, what lands where, who the commands
run as, and the hostile paths (at submission: `test_contexts submit`, as the user; at start: the
task fails, nothing is mounted); a folder swapped for a symlink while the bind is entered (a
seccomp filter stops the very call until this test has swapped it) ends on the checked
folder, on the new mount API and on mount(2) through /proc/self/fd alike. The cluster's own
run of the same is tests/cluster/test_view_on_slurm.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support import REPO, build_spank

from dispatch_slurm import view as viewmod

USER, OTHER = 54321, 54322  # the job user and another user: ids no account here has
ATTEMPT = "harness.42.1000000"  # the driver's job 42 on cluster "harness", N = 1
STAND_IN = REPO / "tests" / "stubs" / "view-commands"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the view's namespace and mounts need root"),
    pytest.mark.skipif(not Path("/usr/include/slurm/spank.h").exists(),
                       reason="no slurm/spank.h: apt-get install libslurm-dev (tools/setup-host does)"),
    pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None, reason="no C compiler or make"),
]


@pytest.fixture(scope="module")
def driver():
    """Built where the job user can run it (sbatch's side runs as the user); short bounds, so a
    prepare that hangs and a publisher that ignores SIGTERM cost seconds."""
    out = Path(tempfile.mkdtemp(prefix="dsp-view-driver-", dir="/tmp"))
    out.chmod(0o755)
    try:
        yield build_spank("test_contexts", out, cppflags="-DDSP_PREPARE_TIMEOUT_MS=1500 -DDSP_PUBLISH_STOP_MS=2000")
    finally:
        shutil.rmtree(out)


class Bed:
    """A job's tree: the root ckpt/ (the job user's), target/ (root's, what a planted symlink
    points to, as /etc would be), the stand-in commands and their log in cmd/."""

    def __init__(self, top: Path):
        self.top = top
        self.root = top / "ckpt"
        self.exec = self.root / "exec" / ATTEMPT
        self.target = top / "target"
        self.cmd = top / "cmd"
        for d, mode in ((self.root, 0o700), (self.target, 0o755), (self.cmd, 0o777)):
            d.mkdir(mode=mode)
            d.chmod(mode)
        (self.root / "sub").mkdir()
        (self.root / "sub" / "000001").touch()  # N = 1, as sbatch allocated it
        for p in (self.root, self.root / "sub", self.root / "sub" / "000001"):
            os.chown(p, USER, USER)
        (self.target / "passwd").write_text("root:x:0:0\n")
        shutil.copy(STAND_IN, self.cmd / "view-commands")
        self.site(f"dispatch_slurm = {self.cmd}/view-commands\n")

    def site(self, text: str) -> None:
        (self.top / "site.conf").write_text(text)

    def user_dir(self, rel: str, owner: int = USER, mode: int = 0o755) -> Path:
        p = self.root / rel
        p.mkdir(mode=mode)
        p.chmod(mode)
        os.chown(p, owner, owner)
        return p

    def log(self) -> list[str]:
        p = self.cmd / "log"
        return p.read_text().splitlines() if p.exists() else []


@pytest.fixture
def bed():
    top = Path(tempfile.mkdtemp(prefix="dsp-view-", dir="/tmp"))  # the job user must reach it
    top.chmod(0o755)
    try:
        yield Bed(top)
    finally:
        shutil.rmtree(top)


def step(driver, bed: Bed, view, scenario: str = "plain"):
    """One step; its "key: value" lines as a dict, and its stderr (the job's)."""
    r = subprocess.run([str(driver), "view", str(bed.top), str(view), scenario], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r
    got = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    return got, r.stderr


def submit(driver, bed: Bed, view) -> tuple[dict, str]:
    """sbatch --dispatch-checkpoint=ckpt --dispatch-view=VIEW, as the job user."""
    r = subprocess.run([str(driver), "submit", str(bed.top), str(view)], capture_output=True, text=True, timeout=60,
                       user=USER, group=USER, extra_groups=[])
    assert r.returncode == 0, r
    return dict(line.split(": ", 1) for line in r.stdout.splitlines()), r.stderr


def ids(line: str) -> tuple[str, str]:
    """The Uid: and Gid: lines a stand-in logged: real, effective, saved, filesystem."""
    return re.search(r"Uid: ([\d ]+?) Gid:", line)[1], re.search(r"Gid: ([\d ]+?) Groups:", line)[1]


def no_mount_left(bed: Bed) -> None:
    assert str(bed.top) not in Path("/proc/self/mountinfo").read_text(), "a mount reached this namespace"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def gone(*pids: int, within: float = 10.0) -> bool:
    """Each pid dead within the bound. A killed process closes its files (so the step's output
    reaches its end) before it is a zombie; on a loaded machine a read in between sees it alive."""
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_task_and_its_children_see_the_execution_folder(driver, bed):
    view = bed.root / "out"
    got, err = step(driver, bed, view)
    assert (got["user_init"], got["task_init_privileged"], got["task_init"]) == ("0", "0", "0"), err
    assert got["view is the exec folder"] == "yes"
    assert (got["write by-task"], got["write by-child"]) == ("ok", "ok")
    assert sorted(p.name for p in bed.exec.iterdir()) == ["by-child", "by-task", "prepared"]
    assert all(p.stat().st_uid == USER for p in bed.exec.iterdir())
    assert view.is_dir() and list(view.iterdir()) == [], "the host's view folder was written"
    assert view.stat().st_uid == USER  # made by user_init, as the user
    no_mount_left(bed)
    log = bed.log()
    prepare, publish = (next(line for line in log if line.startswith(w + " ")) for w in ("prepare", "publish"))
    want = f"{USER} {USER} {USER} {USER}"  # real, effective, saved, fs: no root id left to take back
    assert ids(prepare) == ids(publish) == (want, want), log
    for line in (prepare, publish):  # each in a session of its own, with DISPATCH_VIEW set
        assert re.search(r"pid=(\d+) sid=\1 ", line) and f"view={view} exec={bed.exec} " in line, line
        assert int(re.search(r"fds=(\d+)", line)[1]) <= 5, f"slurmstepd's descriptors reached it: {line}"
    assert " batch= " in prepare and " batch=1 " in publish, "the batch step's publisher is told it is that"
    assert " stepend= " in prepare and " stepend=stdin " in publish, "the publisher is told how its step's end comes"
    assert log.index(prepare) < log.index(publish)
    assert "prepared the latest save for" in err  # its output, at the info level
    # the step's last task ended: the publisher got SIGTERM for its last pass, nothing of it is left
    assert any(line.startswith("publish term ") for line in log), log
    child = int(next(line for line in log if line.startswith("publish child "))[14:])
    assert gone(child, int(re.search(r"pid=(\d+)", publish)[1]))


@pytest.mark.parametrize("scenario", ["old-kernel", "container-seccomp"])
def test_without_the_new_mount_api_the_bind_goes_through_proc_self_fd(driver, bed, scenario):
    """open_tree/move_mount refused (ENOSYS: a kernel before 5.2; EPERM: a container's seccomp
    profile that does not know them): the same descriptors, mounted by mount(2)."""
    got, err = step(driver, bed, bed.root / "out", scenario)
    assert (got["task_init_privileged"], got["view is the exec folder"], got["write by-task"]) == ("0", "yes", "ok"), err
    assert (bed.exec / "by-task").exists() and not (bed.root / "out" / "by-task").exists()
    no_mount_left(bed)


@pytest.mark.parametrize("scenario", ["race", "race-old-kernel"])
def test_a_folder_swapped_for_a_symlink_at_the_bind_is_never_followed(driver, bed, scenario):
    """Every time: the bind call (move_mount, or mount(2) with MS_BIND) stops in the kernel until
    this process has renamed the checked view away and put a symlink to target/ (an /etc) in its
    place. The mount lands on the checked folder, wherever it went; the symlink's target is not
    mounted over, and the task (the user) cannot write there."""
    view = bed.root / "out"
    got, err = step(driver, bed, view, scenario)
    assert (got["swap"], got["binds stopped"]) == ("done", "1"), (got, err)
    assert got["task_init_privileged"] == "0", err
    assert got["checked folder is the exec folder"] == "yes"
    assert (got["symlink target is the exec folder"], got["symlink target is itself"]) == ("no", "yes")
    assert view.is_symlink() and got["write by-task"] == "Permission denied"
    assert sorted(p.name for p in bed.target.iterdir()) == ["passwd"]
    assert (bed.target / "passwd").read_text() == "root:x:0:0\n"
    no_mount_left(bed)


def test_a_swap_between_user_init_and_the_task_fails_the_task(driver, bed):
    view = bed.root / "out"
    got, err = step(driver, bed, view, "swap-before-task")
    assert (got["user_init"], got["task_init_privileged"]) == ("0", "-1")
    refusal = [line for line in err.splitlines() if "dispatch-slurm:" in line]
    assert refusal == [f"[error] dispatch-slurm: view folder: {view} is a symlink; the view and its root must be "
                       f"real folders (give the real path: realpath {view})"]
    assert (got["symlink target is the exec folder"], got["symlink target is itself"]) == ("no", "yes")
    no_mount_left(bed)


# ---- hostile paths: what works literally, what is refused at submission and at start ----

LITERAL = {  # name -> the view's path below the root: odd bytes are only bytes
    "tab": "a\tb",
    "command substitution": "$(touch PWNED)",
    "quotes": "it's \"quoted\"",
    "4,000-byte path": "/".join(["d" * 200] * 19) + "/" + "e" * 170,
}


def long_view(bed: Bed, rel: str) -> Path:
    """The view for rel, its length counted on the path the plugin sees (the tests' /tmp/... root)."""
    return bed.root / rel


@pytest.mark.parametrize("name", LITERAL)
def test_odd_names_are_bytes(driver, bed, name):
    rel = LITERAL[name]
    if name.startswith("4,000"):  # the whole view path 4,000 bytes
        rel = rel[:4000 - len(str(bed.root)) - 1]
    view = long_view(bed, rel)
    got, err = submit(driver, bed, view)
    assert (got["options"], got["post_opt"]) == ("0", "0"), err
    got, err = step(driver, bed, view)
    assert (got["user_init"], got["task_init_privileged"], got["view is the exec folder"]) == ("0", "0", "yes"), err
    assert (bed.exec / "by-task").exists()
    assert not list(bed.top.rglob("PWNED")) and not Path("PWNED").exists()
    no_mount_left(bed)


def plant(bed: Bed, name: str) -> Path:
    """The view of a refused case, the tree made as the case says; returns the view."""
    if name == "symlink to /etc":
        link = bed.root / "out"
        os.symlink(bed.target, link)
        os.lchown(link, USER, USER)
        return link
    if name == "symlink on the way":
        os.symlink(bed.target, bed.root / "via")
        os.lchown(bed.root / "via", USER, USER)
        return bed.root / "via" / "out"
    if name == "another user's 0777 folder":
        bed.root.chmod(0o777)
        return bed.user_dir("bobs", owner=OTHER, mode=0o777)
    if name == "inside another user's 0777 folder":
        bed.root.chmod(0o777)
        bed.user_dir("bobs", owner=OTHER, mode=0o777)
        return bed.user_dir("bobs/out")
    if name == "a file":
        (bed.root / "out").touch()
        os.chown(bed.root / "out", USER, USER)
        return bed.root / "out"
    raise KeyError(name)


REFUSED = {  # name -> what the refusal says of the view
    "symlink to /etc": "is a symlink; the view and its root must be real folders",
    "symlink on the way": "is a symlink; the view and its root must be real folders",
    "another user's 0777 folder": f"belongs to uid {OTHER}, not to you (uid {USER})",
    "inside another user's 0777 folder": f"belongs to uid {OTHER}, not to you (uid {USER})",
    "a file": "is not a folder",
}


@pytest.mark.parametrize("name", REFUSED)
def test_hostile_views_are_refused_at_submission_and_at_start(driver, bed, name):
    view = plant(bed, name)
    got, err = submit(driver, bed, view)
    assert (got["options"], got["post_opt"]) == ("0", "-1")
    said = [line for line in err.splitlines() if line.startswith("[error]")]
    assert len(said) == 1 and said[0].startswith("[error] --dispatch-view: view folder: ") and REFUSED[name] in said[0]
    got, err = step(driver, bed, view)
    assert (got["user_init"], got["task_init_privileged"], got["task_init"]) == ("0", "0", "-1")
    said = [line for line in err.splitlines() if line.startswith("[error]")]
    assert len(said) == 1 and said[0].startswith("[error] dispatch-slurm: view folder: ") and REFUSED[name] in said[0]
    assert got["view is the exec folder"] != "yes" and not bed.log(), "the view was set up although refused"
    assert sorted(p.name for p in bed.target.iterdir()) == ["passwd"]
    no_mount_left(bed)


def test_a_view_on_another_filesystem_is_refused_at_start(driver, bed):
    """A tmpfs mounted on the view (in the driver's own namespace): what the task would see
    there is not the root's filesystem."""
    view = bed.user_dir("out")
    got, err = step(driver, bed, view, "other-fs")
    assert (got["user_init"], got["task_init"]) == ("0", "-1")
    assert f"view folder: {view} is on another filesystem or mount than the checkpoint root" in err
    assert not bed.log()


LEXICAL = {  # --dispatch-view=... -> (refused as the option is read?, what the refusal says)
    "out": (True, "view folder 'out' must be an absolute path"),
    "ROOT/../x": (True, "must not contain '..'"),
    "ROOT/" + "x" * 4200: (True, "is too long"),
    "ROOT": (False, "is the checkpoint root itself: name a folder inside it (e.g. ROOT/out)"),
    "ROOT/": (False, "is the checkpoint root itself"),
    "ROOT2/out": (False, "is not inside the checkpoint root ROOT: name a folder inside it"),
    "/etc": (False, "is not inside the checkpoint root ROOT"),
    "ROOT/exec/mine": (False, "is in ROOT/exec, dispatch-slurm's own folder: name another folder inside the root"),
    "ROOT/pub": (False, "is in ROOT/pub, dispatch-slurm's own folder"),
}


@pytest.mark.parametrize("view", LEXICAL)
def test_views_refused_by_their_words(driver, bed, view):
    at_option, said = LEXICAL[view]
    view, said = (s.replace("ROOT", str(bed.root)) for s in (view, said))
    got, err = submit(driver, bed, view)
    assert got["options"] == ("1" if at_option else "0") and got.get("post_opt", "-1") == "-1", (got, err)
    errors = [line for line in err.splitlines() if line.startswith("[error]")]
    assert len(errors) == 1 and said in errors[0], err
    assert not (bed.root / "sub" / "000002").exists(), "a refused job spent a submission number"


def test_site_default_view_and_none(driver, bed):
    """site.conf's view is every job's unless it says --dispatch-view=none."""
    bed.site(f"dispatch_slurm = {bed.cmd}/view-commands\nview = runs/out\n")
    got, err = step(driver, bed, "none")
    assert got["task_init_privileged"] == "0" and not bed.log() and not (bed.root / "runs").exists(), err
    got, err = submit(driver, bed, "none")
    assert got["post_opt"] == "0", err


# ---- the commands: a prepare that fails, hangs or is missing fails the tasks, never quietly ----

PREPARE = {  # prepare.mode / site.conf -> the one line the tasks fail with
    "fail": "the view cannot be prepared: this is the line that names the fix",
    "crash": "{cmd} view prepare exited 1: Traceback (most recent call last): something broke",
    "hang": "{cmd} view prepare did not finish in 1 s (killed)",
    "missing": "/nowhere/dispatch-slurm view prepare: cannot run it: No such file or directory (the view needs "
               "dispatch-slurm on every node; tell your cluster admin)",
    "not on PATH": "dispatch-slurm is not on the job's PATH (/usr/bin:/bin): the view needs it on every node; "
                   "install it there, or set dispatch_slurm = PATH in site.conf (tell your cluster admin)",
}


@pytest.mark.parametrize("mode", PREPARE)
def test_a_prepare_that_does_not_succeed_fails_the_tasks_with_its_line(driver, bed, mode):
    cmd = bed.cmd / "view-commands"
    if mode == "missing":
        bed.site("dispatch_slurm = /nowhere/dispatch-slurm\n")
    elif mode == "not on PATH":
        bed.site("")
    else:
        (bed.cmd / "prepare.mode").write_text(mode)
    got, err = step(driver, bed, bed.root / "out")
    assert (got["user_init"], got["task_init_privileged"], got["task_init"]) == ("0", "0", "-1"), err
    assert f"[error] dispatch-slurm: {PREPARE[mode].format(cmd=cmd)}" in err.splitlines(), err
    assert not any(line.startswith("publish") for line in bed.log()), "a publisher started for a failed prepare"
    if mode == "hang":  # the hanging prepare is gone with its session
        pid = int(re.search(r"pid=(\d+)", bed.log()[0])[1])
        assert gone(pid)
    no_mount_left(bed)


def test_a_publisher_that_ignores_sigterm_is_killed_with_its_session(driver, bed):
    (bed.cmd / "publish.mode").write_text("ignore")
    got, err = step(driver, bed, bed.root / "out")
    assert got["task_init"] == "0" and got["task_exit"] == "0", err
    log = bed.log()
    publisher = int(re.search(r"pid=(\d+)", next(line for line in log if line.startswith("publish ")))[1])
    child = int(next(line for line in log if line.startswith("publish child "))[14:])
    assert not any("publish term" in line for line in log)
    assert gone(publisher, child)


def test_the_publisher_is_told_by_its_stdin_that_the_steps_tasks_are_gone(driver, bed):
    """Slurm's own signals reach the publisher (scancel signals the step), so the package's
    ignores SIGTERM; the end of its stdin is the plugin's word alone: the step's last task here
    ended. A step waits for its publisher's end (task_exit comes before srun is told), so a
    publisher that waited on for the first of the execution's processes made every short step
    on a node without the batch step 5 s longer (benchmarks/bench_view.py --steps-on other)."""
    (bed.cmd / "publish.mode").write_text("told")
    got, err = step(driver, bed, bed.root / "out")
    assert got["task_init"] == "0" and got["task_exit"] == "0", err
    log = bed.log()
    told = [line for line in log if line.startswith("publish told ")]
    assert len(told) == 1, log
    publisher = int(re.search(r"pid=(\d+)", told[0])[1])
    child = int(next(line for line in log if line.startswith("publish child "))[14:])
    assert gone(publisher, child)


def test_a_publisher_whose_slurmstepd_is_killed_is_told_at_once(driver, bed):
    """slurmstepd gone without its task_exit or exit (killed, crashed): the kernel sends the
    publisher SIGTERM (PR_SET_PDEATHSIG), so it never runs on for a step that is no more."""
    got, err = step(driver, bed, bed.root / "out", "stepd-killed")
    assert got["task_init"] == "0" and "task_exit" not in got, err
    deadline = time.monotonic() + 10
    while not any(line.startswith("publish term ") for line in bed.log()):
        assert time.monotonic() < deadline, f"the publisher was not told: {bed.log()}"
        time.sleep(0.05)


def prepared_before(bed: Bed, record: str = "file") -> None:
    """The execution's folder as an earlier step (or another node's prepare) left it: its
    record written last, the user's; ``symlink``: a link of that name the user planted."""
    for d in (bed.root / "exec", bed.exec):
        d.mkdir(exist_ok=True)
        os.chown(d, USER, USER)
    rec = bed.exec / "dispatch-view"
    if record == "file":
        rec.write_text('{"pub": null}\n')
    else:
        rec.symlink_to(bed.target / "passwd")
    os.lchown(rec, USER, USER)


@pytest.mark.parametrize("record", ["file", "symlink"])
def test_a_step_of_a_prepared_execution_runs_no_prepare(driver, bed, record):
    """Each `view prepare` is a Python start before the step's tasks: the plugin looks for the
    record itself (as the user, never following a link) and runs none once it is there."""
    prepared_before(bed, record)
    got, err = step(driver, bed, bed.root / "out")
    assert (got["user_init"], got["task_init"], got["view is the exec folder"]) == ("0", "0", "yes"), err
    ran = [line.split()[0] for line in bed.log() if re.match(r"(prepare|publish) pid=", line)]
    assert ran == (["publish"] if record == "file" else ["prepare", "publish"]), bed.log()


class Holder:
    """A process of ``uid`` bound to the batch step's publisher's claim name, as that publisher
    binds it (view.py): what an srun step's plugin asks before starting one of its own."""

    def __init__(self, bed: Bed, uid: int):
        name = viewmod.claim_name(str(bed.root), ATTEMPT, batch=True)
        code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
                f"s.bind({chr(0) + name!r}); s.listen(8)\nprint('bound', flush=True)\nsys.stdin.read()\n")
        # the system's Python: the job user cannot reach this checkout's venv under /root
        self.proc = subprocess.Popen(["/usr/bin/python3", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, user=uid, group=uid, extra_groups=[])
        assert self.proc.stdout.readline() == "bound\n"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.mark.parametrize("holder", ["batch publisher", "another user", "none"])
def test_an_srun_step_where_the_batch_steps_publisher_runs_starts_none(driver, bed, holder):
    """The batch step lives longest, so its publisher covers every srun step on its node: the
    step starts none of its own (and no prepare). A name held by another user stops nothing,
    and the user's own DISPATCH_VIEW_BATCH (srun carries the user's env) never reaches one."""
    prepared_before(bed)
    held = Holder(bed, {"batch publisher": USER, "another user": OTHER}[holder]) if holder != "none" else None
    try:
        got, err = step(driver, bed, bed.root / "out", "srun-step")
    finally:
        if held:
            held.close()
    assert (got["user_init"], got["task_init"], got["view is the exec folder"]) == ("0", "0", "yes"), err
    assert (got["write by-task"], got["write by-child"]) == ("ok", "ok")
    started = [line for line in bed.log() if line.startswith("publish pid=")]
    assert not any(line.startswith("prepare ") for line in bed.log()), bed.log()
    if holder == "batch publisher":
        assert started == [], "an srun step started a publisher beside the batch step's"
    else:
        assert len(started) == 1 and " batch= " in started[0], started
    no_mount_left(bed)
