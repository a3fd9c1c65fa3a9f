"""Timeline outputs: Chrome trace JSON (Perfetto, chrome://tracing) and a Gantt chart PNG.

Events are the dicts of ``SimulationResult.timeline`` (rank, thread, name, start_s, end_s,
category); the executor's measured timelines use the same shape, so one function draws both and
a simulated and a measured run can be compared side by side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

THREADS = {"compute": 0, "comm": 1}
COLORS = {
    "F": "#4C72B0", "B": "#DD8452", "I": "#DD8452", "W": "#55A868", "optimizer": "#8172B3",
    "p2p": "#937860", "dp": "#C44E52", "tp": "#DA8BC3", "swap": "#8C8C8C", "overhead": "#BBBBBB",
}


def chrome_trace(events: Sequence[dict[str, Any]], label: str = "mindpipe") -> dict[str, Any]:
    """Chrome trace-event document: one process per rank, compute and communication threads."""
    out: list[dict[str, Any]] = []
    ranks = sorted({int(e["rank"]) for e in events})
    for r in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"{label} rank {r}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for thread, tid in THREADS.items():
            out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": thread}})
    for e in events:
        out.append({
            "ph": "X",
            "name": e["name"],
            "cat": e.get("category", ""),
            "pid": int(e["rank"]),
            "tid": THREADS.get(e.get("thread", "compute"), 0),
            "ts": float(e["start_s"]) * 1e6,
            "dur": max(float(e["end_s"]) - float(e["start_s"]), 0.0) * 1e6,
        })
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(events: Sequence[dict[str, Any]], path: str | os.PathLike[str], label: str = "mindpipe") -> None:
    """Write :func:`chrome_trace` to ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(chrome_trace(events, label)), encoding="utf-8")


def draw_gantt(ax: Any, events: Sequence[dict[str, Any]], title: str = "") -> None:
    """Draw a Gantt chart on a matplotlib Axes: a row per rank, compute above communication."""
    ranks = sorted({int(e["rank"]) for e in events})
    row = {r: i for i, r in enumerate(ranks)}
    for e in events:
        y = row[int(e["rank"])]
        comm = e.get("thread") == "comm"
        height, off = (0.3, -0.35) if comm else (0.6, 0.0)
        start, end = float(e["start_s"]), float(e["end_s"])
        cat = e.get("category", "F")
        ax.broken_barh([(start, end - start)], (y + off - height / 2 + (0.15 if not comm else 0.0), height),
                       facecolors=COLORS.get(cat, "#999999"), edgecolor="white", linewidth=0.2)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    if title:
        ax.set_title(title)


def write_gantt(events: Sequence[dict[str, Any]], path: str | os.PathLike[str], title: str = "") -> None:
    """Save a Gantt chart PNG of ``events`` (matplotlib, Agg backend)."""
    write_gantts([(events, title)], path)


def write_gantts(panels: Sequence[tuple[Sequence[dict[str, Any]], str]], path: str | os.PathLike[str]) -> None:
    """Save Gantt charts stacked on one time axis (e.g. measured above simulated) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [max(len({int(e["rank"]) for e in events}), 1) for events, _ in panels]
    legend_in = 0.45  # a strip of its own under the time axis, so it hides neither actions nor the axis label
    height = sum(1.0 + 0.6 * r for r in rows) + legend_in
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, height), sharex=True,
                             gridspec_kw={"height_ratios": rows}, squeeze=False)
    for ax, (events, title) in zip(axes[:, 0], panels, strict=True):
        draw_gantt(ax, events, title)
    cats = sorted({e.get("category", "F") for events, _ in panels for e in events})
    fig.legend(handles=[Patch(color=COLORS.get(c, "#999999"), label=c) for c in cats], loc="lower center",
               fontsize="small", ncol=len(cats), frameon=False)
    fig.tight_layout(rect=(0.0, legend_in / height, 1.0, 1.0))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["chrome_trace", "draw_gantt", "write_chrome_trace", "write_gantt", "write_gantts"]
