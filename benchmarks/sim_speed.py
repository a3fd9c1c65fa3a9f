"""Simulator speed: gpt3-175b on 1024 A100 (tp8, pp16, dp8, mb1, gbs1024, 1f1b), and growth in m, p, dp.

Run: ``.venv/bin/python benchmarks/sim_speed.py`` (pins itself to one core where the OS allows).
Prints a table and writes ``benchmarks/results/sim_speed.json``. The headline target is ≤ 0.10 s
for the 1,024-GPU case (issue 14; vTrain needs about 2.5 s for a similar 512-GPU case): the median
of 7 runs, wall clock, with the process's CPU time beside it and the load average before and
after, since the machine may be shared. The table checks that time grows at most linearly in m·p
and does not grow with dp (one pipeline is simulated, data replicas enter as flow multiplicities).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from mindpipe.simulator.api import simulate
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Plan

OUT = Path(__file__).resolve().parent / "results" / "sim_speed.json"
TARGET_S = 0.10


def timed(model, cluster, plan, repeats: int = 3) -> tuple[float, float, float]:
    """(median wall seconds, median CPU seconds, iteration_time_s) of simulate()."""
    walls, cpus, it = [], [], 0.0
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        r = simulate(model, cluster, plan)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
        it = r.iteration_time_s
    return statistics.median(walls), statistics.median(cpus), it


def main() -> None:
    """Run the headline case and the scaling table."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    model = load_model("gpt3-175b")
    rows = []
    head_plan = Plan(dp=8, tp=8, pp=16, micro_batch_size=1, global_batch_size=1024, schedule="1f1b", recompute="full")
    head_cluster = load_cluster("a100-sxm4-80gb:128x8")
    load_before = os.getloadavg()
    simulate(model, head_cluster, head_plan)  # warm-up: imports and schedule caches
    secs, cpu, it = timed(model, head_cluster, head_plan, repeats=7)
    headline = {"case": "gpt3-175b, 1024 A100, tp8 pp16 dp8, mb1, gbs1024, 1f1b, full recompute",
                "sim_seconds": secs, "cpu_seconds": cpu, "repeats": 7, "target_s": TARGET_S,
                "meets_target": secs <= TARGET_S, "load_average_1m_before": load_before[0],
                "load_average_1m_after": os.getloadavg()[0], "predicted_iteration_s": it}
    print(f"headline: {headline['case']}: {secs:.3f} s to simulate (CPU {cpu:.3f} s; target {TARGET_S} s; "
          f"load average {load_before[0]:.1f}; predicted iteration {it:.2f} s)")
    print(f"{'pp':>4} {'dp':>4} {'m':>6} {'m*p':>7} {'sim s':>8} {'CPU s':>8} {'us per m*p':>11}")
    for pp, dp, m in [(4, 8, 32), (8, 8, 32), (16, 8, 32), (16, 8, 64), (16, 8, 128), (16, 8, 256), (32, 8, 128),
                      (16, 1, 128), (16, 2, 128), (16, 4, 128), (16, 16, 128), (16, 32, 128)]:
        tp = 8
        gpus = tp * pp * dp
        cluster = load_cluster(f"a100-sxm4-80gb:{gpus // 8}x8")
        plan = Plan(dp=dp, tp=tp, pp=pp, micro_batch_size=1, global_batch_size=m * dp, schedule="1f1b",
                    recompute="full")
        secs, cpu, it = timed(model, cluster, plan)
        row = {"pp": pp, "dp": dp, "m": m, "gpus": gpus, "sim_seconds": secs, "cpu_seconds": cpu,
               "us_per_mp": secs / (m * pp) * 1e6, "predicted_iteration_s": it}
        rows.append(row)
        print(f"{pp:>4} {dp:>4} {m:>6} {m * pp:>7} {secs:>8.3f} {cpu:>8.3f} {row['us_per_mp']:>11.1f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"headline": headline, "table": rows}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
