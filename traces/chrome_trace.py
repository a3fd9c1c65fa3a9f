"""Chrome trace-event JSON (Perfetto, chrome://tracing) of a per-rank timeline.

Events are :class:`TimelineEvent` records: ``SimulationResult.timeline``, the executor's measured
timeline and a measured run's step (:func:`mindpipe.simulator.calibrate.runs.measured_events`) are
all lists of them, so a simulated and a measured run open side by side in the same viewer. The
record and the writer live with the data contracts because the simulator and the executor both
write them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mindpipe.traces.atomic import write_text

THREADS = {"compute": 0, "comm": 1}


@dataclass(frozen=True)
class TimelineEvent:
    """One span of a per-rank timeline.

    Attributes:
        rank: The pipeline rank (a timeline draws one representative pipeline) or the global rank
            (the executor's measured timeline).
        thread: ``compute`` (actions, copies, the optimizer) or ``comm`` (transfers and waits).
        name: Label, e.g. ``0F3`` or ``grad-reduce``.
        start_s, end_s: Seconds from the start of the iteration (or run).
        category: ``F``, ``B``, ``W``, ``p2p``, ``dp``, ``tp``, ``optimizer``, ... (the colour key).
        step: The training step (measured timelines only).
        chunk: Which of its rank's model chunks a compute action ran (0: the rank's lowest stage; 1:
            its second, under interleaved and V schedules), so the chunks can be told apart.
    """

    rank: int
    thread: Literal["compute", "comm"]
    name: str
    start_s: float
    end_s: float
    category: str
    step: int | None = None
    chunk: int = 0


def chunk_of(rank_stages: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """``(rank, stage) → chunk`` for :attr:`TimelineEvent.chunk`: a stage's position among its rank's
    stages, ascending (the simulator's ``Schedule.stages_of_rank`` order)."""
    by_rank: dict[int, set[int]] = {}
    for r, st in rank_stages:
        by_rank.setdefault(r, set()).add(st)
    return {(r, st): i for r, stages in by_rank.items() for i, st in enumerate(sorted(stages))}


def chrome_trace(events: Sequence[TimelineEvent], label: str = "mindpipe") -> dict[str, Any]:
    """Chrome trace-event document: one process per rank, compute and communication threads."""
    out: list[dict[str, Any]] = []
    ranks = sorted({e.rank for e in events})
    for r in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"{label} rank {r}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for thread, tid in THREADS.items():
            out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": thread}})
    for e in events:
        out.append({
            "ph": "X",
            "name": e.name,
            "cat": e.category,
            "pid": e.rank,
            "tid": THREADS[e.thread],
            "ts": e.start_s * 1e6,
            "dur": max(e.end_s - e.start_s, 0.0) * 1e6,
            **({"args": {"chunk": e.chunk}} if e.chunk else {}),
        })
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(events: Sequence[TimelineEvent], path: str | os.PathLike[str], label: str = "mindpipe") -> None:
    """Write :func:`chrome_trace` to ``path`` (parent folders are created)."""
    write_text(path, json.dumps(chrome_trace(events, label)), make_parents=True)


__all__ = ["THREADS", "TimelineEvent", "chrome_trace", "chunk_of", "write_chrome_trace"]
