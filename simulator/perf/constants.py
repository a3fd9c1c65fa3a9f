"""Per-GPU-type constants of the performance model, read from JSON with their provenance.

Files live in ``simulator/perf/data/`` (or anywhere, for a user's own fit):

* ``devices.json`` — per catalog device: SM count (a spec figure the shared catalog does not
  carry) and which compute / NCCL constants file applies.
* ``<family>.json`` (compute) and ``nccl_<family>.json`` (collectives) — ``{"format_version": 1,
  "family": ..., "regenerate": CMD, "constants": {KEY: RECORD}}``.

Every RECORD says where its number comes from: ``{"value", "unit", "method", "source"}`` with
``method`` one of ``spec`` (vendor figure), ``prior`` (published figure or engineering estimate,
not fitted), ``derived`` (counted from the algorithm), ``fit`` (fitted here; then ``fit_files``,
``holdout_files`` and ``holdout_mape_percent`` are required), plus an optional ``note``.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindpipe.simulator.perf.kernels import Tile
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import CONSTANTS, parse_json, read_json

FORMAT_VERSION = 1
METHODS = ("spec", "prior", "derived", "fit")
_RECORD_KEYS = ("value", "unit", "method", "source", "fit_files", "holdout_files", "holdout_mape_percent", "note")
COMPUTE_KEYS = (
    "gemm_efficiency_ceiling", "gemm_tiles", "gemm_k_overhead", "gemm_max_split_k", "memory_bandwidth_efficiency",
    "kernel_overhead_s", "host_overhead_per_kernel_s", "flash_attention_efficiency", "optimizer_bytes_per_param",
    "gemm_sustained_fraction", "optimizer_bandwidth_efficiency",
)
# The family whose curves stand in for GPUs without their own fit (DESIGN: H100/H200 reuse A100's).
REFERENCE_FAMILY = "a100"
REFERENCE_SM_COUNT = 108


@dataclass(frozen=True)
class Record:
    """One constant and its provenance (see module docstring)."""

    value: Any
    unit: str
    method: str
    source: str
    fit_files: list[str] = field(default_factory=list)
    holdout_files: list[str] = field(default_factory=list)
    holdout_mape_percent: float | None = None
    note: str = ""


@dataclass(frozen=True)
class ConstantsFile:
    """A parsed constants file: family name, regeneration command and records by key."""

    family: str
    regenerate: str
    records: dict[str, Record]
    source: str

    def number(self, key: str) -> float:
        """The numeric value of ``key`` (ContractError naming the file if absent or not a number)."""
        rec = self.records.get(key)
        if rec is None:
            raise ContractError(self.source, f"constants.{key}", "missing constant")
        v = rec.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ContractError(self.source, f"constants.{key}.value", f"must be a finite number, got {v!r}")
        return float(v)


def _record(raw: Any, source: str, key: str) -> Record:
    where = f"constants.{key}"
    if not isinstance(raw, dict):
        raise ContractError(source, where, "a constant must be an object with value, unit, method, source")
    for k in raw:
        if k not in _RECORD_KEYS:
            raise ContractError(source, f"{where}.{k}", f"unknown key; allowed: {', '.join(_RECORD_KEYS)}")
    for k in ("value", "unit", "method", "source"):
        if k not in raw:
            raise ContractError(source, f"{where}.{k}", "missing required key")
    if raw["method"] not in METHODS:
        raise ContractError(source, f"{where}.method", f"method={raw['method']!r} is not one of {', '.join(METHODS)}")
    if raw["method"] == "fit":
        for k in ("fit_files", "holdout_files", "holdout_mape_percent"):
            if not raw.get(k) and raw.get(k) != 0:
                raise ContractError(source, f"{where}.{k}", "a fitted constant must name its fit and hold-out data")
    return Record(**raw)


def parse_constants(doc: Any, source: str) -> ConstantsFile:
    """Validate a constants document (see module docstring)."""
    if not isinstance(doc, dict):
        raise ContractError(source, None, "a constants file must be a JSON object")
    for k in doc:
        if k not in ("format_version", "family", "description", "regenerate", "constants"):
            raise ContractError(source, k, "unknown key; allowed: format_version, family, description, regenerate, constants")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ContractError(source, "format_version", f"format_version must be {FORMAT_VERSION}")
    consts = doc.get("constants")
    if not isinstance(consts, dict) or not consts:
        raise ContractError(source, "constants", "constants must be a non-empty object")
    records = {k: _record(v, source, k) for k, v in consts.items()}
    return ConstantsFile(str(doc.get("family", "")), str(doc.get("regenerate", "")), records, source)


def data_text(name: str) -> str:
    """Text of a shipped file under ``simulator/perf/data``."""
    return importlib.resources.files("mindpipe.simulator.perf").joinpath("data", name).read_text(encoding="utf-8")


def read_constants(path: str | Path | None = None, shipped: str | None = None) -> ConstantsFile:
    """Read a constants file from ``path``, or the shipped ``data/<shipped>``."""
    if path is not None:
        source = str(path)
        doc = read_json(path, CONSTANTS)
    elif shipped:
        source = f"simulator/perf/data/{shipped}"
        try:
            text = data_text(shipped)
        except FileNotFoundError:
            raise ContractError(source, None, "no such shipped constants file") from None
        doc = parse_json(text, source)
    else:
        raise ContractError("", None, "read_constants needs a path or a shipped file name")
    return parse_constants(doc, source)


@functools.lru_cache(maxsize=8)
def shipped_constants(name: str) -> ConstantsFile:
    """A shipped constants file (cached)."""
    return read_constants(shipped=name)


@functools.lru_cache(maxsize=1)
def device_facts() -> dict[str, dict[str, Any]]:
    """``devices.json``: per catalog device, SM count and the constants files that apply."""
    source = "simulator/perf/data/devices.json"
    doc = json.loads(data_text("devices.json"))
    devices = doc.get("devices")
    if doc.get("format_version") != FORMAT_VERSION or not isinstance(devices, dict):
        raise ContractError(source, "devices", "expected format_version 1 and a devices object")
    for name, entry in devices.items():
        for k in ("sm_count", "compute", "nccl", "source"):
            if k not in entry:
                raise ContractError(source, f"devices.{name}.{k}", "missing required key")
        if "gemm_sustained_fraction" in entry:
            value = entry["gemm_sustained_fraction"]
            if not isinstance(value, (int, float)) or not 0 < value <= 1 or "gemm_sustained_source" not in entry:
                raise ContractError(source, f"devices.{name}.gemm_sustained_fraction",
                                    "must be a fraction in (0, 1] with a gemm_sustained_source")
    return devices


def sustained_fraction_for(device: DeviceSpec) -> float | None:
    """The device's own measured maximum achievable matmul rate (fraction of dense peak) from
    ``devices.json``, or None where it has none (its constants file's ``gemm_sustained_fraction``,
    the A100's, then bounds its GEMMs)."""
    entry = device_facts().get(device.name) or {}
    value = entry.get("gemm_sustained_fraction")
    return None if value is None else float(value)


def facts_for(device: DeviceSpec) -> tuple[int, str, str, str]:
    """(SM count, compute file, NCCL file, how the SM count was obtained) for a catalog device.

    Devices not listed in ``devices.json`` get the reference (A100) constants and an SM count
    scaled from the A100's by dense 16-bit peak FLOP/s — a stand-in, said so in the last field.
    """
    entry = device_facts().get(device.name)
    if entry is not None:
        return int(entry["sm_count"]), entry["compute"], entry["nccl"], entry["source"]
    peak = device.peak_flops_per_s.get("bf16") or device.peak_flops_per_s.get("fp16") or device.peak_flops("fp32")
    sms = max(1, round(REFERENCE_SM_COUNT * peak / 312e12))
    ref = f"{REFERENCE_FAMILY}.json"
    return sms, ref, f"nccl_{ref}", f"not in devices.json: {REFERENCE_SM_COUNT} A100 SMs scaled by peak FLOP/s"


@dataclass(frozen=True)
class GpuConstants:
    """The compute constants of one GPU family (values only; provenance stays in ``file``)."""

    gemm_ceiling: float
    tiles: tuple[Tile, ...]
    k_overhead: float
    max_split_k: int
    memory_bandwidth_efficiency: float
    kernel_overhead_s: float
    host_overhead_per_kernel_s: float
    flash_attention_efficiency: float
    optimizer_bytes_per_param: float
    gemm_sustained_fraction: float = 1.0
    optimizer_bandwidth_efficiency: float | None = None
    family: str = REFERENCE_FAMILY
    source: str = ""

    @classmethod
    def from_file(cls, cf: ConstantsFile) -> GpuConstants:
        """Build from a parsed compute constants file."""
        raw_tiles = cf.records.get("gemm_tiles")
        if raw_tiles is None or not isinstance(raw_tiles.value, list) or not raw_tiles.value:
            raise ContractError(cf.source, "constants.gemm_tiles.value", "must be a list of [rows, cols, efficiency]")
        tiles = []
        for i, t in enumerate(raw_tiles.value):
            if not (isinstance(t, list) and len(t) == 3 and t[0] > 0 and t[1] > 0 and 0 < t[2] <= 1):
                raise ContractError(cf.source, f"constants.gemm_tiles.value[{i}]", "must be [rows>0, cols>0, 0<eff<=1]")
            tiles.append(Tile(int(t[0]), int(t[1]), float(t[2])))
        out = cls(
            gemm_ceiling=cf.number("gemm_efficiency_ceiling"),
            tiles=tuple(tiles),
            k_overhead=cf.number("gemm_k_overhead"),
            max_split_k=int(cf.number("gemm_max_split_k")),
            memory_bandwidth_efficiency=cf.number("memory_bandwidth_efficiency"),
            kernel_overhead_s=cf.number("kernel_overhead_s"),
            host_overhead_per_kernel_s=cf.number("host_overhead_per_kernel_s"),
            flash_attention_efficiency=cf.number("flash_attention_efficiency"),
            optimizer_bytes_per_param=cf.number("optimizer_bytes_per_param"),
            # Optional: files written before the sustained-rate bound leave GEMMs unbounded by it.
            gemm_sustained_fraction=(cf.number("gemm_sustained_fraction") if "gemm_sustained_fraction" in cf.records
                                     else 1.0),
            # Optional: files without it stream the optimizer at ``memory_bandwidth_efficiency``.
            optimizer_bandwidth_efficiency=(cf.number("optimizer_bandwidth_efficiency")
                                            if "optimizer_bandwidth_efficiency" in cf.records else None),
            family=cf.family,
            source=cf.source,
        )
        for key in ("gemm_ceiling", "memory_bandwidth_efficiency", "flash_attention_efficiency", "gemm_sustained_fraction",
                    "optimizer_bandwidth_efficiency"):
            if getattr(out, key) is not None and not 0 < getattr(out, key) <= 1:
                raise ContractError(cf.source, key, f"{key}={getattr(out, key)} must be in (0, 1]")
        return out


__all__ = [
    "COMPUTE_KEYS",
    "ConstantsFile",
    "GpuConstants",
    "Record",
    "data_text",
    "device_facts",
    "facts_for",
    "parse_constants",
    "read_constants",
    "shipped_constants",
    "sustained_fraction_for",
]
