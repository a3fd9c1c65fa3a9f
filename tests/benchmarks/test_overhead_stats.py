"""The executor-overhead benchmark's statistics (``benchmarks/overhead_stats.py``) on synthetic rounds."""

from __future__ import annotations

import math
import random

import pytest

from .conftest import load_benchmark

stats = load_benchmark("overhead_stats")


def rounds(n: int, ratio: float, seed: int, wobble: float = 0.04, steps: int = 30, warmup: int = 5) -> tuple[list, list]:
    """``n`` synthetic rounds: a machine drift per round shared by both runs, a run-to-run wobble of
    the executor's ratio (log-normal, sd ``wobble``), log-normal step noise, and slow warm-up steps."""
    rng = random.Random(seed)
    hand, execu = [], []
    for _ in range(n):
        drift = 0.5 * math.exp(rng.gauss(0.0, 0.1))
        run_ratio = ratio * math.exp(rng.gauss(0.0, wobble))
        hand.append([drift * (3.0 if k < warmup else 1.0) * math.exp(rng.gauss(0.0, 0.06)) for k in range(steps)])
        execu.append([drift * run_ratio * (3.0 if k < warmup else 1.0) * math.exp(rng.gauss(0.0, 0.06))
                      for k in range(steps)])
    return hand, execu


def test_identical_distributions_give_an_interval_covering_one() -> None:
    for seed in range(5):
        r = stats.ratio_interval(*rounds(6, 1.0, seed), warmup=5, seed=seed)
        assert r.low <= 1.0 <= r.high, (seed, r)
        assert r.low <= r.ratio <= r.high


def test_a_ten_percent_slower_executor_gives_an_interval_above_the_target() -> None:
    # Runs that agree within ~2 % round to round: six rounds then resolve 10 % from 5 %.
    for seed in range(5):
        r = stats.ratio_interval(*rounds(6, 1.10, seed, wobble=0.02), warmup=5, seed=seed)
        assert r.low > 1.05, (seed, r)


def test_a_constant_ratio_is_recovered_exactly_and_warm_up_steps_are_left_out() -> None:
    hand = [[9.0, 9.0, 1.0, 2.0, 3.0], [9.0, 9.0, 2.0, 4.0, 6.0], [9.0, 9.0, 1.5, 1.5, 1.5]]
    execu = [[0.1, 0.1, 1.2 * t, 1.2 * t, 1.2 * t] for t in (2.0, 4.0, 1.5)]
    r = stats.ratio_interval(hand, execu, warmup=2, resamples=200)
    assert r.per_round == pytest.approx([1.2, 1.2, 1.2])
    assert (r.ratio, r.low, r.high) == pytest.approx((1.2, 1.2, 1.2))


def test_point_estimate_is_the_geometric_mean_of_round_ratios_and_the_seed_fixes_the_interval() -> None:
    hand = [[1.0, 1.0, 1.0]] * 3
    execu = [[2.0, 2.0, 2.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0]]
    r = stats.ratio_interval(hand, execu, warmup=0)
    assert r.ratio == pytest.approx(1.0)  # geometric mean of 2, 1/2 and 1
    data = rounds(8, 1.02, seed=3)
    a = stats.ratio_interval(*data, warmup=5, seed=11)
    b = stats.ratio_interval(*data, warmup=5, seed=11)
    c = stats.ratio_interval(*data, warmup=5, seed=12)
    assert (a.low, a.high) == (b.low, b.high)
    assert (a.low, a.high) != (c.low, c.high)


def test_expanded_interval_is_wider_and_covers_near_the_nominal_level() -> None:
    # 300 synthetic 6-round experiments at a true ratio of 1: the plain percentile interval
    # covers too rarely, the expanded one near 95 %.
    plain = expanded = 0
    for k in range(300):
        data = rounds(6, 1.0, seed=1000 + k)
        e = stats.ratio_interval(*data, warmup=5, resamples=1000, seed=k)
        p = stats.ratio_interval(*data, warmup=5, resamples=1000, seed=k, expand=False)
        assert e.low <= p.low and p.high <= e.high
        expanded += e.low <= 1.0 <= e.high
        plain += p.low <= 1.0 <= p.high
    assert expanded / 300 >= 0.90
    assert plain < expanded


def test_expanded_tail_matches_hesterberg_for_six_rounds() -> None:
    # α' / 2 = Φ(−√(6/5) · t_{5, 0.975}) = Φ(−1.0954 · 2.5706) = Φ(−2.8159) ≈ 0.00243.
    assert stats.expanded_tail(0.95, 6) == pytest.approx(0.00243, abs=1e-5)
    assert stats.expanded_tail(0.95, 1000) == pytest.approx(0.025, abs=3e-4)


@pytest.mark.parametrize(("hand", "execu", "warmup"), [
    ([[1.0, 1.0]], [[1.0, 1.0]], 0),  # one round: nothing to resample
    ([[1.0, 1.0]] * 2, [[1.0, 1.0]] * 3, 0),  # rounds do not pair up
    ([[1.0, 1.0]] * 2, [[1.0, 1.0]] * 2, 2),  # warm-up leaves no step
    ([[1.0, 0.0]] * 2, [[1.0, 1.0]] * 2, 1),  # a zero step time
])
def test_bad_input_is_refused(hand: list, execu: list, warmup: int) -> None:
    with pytest.raises(ValueError):
        stats.ratio_interval(hand, execu, warmup)
