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
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.costs import layer_params
from mindpipe.simulator.perf.accuracy import (
    ErrorStats,
    RankingGroup,
    RankingSummary,
    RowResult,
    ValidationSummary,
    error_stats,
    error_table_lines,
    ranked,
    ranking_groups,
    ranking_stats,
    ranking_summary,
    spearman_rho,
    summarize,
)
from mindpipe.simulator.perf.constants import GpuConstants
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.simulator.perf.vtrain import VOCAB, VTrainRow
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.catalog import get_device
from mindpipe.traces.units import plural

# Published MAPE of vTrain on the same data (MICRO'24, §V): the figure to beat.
VTRAIN_PUBLISHED_MAPE = {"vtrain-single": 8.37, "vtrain-multi": 14.73}


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


def format_report(dataset: str, results: Sequence[RowResult], summary: ValidationSummary, rows_shown: bool = True) -> str:
    """Human-readable table: one line per row, then the summary and the error by model size and by
    layout (tp·pp)."""
    lines = []
    if rows_shown:
        lines.append(f"{'row':<34} {'size':<20} {'gpus':>4} {'tp':>3} {'pp':>3} {'dp':>3} {'mb':>3} {'gbs':>5} "
                     f"{'measured ms':>12} {'predicted ms':>12} {'error':>8}")
        for r in results:
            src = Path(r.source).name  # <file>:<line>
            lines.append(f"{src:<34} {r.size:<20} {r.gpus:>4} {r.tp:>3} {r.pp:>3} {r.dp:>3} {r.micro_batch:>3} "
                         f"{r.global_batch:>5} {1e3 * r.measured_s:>12.2f} {1e3 * r.predicted_s:>12.2f} {100 * r.error:>+7.1f}%")
        lines.append("")
    o = summary.overall
    lines.append(f"{dataset}: {plural(o.n, 'row')}, MAPE {o.mape:.2f}%, max |error| {o.max_abs_pct_error:.1f}%, "
                 f"median signed {o.median_signed_pct_error:+.1f}%")
    for half, h in (("fit half", summary.fit_half), ("holdout half", summary.holdout_half)):
        if h is not None and h.n:
            lines.append(f"  {half:<13} {h.n:>5} {'row' if h.n == 1 else 'rows'}, MAPE {h.mape:.2f}%, max {h.max_abs_pct_error:.1f}%")
    published = VTRAIN_PUBLISHED_MAPE.get(dataset)
    if published is not None:
        lines.append(f"  vTrain's published MAPE on this data: {published:.2f}%")
    lines += error_table_lines("model size", summary.by_model_size, 22)
    lines += error_table_lines("layout", summary.by_layout, 22)
    if summary.ranking:
        lines.append("")
        lines += format_ranking(summary.ranking, summary.ranking_summary)
    return "\n".join(lines)


def format_ranking(groups: Sequence[RankingGroup], summary: RankingSummary, max_groups: int = 12) -> list[str]:
    """Lines of the ranking section: one per group (or, past ``max_groups`` groups, the five with
    the largest regret), then the summary across groups."""
    shown = ranked(groups)
    total = len(shown)
    if total > max_groups:
        shown = sorted(shown, key=lambda g: -(g.stats.regret_pct or 0.0))[:5]
    title = "ranking within each group (same model, GPUs, global batch)"
    if len(shown) < total:
        title += f": the {len(shown)} of {plural(total, 'group')} with the largest regret"
    lines = [title, f"{'group':<34} {'rows':>5} {'Spearman':>9} {'regret':>8}  {'predicted best':<22} measured best"]
    for g in shown:
        st = g.stats
        rho = "—" if st.spearman_rho is None else f"{st.spearman_rho:.3f}"
        picked = st.predicted_best.label if st.predicted_best is not None else "—"
        best = st.measured_best.label if st.measured_best is not None else "—"
        lines.append(f"{g.label:<34} {st.n:>5} {rho:>9} {st.regret_pct or 0.0:>7.1f}%  {picked:<22} {best}")
    if summary.groups:
        med, low = summary.median_spearman_rho, summary.min_spearman_rho
        rho_txt = "—" if med is None or low is None else f"median {med:.3f}, lowest {low:.3f}"
        lines.append(f"  {plural(summary.groups, 'group')}: Spearman {rho_txt}; regret mean {summary.mean_regret_pct or 0.0:.2f}%, "
                     f"largest {summary.max_regret_pct or 0.0:.1f}%; rho >= 0.9 in {summary.groups_rho_at_least_0_9}, "
                     f"regret <= 1% in {summary.groups_regret_at_most_1pct}")
    return lines


# The statistics and their records live in mindpipe.simulator.perf.accuracy; re-exported for the CLI,
# the benchmarks and the fits, which read them from here.
__all__ = ["VTRAIN_PUBLISHED_MAPE", "ErrorStats", "RankingGroup", "RankingSummary", "RowResult", "ValidationSummary",
           "error_stats", "format_ranking", "format_report", "predict_s", "ranking_groups", "ranking_stats",
           "ranking_summary", "size_label", "spearman_rho", "summarize", "validate_rows", "with_gpu"]
