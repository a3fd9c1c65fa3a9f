"""GPU SM-clock data (``traces/hardware/frequency.json``) and the ``stage_clocks_mhz`` / ``action_clocks_mhz`` plan rules.

The file lists, per catalog GPU, the lockable SM clock range and step, the default (boost) clock,
the base clock, the power while blocked on pipeline P2P (Perseus, SOSP'24) and two constants of
the power model of :mod:`mindpipe.simulator.frequency`, each with a citation; values that are our
estimates say so. A device without an entry has "no frequency data": a plan that sets
``stage_clocks_mhz`` for it is refused with one line. This module holds the data and the plan
rule (``traces`` is imported by the executor and the CLI); the power and time model lives in
:mod:`mindpipe.simulator.frequency`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import math
from typing import Any

from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import parse_json
from mindpipe.traces.units import plural

_SHIPPED = "traces/hardware/frequency.json"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class FrequencySpec:
    """SM-clock facts of one GPU (units in the names; see the module docstring).

    Attributes:
        device: Catalog name.
        min_sm_clock_MHz, max_sm_clock_MHz, sm_clock_step_MHz: Lockable range and step.
        default_sm_clock_MHz: The clock training runs at when nothing is locked (boost).
        base_sm_clock_MHz: Where the power model's voltage stops falling (its knee).
        blocked_power_W: Board power while blocked in a P2P receive.
        memory_bound_power_fraction: Dynamic power of a memory-bound kernel relative to a GEMM's.
        memory_power_clock_independent_fraction: Share of that power the SM clock does not scale.
        sources: Citation per key.
    """

    device: str
    min_sm_clock_MHz: int
    max_sm_clock_MHz: int
    sm_clock_step_MHz: int
    default_sm_clock_MHz: int
    base_sm_clock_MHz: int
    blocked_power_W: float
    memory_bound_power_fraction: float
    memory_power_clock_independent_fraction: float
    sources: dict[str, str]

    def __post_init__(self) -> None:
        where = f"devices.{self.device}"
        for key in ("min_sm_clock_MHz", "max_sm_clock_MHz", "sm_clock_step_MHz", "default_sm_clock_MHz",
                    "base_sm_clock_MHz"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ContractError(_SHIPPED, f"{where}.{key}", f"{key}={v!r} must be a positive integer")
        lo, hi = self.min_sm_clock_MHz, self.max_sm_clock_MHz
        if lo >= hi or (hi - lo) % self.sm_clock_step_MHz:
            raise ContractError(_SHIPPED, f"{where}.sm_clock_step_MHz",
                                f"the range {lo}..{hi} MHz must be a whole number of {self.sm_clock_step_MHz} MHz steps")
        for key in ("default_sm_clock_MHz", "base_sm_clock_MHz"):
            if not self.supports(getattr(self, key)):
                raise ContractError(_SHIPPED, f"{where}.{key}", f"{key}={getattr(self, key)} is not a supported clock")
        for key in ("blocked_power_W", "memory_bound_power_fraction", "memory_power_clock_independent_fraction"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ContractError(_SHIPPED, f"{where}.{key}", f"{key}={v!r} must be a finite number >= 0")
        for key in ("memory_bound_power_fraction", "memory_power_clock_independent_fraction"):
            if getattr(self, key) > 1:
                raise ContractError(_SHIPPED, f"{where}.{key}", f"{key} must be <= 1")
        missing = [f.name for f in dataclasses.fields(self) if f.name not in ("device", "sources")
                   and f.name not in self.sources]
        if missing:
            raise ContractError(_SHIPPED, f"{where}.sources.{missing[0]}", "every number needs a source")

    def supports(self, mhz: Any) -> bool:
        """True for an integer clock on the device's grid."""
        return (isinstance(mhz, int) and not isinstance(mhz, bool) and self.min_sm_clock_MHz <= mhz <= self.max_sm_clock_MHz
                and (mhz - self.min_sm_clock_MHz) % self.sm_clock_step_MHz == 0)

    def clocks(self, lowest: int | None = None, stride: int = 1) -> list[int]:
        """Supported clocks from the maximum down to ``lowest`` (default: the minimum), every ``stride`` steps."""
        lo = self.min_sm_clock_MHz if lowest is None else max(lowest, self.min_sm_clock_MHz)
        step = self.sm_clock_step_MHz * max(1, stride)
        out = list(range(self.max_sm_clock_MHz, lo - 1, -step))
        return out


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, FrequencySpec]:
    text = importlib.resources.files("mindpipe.traces.hardware").joinpath("frequency.json").read_text(encoding="utf-8")
    doc = parse_json(text, _SHIPPED, unique_keys=True)
    if not isinstance(doc, dict) or doc.get("format_version") != FORMAT_VERSION or not isinstance(doc.get("devices"), dict):
        raise ContractError(_SHIPPED, "format_version", f"expected format_version {FORMAT_VERSION} and a devices object")
    return {name: FrequencySpec(device=name, **entry) for name, entry in doc["devices"].items()}


