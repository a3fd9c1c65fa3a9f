"""The simulation-result contract (DESIGN.md): what ``mindpipe simulate --json`` prints."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from mindpipe.traces.config import non_negative
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import check_format_version, from_dict, read_json, write_json

RESULT_FORMAT_VERSION = 1


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
        fits_in_memory: Whether every stage fits in device memory.
        energy_j: Facility energy for one iteration (device energy × PUE).
        carbon_gco2: Grid emissions for one iteration.
        timeline: Per-rank events when requested (Chrome-trace ready), else None.
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
    timeline: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
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
