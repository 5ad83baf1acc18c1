"""What the campaign prints: the summary table, the evidence's lines, a run's timeline."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from dispatch_slurm.report import goodput

from .. import checker
from .judge import _quick_run, lineage

if TYPE_CHECKING:
    from .runs import RunState


def summarize(results: list[dict]) -> str:
    lines = []
    kinds: dict[str, int] = {}
    classes: dict[str, dict[str, int]] = {}
    gp: dict[str, list[dict]] = {}
    for r in results:
        for a in r["faults"]:
            if not a["missed"]:
                kinds[a["kind"]] = kinds.get(a["kind"], 0) + 1
        for mode, m in r["modes"].items():
            for a in m["anomalies"]:
                classes.setdefault(mode, {}).setdefault(a["cls"], 0)
                classes[mode][a["cls"]] += 1
            if m["goodput"].get("goodput") is not None:
                gp.setdefault(mode, []).append(m["goodput"])
    head = f"{'seed':>6} {'setup':<36} {'faults':>6}  " + "  ".join(f"{m:<34}" for m in ("dispatch", "naive"))
    lines += [head, "-" * len(head)]
    for r in results:
        cells = []
        for mode in ("dispatch", "naive"):
            m = r["modes"].get(mode)
            if m is None:
                cells.append(f"{'-':<34}")
                continue
            g = m["goodput"].get("goodput")
            an = ",".join(sorted({a["cls"] for a in m["anomalies"]})) or "ok"
            cells.append(f"{(m['outcome'] or {}).get('state', '?'):<8} {'' if g is None else f'{100 * g:4.0f}%':>5} "
                         f"{an[:19]:<19}")
        n = sum(1 for a in r["faults"] if not a["missed"])
        lines.append(f"{r['seed']:>6} {r['label'][:36]:<36} {n:>6}  " + "  ".join(cells))
    lines += ["", "faults applied: " + (", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none")
              + f" ({sum(kinds.values())} in all)"]
    for mode in ("dispatch", "naive"):
        if mode in {m for r in results for m in r["modes"]}:
            cl = classes.get(mode, {})
            lines.append(f"anomalies, {mode}: " + (", ".join(f"{k} {v}" for k, v in sorted(cl.items())) or "none"))
    for mode, gs in sorted(gp.items()):
        wall = sum(g["wall_s"] for g in gs)
        b = {k: sum(g["buckets"][k] for g in gs) for k in goodput.BUCKETS}
        preds = [g["prediction"] for g in gs if g.get("prediction")]
        dalys = [x["daly"] for x in preds if x["daly"] is not None]
        youngs = [x["young"] for x in preds if x["young"] is not None]
        daly = statistics.mean(dalys) if dalys else None
        young = statistics.mean(youngs) if youngs else None
        lines.append(f"goodput, {mode}: {100 * b['productive'] / wall:.1f}% of {wall:.0f}s; "
                     + ", ".join(f"{k} {100 * v / wall:.1f}%" for k, v in b.items() if k != "productive")
                     + (f"; Young {100 * young:.1f}%, Daly {100 * daly:.1f}% predicted"
                        if daly is not None and young is not None else ""))
    return "\n".join(lines)


def _totals(results: list[dict], mode: str) -> dict:
    """One mode's sums over a campaign: runs, ends, anomalies by class, goodput's buckets."""
    ms = [r["modes"][mode] for r in results if mode in r["modes"]]
    gs = [m["goodput"] for m in ms if m["goodput"].get("goodput") is not None]
    wall = sum(g["wall_s"] for g in gs) or 1.0
    preds = [g["prediction"] for g in gs if g.get("prediction")]
    classes: dict[str, list[int]] = {}
    for r in results:
        for a in r["modes"].get(mode, {}).get("anomalies", []):
            seeds = classes.setdefault(a["cls"], [])
            if r["seed"] not in seeds:
                seeds.append(r["seed"])
    ends: dict[str, int] = {}
    for m in ms:
        state = (m["outcome"] or {}).get("state", "?")
        ends[state] = ends.get(state, 0) + 1
    events: dict[str, int] = {}
    for m in ms:
        for e in m["events"]:
            if e["what"] not in ("ended", "submitted") and not e["what"].startswith("job ended before"):
                events[e["what"]] = events.get(e["what"], 0) + 1
    return {"runs": len(ms), "ends": ends, "classes": classes, "wall": wall,
            "buckets": {k: sum(g["buckets"][k] for g in gs) / wall for k in goodput.BUCKETS},
            "young": statistics.mean(x["young"] for x in preds) if preds else None,
            "daly": statistics.mean(x["daly"] for x in preds) if preds else None, "events": events}


def seed_ranges(seeds: list[int]) -> str:
    """``1000-1030, 1100-1131``: sorted seeds as runs of consecutive numbers (campaigns
    merged by ``--from-json`` each start at their own seed)."""
    out: list[list[int]] = []
    for s in sorted(seeds):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in out)


def evidence(results: list[dict]) -> str:
    """The campaign as docs/evidence.md's table (markdown): faults by kind, ends and anomalies
    by class per mode (with the seeds that showed each), goodput and its buckets beside
    Young/Daly's prediction."""
    kinds: dict[str, int] = {}
    for r in results:
        for a in r["faults"]:
            if not a["missed"]:
                kinds[a["kind"]] = kinds.get(a["kind"], 0) + 1
    seeds = sorted(r["seed"] for r in results)
    modes = [m for m in ("dispatch", "naive") if any(m in r["modes"] for r in results)]
    t = {m: _totals(results, m) for m in modes}
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    rows = [("runs (seeds)", {m: f"{t[m]['runs']} ({seed_ranges(seeds)})" if seeds else "0" for m in modes}),
            ("setups", {m: str(len({r["label"] for r in results})) for m in modes}),
            ("faults applied", {m: f"{sum(kinds.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
                                for m in modes}),
            ("how runs ended", {m: ", ".join(f"{k} {v}" for k, v in sorted(t[m]["ends"].items())) for m in modes}),
            ("anomalies by class (seeds)", {m: "; ".join(f"{k}: {len(v)} runs ({', '.join(map(str, v[:8]))}"
                                                         f"{', ...' if len(v) > 8 else ''})"
                                                         for k, v in sorted(t[m]["classes"].items())) or "none"
                                            for m in modes}),
            ("goodput (productive steps / wall)", {m: f"**{pct(t[m]['buckets']['productive'])}** of "
                                                      f"{t[m]['wall'] / 60:.0f} min" for m in modes}),
            ("badput: save / recomputed / restore / queue / restart",
             {m: " / ".join(pct(t[m]["buckets"][k]) for k in goodput.BUCKETS[1:]) for m in modes}),
            ("Young / Daly predicted (per run, mean)", {m: f"{pct(t[m]['young'])} / {pct(t[m]['daly'])}" for m in modes}),
            ("other events", {m: "; ".join(f"{k} {v}" for k, v in sorted(t[m]["events"].items())) or "none"
                              for m in modes})]
    out = ["| | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    out += [f"| {name} | " + " | ".join(v[m].replace("|", "/") for m in modes) + " |" for name, v in rows]
    return "\n".join(out)


def plot_run(result: dict, run: RunState, path: Path) -> None:
    """Per mode (naive above dispatch): each execution a bar on its node's row, its steps
    in the final state solid and its recomputed steps hatched, saves as ticks (dispatch: the
    publications), each resume an arrow from the save it loaded, faults as shaded spans."""
    from dispatch_slurm.report.timeline import _pyplot
    plt = _pyplot()
    sides = sorted(run.sides, key=lambda s: s.mode != "naive")
    fig, axes = plt.subplots(len(sides), 1, figsize=(13, 2.2 + 1.6 * len(sides)), sharex=True, squeeze=False)
    t0 = run.t0 or min(s.started_at for s in sides)
    nodes = list(run.sides[0].bed.node_names)
    colors = plt.get_cmap("tab10")
    for ax, side in zip(axes[:, 0], sides):
        c = checker.Checker(_quick_run(side))
        keep = lineage(c.execs, c.rel)
        saves_at: dict[str, tuple[float, int]] = {}
        for i, ex in enumerate(c.execs):
            host = next((r.get("host") for r in ex.records if r.get("host")), None)
            row = nodes.index(host) if host in nodes else len(nodes)
            steps = ex.ops("step")
            col = colors(i % 10)
            ax.barh(row, ex.last_t - ex.first_t, left=ex.first_t - t0, height=0.5, color=col, alpha=0.25)
            for s in steps:
                if (ex.attempt, s["step"]) not in keep:
                    ax.barh(row, c.run.step_time, left=s["t"] - t0 - c.run.step_time, height=0.5, color="none",
                            hatch="////", edgecolor="red", linewidth=0)
            for w in ex.ops("save"):
                saves_at[c.rel(w["path"]) or ""] = (w["t"], row)
                if side.mode == "naive":
                    ax.plot(w["t"] - t0, row + 0.3, "|", color="black", markersize=7)
            for res in ex.ops("resume"):
                src = saves_at.get(c.rel(res["path"]) or "")
                if src:
                    ax.annotate("", xy=(res["t"] - t0, row), xytext=(src[0] - t0, src[1]),
                                arrowprops={"arrowstyle": "->", "color": col, "lw": 1})
        for p in c.pubs:
            owner = next((e for e in c.execs if p.path.startswith(f"exec/{e.attempt}/")), None)
            host = next((r.get("host") for r in owner.records if r.get("host")), None) if owner else None
            row = nodes.index(host) if host in nodes else len(nodes)
            ax.plot(p.made - t0, row + 0.3, "|", color="black", markersize=7)
        for a in result["faults"]:
            if a["missed"]:
                continue
            x0, x1 = a["t0"] - t0, (a["t1"] or a["t0"]) - t0
            ax.axvspan(x0, max(x1, x0 + 0.5), color="orange", alpha=0.15)
            ax.annotate(a["kind"], (x0, len(nodes) + 0.1), fontsize=7, rotation=30, color="darkorange")
        m = result["modes"].get(side.mode, {})
        g = (m.get("goodput") or {}).get("goodput")
        an = ", ".join(sorted({x["cls"] for x in m.get("anomalies", [])})) or "no anomaly"
        ax.set_title(f"{side.mode}: goodput {'-' if g is None else f'{100 * g:.0f}%'}; "
                     f"{(m.get('outcome') or {}).get('state', '?')}; {an}", fontsize=9)
        ax.set_yticks(range(len(nodes) + 1), nodes + ["?"], fontsize=8)
        ax.set_ylim(-0.7, len(nodes) + 0.7)
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("seconds after training began (bars: executions on their node; hatched: recomputed "
                           "steps; |: saves/publications; arrows: resumes from the save loaded; shaded: faults)")
    fig.suptitle(f"seed {run.seed}: {run.setup.label()}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