def frequency_spec(device: str, source: str = "cluster") -> FrequencySpec:
    """The clock data of catalog device ``device``.

    Raises:
        ContractError: the device has no frequency data (the message lists those that do).
    """
    specs = _shipped()
    key = device.strip().lower()
    if key not in specs:
        raise ContractError(source, "stage_clocks_mhz",
                            f"no frequency data for {device!r}: clock plans need one of {', '.join(sorted(specs))}")
    return specs[key]


def has_frequency_data(device: str) -> bool:
    """True when ``device`` has an entry in ``frequency.json``."""
    return device.strip().lower() in _shipped()


def check_stage_clocks_shape(clocks: Any, stage_rank: list[int]) -> None:
    """The device-free rules of ``stage_clocks_mhz``: a list of integers, one per (virtual) stage
    (``stage_rank[s]`` is stage ``s``'s pipeline rank), equal on the stages one rank holds (NVML locks a device's clock; per-action switching is not
    carried out by the executor).

    Raises:
        ContractError: naming the key and the rule (source empty, :class:`~mindpipe.traces.config.Plan` fills it).
    """
    if not isinstance(clocks, list):
        raise ContractError("", "stage_clocks_mhz", f"stage_clocks_mhz={clocks!r} must be a list of MHz or null")
    num_stages = len(stage_rank)
    if len(clocks) != num_stages:
        raise ContractError("", "stage_clocks_mhz",
                            f"stage_clocks_mhz has {plural(len(clocks), 'entry', 'entries')}, expected pp×virtual_stages={num_stages}")
    for i, v in enumerate(clocks):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ContractError("", f"stage_clocks_mhz[{i}]", f"stage_clocks_mhz[{i}]={v!r} must be a positive integer (MHz)")
    first: dict[int, int] = {}
    for s, r in enumerate(stage_rank):
        f = first.setdefault(r, s)
        if clocks[s] != clocks[f]:
            raise ContractError("", f"stage_clocks_mhz[{s}]",
                                f"stage_clocks_mhz[{s}]={clocks[s]} differs from stage {f} on the same rank "
                                f"({clocks[f]}); a rank runs all its stages at one locked clock")


