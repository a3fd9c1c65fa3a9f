"""Hardware catalog: device specifications the simulator prices a plan with.

Loads and validates ``traces/hardware/catalog.json`` (or a user file in the same format):
``{"format_version": 1, "devices": {NAME: ENTRY}}``, ENTRY with exactly the keys of
``DeviceSpec.to_dict()``, units in key names, dense FLOP/s (no 2:4 sparsity), and a citation
for every number so vendor figures, estimates and local measurements stay apart.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import math
import os
from typing import Any

from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import CATALOG, parse_json, read_json

# Precisions that need a device figure of their own: ``fp8`` runs the transformer blocks' GEMMs in
# FP8 (E4M3 forward, E5M2 gradients; Micikevicius et al. 2022, arXiv 2209.05433) with bf16
# everywhere else, as Transformer Engine and torchao's float8 training do, so it needs FP8 tensor
# cores (Hopper/Ada and later): a catalog device without an ``fp8`` peak cannot run it.
DEVICE_PRECISIONS = ("fp8",)

FORMAT_VERSION = 1
KINDS = ("gpu", "cpu")
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
DTYPE_ALIASES = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
NUMERIC_KEYS = (
    "memory_capacity_bytes",
    "memory_bandwidth_GBps",
    "nvlink_bandwidth_GBps",
    "nvlink_bandwidth_unidirectional_GBps",
    "nic_bandwidth_Gbps",
    "pcie_bandwidth_GBps",
    "idle_power_W",
    "max_power_W",
)
ENTRY_KEYS = ("display_name", "kind", "peak_flops_per_s", *NUMERIC_KEYS, "sources")
# Keys an entry may leave out. ``host_memory_bytes``: host (CPU) memory per device, where swapped
# activations go (``layer_memory_policy`` swap); without it the host is not checked. ``host_cpu``: the
# CPU a ``cpu`` entry was measured on (``vendor_id cpu-family model`` of /proc/cpuinfo).
OPTIONAL_KEYS = ("host_memory_bytes", "host_cpu")
# A GPU always hangs off PCIe; NVLink and NICs are optional (PCIe cards, single nodes).
_POSITIVE_FOR_GPU = ("pcie_bandwidth_GBps",)
_ALWAYS_POSITIVE = ("memory_capacity_bytes", "memory_bandwidth_GBps", "max_power_W")
_SHIPPED = "traces/hardware/catalog.json"


def _is_number(value: Any) -> bool:
    """True for a finite int or float (bool is rejected although it subclasses int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One device of the catalog, validated on construction.

    Attributes:
        name, display_name: Lowercase catalog key (``"h100-sxm5-80gb"``); human-readable name.
        kind: ``"gpu"`` or ``"cpu"``.
        peak_flops_per_s: Dense peak FLOP/s per dtype (``fp32``, ``tf32``, ``bf16`` ...).
        memory_capacity_bytes, memory_bandwidth_GBps: Device memory size and bandwidth.
        nvlink_bandwidth_GBps: NVLink per device, both directions together (the vendor figure);
            ``nvlink_bandwidth_unidirectional_GBps`` is half of it.
        nic_bandwidth_Gbps, pcie_bandwidth_GBps: NIC per device; PCIe per direction.
        idle_power_W, max_power_W: Idle (driver loaded) and maximum board power.
        sources: Citation per numeric key; FLOP/s figures as ``"peak_flops_per_s.<dtype>"``.
        host_memory_bytes: The host memory per device (its server's memory over its devices),
            which a swapping plan's host copies must fit; None: not known, not checked.
        host_cpu: For a ``cpu`` entry measured on one machine, that machine's CPU as
            ``"vendor_id family model"`` from /proc/cpuinfo (``"AuthenticAMD 25 17"``): a run on
            another CPU does not take this entry's peak for its MFU (:func:`this_host_cpu`).
            None: not checked.
        origin, key_prefix: File and key prefix (``"devices.cpu."``) named in errors only.
    """

    name: str
    display_name: str
    kind: str
    peak_flops_per_s: dict[str, float]
    memory_capacity_bytes: int
    memory_bandwidth_GBps: float
    nvlink_bandwidth_GBps: float
    nvlink_bandwidth_unidirectional_GBps: float
    nic_bandwidth_Gbps: float
    pcie_bandwidth_GBps: float
    idle_power_W: float
    max_power_W: float
    sources: dict[str, str]
    host_memory_bytes: int | None = None
    host_cpu: str | None = None
    origin: str = dataclasses.field(default="<dict>", compare=False, repr=False)
    key_prefix: str = dataclasses.field(default="", compare=False, repr=False)

    def _error(self, key: str | None, rule: str) -> ContractError:
        return ContractError(self.origin, f"{self.key_prefix}{key}" if key else None, rule)

    def __post_init__(self) -> None:
        for key in ("name", "display_name", "kind"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value.strip():
                raise self._error(key, f"{key} must be a non-empty string, got {value!r}")
        if self.kind not in KINDS:
            raise self._error("kind", f"kind must be one of {list(KINDS)}, got {self.kind!r}")
        self._check_flops()
        self._check_numbers()
        self._check_sources()

    def _check_flops(self) -> None:
        flops = self.peak_flops_per_s
        if not isinstance(flops, dict) or not flops:
            raise self._error("peak_flops_per_s", "peak_flops_per_s must be a non-empty object")
        for dtype, value in flops.items():
            key = f"peak_flops_per_s.{dtype}"
            if dtype not in DTYPES:
                raise self._error(key, f"unknown dtype {dtype!r}; known dtypes: {list(DTYPES)}")
            if not _is_number(value) or value <= 0:
                raise self._error(key, f"{key} must be a positive finite number, got {value!r}")
        if "fp32" not in flops:
            raise self._error("peak_flops_per_s.fp32", "every device needs an fp32 peak")
        object.__setattr__(self, "peak_flops_per_s", {k: float(v) for k, v in flops.items()})

    def _check_numbers(self) -> None:
        for key in NUMERIC_KEYS:
            value = getattr(self, key)
            if not _is_number(value):
                raise self._error(key, f"{key} must be a finite number, got {value!r}")
            positive = key in _ALWAYS_POSITIVE or (self.kind == "gpu" and key in _POSITIVE_FOR_GPU)
            if value < 0 or (positive and value == 0):
                rule = "> 0" if positive else ">= 0"
                raise self._error(key, f"{key}={value!r} must be {rule} for a {self.kind}")
            whole = key == "memory_capacity_bytes"
            if whole and value != int(value):
                raise self._error(key, f"{key}={value!r} must be a whole number of bytes")
            object.__setattr__(self, key, int(value) if whole else float(value))
        host = self.host_memory_bytes
        if host is not None:
            if not _is_number(host) or host <= 0 or host != int(host):
                raise self._error("host_memory_bytes", f"host_memory_bytes must be a positive whole number of bytes, "
                                                       f"got {host!r}")
            object.__setattr__(self, "host_memory_bytes", int(host))
        if self.host_cpu is not None:
            parts = self.host_cpu.split() if isinstance(self.host_cpu, str) else []
            if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
                raise self._error("host_cpu", f"host_cpu must be 'vendor_id family model' as /proc/cpuinfo gives them "
                                              f"(e.g. 'AuthenticAMD 25 17'), got {self.host_cpu!r}")
            if self.kind != "cpu":
                raise self._error("host_cpu", f"host_cpu describes a cpu entry's machine; this entry is a {self.kind}")
        idle, peak = self.idle_power_W, self.max_power_W
        if idle > peak:
            raise self._error("idle_power_W", f"idle_power_W={idle} exceeds max_power_W={peak}")
        uni, bi = self.nvlink_bandwidth_unidirectional_GBps, self.nvlink_bandwidth_GBps
        if not math.isclose(2 * uni, bi, rel_tol=1e-6):
            k = "nvlink_bandwidth_unidirectional_GBps"
            raise self._error(k, f"{k}={uni} must be half of nvlink_bandwidth_GBps={bi}")

    def _check_sources(self) -> None:
        sources = self.sources
        if not isinstance(sources, dict):
            raise self._error("sources", "sources must be an object mapping keys to citations")
        needed = [*NUMERIC_KEYS, *(f"peak_flops_per_s.{d}" for d in self.peak_flops_per_s),
                  *(k for k in OPTIONAL_KEYS if getattr(self, k) is not None)]
        for key in needed:
            if key not in sources:
                raise self._error(f"sources.{key}", f"{key} has no source; every number needs one")
        for key, text in sources.items():
            if key not in needed:
                raise self._error(f"sources.{key}", "this key names no number of the entry")
            if not isinstance(text, str) or not text.strip():
                raise self._error(f"sources.{key}", "a source must be a non-empty string")
        object.__setattr__(self, "sources", dict(sources))

    def peak_flops(self, dtype: str) -> float:
        """Return the dense peak FLOP/s for ``dtype``.

        Args:
            dtype: ``"fp32"``, ``"bf16"`` ... or a torch-style alias (``"bfloat16"``).

        Raises:
            ContractError: The device has no figure for that dtype.
        """
        key = DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
        if key not in self.peak_flops_per_s:
            known = sorted(self.peak_flops_per_s)
            raise ContractError(self.name, "precision", f"no {dtype!r} figure; available: {known}")
        return self.peak_flops_per_s[key]

    @property
    def memory_capacity_gib(self) -> float:
        """Device memory in GiB (2**30 bytes)."""
        return self.memory_capacity_bytes / 2**30

    def to_dict(self) -> dict[str, Any]:
        """Return the catalog ENTRY (JSON-ready; the name is the catalog key, not a field)."""
        out = {key: getattr(self, key) for key in ENTRY_KEYS}
        out["peak_flops_per_s"] = dict(self.peak_flops_per_s)
        out["sources"] = dict(self.sources)
        out.update({k: getattr(self, k) for k in OPTIONAL_KEYS if getattr(self, k) is not None})
        return out

    @classmethod
    def from_dict(
        cls, d: Any, source: str = "<dict>", name: str = "custom", key_prefix: str = ""
    ) -> DeviceSpec:
        """Build a spec from a catalog ENTRY.

        Args:
            d: The ENTRY object (the keys of ``to_dict()``: every one of ``ENTRY_KEYS``, any of ``OPTIONAL_KEYS``).
            source, key_prefix: File and key prefix (``"devices.cpu."``) named in errors.
            name: The device's catalog name.

        Raises:
            ContractError: Not an object, unknown or missing keys, wrong types or values.
        """
        if not isinstance(d, dict):
            rule = f"a device entry must be an object, got {type(d).__name__}"
            raise ContractError(source, key_prefix.rstrip(".") or None, rule)
        allowed = ", ".join((*ENTRY_KEYS, *OPTIONAL_KEYS))
        bad = [(k, f"unknown key; allowed: {allowed}") for k in d if k not in ENTRY_KEYS + OPTIONAL_KEYS]
        bad += [(k, "missing required key") for k in ENTRY_KEYS if k not in d]
        if bad:
            raise ContractError(source, f"{key_prefix}{bad[0][0]}", bad[0][1])
        return cls(name=name, origin=source, key_prefix=key_prefix, **d)


def _read_json(path: str | os.PathLike[str] | None) -> tuple[Any, str]:
    """Read and parse the catalog text (duplicate keys refused); return (document, source name for errors)."""
    if path is None:
        resource = importlib.resources.files("mindpipe.traces.hardware").joinpath("catalog.json")
        return parse_json(resource.read_text(encoding="utf-8"), _SHIPPED, unique_keys=True), _SHIPPED
    source = os.fspath(path)
    return read_json(path, CATALOG, source, unique_keys=True), source


def _parse_catalog(doc: Any, source: str) -> dict[str, DeviceSpec]:
    if not isinstance(doc, dict):
        raise ContractError(source, None, "a catalog must be a JSON object")
    for key in doc:
        if key not in ("format_version", "devices"):
            raise ContractError(source, key, "unknown key; allowed: format_version, devices")
    version = doc.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        rule = f"format_version must be {FORMAT_VERSION}, got {version!r}"
        raise ContractError(source, "format_version", rule)
    devices = doc.get("devices")
    if not isinstance(devices, dict) or not devices:
        raise ContractError(source, "devices", "devices must be a non-empty object")
    catalog: dict[str, DeviceSpec] = {}
    for raw_name, entry in devices.items():
        name = raw_name.strip().lower()
        if not name:
            raise ContractError(source, "devices", "a device name must be non-empty")
        if name in catalog:
            rule = f"device names are case-insensitive; {raw_name!r} repeats {name!r}"
            raise ContractError(source, f"devices.{raw_name}", rule)
        catalog[name] = DeviceSpec.from_dict(entry, source, name, key_prefix=f"devices.{raw_name}.")
    return catalog


@functools.lru_cache(maxsize=1)
def _shipped_catalog() -> dict[str, DeviceSpec]:
    return _parse_catalog(*_read_json(None))


def load_catalog(path: str | os.PathLike[str] | None = None) -> dict[str, DeviceSpec]:
    """Load a hardware catalog and return its device specs keyed by lowercase name.

    Args:
        path: A catalog JSON file in the shipped format, or ``None`` for the shipped catalog
            (cached after the first call).

    Raises:
        ContractError: Missing file, malformed JSON, or an entry that breaks the format.
    """
    if path is None:
        return dict(_shipped_catalog())
    return _parse_catalog(*_read_json(path))


def get_device(
    name: str,
    catalog: dict[str, DeviceSpec] | None = None,
    source: str = "cluster",
    key: str = "gpu",
) -> DeviceSpec:
    """Look a device up by name, case-insensitively.

    Args:
        name: Device name such as ``"A100-SXM4-80GB"``.
        catalog: Catalog to search; ``None`` for the shipped one.
        source, key: File and key named in the error message (the cluster file's ``gpu``).

    Raises:
        ContractError: Unknown name; the message lists the known names.
    """
    devices = _shipped_catalog() if catalog is None else catalog
    wanted = name.strip().lower() if isinstance(name, str) else None
    if wanted not in devices:
        known = ", ".join(sorted(devices))
        raise ContractError(source, key, f"unknown device {name!r}; known devices: {known}")
    return devices[wanted]


def device_names() -> list[str]:
    """Return the sorted names of the shipped devices."""
    return sorted(_shipped_catalog())


def this_host_cpu(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """This machine's CPU as ``"vendor_id family model"`` (its first processor in ``cpuinfo``, as
    :attr:`DeviceSpec.host_cpu` names one); None where the file is missing or says less (not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("vendor_id", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:  # the first processor's block ends
                    break
    except OSError:
        return None
    parts = [fields.get(k, "") for k in ("vendor_id", "cpu family", "model")]
    return " ".join(parts) if all(parts) else None


def describes_this_host(spec: DeviceSpec, cpuinfo: str = "/proc/cpuinfo") -> bool:
    """False when ``spec`` is a ``cpu`` entry measured on another CPU than this machine's
    (:attr:`DeviceSpec.host_cpu`); True otherwise (a GPU, an entry that names no CPU, or a host
    whose CPU cannot be read)."""
    if spec.kind != "cpu" or spec.host_cpu is None:
        return True
    here = this_host_cpu(cpuinfo)
    return here is None or here == spec.host_cpu


def precision_supported(precision: str, device_name: str) -> bool:
    """True when the catalog device ``device_name`` can run ``precision`` (:data:`DEVICE_PRECISIONS`
    need the device's own peak figure; the rest run everywhere)."""
    return precision not in DEVICE_PRECISIONS or precision in get_device(device_name).peak_flops_per_s


def check_precision(precision: str, device_name: str, source: str = "plan") -> None:
    """Refuse a precision the device has no hardware for (``fp8`` on an A100 or a CPU).

    Raises:
        ContractError: e.g. ``plan.json: precision: precision 'fp8' needs FP8 tensor cores; a100-sxm4-80gb has none``.
    """
    if not precision_supported(precision, device_name):
        raise ContractError(source, "precision", f"precision {precision!r} needs FP8 tensor cores "
                                                 f"(H100, H200); {device_name} has none (use bf16)")


def fp8_tp_refusal(precision: str, tp: int) -> str | None:
    """Why the executor cannot run ``precision`` at this tensor-parallel degree (None when it can).

    The executor runs ``fp8`` as torchao ``Float8Linear`` without torchao's float8 tensor-parallel
    styles, so only at tp = 1: the launcher refuses the rest (``executor/fp8.py`` ``fp8_refusal``)
    and the tuner does not search them (``tuner/space.py``), so a tuned plan is one it runs.
    """
    if precision == "fp8" and tp > 1:
        return "precision 'fp8' with tp > 1 needs torchao's float8 tensor-parallel styles, which the executor does not apply"
    return None
