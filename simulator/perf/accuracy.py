"""How far predicted iteration times are from measured ones, and how well they order plans.

Typed records for what ``mindpipe validate``, the validation benchmarks and the constant fits
(:mod:`mindpipe.simulator.perf.refit`, :mod:`mindpipe.simulator.perf.nemo_validate`) report about a
set of :class:`RowResult`: the error statistics calculon's ``validate`` and vTrain's paper give
(:class:`ErrorStats`: MAPE, the largest error, the median signed error), per model size and per
fit/hold-out half, and the ranking a tuner needs (:class:`RankingGroup`: Spearman's ρ between
predicted and measured times within each group of plans a tuner chooses among, and the regret of
the plan the simulator ranks first). Each record's ``to_dict`` is the JSON the CLI and the
benchmarks write; the keys are the ones those files have always had.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


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


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """Errors of a set of rows, in percent; the three figures are None for an empty set."""

    n: int
    mape: float | None
    max_abs_pct_error: float | None
    median_signed_pct_error: float | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (``n``, ``mape``, ``max_abs_pct_error``, ``median_signed_pct_error``)."""
        return asdict(self)


def error_stats(results: Sequence[RowResult]) -> ErrorStats:
    """``n``, ``mape`` and ``max_abs_pct_error`` (percent), and the median signed error."""
    if not results:
        return ErrorStats(0, None, None, None)
    errs = [r.error for r in results]
    return ErrorStats(len(results), 100 * statistics.fmean(abs(e) for e in errs), 100 * max(abs(e) for e in errs),
                      100 * statistics.median(errs))


def error_table_lines(title: str, table: Mapping[str, ErrorStats], width: int, median: bool = True) -> list[str]:
    """A blank line, a header and one line per group of ``table`` (rows, MAPE, max, and the median
    signed error unless ``median`` is off): the per-model and per-layout tables of the reports."""
    lines = ["", f"{title:<{width}} {'rows':>5} {'MAPE':>8} {'max':>8}" + (f" {'median':>8}" if median else "")]
    for k, st in table.items():
        line = f"{k:<{width}} {st.n:>5} {st.mape:>7.2f}% {st.max_abs_pct_error:>7.1f}%"
        lines.append(line + (f" {st.median_signed_pct_error:>+7.1f}%" if median else ""))
    return lines


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


@dataclass(frozen=True, slots=True)
class PlanBrief:
    """One row of a ranking group: where it comes from, its plan and both times."""

    source: str
    tp: int
    pp: int
    dp: int
    micro_batch: int
    measured_s: float
    predicted_s: float

    @classmethod
    def of(cls, r: RowResult) -> PlanBrief:
        """The brief of a row result."""
        return cls(r.source, r.tp, r.pp, r.dp, r.micro_batch, r.measured_s, r.predicted_s)

    @property
    def label(self) -> str:
        """``tp2 pp1 dp4 mb1``."""
        return f"tp{self.tp} pp{self.pp} dp{self.dp} mb{self.micro_batch}"


@dataclass(frozen=True, slots=True)
class RankingStats:
    """How well the predictions order one group of plans (:func:`ranking_stats`)."""

    n: int
    spearman_rho: float | None
    regret_pct: float | None
    predicted_best: PlanBrief | None
    measured_best: PlanBrief | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object; the two best rows as objects (or null)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RankingGroup:
    """:class:`RankingStats` of the plans of one model size on one number of GPUs at one global batch."""

    size: str
    gpus: int
    global_batch: int
    stats: RankingStats

    @property
    def label(self) -> str:
        """``39.1B, 512 GPUs, batch 1536``."""
        return f"{self.size}, {self.gpus} GPUs, batch {self.global_batch}"

    def to_dict(self) -> dict[str, Any]:
        """``size``, ``gpus``, ``global_batch`` and the stats' keys, in one flat object."""
        return {"size": self.size, "gpus": self.gpus, "global_batch": self.global_batch, **self.stats.to_dict()}


def ranking_stats(results: Sequence[RowResult]) -> RankingStats:
    """How well the predictions order one group of plans (rows a tuner would choose among).

    ``n``; ``spearman_rho`` between predicted and measured times (None for n < 2 or a constant
    side); ``regret_pct``: the measured time of the plan the simulator ranks first ÷ the best
    measured time − 1, in percent (a tie for the predicted first place counts its slowest measured
    row: the regret is never flattered by a tie); ``predicted_best`` and ``measured_best``: those rows.
    """
    if not results:
        return RankingStats(0, None, None, None, None)
    best_pred = min(r.predicted_s for r in results)
    picked = max((r for r in results if r.predicted_s == best_pred), key=lambda r: r.measured_s)
    best = min(results, key=lambda r: r.measured_s)
    return RankingStats(len(results), spearman_rho([r.predicted_s for r in results], [r.measured_s for r in results]),
                        100 * (picked.measured_s / best.measured_s - 1), PlanBrief.of(picked), PlanBrief.of(best))


def size_key(label: str) -> tuple[float, str]:
    """Sort key of a model-size label: its leading number of billions (``39.1B``), else last."""
    head = label.split()[0]
    try:
        return float(head.rstrip("B")), label
    except ValueError:
        return float("inf"), label


