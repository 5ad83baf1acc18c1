"""What a run is drawn from its seed: the setup (``setup_for``) and the schedule of faults
(``schedule_for``), and the command that replays it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional

from ..bed import ClusterError


#: setup axis -> its values, drawn in this order from the run's seed
AXES: dict[str, tuple] = {
    "trainer": ("handler", "own", "none", "hf"),
    "ranks": (1, 2),
    "output": ("default", "name", "literal", "append"),
    "launcher": ("run", "plugin"),
    "signal": (False, True),
    "gc": (0, 2),
}


#: fault kind -> (weight, duration range in seconds; (0, 0): instant)
KINDS: dict[str, tuple[float, tuple[float, float]]] = {
    "timelimit": (2.0, (0, 0)),        # scontrol update TimeLimit: the job's time limit, now
    "cancel": (2.0, (0, 0)),           # an admin's scancel
    "preempt": (2.0, (10, 30)),        # a higher-tier job wants the node for that long
    "requeue": (2.0, (0, 0)),          # scontrol requeue while the execution runs
    "partition": (2.0, (25, 70)),      # the node's traffic dropped, its processes running
    "partition-long": (0.5, (0, 0)),   # the same, longer than MinJobAge
    "crash": (1.5, (20, 60)),          # slurmd and the job's processes killed, the node back later
    "stall": (1.5, (5, 40)),           # SIGSTOP of a rank, SIGCONT later
    "enospc": (1.5, (10, 40)),         # the checkpoint filesystem full
    "ctld-restart": (1.0, (0, 0)),     # slurmctld stopped and started
    "stray": (1.0, (10, 40)),          # a stray file in pub/, removed by a person later
    "slurmd-stop": (1.5, (45, 90)),    # slurmd SIGSTOPped (a hung mount, memory pressure), the job's processes running
}


NODE_FAULTS = ("partition", "partition-long", "crash", "slurmd-stop")


#: kinds added since the long campaign, drawn on a generator of their own: a seed draws the
#: faults it drew before, but for those an added kind takes the place of (at its weight's share)
ADDED = ("slurmd-stop",)


GIVE_UP = 8  # a user who resubmits by hand gives up after this many jobs in a row without a new step


STRAYS = ("notes.txt", ".nfs000000000123abcd00000001", "00000000000001000000-00000000000000000100-MZXW6===")


@dataclass
class Setup:
    trainer: str
    ranks: int
    output: str
    launcher: str
    signal: bool
    gc: int

    def label(self) -> str:
        return (f"{self.trainer}/{self.ranks}r/{self.output}/{self.launcher}"
                f"{'/signal' if self.signal else ''}{f'/gc{self.gc}' if self.gc else ''}")


@dataclass
class Fault:
    at: float  # seconds after both modes took their first step
    kind: str
    duration: float
    pick: int  # which node, rank or stray name, among the candidates at that time


@dataclass
class Params:
    """Timings of a campaign (``--steps``, the profile's MinJobAge)."""

    steps: int = 480
    hf_steps: int = 240
    step_time: float = 0.25
    save_every: int = 20
    lead_s: int = 20  # --signal=TERM@lead
    min_job_age: float = 180.0
    slurmd_timeout: float = 15.0  # the profile's SlurmdTimeout: a slurmd-stop outlasts it
    deadline_s: float = 1500.0
    mean_gap_s: float = 25.0
    resubmit: int = 100
    kinds: Optional[tuple[str, ...]] = None  # draw faults among these kinds only (None: every kind)


def parse_setup(text: Optional[str]) -> dict[str, Any]:
    """``--setup trainer=own,ranks=2``: the axes to fix (the others are drawn)."""
    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        axis, _, value = part.partition("=")
        axis = axis.strip()
        if axis not in AXES:
            raise ClusterError(f"--setup: unknown axis {axis!r}: one of {', '.join(AXES)}")
        for v in AXES[axis]:
            if str(v).lower() == value.strip().lower() or (isinstance(v, bool) and value.strip() in ("0", "1")
                                                          and v == (value.strip() == "1")):
                out[axis] = v
                break
        else:
            raise ClusterError(f"--setup: {axis}={value!r} is not one of {', '.join(map(str, AXES[axis]))}")
    return out


def setup_for(seed: int, fixed: Optional[dict] = None, hf: bool = True) -> Setup:
    """The run's setup: every axis drawn from the seed (always all, in order, so fixing one
    axis leaves the others as they were), then ``fixed``, then what cannot go together:
    the Hugging Face trainer runs one rank and only where torch runs (``hf``); gc is
    ``run``'s (``--keep-last``)."""
    rng = random.Random(f"setup:{seed}")
    v = {axis: rng.choice(values) for axis, values in AXES.items()}
    spare = rng.choice(("handler", "own", "none"))
    v.update(fixed or {})
    if v["trainer"] == "hf" and not hf:
        if (fixed or {}).get("trainer") == "hf":
            raise ClusterError("--setup trainer=hf needs torch in the cluster: --suite bookworm (its Python 3.11 "
                               "runs this machine's torch)")
        v["trainer"] = spare
    if v["trainer"] == "hf":
        v["ranks"] = 1
    if v["launcher"] == "plugin":
        if (fixed or {}).get("gc"):
            raise ClusterError("--setup gc=2 needs launcher=run (gc is `run --keep-last`)")
        v["gc"] = 0
    return Setup(**v)


def schedule_for(seed: int, p: Params, n: Optional[int] = None) -> list[Fault]:
    """The run's faults: ``n`` (else 2..5, from the seed) of weighted kinds, the first 10-25 s
    after training began, then exponential gaps (mean ``p.mean_gap_s``, at least 3 s), so
    faults with durations overlap the next ones. A kind of ``ADDED`` replaces the one drawn
    at its weight's share, so every other fault of a seed stays what it was."""
    rng, later = random.Random(f"faults:{seed}"), random.Random(f"faults:{seed}:added")
    count = rng.randint(2, 5) if n is None else n
    kinds = [k for k in KINDS if (p.kinds is None or k in p.kinds) and k not in ADDED]
    added = [k for k in ADDED if p.kinds is None or k in p.kinds]
    weights, more = [KINDS[k][0] for k in kinds], [KINDS[k][0] for k in added]
    out, t = [], rng.uniform(10, 25)
    for _ in range(count):
        kind = rng.choices(kinds, weights)[0] if kinds else str(rng.random())
        if added and (not kinds or later.random() < sum(more) / (sum(weights) + sum(more))):
            kind = later.choices(added, more)[0]
        lo, hi = KINDS[kind][1]
        duration = p.min_job_age + rng.uniform(15, 45) if kind == "partition-long" else rng.uniform(lo, hi)
        if kind == "slurmd-stop":  # long enough for slurmctld to set the node DOWN, whatever the profile
            duration = max(duration, p.slurmd_timeout + 30)
        out.append(Fault(round(t, 1), kind, round(duration, 1), rng.randrange(1 << 16)))
        t += max(3.0, rng.expovariate(1 / p.mean_gap_s))
    return out


def replay_command(suite: str, seed: int, mode: str, setup: str = "", steps: Optional[int] = None,
                   kinds: Optional[tuple[str, ...]] = None) -> str:
    more = (f" --setup {setup}" if setup else "") + (f" --steps {steps}" if steps else "") + \
        "".join(f" --kind {k}" for k in kinds or ())
    return f"PYTHONPATH=tests python -m testbed campaign --suite {suite} --seed {seed} --runs 1 --mode {mode}{more}"


def plan(suite: str, seed: int, runs: Optional[int], faults: Optional[int], fixed: dict, p: Params) -> str:
    """What a campaign would run, one line per run, as if every fault hit (``--dry-run``;
    ``--duration`` alone: the first 100 runs)."""
    hf = suite == "bookworm"
    lines: list[str] = []
    total, kinds, setups = 0, dict[str, int](), set()
    for i in range(runs or 10_000):
        if runs is None and (total >= faults if faults else i >= 100):
            break
        s = setup_for(seed + i, fixed, hf=hf)
        sched = schedule_for(seed + i, p)
        total += len(sched)
        setups.add(s.label())
        for f in sched:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        lines.append(f"seed {seed + i}: {s.label()}: " + ", ".join(f"{f.kind}@{f.at:.0f}s" for f in sched))
    lines.append(f"{len(lines)} runs, {len(setups)} setups, {total} faults: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    return "\n".join(lines)
