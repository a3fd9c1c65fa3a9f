"""Chrome trace-event JSON, as ``torch.profiler`` (Kineto) writes it, reduced to what importers need.

A Chrome trace is ``{"traceEvents": [...], ...}`` or a bare list of events (the Trace Event Format,
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). Importers use the
complete (``"ph": "X"``) events with a start ``ts`` and a duration ``dur``, both in microseconds.
They are converted to integer nanoseconds: Kineto writes 3 decimals of µs (whole ns), and integers
make "range A contains event B" exact where float sums of epoch-sized timestamps are not.

GPU kernels run on a device timeline; :class:`KernelLaunches` links each kernel to the CPU-side
runtime call that launched it (``args.correlation``, as Kineto pairs them), so a kernel's time can
be charged to the CPU range that was open when it was launched.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import CHROME_TRACE, read_json

Thread = tuple[Any, Any]
"""``(pid, tid)``; Kineto uses integers for CPU threads and strings for some synthetic rows."""

RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
SPAN_CATS = ("user_annotation", "cpu_op", "kernel", *RUNTIME_CATS)
MODULE_PREFIX = "nn.Module: "


@dataclass(frozen=True)
class Span:
    """One complete event: ``name`` on ``thread`` from ``start`` for ``dur`` nanoseconds."""

    index: int
    name: str
    cat: str
    thread: Thread
    start: int
    dur: int
    args: dict[str, Any]

    @property
    def end(self) -> int:
        """End time (ns)."""
        return self.start + self.dur


def load_events(path: str | os.PathLike[str]) -> list[Any]:
    """Read a Chrome trace (plain or gzip'ed JSON) and return its list of events.

    The file goes through the reading layer (:mod:`mindpipe.traces.reading`): a regular file of
    at most the Chrome-trace size limit, gzip recognised by its magic bytes, strict numbers.

    Raises:
        ContractError: naming the file when it is missing, unreadable, not JSON or not a trace.
    """
    source = str(path)
    doc = read_json(path, CHROME_TRACE)
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    raise ContractError(
        source, "traceEvents", "not a Chrome trace: expected {\"traceEvents\": [...]} or a list of events"
    )


def _to_ns(value: Any) -> int | None:
    """A µs JSON number as integer ns, or None if it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        ns = float(value) * 1000.0
    except OverflowError:
        return None
    return round(ns) if math.isfinite(ns) else None


def _ns(value: Any, source: str, where: str, field: str) -> int:
    """Like :func:`_to_ns`, raising a ContractError that names the event and field."""
    ns = _to_ns(value)
    if ns is None:
        raise ContractError(source, f"{where}.{field}", f"{where}.{field} must be a finite number, got {value!r}"[:200])
    return ns


def _is_of_interest(event: Any) -> bool:
    if not isinstance(event, dict) or event.get("ph") != "X":
        return False
    cat, name = event.get("cat"), event.get("name")
    if cat == "python_function":
        return isinstance(name, str) and name.startswith(MODULE_PREFIX)
    return isinstance(cat, str) and cat in SPAN_CATS


def read_spans(events: Sequence[Any], source: str) -> list[Span]:
    """The complete events importers use (annotations, CPU ops, kernels, runtime calls, modules).

    Other events (metadata, flows, instants, other categories) are skipped, malformed or not; a
    malformed event of a used category is an error.

    Raises:
        ContractError: ``trace.json: traceEvents[12].dur: ... must be >= 0``.
    """
    spans: list[Span] = []
    for i, event in enumerate(events):
        if not _is_of_interest(event):
            continue
        where = f"traceEvents[{i}]"
        name, args = event.get("name"), event.get("args", {})
        if not isinstance(name, str):
            raise ContractError(source, f"{where}.name", f"{where}.name must be a string")
        if not isinstance(args, dict):
            raise ContractError(source, f"{where}.args", f"{where}.args must be an object")
        for key in ("pid", "tid"):
            value = event.get(key)
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ContractError(source, f"{where}.{key}", f"{where}.{key} must be an integer or a string")
        start = _ns(event.get("ts"), source, where, "ts")
        dur = _ns(event.get("dur"), source, where, "dur")
        if dur < 0:
            raise ContractError(source, f"{where}.dur", f"{where}.dur must be >= 0")
        spans.append(Span(i, name, event["cat"], (event["pid"], event["tid"]), start, dur, args))
    return spans


def int_arg(span: Span, key: str, source: str) -> int | None:
    """``span.args[key]`` as an integer, ``None`` if absent; ContractError if not an integer."""
    value = span.args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        where = f"traceEvents[{span.index}].args.{key}"
        raise ContractError(source, where, f"{where} must be an integer, got {value!r}"[:200])
    return value


def _order(spans: Iterable[Span]) -> list[Span]:
    # Start time, then longer first: an enclosing range precedes what it contains.
    return sorted(spans, key=lambda s: (str(s.thread), s.start, -s.end, s.index))


def outermost(spans: Iterable[Span]) -> list[Span]:
    """Spans not inside another of ``spans`` on the same thread."""
    out: list[Span] = []
    for s in _order(spans):
        if out and out[-1].thread == s.thread and s.start < out[-1].end:
            continue
        out.append(s)
    return out


def leaves(spans: Iterable[Span]) -> list[Span]:
    """Spans that contain no other of ``spans`` on the same thread (the innermost ranges)."""
    ordered = _order(spans)
    if not ordered:
        return []
    return [
        s
        for s, nxt in zip(ordered, [*ordered[1:], None], strict=True)
        if nxt is None or nxt.thread != s.thread or nxt.start >= s.end
    ]


class Ranges:
    """Disjoint ranges per thread, answering "which range contains [start, end]?" by bisection."""

    def __init__(self, spans: Iterable[Span]) -> None:
        self._by_thread: dict[Thread, list[Span]] = defaultdict(list)
        for s in outermost(spans):
            self._by_thread[s.thread].append(s)
        self._starts = {t: [s.start for s in ss] for t, ss in self._by_thread.items()}

    def find(self, thread: Thread, start: int, end: int) -> Span | None:
        """The range on ``thread`` that contains ``[start, end]``, if any."""
        starts = self._starts.get(thread)
        if not starts:
            return None
        i = bisect.bisect_right(starts, start) - 1
        if i < 0:
            return None
        s = self._by_thread[thread][i]
        return s if end <= s.end else None


class KernelLaunches:
    """GPU kernels indexed by where and when the CPU launched them.

    A kernel is linked to its launch by ``args.correlation`` (shared with the ``cuda_runtime`` /
    ``cuda_driver`` call), else by an ``ac2g`` flow (start at the launch, end bound to the kernel),
    else by ``args["External id"]`` to the CPU op that issued it. Unlinked kernels are counted. A
    trace whose launches on two processes share a correlation id (ranks merged into one file: each
    process numbers them from the same start) is refused, as its kernels cannot be linked.
    """

    def __init__(self, spans: Sequence[Span], events: Sequence[Any], source: str) -> None:
        runtime: dict[int, Span] = {}
        for s in spans:
            if s.cat in RUNTIME_CATS and (c := int_arg(s, "correlation", source)) is not None:
                if c in runtime and runtime[c].thread[0] != s.thread[0]:
                    # Each process numbers its correlation ids from the same start (ranks merged
                    # into one file): a kernel's id no longer says which process launched it.
                    where = f"traceEvents[{s.index}].args.correlation"
                    raise ContractError(source, where, (
                        f"{where}: correlation id {c} is used by CUDA launches of processes {runtime[c].thread[0]} "
                        f"and {s.thread[0]} (a trace merged from several ranks), so GPU kernels cannot be linked to "
                        "their launches: import each rank's trace on its own"))
                runtime[c] = s
        ops = {x: s for s in spans if s.cat == "cpu_op" if (x := int_arg(s, "External id", source)) is not None}
        flow_start: dict[Any, tuple[Thread, int]] = {}
        flow_end: dict[tuple[Thread, int], Any] = {}
        for e in events:  # ac2g flows are only a fallback: malformed ones are skipped silently
            if not (isinstance(e, dict) and e.get("cat") == "ac2g" and e.get("ph") in ("s", "f")):
                continue
            pid, tid, key, ts = e.get("pid"), e.get("tid"), e.get("id"), _to_ns(e.get("ts"))
            if ts is None or not all(isinstance(v, int | str) and not isinstance(v, bool) for v in (pid, tid, key)):
                continue
            at = ((pid, tid), ts)
            if e["ph"] == "s":
                flow_start[key] = at
            else:
                flow_end[at] = key
        launches: dict[Thread, list[tuple[int, int]]] = defaultdict(list)
        self.count = self.unlinked = 0
        for k in spans:
            if k.cat != "kernel":
                continue
            self.count += 1
            corr = int_arg(k, "correlation", source)
            launch: tuple[Thread, int] | None = None
            if corr in runtime:
                launch = (runtime[corr].thread, runtime[corr].start)
            elif (flow := flow_end.get((k.thread, k.start), corr)) in flow_start:
                launch = flow_start[flow]
            elif (ext := int_arg(k, "External id", source)) is not None and ext in ops:
                launch = (ops[ext].thread, ops[ext].start)
            if launch is None:
                self.unlinked += 1
            else:
                launches[launch[0]].append((launch[1], k.dur))
        self._times: dict[Thread, list[int]] = {}
        self._cum: dict[Thread, list[int]] = {}
        for thread, items in launches.items():
            items.sort()
            self._times[thread] = [t for t, _ in items]
            cum = [0]
            for _, d in items:
                cum.append(cum[-1] + d)
            self._cum[thread] = cum

    def gpu_ns(self, span: Span) -> int:
        """Total duration of the kernels launched on ``span``'s thread during ``span``."""
        times = self._times.get(span.thread)
        if not times:
            return 0
        lo, hi = bisect.bisect_left(times, span.start), bisect.bisect_right(times, span.end)
        return self._cum[span.thread][hi] - self._cum[span.thread][lo]