def ranking_groups(results: Sequence[RowResult]) -> list[RankingGroup]:
    """:func:`ranking_stats` per group of plans a tuner chooses among: one model size on one
    number of GPUs at one global batch."""
    groups: dict[tuple[str, int, int], list[RowResult]] = defaultdict(list)
    for r in results:
        groups[(r.size, r.gpus, r.global_batch)].append(r)
    keys = sorted(groups, key=lambda k: (size_key(k[0]), k[1], k[2]))
    return [RankingGroup(k[0], k[1], k[2], ranking_stats(groups[k])) for k in keys]


@dataclass(frozen=True, slots=True)
class RankingSummary:
    """Across ranking groups with at least two rows (:func:`ranking_summary`)."""

    groups: int
    median_spearman_rho: float | None
    min_spearman_rho: float | None
    mean_regret_pct: float | None
    max_regret_pct: float | None
    groups_rho_at_least_0_9: int
    groups_regret_at_most_1pct: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return asdict(self)


def ranked(groups: Sequence[RankingGroup]) -> list[RankingGroup]:
    """The groups that order something: at least two rows."""
    return [g for g in groups if g.stats.n >= 2]


def ranking_summary(groups: Sequence[RankingGroup]) -> RankingSummary:
    """Across ranking groups with at least two rows: how many, median and lowest ρ, mean and largest
    regret (percent), and how many groups have ρ ≥ 0.9 and regret ≤ 1 % (issue 19's bar)."""
    stats = [g.stats for g in ranked(groups)]
    rhos = [s.spearman_rho for s in stats if s.spearman_rho is not None]
    regrets = [s.regret_pct for s in stats if s.regret_pct is not None]
    return RankingSummary(
        groups=len(stats),
        median_spearman_rho=statistics.median(rhos) if rhos else None,
        min_spearman_rho=min(rhos) if rhos else None,
        mean_regret_pct=statistics.fmean(regrets) if regrets else None,
        max_regret_pct=max(regrets) if regrets else None,
        groups_rho_at_least_0_9=sum(1 for r in rhos if r >= 0.9),
        groups_regret_at_most_1pct=sum(1 for r in regrets if r <= 1.0),
    )


@dataclass(frozen=True)
class ValidationSummary:
    """Whole-set errors, per model size, per layout (``tp·pp``: a bias that follows the parallelism, not
    the model, shows there), per fit/hold-out half (when the fit rows are known), and the ranking."""

    overall: ErrorStats
    by_model_size: dict[str, ErrorStats]
    by_layout: dict[str, ErrorStats]
    fit_half: ErrorStats | None
    holdout_half: ErrorStats | None
    ranking: list[RankingGroup]
    ranking_summary: RankingSummary

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``mindpipe validate --json`` and the benchmarks: the overall stats' keys,
        ``by_model_size``, ``by_layout``, ``fit_half`` and ``holdout_half`` (only with a fit split),
        ``ranking`` and ``ranking_summary``."""
        out: dict[str, Any] = {**self.overall.to_dict(),
                               "by_model_size": {k: v.to_dict() for k, v in self.by_model_size.items()},
                               "by_layout": {k: v.to_dict() for k, v in self.by_layout.items()}}
        if self.fit_half is not None and self.holdout_half is not None:
            out["fit_half"] = self.fit_half.to_dict()
            out["holdout_half"] = self.holdout_half.to_dict()
        out["ranking"] = [g.to_dict() for g in self.ranking]
        out["ranking_summary"] = self.ranking_summary.to_dict()
        return out


def summarize(results: Sequence[RowResult], fit_sources: set[str] | None = None) -> ValidationSummary:
    """Whole-set statistics, per model size, per half when the fit rows are given, and the ranking.

    Args:
        results: Row results.
        fit_sources: ``source`` of the rows a fit of constants used; the rest is the hold-out.
    """
    groups: dict[str, list[RowResult]] = defaultdict(list)
    layouts: dict[tuple[int, int], list[RowResult]] = defaultdict(list)
    for r in results:
        groups[r.size].append(r)
        layouts[(r.tp, r.pp)].append(r)
    fit = hold = None
    if fit_sources is not None:
        fit = error_stats([r for r in results if r.source in fit_sources])
        hold = error_stats([r for r in results if r.source not in fit_sources])
    rank = ranking_groups(results)
    return ValidationSummary(error_stats(results),
                             {k: error_stats(v) for k, v in sorted(groups.items(), key=lambda kv: size_key(kv[0]))},
                             {f"tp{tp} pp{pp}": error_stats(layouts[(tp, pp)]) for tp, pp in sorted(layouts)},
                             fit, hold, rank, ranking_summary(rank))


__all__ = ["ErrorStats", "PlanBrief", "RankingGroup", "RankingStats", "RankingSummary", "RowResult", "ValidationSummary",
           "error_stats", "error_table_lines", "ranked", "ranking_groups", "ranking_stats", "ranking_summary", "size_key",
           "spearman_rho", "summarize"]
