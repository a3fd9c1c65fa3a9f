"""How much carbon time-shifting saves, per zone, on 2024 hourly grid intensity (issue 18, point 4).

For every zone in ``../shared/data/carbon/*_2024_hourly.csv`` (Electricity Maps, LCA column) and
every start hour ``t`` of 2024 whose horizon the series covers: a J-hour job that may start up to D
hours late — window ``[t, t + D]`` — is placed by :mod:`mindpipe.simulator.timeshift`
(non-interruptible: best contiguous start; interruptible: the J cleanest hours before the
deadline ``t + D + J``), and its saving ``1 − CI_shifted / CI_now`` against starting at ``t`` is
averaged over all ``t`` (the method of BACKGROUND.md §7, whose reference figures are printed beside
ours). Power is constant over the job, so the saving in gCO2 is the saving in mean intensity.
Cases: 4 h / +24 h and 24 h / +48 h.

Issue 18's acceptance (4 h / +24 h): ≥ 35 % in US-CAL-CISO and ≥ 25 % in GB, and honestly small in
SG and IN-WE. Every figure is reported, met or not.

Run from the repository root (a few minutes on 2 cores)::

    .venv/bin/python benchmarks/time_shifting.py [--data ../shared/data/carbon] [--stride 1]

Writes ``benchmarks/results/time_shifting.json`` and ``benchmarks/results/time_shifting.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from mindpipe.simulator.carbon import CarbonSeries, load_carbon_csv
from mindpipe.simulator.timeshift import Window, schedule

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "carbon"
OUT = REPO / "benchmarks" / "results" / "time_shifting.json"
CASES = ((4, 24), (24, 48))  # (job hours J, may start up to D hours late)
# BACKGROUND.md §7 "hourly statistics and time-shifting bounds, 2024": (J, D) -> (non-int, int) %.
REFERENCE = {
    "US-CAL-CISO": {(4, 24): (38.3, 38.7), (24, 48): (7.8, 39.7)},
    "GB": {(4, 24): (27.3, 28.1), (24, 48): (18.7, 28.6)},
    "DE-LU": {(4, 24): (25.4, 25.8), (24, 48): (15.2, 26.3)},
    "US-TEX-ERCO": {(4, 24): (19.2, 19.9), (24, 48): (10.9, 18.9)},
    "SG": {(4, 24): (4.6, 4.8), (24, 48): (0.4, 3.3)},
    "IN-WE": {(4, 24): (2.3, 2.4), (24, 48): (0.4, 1.8)},
}
ACCEPT = {"US-CAL-CISO": 0.35, "GB": 0.25}  # 4 h / +24 h, non-interruptible and interruptible


def savings(series: CarbonSeries, job_h: int, late_h: int, interruptible: bool, stride: int) -> dict[str, Any]:
    """Mean (and spread) of the saving over every start hour whose horizon the series covers."""
    hour = dt.timedelta(hours=1)
    last = len(series) - (late_h + job_h)  # t + D + J must not pass the series' end
    got, waits = [], []
    for i in range(0, last + 1, stride):
        t = series.times[i]
        sched = schedule(series, Window(t, t + late_h * hour), job_h * 3600.0, interruptible)
        got.append(sched.saving_fraction)
        waits.append(sched.wait_s / 3600)
    q = statistics.quantiles(got, n=10)
    return {"mean_saving": statistics.fmean(got), "p10": q[0], "median": statistics.median(got), "p90": q[-1],
            "starts": len(got), "mean_wait_hours": statistics.fmean(waits)}


def zone(path: Path, stride: int) -> dict[str, Any]:
    """Every case for one zone, with the series' own statistics."""
    series = load_carbon_csv(path)
    name = path.name.split("_")[0]
    out: dict[str, Any] = {"zone": name, "hours": len(series), "mean_g_per_kwh": statistics.fmean(series.values),
                           "cases": {}}
    for job_h, late_h in CASES:
        key = f"{job_h}h/+{late_h}h"
        ref = REFERENCE.get(name, {}).get((job_h, late_h))
        out["cases"][key] = {
            "non_interruptible": savings(series, job_h, late_h, False, stride),
            "interruptible": savings(series, job_h, late_h, True, stride),
            "background_reference_percent": list(ref) if ref else None,
        }
    return out