def check_action_clocks_shape(clocks: Any, num_stages: int, num_microbatches: int, stage_clocks: Any) -> None:
    """The device-free rules of ``action_clocks_mhz``: per (virtual) stage, two lists of
    ``num_microbatches`` integer MHz, the clock of each micro-batch's forward and of its backward
    (recompute, input and weight gradients), Perseus's per-instruction frequency plan (SOSP'24).
    It replaces ``stage_clocks_mhz``, so a plan sets at most one of the two.

    Raises:
        ContractError: naming the key, the index and the rule (source filled by the caller).
    """
    if stage_clocks is not None:
        raise ContractError("", "action_clocks_mhz", "set stage_clocks_mhz or action_clocks_mhz, not both")
    if not isinstance(clocks, list) or len(clocks) != num_stages:
        raise ContractError("", "action_clocks_mhz",
                            f"action_clocks_mhz must be a list of pp×virtual_stages={num_stages} [forward, backward] pairs")
    for s, pair in enumerate(clocks):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ContractError("", f"action_clocks_mhz[{s}]",
                                f"action_clocks_mhz[{s}] must be [forward MHz per micro-batch, backward MHz per micro-batch]")
        for k, row in enumerate(pair):
            if not isinstance(row, list) or len(row) != num_microbatches:
                raise ContractError("", f"action_clocks_mhz[{s}][{k}]",
                                    f"action_clocks_mhz[{s}][{k}] must list one MHz per micro-batch (m={num_microbatches})")
            for mb, v in enumerate(row):
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise ContractError("", f"action_clocks_mhz[{s}][{k}][{mb}]",
                                        f"action_clocks_mhz[{s}][{k}][{mb}]={v!r} must be a positive integer (MHz)")


def flat_action_clocks(clocks: list[list[list[int]]]) -> list[int]:
    """Every clock of an ``action_clocks_mhz`` value, stage by stage (for :func:`check_stage_clocks`)."""
    return [v for pair in clocks for row in pair for v in row]


def action_clocks_summary(clocks: list[list[list[int]]]) -> str:
    """An ``action_clocks_mhz`` value in a few words for the command line: ``128 clocks, 420-1410 MHz``."""
    flat = flat_action_clocks(clocks)
    return f"{len(flat)} clocks, {min(flat)}-{max(flat)} MHz"


def check_action_clocks(clocks: list[list[list[int]]], device: str, source: str = "plan") -> None:
    """Every per-action clock is one the device supports (shape checked by :func:`check_action_clocks_shape`).

    Raises:
        ContractError: no frequency data for the device, or a clock off its range or grid.
    """
    spec = frequency_spec(device, source)
    for s, pair in enumerate(clocks):
        for k, row in enumerate(pair):
            for mb, v in enumerate(row):
                if not spec.supports(v):
                    raise ContractError(source, f"action_clocks_mhz[{s}][{k}][{mb}]",
                                        f"action_clocks_mhz[{s}][{k}][{mb}]={v} is not a supported {device} SM clock "
                                        f"({spec.min_sm_clock_MHz}..{spec.max_sm_clock_MHz} MHz in "
                                        f"{spec.sm_clock_step_MHz} MHz steps)")


def check_stage_clocks(clocks: list[int], device: str, source: str = "plan") -> None:
    """Every clock is one the device supports.

    Raises:
        ContractError: no frequency data for the device, or a clock off its range or grid.
    """
    spec = frequency_spec(device, source)
    for i, v in enumerate(clocks):
        if not spec.supports(v):
            raise ContractError(source, f"stage_clocks_mhz[{i}]", f"stage_clocks_mhz[{i}]={v} is not a supported {device} SM clock "
                                f"({spec.min_sm_clock_MHz}..{spec.max_sm_clock_MHz} MHz in {spec.sm_clock_step_MHz} MHz steps)")


def rank_clocks(clocks: list[int] | None, stage_rank: list[int]) -> list[int | None]:
    """The clock each pipeline rank locks (``stage_rank[s]`` runs stage ``s``); None: default."""
    out: list[int | None] = [None] * (max(stage_rank) + 1)
    if clocks is not None:
        for s, r in enumerate(stage_rank):
            out[r] = clocks[s]
    return out


__all__ = [
    "FrequencySpec",
    "action_clocks_summary",
    "check_action_clocks",
    "check_action_clocks_shape",
    "check_stage_clocks",
    "check_stage_clocks_shape",
    "flat_action_clocks",
    "frequency_spec",
    "has_frequency_data",
    "rank_clocks",
]
