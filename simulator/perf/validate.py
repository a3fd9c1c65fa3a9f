"""Validate the GPU performance model against published iteration times (``mindpipe validate``).

Every row of a vTrain ground-truth CSV (:mod:`mindpipe.simulator.perf.vtrain`) is simulated end to end
with :func:`mindpipe.simulator.api.simulate` — the shape-aware kernel model and the NCCL model of
:mod:`mindpipe.simulator.perf`, the schedule, the event engine — and compared with the measured time.
The summary is what calculon's ``validate`` and vTrain's paper report: mean absolute percentage
error (MAPE), the largest error, and the error per model size; with a fit/hold-out split (the
rows an end-to-end fit of constants was allowed to see, :func:`~mindpipe.simulator.perf.vtrain.split_fit_holdout`)
it also reports each half separately, so the hold-out figure is not flattered by the fit.

vTrain's own errors on the same files: 8.37 % (single node) and 14.73 % (multi node) MAPE
(Bang et al., "vTrain", MICRO'24, §V).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.costs import layer_params
from mindpipe.simulator.perf.constants import GpuConstants
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.simulator.perf.vtrain import VOCAB, VTrainRow
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.catalog import get_device

# Published MAPE of vTrain on the same data (MICRO'24, §V): the figure to beat.
VTRAIN_PUBLISHED_MAPE = {"vtrain-single": 8.37, "vtrain-multi": 14.73}


@dataclass(frozen=True, slots=True)
class RowResult:
    """Predicted and measured iteration time of one row."""

    source: str
    size: str
    gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        """Signed relative error (predicted − measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s


def size_label(row: VTrainRow) -> str:
    """Model-size group of a row: the stated parameter count, else hidden size × layers."""
    if row.stated_params_billion is not None:
        return f"{row.stated_params_billion:g}B"
    # Count at the unpadded GPT-2 vocabulary: Megatron's padding depends on tp, the model does not.
    n = sum(p for _, _, p in layer_params(dataclasses.replace(row.model, vocab_size=VOCAB), 1)) / 1e9
    return f"h{row.model.hidden_size}-L{row.model.num_layers} ({n:.2f}B)"


def with_gpu(row: VTrainRow, gpu: str) -> VTrainRow:
    """The same run on another catalog GPU (what-if predictions, e.g. H100 for A100 rows)."""
    if gpu == row.cluster.gpu:
        return row
    return dataclasses.replace(row, cluster=dataclasses.replace(row.cluster, gpu=gpu))


def predict_s(row: VTrainRow, constants: GpuConstants | None = None, calibration: Calibration | None = None) -> float:
    """Simulated iteration time of a row (default models, or given compute constants or calibration)."""
    opts = SimulationOptions(calibration=calibration)
    if constants is not None:
        opts.compute = GpuComputeModel(get_device(row.cluster.gpu), constants=constants)
    return simulate(row.model, row.cluster, row.plan, opts).iteration_time_s


def validate_rows(rows: Iterable[VTrainRow], constants: GpuConstants | None = None,
                  progress: Callable[[int], None] | None = None, calibration: Calibration | None = None) -> list[RowResult]:
    """Simulate every row; ``progress(i)`` is called after each one."""
    out = []
    for i, r in enumerate(rows, start=1):
        p = r.plan
        out.append(RowResult(r.source, size_label(r), p.world_size, p.tp, p.pp, p.dp, p.micro_batch_size,
                             p.global_batch_size, r.measured_iteration_time_s, predict_s(r, constants, calibration)))
        if progress is not None:
            progress(i)
    return out


def error_stats(results: Sequence[RowResult]) -> dict[str, Any]:
    """``n``, ``mape`` and ``max_abs_pct_error`` (percent), and the median signed error."""
    if not results:
        return {"n": 0, "mape": None, "max_abs_pct_error": None, "median_signed_pct_error": None}
    errs = [r.error for r in results]
    return {
        "n": len(results),
        "mape": 100 * statistics.fmean(abs(e) for e in errs),
        "max_abs_pct_error": 100 * max(abs(e) for e in errs),
        "median_signed_pct_error": 100 * statistics.median(errs),
    }


def summarize(results: Sequence[RowResult], fit_sources: set[str] | None = None) -> dict[str, Any]:
    """Whole-set statistics, per model size, and per half when the fit rows are given.

    Args:
        results: Row results.
        fit_sources: ``source`` of the rows a fit of constants used; the rest is the hold-out.
    """
    out = error_stats(results)
    groups: dict[str, list[RowResult]] = defaultdict(list)
    for r in results:
        groups[r.size].append(r)
    out["by_model_size"] = {k: error_stats(v) for k, v in sorted(groups.items(), key=lambda kv: _size_key(kv[0]))}
    if fit_sources is not None:
        out["fit_half"] = error_stats([r for r in results if r.source in fit_sources])
        out["holdout_half"] = error_stats([r for r in results if r.source not in fit_sources])
    return out


def _size_key(label: str) -> tuple[float, str]:
    head = label.split()[0]
    try:
        return float(head.rstrip("B")), label
    except ValueError:
        return float("inf"), label


def format_report(dataset: str, results: Sequence[RowResult], summary: dict[str, Any], rows_shown: bool = True) -> str:
    """Human-readable table: one line per row, then the summary and the error by model size."""
    lines = []
    if rows_shown:
        lines.append(f"{'row':<34} {'size':<20} {'gpus':>4} {'tp':>3} {'pp':>3} {'dp':>3} {'mb':>3} {'gbs':>5} "
                     f"{'measured ms':>12} {'predicted ms':>12} {'error':>8}")
        for r in results:
            src = Path(r.source).name  # <file>:<line>
            lines.append(f"{src:<34} {r.size:<20} {r.gpus:>4} {r.tp:>3} {r.pp:>3} {r.dp:>3} {r.micro_batch:>3} "
                         f"{r.global_batch:>5} {1e3 * r.measured_s:>12.2f} {1e3 * r.predicted_s:>12.2f} {100 * r.error:>+7.1f}%")
        lines.append("")
    lines.append(f"{dataset}: {summary['n']} rows, MAPE {summary['mape']:.2f}%, max |error| "
                 f"{summary['max_abs_pct_error']:.1f}%, median signed {summary['median_signed_pct_error']:+.1f}%")
    for half in ("fit_half", "holdout_half"):
        h = summary.get(half)
        if h and h["n"]:
            lines.append(f"  {half.replace('_', ' '):<13} {h['n']:>5} rows, MAPE {h['mape']:.2f}%, max {h['max_abs_pct_error']:.1f}%")
    published = VTRAIN_PUBLISHED_MAPE.get(dataset)
    if published is not None:
        lines.append(f"  vTrain's published MAPE on this data: {published:.2f}%")
    lines.append("")
    lines.append(f"{'model size':<22} {'rows':>5} {'MAPE':>8} {'max':>8} {'median':>8}")
    for k, s in summary["by_model_size"].items():
        lines.append(f"{k:<22} {s['n']:>5} {s['mape']:>7.2f}% {s['max_abs_pct_error']:>7.1f}% {s['median_signed_pct_error']:>+7.1f}%")
    return "\n".join(lines)


__all__ = ["VTRAIN_PUBLISHED_MAPE", "RowResult", "error_stats", "format_report", "predict_s", "size_label",
           "summarize", "validate_rows", "with_gpu"]
