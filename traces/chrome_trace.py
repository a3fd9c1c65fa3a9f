"""Chrome trace-event JSON (Perfetto, chrome://tracing) of a per-rank timeline.

Events are dicts with ``rank``, ``thread`` (``compute`` or ``comm``), ``name``, ``start_s``,
``end_s`` and ``category``: the shape of ``SimulationResult.timeline`` and of the executor's
measured timeline, so a simulated and a measured run open side by side in the same viewer. The
writer lives with the data contracts because both the simulator and the executor write it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from mindpipe.traces.atomic import write_text

THREADS = {"compute": 0, "comm": 1}


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
    """Write :func:`chrome_trace` to ``path`` (parent folders are created)."""
    write_text(path, json.dumps(chrome_trace(events, label)), make_parents=True)


__all__ = ["THREADS", "chrome_trace", "write_chrome_trace"]
