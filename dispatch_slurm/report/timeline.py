"""The report as a picture: one row per execution on a shared time axis, because people
see an overlap on a timeline faster than they find it in JSON (needs matplotlib, the
`plot` extra)."""

from __future__ import annotations

from ..errors import DispatchError


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DispatchError("--plot needs matplotlib: pip install 'dispatch-slurm[plot]'") from None
    return plt


def plot(r: dict, path: str) -> None:
    """A PNG: per execution, a bar from its start to its last write, its publications
    (ticks, labelled with the step), signals (red x), its end as Slurm or its events
    said (a dashed line), and the holds (shaded) with their cessation answers."""
    plt = _pyplot()
    execs = r["executions"]
    t0 = min((e["started_at"] for e in execs if e["started_at"] is not None), default=0.0)
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.7 * max(1, len(execs))))
    for row, e in enumerate(execs):
        if e["started_at"] is not None and e["last_write_at"] is not None:
            ax.barh(row, e["last_write_at"] - e["started_at"], left=e["started_at"] - t0, height=0.45,
                    color="tab:blue", alpha=0.35)
        for p in e["publications"]:
            if p["t"] is not None:
                ax.plot(p["t"] - t0, row, "|", color="black", markersize=14)
                ax.annotate(str(p["step"]), (p["t"] - t0, row + 0.28), fontsize=6, ha="center")
        for s in e["signals"]:
            ax.plot(s["t"] - t0, row, "x", color="red", markersize=9)
        if e["ended"] is not None and e["ended"].get("at") is not None:
            ax.vlines(e["ended"]["at"] - t0, row - 0.35, row + 0.35, colors="darkred", linestyles="dashed")
            ax.annotate(e["ended"]["state"], (e["ended"]["at"] - t0, row - 0.42), fontsize=7, color="darkred")
    for h in r["holds"]:
        end = h["released"]["t"] if h["released"] else max((a["t"] for a in h["answers"]), default=h["from"])
        ax.axvspan(h["from"] - t0, end - t0, color="orange", alpha=0.15)
        for a in h["answers"]:
            ax.plot(a["t"] - t0, -0.6, "o", color="green" if a["answer"] == "ceased" else "orange", markersize=4)
    ax.set_yticks(range(len(execs)), [f"{e['attempt']}\n{e['ended']['state'] if e['ended'] else ''}"
                                      for e in execs], fontsize=7)
    ax.set_ylim(-0.9, len(execs) - 0.3)
    ax.invert_yaxis()
    ax.set_xlabel("seconds after the first execution started  (bar: start to last write; |: publication with "
                  "its step; x: signal; dashed: ended; shaded: hold)")
    ax.set_title(f"{r['root']}: {len(execs)} executions, {len(r['publications'])} publications", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")  # a PNG whatever the name ends with (the help says so)
    plt.close(fig)
