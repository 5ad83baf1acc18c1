"""The runs: each mode's job on the cluster (``Side``), a run's two sides under one nemesis
(``Campaign``), and the whole campaign (``run``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from dispatch_slurm.slurm.client import SlurmError

from .. import checker
from ..bed import ClusterError
from .judge import measured_goodput, report_estimate
from .nemesis import FS, FS_MIB, Applied, Nemesis
from .report import plot_run
from .schedule import GIVE_UP, Fault, Params, Setup, replay_command, schedule_for, setup_for


README = Path(__file__).resolve().parents[3] / "README.md"  # the checkout's, whose job script the runs use
IMAGE_TESTBED = "/src/dispatch-slurm/tests/testbed"  # the test bed's copy in docker-slurm's image


HOST_SITE = "/opt/host-site"  # where bookworm's containers see this machine's torch


USER = "alice"


def readme_job_script(readme: Path) -> str:
    """The README's job script without the plugin's view (its ``job-script`` snippet): the one
    the tests of the protocol run; the view's one-line form has a test of its own."""
    found = re.search(r"<!-- snippet: job-script -->\n```sh\n(.*?)```", readme.read_text(), re.S)
    if found is None:
        raise ClusterError(f"{readme} has no `<!-- snippet: job-script -->` sh block")
    return found[1]


def wrapper(trainer: str, args: list[str], site: Optional[str] = None) -> str:
    """A ``train.py`` that runs ``trainer`` with ``args`` first, as a user's entry point would
    (``site``: a folder of packages to add, e.g. this machine's torch)."""
    path = f"sys.path.insert(0, {site!r})\n" if site else ""
    return (f"import sys\n{path}sys.argv[1:1] = {args!r}\nsys.argv[0] = {trainer!r}\n"
            f"exec(compile(open({trainer!r}).read(), {trainer!r}, 'exec'), "
            f"{{'__name__': '__main__', '__file__': {trainer!r}}})\n")


NAIVE_SCRIPT = "#!/bin/bash\n#SBATCH --time=24:00:00\nsrun python train.py --output-dir {shared}\n"


