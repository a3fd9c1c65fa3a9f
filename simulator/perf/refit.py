"""End-to-end refit of compute constants on vTrain's fit half, keeping the fit/hold-out provenance.

Four :class:`~mindpipe.simulator.perf.constants.GpuConstants` fields are fitted through the whole
simulator (engine, schedule, NCCL model) on the seed-0 fit half of the single-node vTrain file —
720 of 1,440 rows; the other 720 and all 109 multi-node rows are never seen by the fit:

* ``host_overhead_per_kernel_s`` — host time per modelled kernel (eager PyTorch + Megatron-
  DeepSpeed dispatch, autograd and activation-checkpointing bookkeeping); it sets the floor that
  small layers hit (vTrain's single-node rows run ~3 ms per layer and micro-batch at h = 1024
  whatever the micro-batch size up to 4: launch-bound). Each modelled op stands for a few eager
  ops (bias adds, casts, views made contiguous), so the fitted value is per *modelled* kernel;
* ``gemm_ceiling`` — what a full wave of the best GEMM tile reaches;
* ``memory_bandwidth_efficiency`` — achieved share of HBM bandwidth of memory-bound kernels;
* ``optimizer_bandwidth_efficiency`` — achieved share of HBM bandwidth of the optimizer step, whose
  multi-tensor kernels stream GBs of fp32 state (the per-iteration fixed time of the pp = 1 rows,
  e.g. tp 8 at dp 1 where no all-reduce runs, is about half of what 54 B per parameter at the
  layers' share predicts). A file without it starts the fit at ``memory_bandwidth_efficiency``.

Procedure (:func:`fit_vtrain`): a coarse scan of the host overhead (the dominant, non-smooth
term: it enters through ``max(GPU, host)``), then bounded least squares on the log ratio
predicted/measured over the four fields (:func:`fit_compute_constants`).
:func:`refit_document` writes the result into ``data/a100.json`` with its provenance.

    .venv/bin/python -m mindpipe.simulator.perf.refit --data ../shared/data [--seed 0] [--write]
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mindpipe.simulator.perf.accuracy import ErrorStats, ValidationSummary
from mindpipe.simulator.perf.constants import GpuConstants, data_text, parse_constants, shipped_constants

T = TypeVar("T")


def _shipped_doc() -> dict[str, Any]:
    return json.loads(data_text("a100.json"))


# Bounds for end-to-end refits of compute constants (GpuConstants field -> (low, high)).
COMPUTE_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_ceiling": (0.3, 1.0), "memory_bandwidth_efficiency": (0.3, 1.0), "flash_attention_efficiency": (0.2, 1.0),
    "kernel_overhead_s": (0.0, 5e-5), "host_overhead_per_kernel_s": (0.0, 1e-4), "k_overhead": (0.0, 512.0),
    "optimizer_bytes_per_param": (16.0, 128.0), "optimizer_bandwidth_efficiency": (0.3, 1.0),
}
_FIELD_TO_KEY = {"gemm_ceiling": "gemm_efficiency_ceiling", "k_overhead": "gemm_k_overhead"}
# Unit and note of a fitted constant the shipped file does not carry yet.
_NEW_RECORDS: dict[str, dict[str, Any]] = {
    "optimizer_bandwidth_efficiency": {
        "unit": "fraction of HBM peak bandwidth",
        "note": ("the optimizer step's multi-tensor kernels stream GBs of fp32 state in long chunks; "
                 "the per-iteration fixed time of vTrain's pp=1 runs (e.g. tp8, dp1: no data-parallel "
                 "all-reduce) is half of what 54 B/parameter at memory_bandwidth_efficiency predicts"),
    },
}


def fit_compute_constants(rows: Sequence[T], predict: Callable[[GpuConstants, T], float],
                          measured: Callable[[T], float], fields: Sequence[str],
                          base: GpuConstants | None = None) -> tuple[GpuConstants, float]:
    """Refit some compute constants end to end (phase 2: the lead's fit on vTrain's fit half).

    Minimises the squared log ratio predicted/measured over ``rows`` within :data:`COMPUTE_BOUNDS`.

    Args:
        rows: The fit rows (at most half of a dataset; see :func:`mindpipe.simulator.perf.vtrain.split_fit_holdout`).
        predict: Predicted seconds of a row under given constants (e.g. the engine's iteration time).
        measured: Measured seconds of a row.
        fields: :class:`GpuConstants` fields to fit, e.g. ``("gemm_ceiling", "host_overhead_per_kernel_s")``.
        base: Starting constants (default: the shipped A100 file).

    Returns:
        (fitted constants, MAPE in percent on ``rows``).
    """
    import numpy as np
    from scipy.optimize import least_squares

    start = base or GpuConstants.from_file(shipped_constants("a100.json"))
    lo = np.array([COMPUTE_BOUNDS[f][0] for f in fields])
    hi = np.array([COMPUTE_BOUNDS[f][1] for f in fields])
    span = hi - lo

    def make(u: Any) -> GpuConstants:
        values: dict[str, Any] = {f: float(lo[i] + span[i] * u[i]) for i, f in enumerate(fields)}
        return dataclasses.replace(start, **values)

    meas = np.array([measured(r) for r in rows])

    def residual(u: Any) -> Any:
        c = make(u)
        return np.log(np.array([predict(c, r) for r in rows]) / meas)

    u0 = np.clip((np.array([getattr(start, f) for f in fields]) - lo) / span, 1e-6, 1 - 1e-6)
    res = least_squares(residual, u0, bounds=(0.0, 1.0), diff_step=1e-3)
    fitted = make(res.x)
    pred = np.array([predict(fitted, r) for r in rows])
    return fitted, float(100 * np.mean(np.abs(pred - meas) / meas))


def refit_document(fitted: GpuConstants, fields: Sequence[str], fit_files: Sequence[str],
                   holdout_files: Sequence[str], holdout_mape_percent: float, how: str) -> dict[str, Any]:
    """The shipped A100 compute document with ``fields`` replaced by an end-to-end fit (to write to data/)."""
    doc = json.loads(json.dumps(_shipped_doc()))
    for f in fields:
        key = _FIELD_TO_KEY.get(f, f)
        doc["constants"][key] = {**doc["constants"].get(key, _NEW_RECORDS.get(key, {})), "value": float(f"{getattr(fitted, f):.6g}"), "method": "fit",
                                 "source": how, "fit_files": list(fit_files), "holdout_files": list(holdout_files),
                                 "holdout_mape_percent": round(holdout_mape_percent, 2)}
    parse_constants(doc, "a100.json")
    return doc


VTRAIN_FIELDS = ("host_overhead_per_kernel_s", "gemm_ceiling", "memory_bandwidth_efficiency",
                 "optimizer_bandwidth_efficiency")
SINGLE_FILE = "validation/vtrain_a100_single_node.csv"
MULTI_FILE = "validation/vtrain_a100_multi_node.csv"
_HOST_SCAN_S = tuple(k * 1e-5 for k in range(1, 11))


@dataclass(frozen=True)
class VTrainFit:
    """What :func:`fit_vtrain` fitted on and measured.

    Attributes:
        seed: Seed of the fit/hold-out split.
        fit_rows: ``source`` of every fit row.
        scan: Fit-half MAPE (percent) at each host overhead of the coarse scan (seconds per kernel).
        fit_mape: Fit-half MAPE of the fitted constants (percent).
        summary: Every single-node row simulated with them, split into the fit and hold-out halves.
    """

    seed: int
    fit_rows: list[str]
    scan: dict[float, float]
    fit_mape: float
    summary: ValidationSummary

    @property
    def holdout(self) -> ErrorStats:
        """The hold-out half's errors."""
        if self.summary.holdout_half is None:  # summarize was given the fit rows, so never
            raise ValueError("the summary has no hold-out half")
        return self.summary.holdout_half


def fit_vtrain(data_dir: str | Path, seed: int = 0, log: Callable[[str], None] = print) -> tuple[GpuConstants, VTrainFit]:
    """Fit :data:`VTRAIN_FIELDS` on the fit half of the single-node file (see module docstring).

    Returns:
        (fitted constants, report with the fit rows' sources and fit/hold-out MAPE).
    """
    from mindpipe.simulator.perf.validate import predict_s, summarize, validate_rows
    from mindpipe.simulator.perf.vtrain import load_vtrain, split_fit_holdout

    rows = load_vtrain(Path(data_dir) / SINGLE_FILE)
    fit, _ = split_fit_holdout(rows, seed=seed, fit_fraction=0.5)
    base = GpuConstants.from_file(shipped_constants("a100.json"))

    def mape(c: GpuConstants) -> float:
        return 100 * sum(abs(predict_s(r, c) / r.measured_iteration_time_s - 1) for r in fit) / len(fit)

    scan = {h: mape(dataclasses.replace(base, host_overhead_per_kernel_s=h)) for h in _HOST_SCAN_S}
    h0 = min(scan, key=lambda h: scan[h])
    log(f"host-overhead scan on {len(fit)} fit rows: " + ", ".join(f"{1e6 * h:.0f} µs {m:.1f}%" for h, m in scan.items()))
    # A file without the optimizer's own bandwidth share starts it at the activation kernels' share.
    opt_eff = base.optimizer_bandwidth_efficiency or base.memory_bandwidth_efficiency
    start = dataclasses.replace(base, host_overhead_per_kernel_s=h0, optimizer_bandwidth_efficiency=opt_eff)
    fitted, fit_mape = fit_compute_constants(fit, lambda c, r: predict_s(r, c), lambda r: r.measured_iteration_time_s,
                                           VTRAIN_FIELDS, start)
    summary = summarize(validate_rows(rows, fitted), {r.source for r in fit})
    fit_half, hold = summary.fit_half, summary.holdout_half
    log(f"fitted {', '.join(f'{f}={getattr(fitted, f):.6g}' for f in VTRAIN_FIELDS)}; MAPE fit half "
        f"{fit_half.mape if fit_half else float('nan'):.2f}%, hold-out half {hold.mape if hold else float('nan'):.2f}%")
    return fitted, VTrainFit(seed, [r.source for r in fit], scan, fit_mape, summary)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mindpipe.simulator.perf.refit``: fit on vTrain's fit half; ``--write`` updates data/a100.json."""
    import argparse

    ap = argparse.ArgumentParser(description="Refit A100 compute constants on the fit half of vTrain's single-node runs")
    ap.add_argument("--data", required=True, help="the shared data folder (holds validation/vtrain_a100_*.csv)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help="write simulator/perf/data/a100.json")
    args = ap.parse_args(argv)
    fitted, report = fit_vtrain(args.data, args.seed)
    if args.write:
        fit_desc = f"{SINGLE_FILE}: the {len(report.fit_rows)} rows of split_fit_holdout(seed={args.seed}, fit_fraction=0.5)"
        hold_desc = [f"{SINGLE_FILE}: the other {report.holdout.n} rows", f"{MULTI_FILE}: all rows"]
        how = ("end to end through simulate(): coarse scan of host_overhead_per_kernel_s, then bounded least squares "
               "on log(predicted/measured) over host_overhead_per_kernel_s, gemm_efficiency_ceiling, "
               "memory_bandwidth_efficiency and optimizer_bandwidth_efficiency (simulator/perf/refit.py)")
        doc = refit_document(fitted, VTRAIN_FIELDS, [fit_desc], hold_desc, report.holdout.mape or 0.0, how)
        doc["regenerate"] = (".venv/bin/python -m simulator.perf.fit --data ../shared/data --write && "
                             f".venv/bin/python -m simulator.perf.refit --data ../shared/data --seed {args.seed} --write")
        path = Path(__file__).parent / "data" / "a100.json"
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}")
    return 0


__all__ = ["COMPUTE_BOUNDS", "VTRAIN_FIELDS", "VTrainFit", "fit_compute_constants", "fit_vtrain", "main", "refit_document"]


if __name__ == "__main__":
    raise SystemExit(main())
