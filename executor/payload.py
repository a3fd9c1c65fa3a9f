"""What each rank sends to rank 0 at the end of a run: typed records, no torch.

A rank's :class:`~mindpipe.executor.measure.Recorder` resolves its timing marks into these
records at the end of every step; the worker bundles them with the rank's place, losses, CPU,
energy and memory readings into a :class:`RankPayload`, ``gather_object`` pickles it to rank 0,
and :mod:`mindpipe.executor.report` reads the fields by name. Times are seconds since the run's
origin (see :mod:`mindpipe.traces.measured`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mindpipe.traces.measured import StageMemory
from mindpipe.traces.noise_scale import GradientNoise

ActionKind = Literal["F", "B", "I", "W"]
CommKind = Literal["p2p_wait", "dp_sync", "collective"]
Axis = Literal["pp", "dp", "tp", "world", "unknown"]
# forward: a layer's share of an F action; backward: of a whole backward (a B action, or the W
# action into which torch folds a first stage's whole backward); backward_input: of an I action;
# backward_weight: of a weight-only W action.
LayerPhase = Literal["forward", "backward", "backward_input", "backward_weight"]
MemorySource = Literal["cuda_allocator", "process_rss"]


@dataclass(frozen=True, slots=True)
class ActionSpan:
    """One compute action: F, B (whole backward), I (input gradient) or W (weight gradient).

    ``cpu_s`` is the CPU time the action used on a CPU rank (None on GPUs); ``memory_bytes`` the
    accounted device memory's peak while it ran (None without the accounting).
    """

    step: int
    stage: int
    microbatch: int
    kind: ActionKind
    start_s: float
    end_s: float
    cpu_s: float | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class CommSpan:
    """Time spent on (or blocked in) communication: a p2p wait, the DP gradient sync, a collective.

    ``size_bytes`` and ``group_size`` are known for collectives of a profiled step only.
    """

    step: int
    kind: CommKind
    axis: Axis
    op: str
    start_s: float
    end_s: float
    size_bytes: int | None = None
    group_size: int | None = None


@dataclass(frozen=True, slots=True)
class OptimizerSpan:
    """The optimizer step of one training step."""

    step: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class StepSpan:
    """One training step on this rank, from its start to the end of the optimizer step."""

    step: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class LayerSpan:
    """One pipeline layer's share of one compute action (:mod:`mindpipe.executor.layer_timing`)."""

    step: int
    stage: int
    microbatch: int
    layer: str
    phase: LayerPhase
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class LayerInfo:
    """A pipeline layer this rank holds, as measured on it.

    Attributes:
        stage: Virtual pipeline stage holding it; ``index`` its position in the stage.
        name, kind: ``block.3`` / ``block`` (``embedding``, ``final_norm``, ``lm_head``).
        param_count: Parameters per tensor-parallel rank (counted on the module's tensors).
        output_bytes: Bytes of the layer's output on this rank (taken from the tensor it
            returned), None until a forward ran.
    """

    stage: int
    index: int
    name: str
    kind: str
    param_count: int
    output_bytes: int | None


@dataclass(frozen=True, slots=True)
class Coords:
    """A rank's place on the (pp, dp, tp, cp) mesh (cp 0 without context parallelism)."""

    pp: int
    dp: int
    tp: int
    cp: int = 0


@dataclass
class Spans:
    """Every interval one rank measured."""

    actions: list[ActionSpan] = field(default_factory=list)
    comms: list[CommSpan] = field(default_factory=list)
    optimizer: list[OptimizerSpan] = field(default_factory=list)
    steps: list[StepSpan] = field(default_factory=list)
    layers: list[LayerSpan] = field(default_factory=list)


@dataclass
class RankPayload:
    """One rank's measurements, gathered to rank 0.

    Attributes:
        rank, coords, stages, host: Who: global rank, mesh coordinates, virtual stages, host.
        cpu_count, threads: The host's logical CPUs and this rank's torch threads.
        spans: The measured intervals (see :class:`Spans`).
        layers: The pipeline layers this rank holds.
        losses: Per-step mean loss on ranks holding the last stage (None elsewhere).
        first_step, first_measured: First step this launch ran, first one aggregated.
        cpu_s, cpu_steps: Process CPU seconds over ``cpu_steps`` measured steps.
        energy_j: NVML energy over the measured steps (None without counters).
        peak_memory_bytes, memory_source: Peak allocator memory (CUDA) or peak RSS (CPU).
        memory: Peak device memory of the rank's stages, with the accounting's terms.
        orders: The compute actions per pipeline rank the schedule followed (``2F0`` ...).
        clock_note: What became of the plan's SM clock on this rank (:mod:`mindpipe.executor.clocks`).
        noise: The gradient noise scale measured every step (the same on every rank; None when
            the plan has nothing to compare, see :func:`mindpipe.executor.noise_probe.noise_method`).
    """

    rank: int
    coords: Coords
    stages: list[int]
    host: str
    cpu_count: int
    threads: int
    spans: Spans
    layers: list[LayerInfo]
    losses: list[float | None]
    first_step: int
    first_measured: int
    cpu_s: float
    cpu_steps: int
    energy_j: float | None
    peak_memory_bytes: int
    memory_source: MemorySource
    orders: dict[int, list[str]] = field(default_factory=dict)
    memory: StageMemory | None = None
    clock_note: str = ""
    noise: GradientNoise | None = None

    @property
    def cpu_per_step(self) -> float:
        """CPU seconds per measured step (the profiled step left out: the profiler's own work)."""
        return self.cpu_s / self.cpu_steps


__all__ = [
    "ActionKind",
    "ActionSpan",
    "Axis",
    "CommKind",
    "CommSpan",
    "Coords",
    "LayerInfo",
    "LayerPhase",
    "LayerSpan",
    "OptimizerSpan",
    "RankPayload",
    "Spans",
    "StepSpan",
]