class Side:
    """One mode of a run: its folder, job script, jobs, and how it ended."""

    def __init__(self, camp: "Campaign", run: "RunState", mode: str):
        self.camp, self.run, self.mode = camp, run, mode
        self.bed = camp.bed
        self.dir = f"/checkpoints/campaign/{run.id}/{mode}"
        self.hdir = self.bed.path(self.dir)
        self.root = f"/checkpoints/{FS}/{run.id}/{mode}/root" if mode == "dispatch" else None
        self.shared = f"/checkpoints/{FS}/{run.id}/{mode}/shared" if mode == "naive" else None
        self.log = f"{self.dir}/train.jsonl"
        self.jobs: list[int] = []
        self.retry_at = 0.0
        self.superseded: dict[int, float] = {}  # finished fact (its seq) -> when its user superseded after it
        self.outcome: Optional[dict] = None
        self.events: list[dict] = []
        s = run.setup
        self.trap = "hf" if s.trainer == "hf" else ("own" if mode == "naive" and s.trainer == "handler" else s.trainer)
        self.launcher = "user" if mode == "naive" else s.launcher
        # the trainer's processes (not srun's, whose command line holds the same words after "srun")
        self.marker = f"^\\S*python[0-9.]* train.py .*/checkpoints/{FS}/{run.id}/{mode}/"
        self.started_at = time.time()

    @property
    def hroot(self) -> Optional[Path]:
        return self.bed.path(self.root) if self.root else None

    def note(self, what: str, **more) -> None:
        self.events.append({"t": time.time(), "what": what, **more})
        self.camp.say(f"run {self.run.seed} {self.mode}: {what} {more if more else ''}".rstrip())

    # preparing and submitting

    def prepare(self) -> None:
        s, p = self.run.setup, self.camp.params
        self.hdir.mkdir(parents=True)
        self.hdir.chmod(0o1777)
        (self.hdir / "bin").mkdir()
        (self.hdir / "bin" / "python").symlink_to("/usr/bin/python3")
        folder = self.shared if self.mode == "naive" else None
        if s.trainer == "hf":
            trainer = f"{IMAGE_TESTBED}/hftrain.py"
            args = ["--max-steps", str(p.hf_steps), "--save-every", str(p.save_every), "--step-time",
                    str(p.step_time), "--seed", str(self.run.seed % 1000), "--log", self.log]
            args += ["--naive"] if self.mode == "naive" else []
        else:
            trainer = f"{IMAGE_TESTBED}/dettrain.py"
            args = ["--max-steps", str(p.steps), "--save-every", str(p.save_every), "--step-time", str(p.step_time),
                    "--trap", self.trap, "--seed", str(self.run.seed % 1000), "--log", self.log,
                    "--barrier-dir", f"{self.dir}/barrier", "--warmup", "1"]
            args += ["--naive"] if self.mode == "naive" else []
        (self.hdir / "train.py").write_text(wrapper(trainer, args, HOST_SITE if s.trainer == "hf" else None))
        if self.mode == "naive":
            script = NAIVE_SCRIPT.format(shared=folder)
        else:
            script = self.camp.job_script
            script = re.sub(r" --signal=\S+", "", script)  # the setup's own --signal is on the command line
            if s.launcher == "plugin":  # the plugin sets DISPATCH_* and the Prolog makes the folder
                script = "\n".join(line for line in script.splitlines() if "dispatch-slurm env" not in line) + "\n"
        (self.hdir / "train.sbatch").write_text(script)
        parent = self.root or self.shared
        assert parent is not None
        self.bed.exec("ctl", f"mkdir -p {os.path.dirname(parent)} && mkdir -m 700 {parent}", user=USER)

    def sbatch_args(self) -> list[str]:
        s, p = self.run.setup, self.camp.params
        a = ["-N1", f"-n{s.ranks}", "-c1", "-p", "normal", f"--chdir={self.dir}",
             "-J", f"c{self.run.seed}-{self.mode}"]
        a += {"default": [], "name": [f"-o{self.dir}/%x-%j.out"], "literal": [f"-o{self.dir}/train.out"],
              "append": [f"-o{self.dir}/train.out", "--open-mode=append"]}[s.output]
        if s.signal:
            a.append(f"--signal=TERM@{p.lead_s}")
        return a

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.dir}/bin:/usr/local/bin:/usr/bin:/bin"}

    def start(self) -> None:
        self.started_at = time.time()
        if self.launcher == "run":
            self.start_supervisor(first=True)
        else:
            self.submit()

    def start_supervisor(self, first: bool) -> None:
        s, p = self.run.setup, self.camp.params
        args = ["--resubmit", str(p.resubmit), "--continuations", str(p.resubmit), "--poll", "1"]
        args += ["--keep-last", str(s.gc)] if s.gc else []
        tail = f" {' '.join(args)} -- {' '.join(self.sbatch_args())} {self.dir}/train.sbatch" if first else " --poll 1"
        env = " ".join(f"{k}={v}" for k, v in self.env().items())
        self.bed.exec(self.camp.login, f"cd {self.dir} && env {env} setsid nohup dispatch-slurm run {self.root}{tail} "
                                       f">> {self.dir}/sup.log 2>&1 < /dev/null &", user=USER)

    def submit(self) -> None:
        a = self.sbatch_args() + ["--requeue"]
        if self.mode == "dispatch":
            a.append(f"--dispatch-checkpoint={self.root}")
        job = self.bed.slurm_as(USER, self.camp.login).submit(a + [f"{self.dir}/train.sbatch"], self.env())
        self.jobs.append(job)
        self.note("submitted", job=job)

    # following

    def record(self) -> list[dict]:
        hroot = self.hroot
        p = hroot / "record.jsonl" if hroot else None
        out = []
        if p and p.exists():
            for line in p.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def current_job(self) -> Optional[int]:
        if self.launcher == "run":
            jobs = [f["job"] for f in self.record() if f.get("type") == "submitted"]
            for j in jobs:
                if j not in self.jobs:
                    self.jobs.append(j)
        return self.jobs[-1] if self.jobs else None

    def log_records(self) -> list[dict]:
        return checker.read_log(str(self.bed.path(self.log)))

    def trained(self) -> bool:
        return any(r["op"] == "done" for r in self.log_records())

    def stepping(self) -> bool:
        p = self.bed.path(self.log)
        return p.exists() and '"op": "step"' in p.read_text()

    def poll(self) -> None:
        if self.outcome is not None:
            return
        if self.launcher == "run":
            self.current_job()
            facts = self.record()
            last = next((f for f in reversed(facts) if f.get("type") in ("finished", "job")), {})
            if last.get("type") == "finished":  # of the generation that runs now
                if self.supersede_after(last):
                    return
                self.outcome = {"state": last["outcome"], "message": last.get("message", ""), "t": last["t"],
                                "by": "supervisor"}
                self.note("ended", state=self.outcome["state"], message=self.outcome["message"][:200])
            elif not self.bed.pids(self.camp.login, f"dispatch-slurm (run|supersede) {self.root}", user=USER):
                tail = (self.hdir / "sup.log").read_text()[-600:] if (self.hdir / "sup.log").exists() else ""
                self.note("supervisor exited without finishing; started again (as after a logout)", log=tail)
                self.start_supervisor(first=False)
            return
        job = self.current_job()
        if job is None:
            return
        j = self.camp.job(job)
        if j is None or not j.ended:
            if j is not None and j.state == "PENDING" and "held" in (j.reason or "").lower():
                self.note("Slurm holds the job; released, as its user would", job=job, reason=j.reason)
                self.bed.exec("ctl", ["scontrol", "release", str(job)], check=False)
            return
        if self.trained():
            self.outcome = {"state": "done", "message": f"job {job} ended {j.state}; the log says training finished",
                            "t": time.time(), "by": "user"}
            self.note("ended", state="done", job=job)
        elif len(self.jobs) > self.camp.params.resubmit or self.stuck():
            self.outcome = {"state": "failed", "message": f"no resubmission is left: the user gave up after "
                                                          f"{len(self.jobs)} jobs (the last {GIVE_UP} made no new step)",
                            "t": time.time(), "by": "user"}
            self.note("ended", state="failed", job=job)
        elif time.time() >= self.retry_at:
            # a user looks before resubmitting again: the longer, the more jobs in a row made no step
            idle = self.idle_jobs()
            if idle and self.retry_at == 0.0:
                self.retry_at = time.time() + 5.0 * idle
                return
            self.retry_at = 0.0
            self.note("job ended before training finished; resubmitted by its user", job=job, state=j.state)
            self.submit()

    def supersede_after(self, fin: dict) -> bool:
        """A run that failed on a refusal repeated before training (`run` names it and says
        to supersede once it is fixed): its user looks for up to a minute whether `latest`
        answers again (a person moved the stray entry out of pub/), and then supersedes, as
        the message says. True while the user is at it."""
        if fin["outcome"] != "failed" or "failed the same way before it" not in fin.get("message", ""):
            return False
        if fin["seq"] in self.superseded:  # until the supersession is in the record
            return time.time() < self.superseded[fin["seq"]] + 60
        if time.time() > fin["t"] + 60:
            return False
        if time.time() < self.retry_at:
            return True
        self.retry_at = time.time() + 2
        if self.bed.exec(self.camp.login, ["dispatch-slurm", "latest", self.root], user=USER, check=False).returncode == 2:
            return True
        self.superseded[fin["seq"]] = time.time()
        self.note("run failed on a refusal that went away; superseded, as its user would", message=fin["message"][:200])
        env = " ".join(f"{k}={v}" for k, v in self.env().items())
        self.bed.exec(self.camp.login, f"cd {self.dir} && env {env} setsid nohup dispatch-slurm supersede {self.root} "
                                       f"--poll 1 >> {self.dir}/sup.log 2>&1 < /dev/null &", user=USER)
        return True

    def idle_jobs(self) -> int:
        """How many of the last jobs, in a row, applied no step beyond what earlier ones had."""
        recs = self.log_records()
        best, idle = 0, 0
        for j in self.jobs:
            mine = [r["step"] for r in recs if r["op"] == "step" and r.get("job") == str(j)]
            if mine and max(mine) > best:
                best, idle = max(mine), 0
            else:
                idle += 1
        return idle

    def stuck(self) -> bool:
        """A user who resubmits by hand gives up after ``GIVE_UP`` jobs in a row without a new step."""
        return self.idle_jobs() >= GIVE_UP

    def running(self) -> tuple[Optional[int], list[str]]:
        """The current job and its nodes when it runs."""
        job = self.current_job()
        if job is None or self.outcome is not None:
            return None, []
        j = self.camp.job(job)
        if j is None or j.state != "RUNNING":
            return job, []
        return job, list(j.nodes)

    def stop(self, why: str) -> None:
        """The deadline: stop supervising and cancel."""
        if self.launcher == "run":
            self.bed.exec(self.camp.login, ["dispatch-slurm", "stop", self.root, "-m", why], user=USER, check=False)
        for job in self.jobs:
            self.bed.exec("ctl", ["scancel", str(job)], check=False)
        if self.outcome is None:
            self.outcome = {"state": "unfinished", "message": why, "t": time.time(), "by": "campaign"}


