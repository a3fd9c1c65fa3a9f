"""Statistics of ``benchmarks/executor_overhead.py``: a step-time ratio with a bootstrap interval.

The benchmark alternates rounds (hand-written run, executor run, hand-written, executor …). A
round is the unit of replication: its two runs sit side by side in time, so the machine's drift
(other load, clock changes) falls on both, while runs in different rounds can see a different
machine. Hence:

* per round, the ratio of medians of the post-warm-up steps, executor over hand-written (the
  median shrugs off the odd step stalled by other load);
* the point estimate is the geometric mean of the per-round ratios (a ratio's natural mean: the
  hand-written-over-executor figure is its reciprocal, and a round twice as slow for both counts
  the same as any other);
* the interval is a percentile bootstrap over rounds: resample the rounds with replacement,
  recompute the geometric mean, and read the interval off the resampled values. Steps within a
  run are not resampled: they are correlated (a slow spell lasts several steps), and treating
  them as independent would make the interval far too narrow.

With few rounds the plain percentile interval runs narrow — it ignores that the spread itself is
estimated. On synthetic log-normal rounds (a drift per round shared by both runs, a 4 % run-to-run
wobble of the ratio, 6 % step noise; 600 experiments each) its nominal 95 % covered the true
ratio 85 % of the time with 6 rounds and 90 % with 8 or 10; read at Hesterberg's expanded tail
shares (:func:`expanded_tail`, the default) it covered 93 %, 94 % and 95 %. How wide the
interval comes out is the machine's doing: its half-width is about t_{n−1, 0.975} × (the spread
of the rounds' log-ratios) / √n for n rounds, so at a true ratio of 1.00 and rounds that disagree
by 5 %, the upper end lands near 1.054 with 6 rounds and 1.043 with 8. No torch, so the unit
test runs anywhere.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from scipy.stats import t as student_t


@dataclass(frozen=True)
class RatioInterval:
    """Executor-over-hand-written step-time ratio with its bootstrap interval.

    Attributes:
        ratio: Geometric mean of the per-round ratios.
        low, high: Ends of the percentile bootstrap interval.
        per_round: Ratio of medians of the post-warm-up steps, per round.
        confidence: Central share of the bootstrap distribution the interval spans.
        resamples: Bootstrap resamples drawn.
        seed: Seed of the resampling.
    """

    ratio: float
    low: float
    high: float
    per_round: list[float]
    confidence: float
    resamples: int
    seed: int


def round_ratio(hand: Sequence[float], execu: Sequence[float], warmup: int) -> float:
    """Median post-warm-up step time of ``execu`` over that of ``hand`` (one round).

    Raises:
        ValueError: a run has no step after ``warmup``, or a median is not positive.
    """
    if warmup < 0 or len(hand) <= warmup or len(execu) <= warmup:
        raise ValueError(f"warmup={warmup} leaves no step to measure (runs of {len(hand)} and {len(execu)} steps)")
    h, e = statistics.median(hand[warmup:]), statistics.median(execu[warmup:])
    if h <= 0 or e <= 0:
        raise ValueError(f"step times must be positive (medians {h} and {e})")
    return e / h


def _geomean(values: Sequence[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (Hyndman & Fan type 7, numpy's default) of sorted values."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def expanded_tail(confidence: float, n: int) -> float:
    """Tail share of each end of the expanded percentile interval for ``n`` observations.

    Hesterberg (2015, "What teachers should know about the bootstrap", The American
    Statistician 69(4) §5.4): a percentile bootstrap of a mean behaves like a z interval with the
    divide-by-n spread, too narrow for small n. Widen it to match a t interval: take the
    bootstrap quantiles at Φ(−√(n/(n−1)) · t_{n−1, 1−α/2}) instead of α/2.
    """
    t = float(student_t.ppf(1.0 - (1.0 - confidence) / 2.0, n - 1))
    return NormalDist().cdf(-math.sqrt(n / (n - 1)) * t)


def ratio_interval(hand_rounds: Sequence[Sequence[float]], exec_rounds: Sequence[Sequence[float]], warmup: int, *,
                   confidence: float = 0.95, resamples: int = 10_000, seed: int = 0,
                   expand: bool = True) -> RatioInterval:
    """Point estimate and bootstrap interval of the executor's step-time ratio (module docstring).

    Args:
        hand_rounds, exec_rounds: Per round, the step times of the hand-written and executor runs.
        warmup: Leading steps of each run left out.
        confidence: Central share of the bootstrap distribution (0.95: a 95 % interval).
        resamples: Bootstrap resamples.
        seed: Seed of the resampling (the same inputs and seed give the same interval).
        expand: Use Hesterberg's expanded percentile interval (:func:`expanded_tail`) instead
            of the plain one, which runs narrow with few rounds.

    Raises:
        ValueError: rounds do not pair up, fewer than two rounds, or a bad warm-up, confidence or
            resample count.
    """
    if len(hand_rounds) != len(exec_rounds):
        raise ValueError(f"{len(hand_rounds)} hand-written rounds but {len(exec_rounds)} executor rounds")
    if len(hand_rounds) < 2:
        raise ValueError(f"a bootstrap over rounds needs at least 2 rounds, got {len(hand_rounds)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must lie strictly between 0 and 1")
    if resamples < 1:
        raise ValueError(f"resamples={resamples} must be at least 1")
    per_round = [round_ratio(h, e, warmup) for h, e in zip(hand_rounds, exec_rounds, strict=True)]
    logs = [math.log(r) for r in per_round]
    n = len(logs)
    rng = random.Random(seed)
    boot = sorted(math.exp(math.fsum(rng.choices(logs, k=n)) / n) for _ in range(resamples))
    tail = expanded_tail(confidence, n) if expand else (1.0 - confidence) / 2.0
    return RatioInterval(ratio=_geomean(per_round), low=_quantile(boot, tail), high=_quantile(boot, 1.0 - tail),
                         per_round=per_round, confidence=confidence, resamples=resamples, seed=seed)


__all__ = ["RatioInterval", "ratio_interval", "round_ratio"]
