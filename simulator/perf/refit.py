"""End-to-end refit of compute constants (phase 2), keeping the fit/hold-out provenance.

The lead's validation fits a few :class:`~simulator.perf.constants.GpuConstants` fields on the fit
half of vTrain's iteration times through the engine (:func:`fit_compute_constants`) and writes
the result back with its provenance (:func:`refit_document`). Phase 1 ships none of this fitted:
see :mod:`simulator.perf.fit` for what is.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from simulator.perf.constants import GpuConstants, data_text, parse_constants, shipped_constants

T = TypeVar("T")


def _shipped_doc() -> dict[str, Any]:
    return json.loads(data_text("a100.json"))


# Bounds for end-to-end refits of compute constants (GpuConstants field -> (low, high)).
COMPUTE_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_ceiling": (0.3, 1.0), "memory_bandwidth_efficiency": (0.3, 1.0), "flash_attention_efficiency": (0.2, 1.0),
    "kernel_overhead_s": (0.0, 5e-5), "host_overhead_per_kernel_s": (0.0, 1e-4), "k_overhead": (0.0, 512.0),
    "optimizer_bytes_per_param": (16.0, 128.0),
}
_FIELD_TO_KEY = {"gemm_ceiling": "gemm_efficiency_ceiling", "k_overhead": "gemm_k_overhead"}


def fit_compute_constants(rows: Sequence[T], predict: Callable[[GpuConstants, T], float],
                          measured: Callable[[T], float], fields: Sequence[str],
                          base: GpuConstants | None = None) -> tuple[GpuConstants, float]:
    """Refit some compute constants end to end (phase 2: the lead's fit on vTrain's fit half).

    Minimises the squared log ratio predicted/measured over ``rows`` within :data:`COMPUTE_BOUNDS`.

    Args:
        rows: The fit rows (at most half of a dataset; see :func:`simulator.perf.vtrain.split_fit_holdout`).
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
        doc["constants"][key] = {**doc["constants"][key], "value": float(f"{getattr(fitted, f):.6g}"), "method": "fit",
                                 "source": how, "fit_files": list(fit_files), "holdout_files": list(holdout_files),
                                 "holdout_mape_percent": round(holdout_mape_percent, 2)}
    parse_constants(doc, "a100.json")
    return doc


__all__ = ["COMPUTE_BOUNDS", "fit_compute_constants", "refit_document"]