@dataclass
class RunState:
    seed: int
    setup: Setup
    schedule: list[Fault]
    id: str
    sides: list[Side] = field(default_factory=list)
    t0: float = 0.0


class Campaign:
    def __init__(self, bed, params: Params, say: Callable[[str], None], keep: Optional[Path] = None,
                 suite: str = "trixie", readme: Optional[Path] = None):
        self.bed, self.params, self.say, self.keep, self.suite = bed, params, say, keep, suite
        self.hf = HOST_SITE in getattr(bed, "volumes", {}).values()
        self.job_script = readme_job_script(readme or README)
        ok = bed.exec("db", ["sinfo", "-h"], user=USER, check=False).returncode == 0
        self.login = "db" if ok else "ctl"  # a login node of its own, when Slurm's clients work there
        conf = bed.slurm.config()
        for key, attr in (("MinJobAge", "min_job_age"), ("SlurmdTimeout", "slurmd_timeout")):
            value = str(conf.get(key) or "").split()  # "180 sec"
            if value and value[0].isdigit():
                setattr(self.params, attr, float(value[0]))
        bed.path("campaign").mkdir(exist_ok=True)
        bed.path("campaign").chmod(0o1777)
        if hasattr(bed, "kill"):
            self.pin_addresses()

    def job(self, job: int):
        """The job as Slurm says (None when neither slurmctld nor sacct knows it, or slurmctld
        did not answer for a minute: restarting, or busy)."""
        deadline = time.time() + 60
        while True:
            try:
                return self.bed.slurm.job(job)
            except SlurmError:
                if time.time() > deadline:
                    return None
                time.sleep(1)

    def pin_addresses(self) -> None:
        """Every host's address in every container's /etc/hosts. Docker's DNS forgets a stopped
        container's name, which a real crashed node keeps; slurmctld (22.05) then blocks on a
        name it cannot resolve, and nothing answers until the node is back."""
        hosts = ["db", "ctl", *self.bed.node_names]
        addr = {}
        for h in hosts:
            c = self.bed._container(h)
            c.reload()
            ips = [n.get("IPAddress") for n in c.attrs["NetworkSettings"]["Networks"].values() if n.get("IPAddress")]
            if ips:
                addr[h] = ips[0]
        lines = "".join(f"{ip}\t{h}\t# pinned by the campaign\n" for h, ip in addr.items())
        for h in hosts:
            if h in addr:
                self.bed.exec(h, f"grep -v 'pinned by the campaign' /etc/hosts > /tmp/hosts.campaign; "
                                 f"printf '%s' {shlex.quote(lines)} >> /tmp/hosts.campaign; "
                                 "cat /tmp/hosts.campaign > /etc/hosts", check=False)

    def wait_controller(self) -> None:
        self.bed.wait_until(lambda: self.bed.exec("ctl", ["scontrol", "ping"], check=False).returncode == 0,
                            timeout=120, what="slurmctld to answer after its restart", poll=1)

    def run_one(self, seed: int, modes: tuple[str, ...], fixed: Optional[dict] = None) -> dict:
        setup = setup_for(seed, fixed, hf=self.hf)
        schedule = schedule_for(seed, self.params)
        run = RunState(seed, setup, schedule, f"run-{seed}-{int(time.time())}")
        run.sides = [Side(self, run, m) for m in modes]
        self.say(f"run {seed}: {setup.label()}, {len(schedule)} faults: "
                 + ", ".join(f"{f.kind}@{f.at:.0f}s" for f in schedule))
        for s in run.sides:
            s.prepare()
        for s in run.sides:
            s.start()
        nemesis = Nemesis(self, run)
        t_start = time.time()
        def stepping() -> bool:
            for s in run.sides:
                s.poll()
            return all(s.stepping() or s.outcome for s in run.sides)
        try:
            self.bed.wait_until(stepping, timeout=300, what=f"run {seed}: every mode's first step", poll=1)
        except ClusterError as e:
            self.say(str(e))
        run.t0 = time.time()
        nemesis.start()
        deadline = t_start + self.params.deadline_s
        while any(s.outcome is None for s in run.sides) and time.time() < deadline:
            for s in run.sides:
                try:
                    s.poll()
                except (ClusterError, SlurmError) as e:
                    self.say(f"run {seed} {s.mode}: polling: {e}")
            time.sleep(1)
        for s in run.sides:
            if s.outcome is None:
                s.stop(f"the campaign's deadline ({self.params.deadline_s:.0f}s) passed")
        nemesis.finish()
        self.settle(run)
        return self.judge(run, nemesis)

    def settle(self, run: RunState) -> None:
        """Every job of the run ended, its processes gone, every node back and idle or in use."""
        jobs = [j for s in run.sides for j in s.jobs]
        for j in jobs:
            info = self.job(j)
            if info is not None and not info.ended:
                self.bed.exec("ctl", ["scancel", str(j)], check=False)
        self.bed.exec("ctl", ["scancel", "-u", "bob"], check=False)
        try:
            self.bed.wait_until(lambda: all((self.job(j) is None or self.job(j).ended) for j in jobs), timeout=240,
                                what=f"run {run.seed}: its jobs to end", poll=2)
        except ClusterError as e:
            self.say(str(e))
        for s in run.sides:
            for n in self.bed.node_names:
                try:
                    left = self.bed.pids(n, s.marker)
                except ClusterError:
                    continue
                if left:
                    s.note("trainer processes outlived their jobs; killed", node=n, pids=left)
                    self.bed.exec(n, ["kill", "-9", *map(str, left)], check=False)
        for n in self.bed.node_names:  # a drained node is a finding and would starve the next run
            try:
                info = self.bed.node(n)
            except (SlurmError, ClusterError):
                continue
            if "DRAIN" in info.state:
                run.sides[0].note("node drained; resumed", node=n, reason=getattr(info, "reason", ""))
                self.bed.exec("ctl", ["scontrol", "update", f"nodename={n}", "state=resume"], check=False)
        try:
            self.bed.wait_nodes(lambda ns: all("IDLE" in n.state or "ALLOCATED" in n.state or "MIXED" in n.state
                                               for n in ns), timeout=300, what="every node back")
        except ClusterError as e:
            self.say(str(e))

    # judging

    def sacct(self, side: Side) -> str:
        path = side.hdir / "sacct.json"
        if side.jobs:
            res = self.bed.exec("ctl", ["sacct", "-D", "-X", "--json", "-j", ",".join(map(str, side.jobs))],
                                check=False)
            path.write_text(res.stdout if res.returncode == 0 else '{"jobs": []}')
        else:
            path.write_text('{"jobs": []}')
        return str(path)

    def checker_run(self, side: Side, applied: list[Applied]) -> checker.Run:
        s, p = side.run.setup, self.params
        faults = [{"kind": a.kind, "t0": a.t0, "t1": a.t1 or a.t0, "jobs": list(a.jobs.values()), "nodes": a.nodes}
                  for a in applied if not a.missed]
        return checker.Run(
            mode=side.mode, trainer="hf" if s.trainer == "hf" else "det",
            max_steps=p.hf_steps if s.trainer == "hf" else p.steps, save_every=p.save_every, step_time=p.step_time,
            ranks=s.ranks, seed=side.run.seed % 1000, trap=side.trap, trainer_log=str(side.bed.path(side.log)),
            sacct=self.sacct(side), root=str(side.hroot) if side.hroot else None, root_in_cluster=side.root,
            folder=str(side.bed.path(side.shared)) if side.shared else None, folder_in_cluster=side.shared,
            lead_s=p.lead_s if s.signal else 0.0, outcome=side.outcome or {}, faults=faults,
            reference=self.hf_reference(side.run.seed % 1000) if s.trainer == "hf" else None)

    def judge(self, run: RunState, nemesis: Nemesis) -> dict:
        result: dict[str, Any] = {"seed": run.seed, "id": run.id, "setup": asdict(run.setup), "label": run.setup.label(),
                                  "schedule": [asdict(f) for f in run.schedule],
                                  "faults": [asdict(a) for a in nemesis.applied], "nemesis_errors": nemesis.errors,
                                  "modes": {}}
        for side in run.sides:
            crun = self.checker_run(side, nemesis.applied)
            found = checker.check(crun)
            g = measured_goodput(crun, sum(1 for a in nemesis.applied if not a.missed), self.params)
            est = None
            if side.hroot is not None and (side.hroot / "pub").exists():
                est = report_estimate(str(side.hroot))
            replay = replay_command(self.suite, run.seed, side.mode, setup=self.fixed_text,
                                    steps=self.params.steps if self.params.steps != Params.steps else None,
                                    kinds=self.params.kinds)
            result["modes"][side.mode] = {
                "outcome": side.outcome, "jobs": side.jobs, "events": side.events,
                "anomalies": checker.as_dicts(found), "goodput": g, "report_estimate": est, "replay": replay,
                "check": asdict(crun),
                "faults_hit": sum(1 for a in nemesis.applied if not a.missed)}
            for cls in sorted({a.cls for a in found}):
                same = [a for a in found if a.cls == cls]
                more = f" (and {len(same) - 1} more)" if len(same) > 1 else ""
                self.say(f"ANOMALY seed={run.seed} mode={side.mode} class={cls}: {same[0].detail}{more}\n"
                         f"  replay: {replay}")
            if self.keep and (found or side.events):
                dst = self.keep / run.id / side.mode
                shutil.copytree(side.hdir, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("barrier"))
                if side.hroot and side.hroot.exists():
                    shutil.copytree(side.hroot, dst / "root", dirs_exist_ok=True)
                if side.shared:
                    hs = side.bed.path(side.shared)
                    if hs.exists():
                        shutil.copytree(hs, dst / "shared", dirs_exist_ok=True)
        if self.plot_dir is not None:
            try:
                plot_run(result, run, self.plot_dir / f"{run.id}.png")
                result["plot"] = str(self.plot_dir / f"{run.id}.png")
            except Exception as e:  # a picture must not lose the run's verdict
                self.say(f"run {run.seed}: plot failed: {e}")
        shutil.rmtree(self.bed.path(f"{FS}/{run.id}"), ignore_errors=True)
        return result

    plot_dir: Optional[Path] = None
    fixed_text = ""  # the --setup given, for the replay command
    _hf_refs: dict = {}

    def hf_reference(self, seed: int) -> Optional[str]:
        """The uninterrupted Hugging Face run's final digest for this seed: one job, once."""
        if seed in self._hf_refs:
            return self._hf_refs[seed]
        d = "/checkpoints/campaign/hf-reference"
        hd = self.bed.path(d)
        hd.mkdir(exist_ok=True)
        hd.chmod(0o1777)
        p = self.params
        trainer = f"{IMAGE_TESTBED}/hftrain.py"
        args = ["--naive", "--output-dir", f"{d}/out-{seed}", "--max-steps", str(p.hf_steps), "--save-every",
                str(p.save_every), "--step-time", "0", "--seed", str(seed), "--log", f"{d}/{seed}.jsonl"]
        (hd / f"train-{seed}.py").write_text(wrapper(trainer, args, HOST_SITE))
        job = self.bed.submit(USER, args=["-N1", "-n1", "-o", f"{d}/{seed}.out", "--wrap",
                                          f"python3 {d}/train-{seed}.py"])
        self.bed.wait_job(job, lambda j: j.ended, timeout=900, poll=2)
        done = [r for r in checker.read_log(str(hd / f"{seed}.jsonl")) if r["op"] == "done"]
        self._hf_refs[seed] = done[-1]["h"] if done else None
        if not done:
            self.say(f"the Hugging Face reference run for seed {seed} did not finish: "
                     f"{(hd / f'{seed}.out').read_text()[-1500:] if (hd / f'{seed}.out').exists() else ''}")
        return self._hf_refs[seed]


