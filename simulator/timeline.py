"""Timeline outputs: Chrome trace JSON (Perfetto, chrome://tracing) and a Gantt chart PNG.

Events are :class:`~mindpipe.traces.chrome_trace.TimelineEvent` records (``SimulationResult.timeline``);
the executor's measured timelines are made of the same records, so one function draws both and
a simulated and a measured run can be compared side by side. The Chrome-trace writer is
:mod:`mindpipe.traces.chrome_trace` (the executor writes it too), re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mindpipe.traces.atomic import save_figure
from mindpipe.traces.chrome_trace import TimelineEvent, chrome_trace, write_chrome_trace

COLORS = {
    "F": "#4C72B0", "B": "#DD8452", "I": "#DD8452", "W": "#55A868", "optimizer": "#8172B3", "copy": "#CCB974",
    "p2p": "#937860", "dp": "#C44E52", "tp": "#DA8BC3", "swap": "#8C8C8C", "overhead": "#BBBBBB",
}


def draw_gantt(ax: Any, events: Sequence[TimelineEvent], title: str = "") -> None:
    """Draw a Gantt chart on a matplotlib Axes: a row per rank, compute above communication."""
    ranks = sorted({e.rank for e in events})
    row = {r: i for i, r in enumerate(ranks)}
    # One broken_barh (one PolyCollection) per row, thread and category, not one per event: drawing
    # stays linear in the events with a small constant (a call per event took minutes for 10^5 events).
    bars: dict[tuple[int, bool, str], list[tuple[float, float]]] = {}
    for e in events:
        key = (row[e.rank], e.thread == "comm", e.category)
        bars.setdefault(key, []).append((e.start_s, e.end_s - e.start_s))
    for (y, comm, cat), spans in bars.items():
        height, off = (0.3, -0.35) if comm else (0.6, 0.0)
        ax.broken_barh(spans, (y + off - height / 2 + (0.15 if not comm else 0.0), height),
                       facecolors=COLORS.get(cat, "#999999"), edgecolor="white", linewidth=0.2)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    if title:
        ax.set_title(title)


def write_gantt(events: Sequence[TimelineEvent], path: str | os.PathLike[str], title: str = "") -> None:
    """Save a Gantt chart PNG of ``events`` (matplotlib, Agg backend)."""
    write_gantts([(events, title)], path)


def write_gantts(panels: Sequence[tuple[Sequence[TimelineEvent], str]], path: str | os.PathLike[str]) -> None:
    """Save Gantt charts stacked on one time axis (e.g. measured above simulated) as a PNG (or the
    image format the file name ends with), through :func:`mindpipe.traces.atomic.save_figure`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [max(len({e.rank for e in events}), 1) for events, _ in panels]
    legend_in = 0.45  # a strip of its own under the time axis, so it hides neither actions nor the axis label
    height = sum(1.0 + 0.6 * r for r in rows) + legend_in
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, height), sharex=True,
                             gridspec_kw={"height_ratios": rows}, squeeze=False)
    for ax, (events, title) in zip(axes[:, 0], panels, strict=True):
        draw_gantt(ax, events, title)
    cats = sorted({e.category for events, _ in panels for e in events})
    fig.legend(handles=[Patch(color=COLORS.get(c, "#999999"), label=c) for c in cats], loc="lower center",
               fontsize="small", ncol=len(cats), frameon=False)
    fig.tight_layout(rect=(0.0, legend_in / height, 1.0, 1.0))
    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)


__all__ = ["chrome_trace", "draw_gantt", "write_chrome_trace", "write_gantt", "write_gantts"]
