"""Timeline outputs: Chrome trace JSON (Perfetto, chrome://tracing) and a Gantt chart PNG.

Events are :class:`~mindpipe.traces.chrome_trace.TimelineEvent` records (``SimulationResult.timeline``);
the executor's measured timelines are made of the same records, so one function draws both and
a simulated and a measured run can be compared side by side. The Chrome-trace writer is
:mod:`mindpipe.traces.chrome_trace` (the executor writes it too), re-exported here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from mindpipe.traces.atomic import figure, save_figure
from mindpipe.traces.chrome_trace import TimelineEvent, chrome_trace, write_chrome_trace

COLORS = {
    "F": "#4C72B0", "B": "#DD8452", "I": "#DD8452", "W": "#55A868", "optimizer": "#8172B3", "copy": "#CCB974",
    "p2p": "#937860", "dp": "#C44E52", "tp": "#DA8BC3", "swap": "#8C8C8C", "overhead": "#BBBBBB",
}


LEGEND_COLUMNS = 8
"""Legend entries per row under the chart."""
CHUNK_TINT = 0.5
"""How far a rank's second model chunk's colour is blended towards white (interleaved and V schedules)."""


def _colour(category: str, chunk: int) -> tuple[float, float, float]:
    """The category's colour, lighter for a later model chunk of the rank."""
    from matplotlib.colors import to_rgb

    rgb = to_rgb(COLORS.get(category, "#999999"))
    mix = 1.0 - (1.0 - CHUNK_TINT) ** chunk
    return tuple(c + (1.0 - c) * mix for c in rgb)  # type: ignore[return-value]


def _label(category: str, chunk: int, chunked: bool) -> str:
    return f"{category} (chunk {chunk + 1})" if chunked and category in ("F", "B", "I", "W") else category


COMPUTE_LANE = (-0.15, 0.5)
"""A rank's compute lane in its row: (bottom offset from the row's centre, height), in row units."""
COMM_LANE = (-0.37, 0.2)
"""Its communication lane, just above the compute lane (the y axis is inverted) and touching it, so a
transfer reads as its own rank's, not the rank above's (they were 0.05 row from each)."""

MIN_BAR_PX = 2.0
"""Narrowest drawn span, in pixels of the Axes at the figure's dpi: wide enough to cover one pixel whole
(antialiasing fades a narrower one into its neighbours), more at a higher saving dpi."""
THIN_BAR_PX = 3.0
"""Spans narrower than this are drawn without the white edge that separates wide ones."""


def _pixel_s(ax: Any, events: Sequence[TimelineEvent]) -> float:
    """Seconds per pixel of ``ax`` across the events' time range (0 when it has no width)."""
    t0, t1 = min(e.start_s for e in events), max(e.end_s for e in events)
    width = ax.get_window_extent().width
    return (t1 - t0) / width if t1 > t0 and width > 0 else 0.0


def _split_thin(spans: list[tuple[float, float]], px: float) -> tuple[list[tuple[float, float]],
                                                                       list[tuple[float, float]]]:
    """(wide spans, thin spans widened to :data:`MIN_BAR_PX` about their middle) for ``px`` seconds per pixel.

    A transfer of 2 ms on a 14 s axis is a fifth of a pixel: antialiased, and under a white edge of
    its own, it vanished except where it happened to straddle a pixel boundary, so p2p showed on
    some ranks in some windows only although every rank has hundreds.
    """
    least, thin_below = MIN_BAR_PX * px, THIN_BAR_PX * px
    wide = [(s, w) for s, w in spans if w >= thin_below]
    thin = [(s + w / 2 - max(w, least) / 2, max(w, least)) for s, w in spans if w < thin_below]
    return wide, thin


def draw_gantt(ax: Any, events: Sequence[TimelineEvent], title: str = "") -> None:
    """Draw a Gantt chart on a matplotlib Axes: a row per rank, compute above communication; a rank's
    later model chunks (interleaved, V schedules) in lighter shades of their action's colour.

    Every span is at least :data:`MIN_BAR_PX` wide, so short transfers stay visible on a long
    iteration (drawn over the wide spans of their row, without an edge).
    """
    ranks = sorted({e.rank for e in events})
    row = {r: i for i, r in enumerate(ranks)}
    # One broken_barh (one PolyCollection) per row, thread and category, not one per event: drawing
    # stays linear in the events with a small constant (a call per event took minutes for 10^5 events).
    bars: dict[tuple[int, bool, str, int], list[tuple[float, float]]] = {}
    for e in events:
        key = (row[e.rank], e.thread == "comm", e.category, e.chunk)
        bars.setdefault(key, []).append((e.start_s, e.end_s - e.start_s))
    px = _pixel_s(ax, events) if events else 0.0
    for (y, comm, cat, chunk), spans in bars.items():
        bottom, height = COMM_LANE if comm else COMPUTE_LANE
        where = (y + bottom, height)
        wide, thin = _split_thin(spans, px)
        colour = _colour(cat, chunk)
        if wide:
            ax.broken_barh(wide, where, facecolors=colour, edgecolor="white", linewidth=0.2)
        if thin:
            ax.broken_barh(thin, where, facecolors=colour, edgecolor="none", linewidth=0, zorder=2.5)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    if title:
        ax.set_title(title)


def write_gantt(events: Sequence[TimelineEvent], path: str | os.PathLike[str], title: str = "") -> None:
    """Save a Gantt chart PNG of ``events`` (matplotlib, without pyplot: :func:`~mindpipe.traces.atomic.figure`)."""
    write_gantts([(events, title)], path)


def write_gantts(panels: Sequence[tuple[Sequence[TimelineEvent], str]], path: str | os.PathLike[str]) -> None:
    """Save Gantt charts stacked on one time axis (e.g. measured above simulated) as a PNG (or the
    image format the file name ends with), through :func:`mindpipe.traces.atomic.save_figure`."""
    from matplotlib.patches import Patch

    rows = [max(len({e.rank for e in events}), 1) for events, _ in panels]
    keys = sorted({(e.category, e.chunk) for events, _ in panels for e in events})
    chunked = any(chunk for _, chunk in keys)
    ncol = max(min(len(keys), LEGEND_COLUMNS), 1)
    # A strip of its own under the time axis, so it hides neither actions nor the axis label.
    legend_in = 0.25 + 0.2 * math.ceil(len(keys) / ncol)
    height = sum(1.0 + 0.6 * r for r in rows) + legend_in
    fig, axes = figure(len(panels), 1, figsize=(12, height), sharex=True, gridspec_kw={"height_ratios": rows},
                       squeeze=False)
    for ax, (events, title) in zip(axes[:, 0], panels, strict=True):
        draw_gantt(ax, events, title)
    fig.legend(handles=[Patch(color=_colour(c, k), label=_label(c, k, chunked)) for c, k in keys], loc="lower center",
               fontsize="small", ncol=ncol, frameon=False)
    fig.tight_layout(rect=(0.0, legend_in / height, 1.0, 1.0))
    save_figure(fig, path, dpi=120)


__all__ = ["chrome_trace", "draw_gantt", "write_chrome_trace", "write_gantt", "write_gantts"]
