"""Per-rank timing of a real run: every compute action, p2p wait, gradient sync and step.

A :class:`Recorder` replaces, on each :class:`~torch.distributed.pipelining.PipelineStage`
*instance*, the four methods every torch schedule calls — ``forward_one_chunk`` (F),
``backward_one_chunk`` (B, or I when ``full_backward=False``), ``backward_weight_one_chunk`` (W)
and ``perform_reduce_grad`` (the data-parallel gradient reduction) — with timed versions, and
times the pipeline's p2p waits through :func:`mindpipe.executor.torch_pipelining.timed_p2p_waits`. torch's
classes are untouched.

Clocks: on CPU the host's monotonic clock (``time.perf_counter``, system-wide on Linux, so ranks
on one host share it); on CUDA, events on the current stream, anchored to the host clock at the
start of each step after a synchronise, so GPU work is timed where it runs rather than where it
was queued. All times are relative to the run's origin (see :mod:`mindpipe.traces.measured`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

Mark = Any  # float seconds (CPU) or torch.cuda.Event


@dataclass
class Spans:
    """Raw intervals of one rank, JSON-friendly (gathered to rank 0 at the end)."""

    # step, stage, mb, kind, t0, t1, process CPU seconds during the action (None on GPUs)
    actions: list[tuple[int, int, int, str, float, float, float | None]] = field(default_factory=list)
    comms: list[tuple[int, str, str, str, float, float, int | None, int | None]] = field(default_factory=list)
    # comms: step, kind, axis, op, t0, t1, bytes, group size
    optimizer: list[tuple[int, float, float]] = field(default_factory=list)
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # step, t0, t1


class Recorder:
    """Collects :class:`Spans` for one rank (see module docstring)."""

    def __init__(self, device: torch.device, origin: float) -> None:
        self.cuda = device.type == "cuda"
        self.origin = origin
        self.step = 0
        self.spans = Spans()
        self._pending: list[tuple[str, tuple[Any, ...], Mark, Mark]] = []
        self._anchor_host = 0.0
        self._anchor_event: Any = None
        self._step_start = 0.0

    # -- clock -------------------------------------------------------------------------------
    def now(self) -> Mark:
        """A time mark: host seconds since the origin, or a recorded CUDA event."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter() - self.origin

    def _seconds(self, mark: Mark) -> float:
        if not self.cuda:
            return float(mark)
        return self._anchor_host + self._anchor_event.elapsed_time(mark) / 1e3

    def _add(self, what: str, fields: tuple[Any, ...], t0: Mark, t1: Mark) -> None:
        self._pending.append((what, fields, t0, t1))

    # -- steps -------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Start timing global step ``step``."""
        self.step = step
        if self.cuda:
            torch.cuda.synchronize()
            self._anchor_host = time.perf_counter() - self.origin
            self._anchor_event = self.now()
        self._step_start = time.perf_counter() - self.origin

    def end_step(self) -> float:
        """Finish the step (synchronising a GPU), resolve its intervals; returns its wall time."""
        if self.cuda:
            torch.cuda.synchronize()
        end = time.perf_counter() - self.origin
        for what, fields, t0, t1 in self._pending:
            a, b = self._seconds(t0), self._seconds(t1)
            if what == "action":
                *head, cpu = fields
                self.spans.actions.append((self.step, *head, a, b, cpu))
            elif what == "comm":
                self.spans.comms.append((self.step, fields[0], fields[1], fields[2], a, b, *fields[3:]))
            else:
                self.spans.optimizer.append((self.step, a, b))
        self._pending.clear()
        self.spans.steps.append((self.step, self._step_start, end))
        return end - self._step_start

    @contextlib.contextmanager
    def optimizer_span(self) -> Iterator[None]:
        """Time the optimizer step."""
        t0 = self.now()
        yield
        self._add("optimizer", (), t0, self.now())

    def add_collective(self, axis: str, op: str, t0: float, t1: float, size: int | None, group: int | None) -> None:
        """Record a collective observed by the profiler (already in seconds since the origin)."""
        self.spans.comms.append((self.step, "collective", axis, op, t0, t1, size, group))

    # -- instrumentation ---------------------------------------------------------------------
    def p2p_wait(self, do_wait: Callable[[], None]) -> None:
        """Timed pipeline p2p wait (installed by ``timed_p2p_waits``)."""
        t0 = self.now()
        do_wait()
        self._add("comm", ("p2p_wait", "pp", "wait", None, None), t0, self.now())

    def _cpu(self) -> float | None:
        # CPU time: on a CPU rank, the work an action got, whatever else shared the cores
        # (calibration's measure of what the action would take alone). With one intra-op thread
        # every operator runs on this thread, so its own clock excludes the gloo threads copying
        # earlier messages at the same time; with more, the workers' time counts, so the whole
        # process's. Meaningless on GPUs.
        if self.cuda:
            return None
        return time.thread_time() if torch.get_num_threads() == 1 else time.process_time()

    def _action(self, stage: int, mb: int, kind: str, t0: Mark, c0: float | None) -> None:
        c1 = self._cpu()
        cpu = None if c0 is None or c1 is None else c1 - c0
        self._add("action", (stage, mb, kind, cpu), t0, self.now())

    def wrap_stage(self, stage: Any) -> None:
        """Replace the stage instance's F/B/I/W and gradient-reduction methods with timed ones."""
        s = stage.stage_index
        fwd, bwd, bww, red = (stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk,
                              stage.perform_reduce_grad)

        def forward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            t0, c0 = self.now(), self._cpu()
            out = fwd(mb, *args, **kwargs)
            self._action(s, mb, "F", t0, c0)
            return out

        def backward_one_chunk(mb: int, loss: Any = None, full_backward: bool = True, last_backward: bool = False) -> None:
            t0, c0 = self.now(), self._cpu()
            bwd(mb, loss=loss, full_backward=full_backward, last_backward=last_backward)
            self._action(s, mb, "B" if full_backward else "I", t0, c0)

        def backward_weight_one_chunk(mb: int, last_backward: bool = False) -> None:
            t0, c0 = self.now(), self._cpu()
            bww(mb, last_backward=last_backward)
            self._action(s, mb, "W", t0, c0)

        def perform_reduce_grad(grad_scale_factor: int) -> None:
            t0 = self.now()
            red(grad_scale_factor)
            self._add("comm", ("dp_sync", "dp", "reduce_grad", None, None), t0, self.now())

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
        stage.perform_reduce_grad = perform_reduce_grad


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak allocated CUDA memory, or the process's peak resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_allocator"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process_rss"  # Linux: KiB


def cpu_seconds() -> float:
    """CPU time (user + system) this process has used."""
    import psutil

    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


class EnergyMeter:
    """NVML's cumulative energy counter of this rank's GPU (mJ), when pynvml is installed."""

    def __init__(self, device: torch.device) -> None:
        self.handle: Any = None
        self.nvml: Any = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            self.nvml = pynvml
            self.read()
        except Exception:  # no pynvml, or a GPU without energy counters (pre-Volta)
            self.handle = None

    @property
    def available(self) -> bool:
        """True when readings come from the GPU's energy counter."""
        return self.handle is not None

    def read(self) -> float | None:
        """Joules since the driver loaded, or None."""
        if self.handle is None:
            return None
        return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)) / 1e3


__all__ = ["EnergyMeter", "Recorder", "Spans", "cpu_seconds", "peak_memory"]