def run(*, suite: str, profile: str, setup_text: str = "", seed: int, runs: Optional[int], faults: Optional[int], duration: Optional[float],
        modes: tuple[str, ...], fixed: dict, params: Params, say: Callable[[str], None],
        plot_dir: Optional[Path] = None, keep: Optional[Path] = None, tracking: Optional[str] = None,
        results: Optional[list] = None, each: Callable[[], None] = lambda: None) -> list[dict]:
    """Start a docker-slurm cluster and run seeds ``seed, seed+1, ...`` until ``runs`` runs,
    ``faults`` faults applied, or ``duration`` seconds, whichever comes first; each run's
    result is appended to ``results`` and ``each`` called (results survive an interrupt)."""
    from support import host_torch

    from .cluster import Cluster
    cluster = Cluster(suite, profile, log=say, tracking=tracking, volumes=host_torch(suite), tmpfs={FS: FS_MIB})
    cluster.start()
    results = [] if results is None else results
    try:
        camp = Campaign(cluster, params, say, keep=keep, suite=suite)
        camp.plot_dir = plot_dir
        camp.fixed_text = setup_text
        t_end = time.time() + duration if duration else None
        applied, i = 0, 0
        while True:
            if runs is not None and i >= runs:
                break
            if runs is None and faults is not None and applied >= faults:
                break
            if t_end is not None and time.time() >= t_end:
                break
            r = camp.run_one(seed + i, modes, fixed)
            results.append(r)
            each()
            applied += sum(1 for a in r["faults"] if not a["missed"])
            i += 1
    finally:
        cluster.stop()
    return results
