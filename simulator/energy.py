"""Energy and carbon of one iteration, first version (busy/idle power × time, PUE, grid intensity).

Per device, E = P_busy·t_compute + P_wait·(T − t_compute) (BACKGROUND.md §7): compute runs at the
board's maximum power (GEMM-heavy training sits at the power limit on A100/H100), and time spent
communicating or waiting in bubbles at a "blocked" power — Perseus (SOSP'24) measures ~70 W for
an A100 blocked on P2P, i.e. 17.5 % of its 400 W; we use max(idle, 0.175 × max) for every device.
Host CPUs, DRAM and NICs are not counted. The facility multiplies by PUE; emissions are
kWh × grid intensity: an annual mean per region from the shipped table, or the hour of a user's
Electricity Maps CSV.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import importlib.resources
import json
import os
from dataclasses import dataclass

from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.errors import ContractError

BLOCKED_POWER_FRACTION = 0.175  # Perseus: 70 W of a 400 W A100 while blocked on communication
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class EnergyReport:
    """Energy and carbon of one iteration for the whole cluster."""

    device_energy_j: float
    facility_energy_j: float
    carbon_gco2: float
    intensity_g_per_kwh: float
    intensity_source: str


def wait_power_w(device: DeviceSpec) -> float:
    """Power of a device that is blocked on communication or idle inside an iteration."""
    return max(device.idle_power_W, BLOCKED_POWER_FRACTION * device.max_power_W)


def device_energy_j(device: DeviceSpec, iteration_s: float, compute_s: list[float], devices_per_rank: int) -> float:
    """Energy of all devices: each pipeline rank stands for ``devices_per_rank`` identical devices."""
    p_busy, p_wait = device.max_power_W, wait_power_w(device)
    total = 0.0
    for busy in compute_s:
        busy = min(busy, iteration_s)
        total += p_busy * busy + p_wait * (iteration_s - busy)
    return total * devices_per_rank


@functools.lru_cache(maxsize=1)
def _annual_table() -> dict:
    text = importlib.resources.files("mindpipe.simulator.data").joinpath("grid_intensity.json").read_text(encoding="utf-8")
    return json.loads(text)


def region_names() -> list[str]:
    """Regions of the shipped annual table."""
    return sorted(_annual_table()["regions"])


def annual_intensity(region: str | None) -> tuple[float, str]:
    """(gCO2eq/kWh, source) for ``region``; None means the world average.

    Raises:
        ContractError: unknown region (the message lists the known ones).
    """
    table = _annual_table()
    key = (region or table["default_region"]).upper()
    regions = {k.upper(): v for k, v in table["regions"].items()}
    if key not in regions:
        raise ContractError("cluster", "region", f"unknown region {region!r}; known: {', '.join(region_names())}")
    entry = regions[key]
    return float(entry["value"]), f"{key} annual mean: {entry['source']}"


def load_hourly_intensity(path: str | os.PathLike[str]) -> list[tuple[dt.datetime, float]]:
    """Read an Electricity Maps hourly CSV (``Datetime (UTC)`` and an LCA or direct intensity column).

    Raises:
        ContractError: missing file, missing columns or unparsable rows (naming file and row).
    """
    name = str(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except FileNotFoundError:
        raise ContractError(name, None, "file not found") from None
    if not rows:
        raise ContractError(name, None, "empty file")
    header = rows[0]
    try:
        t_col = next(i for i, c in enumerate(header) if c.strip().lower().startswith("datetime"))
    except StopIteration:
        raise ContractError(name, "Datetime (UTC)", "no datetime column") from None
    cols = [i for i, c in enumerate(header) if "carbon intensity" in c.lower()]
    lca = [i for i in cols if "lca" in header[i].lower()]
    if not cols:
        raise ContractError(name, "Carbon Intensity", "no carbon intensity column")
    v_col = (lca or cols)[0]
    out = []
    for n, row in enumerate(rows[1:], start=2):
        try:
            when = dt.datetime.fromisoformat(row[t_col].strip().replace("Z", "+00:00"))
            out.append((when.replace(tzinfo=None), float(row[v_col])))
        except (ValueError, IndexError):
            raise ContractError(name, f"row {n}", f"cannot parse {row!r}") from None
    return out


def hourly_intensity(series: list[tuple[dt.datetime, float]], when: dt.datetime) -> float:
    """Intensity of the hour containing ``when`` (nearest earlier hour in the series)."""
    when = when.replace(tzinfo=None)
    best = series[0][1]
    for t, v in series:
        if t <= when:
            best = v
        else:
            break
    return best


def energy_report(device: DeviceSpec, iteration_s: float, compute_s: list[float], devices_per_rank: int, pue: float,
                  intensity: tuple[float, str]) -> EnergyReport:
    """Energy of one iteration (device and facility) and its emissions."""
    dev = device_energy_j(device, iteration_s, compute_s, devices_per_rank)
    fac = dev * pue
    g_per_kwh, source = intensity
    return EnergyReport(dev, fac, fac / J_PER_KWH * g_per_kwh, g_per_kwh, source)


__all__ = [
    "EnergyReport",
    "annual_intensity",
    "device_energy_j",
    "energy_report",
    "hourly_intensity",
    "load_hourly_intensity",
    "region_names",
    "wait_power_w",
]
