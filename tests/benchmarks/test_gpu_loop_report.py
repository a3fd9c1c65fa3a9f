"""The loop on one H200 (``benchmarks/gpu_loop_report.py`` over the stored runs in
``benchmarks/results/gpu-h200``): the simulator priced from the GPU's own profile, and calibrated on
three of the runs, keeps the errors it had when the runs were taken (2026-12-04). A change to the
simulator that makes these predictions worse fails here, on CPU."""

from __future__ import annotations

from .conftest import BENCHMARKS, load_benchmark

report = load_benchmark("gpu_loop_report")  # it imports its sibling scripts


def test_the_h200_loop_predictions_hold() -> None:
    rows, summary = report.loop_rows(BENCHMARKS / "results" / "gpu-h200")
    assert len(rows) == 8 and sum(r["fitted"] for r in rows) == 3
    # 2026-12-04, with the copy out streaming beside the forward: analytic 19.5 % over all runs, trace
    # 9.8 %; held out calibrated 10.5 %, in sample 4.0 % (20.3 / 11.0 / 12.2 % with the copy after it)
    assert summary["trace_mape_all_pct"] < summary["analytic_mape_all_pct"] <= 21.0
    assert summary["trace_mape_all_pct"] <= 10.5
    assert summary["calibrated_mape_held_out_pct"] <= 11.5 and summary["calibrated_mape_fitted_pct"] <= 5.0
    swap = next(r for r in rows if r["run"] == "loop_mb2_swap")
    assert abs(swap["trace_error"]) <= 0.06  # +12.9 % with the copy out after the forward
    assert summary["memory_worst_abs_error_pct"] <= 8.0
