"""The simulation-result contract (DESIGN.md): what ``mindpipe simulate --json`` prints."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from mindpipe.traces.chrome_trace import TimelineEvent
from mindpipe.traces.config import non_negative
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import check_format_version, from_dict, read_json, write_json

RESULT_FORMAT_VERSION = 1
GIB = 2**30
"""Bytes per GiB: the unit of every memory figure MindPipe prints (``memory_by_stage_gib``)."""


@dataclass(frozen=True)
class StageMemoryParts:
    """One pipeline rank's peak memory by part, in bytes (the simulator's memory model; its records
    of a rank or a supernet stage extend this one)."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    total_bytes: float

    @property
    def total_gib(self) -> float:
        """Total in GiB."""
        return self.total_bytes / GIB

    def parts(self) -> StageMemoryParts:
        """These six parts alone (the record ``SimulationResult.extra.memory_by_stage`` holds)."""
        return StageMemoryParts(self.weights_bytes, self.gradients_bytes, self.optimizer_bytes, self.activations_bytes,
                                self.other_bytes, self.total_bytes)


@dataclass
class CalibrationUse:
    """How a calibration file changed a simulation: its notes and the host constants it applied."""

    notes: list[str]
    cores_per_rank_slots: float | None
    step_overhead_s: float
    step_host_cpu_s: float
    transfers_on_cores: bool
    applied: bool = True


@dataclass
class SimulationDetails:
    """The engine's per-rank figures, the memory and energy parts, and notes (``result.extra``).

    Attributes:
        schedule, num_microbatches: The schedule that ran and its micro-batches.
        pipeline_time_s: The schedule's span (the iteration less the work after the last action).
        exposed_dp_comm_s: Data-parallel communication not hidden under compute (largest rank).
        rank_end_s, rank_compute_s, rank_tp_comm_s: Per pipeline rank: when it finished, its
            compute time, its tensor-parallel communication time.
        params_per_device_by_rank: Parameters each device of a rank holds (before ZeRO sharding).
        model_flops_per_iteration: Model FLOPs of the iteration (no recompute counted).
        bytes_by_link_type: Bytes moved per link type (``nvlink``, ``nic``, ...).
        device_energy_j: Device energy of the iteration (before PUE).
        carbon_intensity_g_per_kwh, carbon_intensity_source: The intensity used and where from.
        compute_model: The compute model's class.
        memory_by_stage: Each rank's peak memory by part.
        precision_bytes: Bytes per element of the plan's precision.
        warning: A trace taken at another micro-batch size or tp, scaled linearly.
        stage_clocks_mhz, rank_busy_power_w: Clocks the plan locks and each rank's busy power under them.
        stage_clocks_note: Why the plan's clocks were not priced (a device without frequency data).
        calibration: What a calibration file applied.
        host_memory_by_stage_gib: Each rank's peak swapped activations in host memory (empty
            without a swapped block).
        host_capacity_gib: The host memory per device (None: not in the device's catalog entry).
        fits_in_device_memory: Whether every rank fits in its device's memory (``fits_in_memory``
            asks the host's too; None in results written before it was recorded).
    """

    schedule: str
    num_microbatches: int
    pipeline_time_s: float
    exposed_dp_comm_s: float
    rank_end_s: list[float]
    rank_compute_s: list[float]
    rank_tp_comm_s: list[float]
    params_per_device_by_rank: list[int]
    model_flops_per_iteration: float
    bytes_by_link_type: dict[str, float]
    device_energy_j: float
    carbon_intensity_g_per_kwh: float
    carbon_intensity_source: str
    compute_model: str
    memory_by_stage: list[StageMemoryParts]
    precision_bytes: int
    warning: str | None = None
    stage_clocks_mhz: list[int] | None = None
    rank_busy_power_w: list[float] | None = None
    stage_clocks_note: str | None = None
    calibration: CalibrationUse | None = None
    host_memory_by_stage_gib: list[float] = field(default_factory=list)
    host_capacity_gib: float | None = None
    fits_in_device_memory: bool | None = None


@dataclass
class SimulationResult:
    """Predicted cost of one training iteration under a plan.

    Attributes:
        iteration_time_s: Wall time of one iteration (global batch).
        throughput_samples_per_s: Sequences per second.
        throughput_tokens_per_s: Tokens per second.
        tflops_per_gpu: Model TFLOP/s per device (no recompute counted).
        mfu: Model FLOPs utilisation in [0, 1].
        bubble_fraction: Share of device time idle inside the pipeline schedule.
        memory_by_stage_gib: Peak memory per pipeline rank.
        peak_memory_gib: Maximum over ``memory_by_stage_gib``.
        fits_in_memory: Whether every stage fits in device memory, and its swapped activations in
            host memory (``extra.host_memory_by_stage_gib``).
        energy_j: Facility energy for one iteration (device energy × PUE).
        carbon_gco2: Grid emissions for one iteration.
        timeline: Per-rank events when requested (Chrome-trace ready), else None.
        extra: The engine's per-rank figures, the memory and energy parts and notes.
    """

    iteration_time_s: float
    throughput_samples_per_s: float
    throughput_tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    memory_by_stage_gib: list[float]
    peak_memory_gib: float
    fits_in_memory: bool
    energy_j: float
    carbon_gco2: float
    extra: SimulationDetails
    timeline: list[TimelineEvent] | None = field(default=None, repr=False)  # thousands of events
    format_version: int = RESULT_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version, RESULT_FORMAT_VERSION, "simulation results")
        for key in (
            "iteration_time_s",
            "throughput_samples_per_s",
            "throughput_tokens_per_s",
            "tflops_per_gpu",
            "mfu",
            "peak_memory_gib",
            "energy_j",
            "carbon_gco2",
        ):
            non_negative(key, getattr(self, key))
        if not 0.0 <= self.bubble_fraction <= 1.0:
            raise ContractError("", "bubble_fraction", f"bubble_fraction={self.bubble_fraction} must be in [0, 1]")
        for i, m in enumerate(self.memory_by_stage_gib):
            non_negative(f"memory_by_stage_gib[{i}]", m)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SimulationResult:
        """Read a result JSON file."""
        return from_dict(cls, read_json(path), str(path))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the result as JSON."""
        write_json(self, path)
