"""MindPipe's loop on one GPU, from ``benchmarks/gpu_check.sh``'s ``loop`` section, on any machine.

The section profiles a 4-block GPT (h 4096, s 2048, V 32k, bf16, fused attention) at micro-batch 2
and runs 8 single-GPU plans of it. For each run this prints the measured iteration time (median of
the clean steps) against three predictions:

- **analytic**: the simulator's hardware model of the catalog GPU the run names, no trace;
- **trace**: the simulator priced from the profile taken on that GPU (``simulate --trace``), the
  product's path from ``mindpipe profile`` to a prediction (micro-batches other than 2 scale it);
- **calibrated**: ``mindpipe calibrate`` fitted on the ``FIT`` runs and applied to the others, which
  are held out.

and each run's peak memory, simulated against the caching allocator's peak.

    .venv/bin/python benchmarks/gpu_loop_report.py [DIR] [--out DIR/loop_report.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from gpu_check_report import run_files  # the script beside this one
from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.calibrate.fit import calibrate
from mindpipe.simulator.calibrate.memory_fidelity import memory_rows
from mindpipe.simulator.calibrate.runs import load_run
from mindpipe.traces.trace import Trace

HERE = Path(__file__).resolve().parent
# Fitted on: keep at micro-batch 1 and 2 and full recompute. Held out: micro-batch 4, selective
# recompute, swap-all, the per-block mix and fp8 (whose kind of GEMM no fitted run has).
FIT = ("loop_mb1_keep", "loop_mb2_keep", "loop_mb2_full")


def _mape(errors: list[float]) -> float:
    return 100 * statistics.fmean(abs(e) for e in errors) if errors else float("nan")


def loop_rows(d: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    runs = [load_run(f) for f in run_files(d, "run_loop_*.json")]
    if not runs:
        raise SystemExit(f"{d}: no run_loop_*.json (bash benchmarks/gpu_check.sh DIR loop, on a GPU)")
    profiles = sorted(d.glob("profile_gpt-4k_*.json"))
    trace = Trace.load(profiles[0]) if profiles else None
    fit = [r for r in runs if r.name.removeprefix("run_") in FIT]
    cal, notes = calibrate(fit) if fit else (None, None)
    rows = []
    for run in runs:
        row: dict[str, Any] = {"run": run.name.removeprefix("run_"), "device": run.measurement.device_name,
                               "fitted": run in fit, "measured_s": run.iteration_s}
        row["analytic_s"] = simulate(run.model, run.cluster, run.plan).iteration_time_s
        if trace is not None:
            row["trace_s"] = simulate(run.model, run.cluster, run.plan, SimulationOptions(trace=trace)).iteration_time_s
        if cal is not None:
            row["calibrated_s"] = simulate(run.model, run.cluster, run.plan,
                                           SimulationOptions(calibration=cal)).iteration_time_s
        for k in ("analytic", "trace", "calibrated"):
            if f"{k}_s" in row:
                row[f"{k}_error"] = row[f"{k}_s"] / run.iteration_s - 1
        mem = memory_rows(run.measurement, run.model)
        if mem:
            row["simulated_peak_gib"] = mem[0].predicted_bytes / 2**30
            row["allocator_peak_gib"] = mem[0].measured_bytes / 2**30
            row["memory_error"] = mem[0].rel_error
        rows.append(row)
    held = [r for r in rows if not r["fitted"]]
    summary = {
        "device": runs[0].measurement.device_name, "torch": runs[0].measurement.torch_version,
        "fitted_on": list(FIT), "calibration_warnings": notes.warnings if notes else [],
        **{f"{k}_mape_all_pct": _mape([r[f"{k}_error"] for r in rows if f"{k}_error" in r])
           for k in ("analytic", "trace")},
        **{f"{k}_mape_held_out_pct": _mape([r[f"{k}_error"] for r in held if f"{k}_error" in r])
           for k in ("analytic", "trace", "calibrated")},
        "calibrated_mape_fitted_pct": _mape([r["calibrated_error"] for r in rows if r["fitted"] and "calibrated_error" in r]),
        "memory_worst_abs_error_pct": 100 * max((abs(r["memory_error"]) for r in rows if "memory_error" in r), default=0.0),
    }
    return rows, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=str(HERE / "results" / "gpu-h200"))
    ap.add_argument("--out")
    args = ap.parse_args()
    d = Path(args.dir)
    rows, summary = loop_rows(d)
    print(f"the loop on one GPU ({summary['device']}, torch {summary['torch']}): iteration seconds, "
          f"measured vs predicted (signed error); * = fitted on")
    for r in rows:
        preds = "  ".join(f"{k} {r[f'{k}_s']:.4f} ({100 * r[f'{k}_error']:+5.1f} %)"
                          for k in ("analytic", "trace", "calibrated") if f"{k}_s" in r)
        mem = (f"  peak {r['simulated_peak_gib']:.2f} / {r['allocator_peak_gib']:.2f} GiB ({100 * r['memory_error']:+.1f} %)"
               if "memory_error" in r else "")
        print(f"  {'*' if r['fitted'] else ' '} {r['run']:<20} measured {r['measured_s']:.4f}  {preds}{mem}")
    print("MAPE held out: " + ", ".join(f"{k} {summary[f'{k}_mape_held_out_pct']:.1f} %"
                                        for k in ("analytic", "trace", "calibrated"))
          + f"; all runs: analytic {summary['analytic_mape_all_pct']:.1f} %, trace {summary['trace_mape_all_pct']:.1f} %"
          + f"; calibrated in sample {summary['calibrated_mape_fitted_pct']:.1f} %")
    for w in summary["calibration_warnings"]:
        print(f"warning: {w}")
    out = Path(args.out) if args.out else d / "loop_report.json"
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
