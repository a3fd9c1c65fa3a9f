"""Validate the FP8 GPU model against NVIDIA's NeMo 24.07 DGX-H100 table (``mindpipe validate nemo-h100``).

Every row :mod:`mindpipe.simulator.perf.nemo` can express is simulated end to end with
:func:`mindpipe.simulator.api.simulate` — the kernel model with FlashAttention pricing and FP8
block GEMMs (:mod:`mindpipe.simulator.perf.fp8`), the NCCL model, the interleaved schedule, the
event engine — and compared with the iteration time derived from the published tokens/s. The
summary is :mod:`mindpipe.simulator.perf.validate`'s (MAPE, largest error, error per model) with the
fit/hold-out halves of :func:`nemo_split`: the rows ``fp8_gemm_efficiency`` may be fitted on
(``python -m mindpipe.simulator.perf.nemo_fit``) and the rest. The context-parallel rows (the plan's
``cp``, priced since the constant was fitted) are in the hold-out half.

Echo (arXiv 2412.12487) reports 8 % error for GPT-175B on 96 H800; that is the figure the issue
compares with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.perf.accuracy import RowResult, ValidationSummary, summarize
from mindpipe.simulator.perf.fp8 import Fp8Constants
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.simulator.perf.nemo import NemoRow
from mindpipe.simulator.perf.vtrain import split_fit_holdout
from mindpipe.traces.catalog import get_device

ECHO_PUBLISHED_ERROR_PCT = 8.0
SPLIT_SEED = 0
# The mechanisms of NeMo's recipe the plan carries beyond the table's columns, each as the plan keys
# that switch it off (for the ablation of benchmarks/validate_nemo.py): TE userbuffers' TP overlap,
# the distributed optimizer's parameter all-gather under the next forward, the recipe's recompute.
MECHANISMS: dict[str, dict[str, Any]] = {
    "tp_comm_overlap": {"tp_comm_overlap": False},
    "overlap_param_gather": {"overlap_param_gather": False},
    "recipe_recompute": {"recompute": "none"},
}


def nemo_split(rows: Sequence[NemoRow], seed: int = SPLIT_SEED) -> tuple[list[NemoRow], list[NemoRow]]:
    """(fit, hold-out): :func:`split_fit_holdout` over the rows without context parallelism (at most
    half for fitting: the rows ``fp8_gemm_efficiency`` was fitted on, before the simulator priced
    ``cp``), and every context-parallel row in the hold-out half."""
    fit, hold = split_fit_holdout([r for r in rows if r.cp == 1], seed=seed)
    return fit, hold + [r for r in rows if r.cp > 1]


def without(row: NemoRow, *mechanisms: str) -> NemoRow:
    """``row`` with the named :data:`MECHANISMS` switched off in its plan."""
    keys: dict[str, Any] = {}
    for m in mechanisms:
        keys.update(MECHANISMS[m])
    return dataclasses.replace(row, plan=dataclasses.replace(row.plan, **keys))


def simulate_row(row: NemoRow, fp8: Fp8Constants | None = None) -> Any:
    """The :class:`~mindpipe.traces.result.SimulationResult` of a row (its plan runs FlashAttention),
    the shipped FP8 constant unless ``fp8`` is given."""
    compute = GpuComputeModel(get_device(row.cluster.gpu), fp8=fp8)
    return simulate(row.model, row.cluster, row.plan, SimulationOptions(compute=compute))


def predict_s(row: NemoRow, fp8: Fp8Constants | None = None) -> float:
    """Simulated iteration time of a row (the shipped FP8 constant unless ``fp8`` is given)."""
    return simulate_row(row, fp8).iteration_time_s


def pct_errors(rows: Sequence[NemoRow], fp8: Fp8Constants | None = None, off: Sequence[str] = ()) -> dict[str, float]:
    """Signed percent error per row source, with the mechanisms ``off`` switched off."""
    return {r.source: 100 * (predict_s(without(r, *off), fp8) / r.measured_iteration_time_s - 1)
            for r in rows}


def validate_nemo(rows: Sequence[NemoRow], fp8: Fp8Constants | None = None) -> list[RowResult]:
    """Predicted vs measured for every row (``size`` is the table's model name)."""
    out = []
    for r in rows:
        p = r.plan
        out.append(RowResult(r.source, r.name, p.world_size, p.tp, p.pp, p.dp, p.micro_batch_size,
                             p.global_batch_size, r.measured_iteration_time_s, predict_s(r, fp8)))
    return out


@dataclass(frozen=True, slots=True)
class NemoRowResult:
    """One row of the table: predicted against measured, its context parallelism and its half."""

    result: RowResult
    cp: int
    half: Literal["fit", "holdout"]

    def to_dict(self) -> dict[str, Any]:
        """The row's JSON object (``source``, ``model``, the mesh, both times, ``pct_error``, ``half``)."""
        r = self.result
        return {"source": r.source, "model": r.size, "gpus": r.gpus, "tp": r.tp, "pp": r.pp, "cp": self.cp, "dp": r.dp,
                "micro_batch": r.micro_batch, "global_batch": r.global_batch, "measured_s": r.measured_s,
                "predicted_s": r.predicted_s, "pct_error": 100 * r.error, "half": self.half}


@dataclass(frozen=True)
class NemoReport:
    """What ``mindpipe validate nemo-h100`` reports: the summary with both halves, how the rows were
    split, and every row."""

    summary: ValidationSummary
    fit_split: str
    rows: list[NemoRowResult]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``--json`` and ``benchmarks/validate_nemo.py``: the summary's keys,
        ``fit_split``, ``echo_published_error_pct`` and ``rows``."""
        return {**self.summary.to_dict(), "fit_split": self.fit_split,
                "echo_published_error_pct": ECHO_PUBLISHED_ERROR_PCT, "rows": [r.to_dict() for r in self.rows]}


def nemo_report(rows: Sequence[NemoRow], fp8: Fp8Constants | None = None, seed: int = SPLIT_SEED,
                table: Sequence[NemoRow] | None = None) -> NemoReport:
    """Every row simulated, summarized with the fit/hold-out halves of :func:`nemo_split`.

    The halves are drawn from ``table``, the whole published table (default: ``rows``). Give it when
    ``rows`` are part of it (one model, a sample): the split drawn from a part labels other rows
    "fit" than the ones ``fp8_gemm_efficiency`` was fitted on.
    """
    whole = rows if table is None else table
    results = validate_nemo(rows, fp8)
    fit, _ = nemo_split(whole, seed)
    fit_sources = {r.source for r in fit}
    split = (f"split_fit_holdout(seed={seed}, fit_fraction=0.5) of the {sum(r.cp == 1 for r in whole)} rows "
             f"without context parallelism; the {sum(r.cp > 1 for r in whole)} with it are hold-out")
    return NemoReport(summarize(results, fit_sources), split,
                      [NemoRowResult(r, row.cp, "fit" if r.source in fit_sources else "holdout")
                       for r, row in zip(results, rows, strict=True)])


__all__ = ["ECHO_PUBLISHED_ERROR_PCT", "MECHANISMS", "NemoReport", "NemoRowResult", "nemo_report", "nemo_split", "pct_errors", "predict_s",
           "simulate_row", "validate_nemo", "without"]
