"""Per-rank timing of a real run: every compute action, its layers, p2p wait, gradient sync and step.

A :class:`Recorder` replaces, on each :class:`~torch.distributed.pipelining.PipelineStage`
*instance*, the four methods every torch schedule calls — ``forward_one_chunk`` (F),
``backward_one_chunk`` (B, or I when ``full_backward=False``), ``backward_weight_one_chunk`` (W)
and ``perform_reduce_grad`` (the data-parallel gradient reduction) — with timed versions, and
times the pipeline's p2p waits through :func:`mindpipe.executor.torch_pipelining.timed_p2p_waits`. torch's
classes are untouched. Inside each action, :class:`~mindpipe.executor.layer_timing.LayerTimer`
cuts the time into per-layer segments at marks the layers' hooks leave.

Clocks: on CPU the host's monotonic clock (``time.perf_counter``, system-wide on Linux, so ranks
on one host share it); on CUDA, events on the current stream, anchored to the host clock at the
start of each step after a synchronise, so GPU work is timed where it runs rather than where it
was queued. All times are relative to the run's origin (see :mod:`mindpipe.traces.measured`).
The records are the typed spans of :mod:`mindpipe.executor.payload`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from mindpipe.executor.clocks import nvml_index
from mindpipe.executor.layer_timing import LayerTimer, Segment
from mindpipe.executor.memory_account import MemoryAccount
from mindpipe.executor.offload import HostPool
from mindpipe.executor.payload import (
    ActionKind,
    ActionSpan,
    Axis,
    CommKind,
    CommSpan,
    LayerSpan,
    MemorySource,
    OptimizerSpan,
    Spans,
    StepSpan,
)
from mindpipe.executor.torch_pipelining import weight_pass_runs_whole_backward
from mindpipe.traces.measured import StageMemory
from torch import nn

Mark = Any  # float seconds (CPU) or torch.cuda.Event
# Builds a record from an interval's resolved (start, end) seconds and files it.
_Sink = Callable[[float, float], None]


def action_cpu_clock(cuda: bool) -> float | None:
    """The CPU clock an action's work is read from (None on GPUs, where it is meaningless).

    On a CPU rank it is the work an action got, whatever else shared the cores (calibration's
    measure of what the action would take alone). With one intra-op thread every operator runs on
    this thread, so its own clock excludes the gloo threads copying earlier messages at the same
    time; with more, the workers' time counts, so the whole process's.
    """
    if cuda:
        return None
    return time.thread_time() if torch.get_num_threads() == 1 else time.process_time()


class Recorder:
    """Collects the :class:`~mindpipe.executor.payload.Spans` of one rank (see module docstring)."""

    def __init__(self, device: torch.device, origin: float) -> None:
        self.cuda = device.type == "cuda"
        self.origin = origin
        self.step = 0
        self.spans = Spans()
        self.layers = LayerTimer(self.now)
        self.memory: MemoryAccount | None = None  # each action's accounted peak (ActionSpan.memory_bytes)
        self._pending: list[tuple[_Sink, Mark, Mark]] = []
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
        for sink, t0, t1 in self._pending:
            sink(self._seconds(t0), self._seconds(t1))
        self._pending.clear()
        self.spans.steps.append(StepSpan(self.step, self._step_start, end))
        return end - self._step_start

    @contextlib.contextmanager
    def optimizer_span(self) -> Iterator[None]:
        """Time the optimizer step."""
        t0, step = self.now(), self.step
        yield
        self._pending.append((lambda a, b: self.spans.optimizer.append(OptimizerSpan(step, a, b)), t0, self.now()))

    def add_collective(self, axis: Axis, op: str, t0: float, t1: float, size: int | None, group: int | None) -> None:
        """Record a collective observed by the profiler (already in seconds since the origin)."""
        self.spans.comms.append(CommSpan(self.step, "collective", axis, op, t0, t1, size, group))

    # -- instrumentation ---------------------------------------------------------------------
    def _comm(self, kind: CommKind, axis: Axis, op: str, t0: Mark) -> None:
        step = self.step
        self._pending.append((lambda a, b: self.spans.comms.append(CommSpan(step, kind, axis, op, a, b)), t0, self.now()))

    def p2p_wait(self, do_wait: Callable[[], None]) -> None:
        """Timed pipeline p2p wait (installed by ``timed_p2p_waits``)."""
        t0 = self.now()
        do_wait()
        self._comm("p2p_wait", "pp", "wait", t0)

    def _cpu(self) -> float | None:
        return action_cpu_clock(self.cuda)

    @contextlib.contextmanager
    def _action(self, stage: int, mb: int, kind: ActionKind, whole_backward: bool = False) -> Iterator[None]:
        """Time one compute action and its layers."""
        self.layers.begin(stage, mb, kind, whole_backward)  # before the clock: W hooks its parameters here
        if self.memory is not None:
            self.memory.open_window()
        t0, c0, step = self.now(), self._cpu(), self.step
        try:
            yield
        finally:
            c1, t1 = self._cpu(), self.now()
            segments = self.layers.end(t0, t1)
        cpu = None if c0 is None or c1 is None else c1 - c0
        # The accounting's peak over the action, before the gradients it made are re-read (as the
        # simulator's memory_by_action counts a backward: what was held when it began, plus its transient).
        peak = None if self.memory is None else self.memory.window
        self._pending.append((lambda a, b: self.spans.actions.append(ActionSpan(step, stage, mb, kind, a, b, cpu, peak)),
                              t0, t1))
        for seg in segments:
            self._pending.append((self._layer_sink(step, stage, mb, seg), seg[2], seg[3]))

    def _layer_sink(self, step: int, stage: int, mb: int, seg: Segment) -> _Sink:
        name, phase = seg[0], seg[1]
        return lambda a, b: self.spans.layers.append(LayerSpan(step, stage, mb, name, phase, a, b))

    def wrap_stage(self, stage: Any, layers: list[tuple[str, str, nn.Module]] | None = None) -> None:
        """Replace the stage instance's F/B/I/W and gradient-reduction methods with timed ones.

        ``layers``: the stage's ``(name, kind, module)`` pipeline layers, to be timed one by one.
        """
        s = stage.stage_index
        if layers is not None:
            self.layers.install(s, layers)
        fwd, bwd, bww, red = (stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk,
                              stage.perform_reduce_grad)

        def forward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            with self._action(s, mb, "F"):
                return fwd(mb, *args, **kwargs)

        def backward_one_chunk(mb: int, loss: Any = None, full_backward: bool = True, last_backward: bool = False) -> None:
            with self._action(s, mb, "B" if full_backward else "I"):
                bwd(mb, loss=loss, full_backward=full_backward, last_backward=last_backward)

        def backward_weight_one_chunk(mb: int, last_backward: bool = False) -> None:
            with self._action(s, mb, "W", whole_backward=weight_pass_runs_whole_backward(stage)):
                bww(mb, last_backward=last_backward)

        def perform_reduce_grad(grad_scale_factor: int) -> None:
            t0 = self.now()
            red(grad_scale_factor)
            self._comm("dp_sync", "dp", "reduce_grad", t0)

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
        stage.perform_reduce_grad = perform_reduce_grad


def peak_memory(device: torch.device) -> tuple[int, MemorySource]:
    """Peak allocated CUDA memory, or the process's peak resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_allocator"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process_rss"  # Linux: KiB


def stage_memory(device: torch.device, account: MemoryAccount, pool: HostPool) -> StageMemory:
    """The rank's :class:`~mindpipe.traces.measured.StageMemory`: CUDA's allocator peak, or the accounted one."""
    t = account.peak
    cuda = device.type == "cuda"
    return StageMemory(
        peak_bytes=int(torch.cuda.max_memory_allocated(device)) if cuda else t.total,
        source="cuda_allocator" if cuda else "tensor_accounting", accounted_peak_bytes=t.total,
        weights_bytes=t.weights, gradients_bytes=t.gradients, optimizer_bytes=t.optimizer,
        activations_bytes=t.activations, transient_bytes=t.transient, host_pool_peak_bytes=pool.peak_bytes,
        budget_bytes=account.budget)


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
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(device))
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


__all__ = ["EnergyMeter", "Recorder", "cpu_seconds", "peak_memory", "stage_memory"]
