"""Energy and carbon of one iteration (busy/blocked power × time, PUE, grid intensity).

Per device, E = P_busy·t_compute + P_wait·(T − t_compute) (BACKGROUND.md §7). On GPUs with clock
data P_busy is the frequency model's power at the rank's SM clock and load
(:mod:`mindpipe.simulator.frequency`: a GEMM at max clock draws the board limit, memory-bound
kernels less, and a launch-bound phase only P_wait in the gaps between its kernels) and P_wait its
blocked-on-P2P power (Perseus, SOSP'24; A100 85 W, kareus). Other
devices compute at the board's maximum power and wait at max(idle, 0.175 × max) (Perseus's
~70 W of a 400 W A100).
Host CPUs, DRAM and NICs are not counted. The facility multiplies by PUE; emissions are
kWh × grid intensity: an annual mean per region from the shipped table, or the hour of a user's
Electricity Maps CSV.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib.resources
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from mindpipe.simulator.carbon import CarbonSeries, load_carbon_csv
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.errors import ContractError
from mindpipe.traces.frequency import frequency_spec, has_frequency_data

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
    """Power of a device that is blocked on communication or idle inside an iteration.

    GPUs with clock data (``traces/hardware/frequency.json``) use their measured blocked-on-P2P
    power (:mod:`mindpipe.simulator.frequency`); other devices max(idle, 17.5 % of max).
    """
    if has_frequency_data(device.name):
        return frequency_spec(device.name).blocked_power_W
    return max(device.idle_power_W, BLOCKED_POWER_FRACTION * device.max_power_W)


def device_energy_j(device: DeviceSpec, iteration_s: float, compute_s: list[float], devices_per_rank: int,
                    busy_power_w: Sequence[float] | None = None) -> float:
    """Energy of all devices: each pipeline rank stands for ``devices_per_rank`` identical devices.

    ``busy_power_w`` is each rank's mean power while computing (the frequency model's, at the
    rank's clock and load); None: the board's maximum power.
    """
    p_wait = wait_power_w(device)
    total = 0.0
    for r, busy in enumerate(compute_s):
        busy = min(busy, iteration_s)
        p_busy = device.max_power_W if busy_power_w is None else busy_power_w[r]
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


def load_hourly_intensity(path: str | os.PathLike[str]) -> CarbonSeries:
    """Read an Electricity Maps hourly CSV (:func:`mindpipe.simulator.carbon.load_carbon_csv`).

    Raises:
        ContractError: naming the file and the line (see :mod:`mindpipe.simulator.carbon`).
    """
    return load_carbon_csv(path)


def hourly_intensity(series: CarbonSeries | Sequence[tuple[dt.datetime, float]], when: dt.datetime,
                     duration_s: float = 0.0) -> float:
    """Mean intensity over ``[when, when + duration_s]`` (the value at ``when`` for 0).

    ``series`` is a :class:`CarbonSeries` or (time, g/kWh) pairs in any order (naive times are
    UTC, offsets are converted; each value holds until the next point, at most an hour).

    Raises:
        ContractError: a span the series does not cover (the missing range named), or a series
            with repeated instants or values that are not finite and >= 0.
    """
    s = series if isinstance(series, CarbonSeries) else CarbonSeries.of(series)
    return s.intensity_over(when, duration_s)


def energy_report(device: DeviceSpec, iteration_s: float, compute_s: list[float], devices_per_rank: int, pue: float,
                  intensity: tuple[float, str], busy_power_w: Sequence[float] | None = None) -> EnergyReport:
    """Energy of one iteration (device and facility) and its emissions (``busy_power_w``: :func:`device_energy_j`)."""
    dev = device_energy_j(device, iteration_s, compute_s, devices_per_rank, busy_power_w)
    fac = dev * pue
    g_per_kwh, source = intensity
    return EnergyReport(dev, fac, fac / J_PER_KWH * g_per_kwh, g_per_kwh, source)


__all__ = [
    "CarbonSeries",
    "EnergyReport",
    "annual_intensity",
    "device_energy_j",
    "energy_report",
    "hourly_intensity",
    "load_hourly_intensity",
    "region_names",
    "wait_power_w",
]
