"""Baseline for phase 2: the untuned hardware models through the engine on vTrain's measurements.

Simulates every row of ``validation/vtrain_a100_{single,multi}_node.csv`` with
:func:`mindpipe.simulator.perf.default_models` (shipped constants: nothing here is fitted on these files)
and reports MAPE on the fit half and the hold-out half of the seed-0 split, plus the signed
median error by configuration knob, to show the lead where an end-to-end fit has to act. Writes
``benchmarks/results/perf_vtrain_untuned.json``.

    .venv/bin/python benchmarks/perf_vtrain_untuned.py [--data ../shared/data] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.perf import default_models
from mindpipe.simulator.perf.vtrain import VTrainRow, load_vtrain, split_fit_holdout
from mindpipe.traces.catalog import get_device

FILES = {"single": "validation/vtrain_a100_single_node.csv", "multi": "validation/vtrain_a100_multi_node.csv"}


def knobs(r: VTrainRow) -> dict[str, int]:
    """The configuration values errors are grouped by."""
    p = r.plan
    return {"tp": p.tp, "pp": p.pp, "dp": p.dp, "micro_batch": p.micro_batch_size, "hidden": r.model.hidden_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "perf_vtrain_untuned.json"))
    args = ap.parse_args()
    result: dict[str, object] = {"seed": args.seed}
    for name, rel in FILES.items():
        rows = load_vtrain(Path(args.data) / rel)
        fit, hold = split_fit_holdout(rows, seed=args.seed)
        t0 = time.perf_counter()
        err: dict[str, float] = {}
        for r in rows:
            comp, comm = default_models(get_device(r.cluster.gpu), r.cluster)
            res = simulate(r.model, r.cluster, r.plan, SimulationOptions(compute=comp, comm=comm))
            err[r.source] = (res.iteration_time_s - r.measured_iteration_time_s) / r.measured_iteration_time_s
        wall = time.perf_counter() - t0
        by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            for k, v in knobs(r).items():
                by[k][str(v)].append(err[r.source])
        by_knob = {k: {v: 100 * statistics.median(e) for v, e in d.items()} for k, d in by.items()}
        summary = {
            "rows": len(rows), "simulate_wall_s": wall,
            "fit_half_mape_percent": 100 * statistics.fmean(abs(err[r.source]) for r in fit),
            "holdout_half_mape_percent": 100 * statistics.fmean(abs(err[r.source]) for r in hold),
            "median_signed_error_percent": 100 * statistics.median(err.values()),
            "median_signed_error_by_knob_percent": by_knob,
        }
        result[name] = summary
        print(f"{name}: {len(rows)} rows in {wall:.1f} s; MAPE fit half {summary['fit_half_mape_percent']:.2f}%, "
              f"hold-out half {summary['holdout_half_mape_percent']:.2f}%; median signed "
              f"{summary['median_signed_error_percent']:+.1f}%")
        for k, d in by_knob.items():
            print(f"   by {k}: " + ", ".join(f"{v}: {e:+.1f}%" for v, e in sorted(d.items(), key=lambda kv: int(kv[0]))))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
