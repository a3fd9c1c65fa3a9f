"""Validate the GPU performance model against published iteration times (``mindpipe validate``).

Every row of a vTrain ground-truth CSV (:mod:`mindpipe.simulator.perf.vtrain`) is simulated end to end
with :func:`mindpipe.simulator.api.simulate` — the shape-aware kernel model and the NCCL model of
:mod:`mindpipe.simulator.perf`, the schedule, the event engine — and compared with the measured time.
The summary is what calculon's ``validate`` and vTrain's paper report: mean absolute percentage
error (MAPE), the largest error, and the error per model size; with a fit/hold-out split (the
rows an end-to-end fit of constants was allowed to see, :func:`~mindpipe.simulator.perf.vtrain.split_fit_holdout`)
it also reports each half separately, so the hold-out figure is not flattered by the fit.

What a tuner needs is the *order* of plans, so the summary also ranks them (:func:`ranking_stats`)
within each group a tuner chooses among — the rows of one model on the same number of GPUs at
the same global batch (each multi-node model size is one such group): Spearman's ρ between
predicted and measured times, and the regret of the plan the simulator ranks first (its measured
time ÷ the best measured time − 1).

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


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values``, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation of ``x`` and ``y``: Pearson's r of their ranks (ties get mean ranks).

    None where it is undefined: fewer than two pairs, or one side constant.
    """
    if len(x) != len(y):
        raise ValueError(f"spearman_rho needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / (sxx * syy) ** 0.5


def _row_brief(r: RowResult) -> dict[str, Any]:
    return {"source": r.source, "tp": r.tp, "pp": r.pp, "dp": r.dp, "micro_batch": r.micro_batch,
            "measured_s": r.measured_s, "predicted_s": r.predicted_s}


def ranking_stats(results: Sequence[RowResult]) -> dict[str, Any]:
    """How well the predictions order one group of plans (rows a tuner would choose among).

    Returns ``n``; ``spearman_rho`` between predicted and measured times (None for n < 2 or a
    constant side); ``regret_pct``: the measured time of the plan the simulator ranks first ÷ the
    best measured time − 1, in percent (a tie for the predicted first place counts its slowest
    measured row: the regret is never flattered by a tie); ``predicted_best`` and
    ``measured_best``: those rows (``source``, ``tp``, ``pp``, ``dp``, ``micro_batch``, both times).
    """
    if not results:
        return {"n": 0, "spearman_rho": None, "regret_pct": None, "predicted_best": None, "measured_best": None}
    best_pred = min(r.predicted_s for r in results)
    picked = max((r for r in results if r.predicted_s == best_pred), key=lambda r: r.measured_s)
    best = min(results, key=lambda r: r.measured_s)
    return {
        "n": len(results),
        "spearman_rho": spearman_rho([r.predicted_s for r in results], [r.measured_s for r in results]),
        "regret_pct": 100 * (picked.measured_s / best.measured_s - 1),
        "predicted_best": _row_brief(picked),
        "measured_best": _row_brief(best),
    }


def ranking_groups(results: Sequence[RowResult]) -> list[dict[str, Any]]:
    """:func:`ranking_stats` per group of plans a tuner chooses among: one model size on one
    number of GPUs at one global batch (``size``, ``gpus`` and ``global_batch`` added to each)."""
    groups: dict[tuple[str, int, int], list[RowResult]] = defaultdict(list)
    for r in results:
        groups[(r.size, r.gpus, r.global_batch)].append(r)
    keys = sorted(groups, key=lambda k: (_size_key(k[0]), k[1], k[2]))
    return [{"size": k[0], "gpus": k[1], "global_batch": k[2], **ranking_stats(groups[k])} for k in keys]


def ranking_summary(groups: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Across ranking groups with at least two rows: how many, median and lowest ρ, mean and largest
    regret (percent), and how many groups have ρ ≥ 0.9 and regret ≤ 1 % (issue 19's bar)."""
    ranked = [g for g in groups if g["n"] >= 2]
    rhos = [g["spearman_rho"] for g in ranked if g["spearman_rho"] is not None]
    regrets = [g["regret_pct"] for g in ranked]
    return {
        "groups": len(ranked),
        "median_spearman_rho": statistics.median(rhos) if rhos else None,
        "min_spearman_rho": min(rhos) if rhos else None,
        "mean_regret_pct": statistics.fmean(regrets) if regrets else None,
        "max_regret_pct": max(regrets) if regrets else None,
        "groups_rho_at_least_0_9": sum(1 for g in ranked if g["spearman_rho"] is not None and g["spearman_rho"] >= 0.9),
        "groups_regret_at_most_1pct": sum(1 for r in regrets if r <= 1.0),
    }


def summarize(results: Sequence[RowResult], fit_sources: set[str] | None = None) -> dict[str, Any]:
    """Whole-set statistics, per model size, per half when the fit rows are given, and the ranking.

    Args:
        results: Row results.
        fit_sources: ``source`` of the rows a fit of constants used; the rest is the hold-out.

    ``ranking`` is :func:`ranking_groups` and ``ranking_summary`` its :func:`ranking_summary`.
    """
    out = error_stats(results)
    groups: dict[str, list[RowResult]] = defaultdict(list)
    for r in results:
        groups[r.size].append(r)
    out["by_model_size"] = {k: error_stats(v) for k, v in sorted(groups.items(), key=lambda kv: _size_key(kv[0]))}
    if fit_sources is not None:
        out["fit_half"] = error_stats([r for r in results if r.source in fit_sources])
        out["holdout_half"] = error_stats([r for r in results if r.source not in fit_sources])
    out["ranking"] = ranking_groups(results)
    out["ranking_summary"] = ranking_summary(out["ranking"])
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
    if summary.get("ranking"):
        lines.append("")
        lines += format_ranking(summary["ranking"], summary["ranking_summary"])
    return "\n".join(lines)


def _plan_label(row: dict[str, Any]) -> str:
    return f"tp{row['tp']} pp{row['pp']} dp{row['dp']} mb{row['micro_batch']}"


def format_ranking(groups: Sequence[dict[str, Any]], summary: dict[str, Any], max_groups: int = 12) -> list[str]:
    """Lines of the ranking section: one per group (or, past ``max_groups`` groups, the five with
    the largest regret), then the summary across groups."""
    ranked = [g for g in groups if g["n"] >= 2]
    shown = ranked if len(ranked) <= max_groups else sorted(ranked, key=lambda g: -g["regret_pct"])[:5]
    title = "ranking within each group (same model, GPUs, global batch)"
    if len(shown) < len(ranked):
        title += f": the {len(shown)} of {len(ranked)} groups with the largest regret"
    lines = [title, f"{'group':<34} {'rows':>5} {'Spearman':>9} {'regret':>8}  {'predicted best':<22} measured best"]
    for g in shown:
        rho = "—" if g["spearman_rho"] is None else f"{g['spearman_rho']:.3f}"
        label = f"{g['size']}, {g['gpus']} GPUs, batch {g['global_batch']}"
        lines.append(f"{label:<34} {g['n']:>5} {rho:>9} {g['regret_pct']:>7.1f}%  {_plan_label(g['predicted_best']):<22} "
                     f"{_plan_label(g['measured_best'])}")
    if summary["groups"]:
        med = summary["median_spearman_rho"]
        low = summary["min_spearman_rho"]
        rho_txt = "—" if med is None else f"median {med:.3f}, lowest {low:.3f}"
        lines.append(f"  {summary['groups']} groups: Spearman {rho_txt}; regret mean {summary['mean_regret_pct']:.2f}%, "
                     f"largest {summary['max_regret_pct']:.1f}%; rho >= 0.9 in {summary['groups_rho_at_least_0_9']}, "
                     f"regret <= 1% in {summary['groups_regret_at_most_1pct']}")
    return lines


__all__ = ["VTRAIN_PUBLISHED_MAPE", "RowResult", "error_stats", "format_ranking", "format_report", "predict_s",
           "ranking_groups", "ranking_stats", "ranking_summary", "size_label", "spearman_rho", "summarize",
           "validate_rows", "with_gpu"]