def acceptance(zones: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's 4 h / +24 h targets, per zone and kind, met or not."""
    out: dict[str, Any] = {}
    for name, target in ACCEPT.items():
        case = zones[name]["cases"]["4h/+24h"]
        for kind in ("non_interruptible", "interruptible"):
            got = case[kind]["mean_saving"]
            out[f"{name} {kind}"] = {"saving": got, "target": target, "met": got >= target}
    for name in ("SG", "IN-WE"):
        got = zones[name]["cases"]["4h/+24h"]["non_interruptible"]["mean_saving"]
        out[f"{name} non_interruptible (reported small)"] = {"saving": got, "small": got < 0.10}
    return out


def plot(zones: dict[str, dict[str, Any]], path: Path) -> None:
    """Grouped bars: mean saving per zone and case, BACKGROUND's reference as ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(zones, key=lambda z: -zones[z]["cases"]["4h/+24h"]["non_interruptible"]["mean_saving"])
    bars = [(c, k) for c in ("4h/+24h", "24h/+48h") for k in ("non_interruptible", "interruptible")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(bars)
    for j, (case, kind) in enumerate(bars):
        xs = [i + (j - (len(bars) - 1) / 2) * width for i in range(len(names))]
        ys = [100 * zones[z]["cases"][case][kind]["mean_saving"] for z in names]
        ax.bar(xs, ys, width, label=f"{case} {kind.replace('_', '-')}")
        refs = [zones[z]["cases"][case]["background_reference_percent"] for z in names]
        ax.plot(xs, [r[kind == "interruptible"] if r else float("nan") for r in refs], "k_", markersize=8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("mean gCO2 saving vs starting now (%)")
    ax.set_title("time-shifting, 2024 hourly LCA intensity (black ticks: BACKGROUND.md §7)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(zones: dict[str, dict[str, Any]]) -> str:
    """The printed table: ours / BACKGROUND's reference, in %."""
    head = f"{'zone':<12} {'mean g/kWh':>10}  " + "  ".join(f"{c + ' non-int / int':>30}" for c, _ in
                                                              ((f"{j}h/+{d}h", 0) for j, d in CASES))
    lines = [head]
    for name, z in sorted(zones.items(), key=lambda kv: -kv[1]["cases"]["4h/+24h"]["non_interruptible"]["mean_saving"]):
        cells = []
        for job_h, late_h in CASES:
            c = z["cases"][f"{job_h}h/+{late_h}h"]
            ref = c["background_reference_percent"]
            ours = f"{100 * c['non_interruptible']['mean_saving']:.1f} / {100 * c['interruptible']['mean_saving']:.1f}"
            cells.append(f"{ours + (f' (ref {ref[0]} / {ref[1]})' if ref else ''):>30}")
        lines.append(f"{name:<12} {z['mean_g_per_kwh']:>10.0f}  " + "  ".join(cells))
    return "\n".join(lines)


def main() -> None:
    """Run every zone (two processes), write the JSON and the plot, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="folder of *_2024_hourly.csv (default ../shared/data/carbon)")
    ap.add_argument("--stride", type=int, default=1, help="every k-th start hour (default 1: all of them)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    files = sorted(args.data.glob("*_2024_hourly.csv"))
    began = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        done = list(pool.map(zone, files, [args.stride] * len(files)))
    zones = {z["zone"]: z for z in done}
    result = {"method": "mean over start hours t of 1 - CI_shifted/CI_now; window [t, t+D], interruptible deadline "
                        "t+D+J (mindpipe.simulator.timeshift)", "stride_hours": args.stride, "zones": zones,
              "acceptance": acceptance(zones) if all(n in zones for n in (*ACCEPT, "SG", "IN-WE")) else None,
              "wall_s": time.perf_counter() - began}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    plot(zones, OUT.with_suffix(".png"))
    print(table(zones))
    for k, v in (result["acceptance"] or {}).items():
        print(f"{k:<45} {100 * v['saving']:.1f} %  " + (f"target >= {100 * v['target']:.0f} %: "
              f"{'met' if v['met'] else 'NOT met'}" if "target" in v else f"small (< 10 %): {v['small']}"))
    print(f"wrote {OUT} and {OUT.with_suffix('.png')} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
