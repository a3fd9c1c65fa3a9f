"""Time-shifting (:mod:`mindpipe.simulator.timeshift`): exact on hand-made series, optimal against brute
force, and the 2024 bounds of BACKGROUND.md §7 reproduced on the shared Electricity Maps data."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pytest
from mindpipe.simulator.carbon import CarbonSeries, load_carbon_csv
from mindpipe.simulator.timeshift import Window, best_start, cleanest_hours, parse_window, schedule
from mindpipe.traces.errors import ContractError

UTC = dt.UTC
T0 = dt.datetime(2024, 6, 1, tzinfo=UTC)
H = dt.timedelta(hours=1)
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "carbon"


def _series(values: list[float]) -> CarbonSeries:
    return CarbonSeries.of([(T0 + k * H, v) for k, v in enumerate(values)], "test.csv")


def _random_series(rng: random.Random, n: int) -> CarbonSeries:
    return _series([round(rng.uniform(50, 500), 1) for _ in range(n)])


def test_hand_example_non_interruptible_and_interruptible():
    s = _series([500, 400, 100, 300, 50, 450, 450, 450, 450, 450])
    w = Window(T0, T0 + 3 * H)
    nonint = best_start(s, w, 2 * 3600)
    # starts 0..3 h: means 450, 250, 200, 175 → start at 03:00, (300 + 50) / 2
    assert nonint.start == T0 + 3 * H and nonint.intensity_g_per_kwh == pytest.approx(175.0)
    assert nonint.intensity_if_now_g_per_kwh == pytest.approx(450.0)
    assert nonint.saving_fraction == pytest.approx(1 - 175 / 450)
    assert nonint.run_hours() == ["2024-06-01T03:00:00Z", "2024-06-01T04:00:00Z"]
    inter = cleanest_hours(s, w, 2 * 3600)  # slots before the deadline 05:00: the two cleanest are 04:00 and 02:00
    assert [(seg.start, seg.seconds) for seg in inter.segments] == [(T0 + 2 * H, 3600.0), (T0 + 4 * H, 3600.0)]
    assert inter.intensity_g_per_kwh == pytest.approx(75.0)
    assert inter.run_hours() == ["2024-06-01T02:00:00Z", "2024-06-01T04:00:00Z"]
    assert inter.finish == T0 + 5 * H <= w.end + 2 * H  # the deadline


def test_run_hours_are_the_series_clock_hours_the_run_overlaps():
    # A contiguous run from 00:30 to 02:15 is priced on the series' rows 00:00, 01:00 and 02:00; the
    # report listed 00:30 and 01:30 (stamps the series has no row for, and one hour short).
    s = _series([100.0] * 6)
    half = T0 + 0.5 * H
    sched = best_start(s, Window(half, half), 1.75 * 3600)
    assert sched.start == half
    assert sched.run_hours() == ["2024-06-01T00:00:00Z", "2024-06-01T01:00:00Z", "2024-06-01T02:00:00Z"]
    assert sched.to_json()["run_hours"] == sched.run_hours()
    # Interruptible from a 00:30 window start: slots 00:30-01:00 (clean) and 03:00-03:30 (the start
    # of the next-cleanest hour) -> one clock hour each.
    s = _series([10, 900, 900, 20, 900, 900])
    inter = cleanest_hours(s, Window(half, half + 2 * H), 3600)
    assert [(seg.start, seg.seconds) for seg in inter.segments] == [(half, 1800.0), (T0 + 3 * H, 1800.0)]
    assert inter.run_hours() == ["2024-06-01T00:00:00Z", "2024-06-01T03:00:00Z"]
    # Whole hours keep their stamps, and a job ending exactly on the hour does not list the next one.
    on_hour = best_start(s, Window(T0 + 3 * H, T0 + 3 * H), 3600)
    assert on_hour.run_hours() == ["2024-06-01T03:00:00Z"]


def test_fractional_job_weights_partial_hours():
    s = _series([400, 100, 100, 400, 400, 400])
    w = Window(T0, T0 + 2 * H)
    sched = best_start(s, w, 2.5 * 3600)
    # the best 2.5 h covers both 100-hours and half an hour of 400: mean (100+100+200)/2.5 = 160
    assert sched.intensity_g_per_kwh == pytest.approx(160.0)
    assert sched.start in (T0 + 0.5 * H, T0 + H)
    inter = cleanest_hours(s, w, 2.5 * 3600)
    assert inter.intensity_g_per_kwh == pytest.approx(160.0)
    assert sum(seg.seconds for seg in inter.segments) == pytest.approx(2.5 * 3600)
    # one full-hour segment of 400 for the fraction? no: 0.5 h at the start of the cleanest 400-slot
    assert [seg.seconds for seg in inter.segments] == [1800.0, 7200.0]


@pytest.mark.parametrize("seed", range(6))
def test_best_start_beats_every_start_on_a_five_minute_grid(seed):
    rng = random.Random(seed)
    s = _random_series(rng, 40)
    job_s = rng.choice([0.75, 1.0, 2.4, 5.0, 7.25]) * 3600
    w = Window(T0 + dt.timedelta(minutes=rng.randrange(0, 120)), T0 + dt.timedelta(hours=rng.randrange(3, 20)))
    sched = best_start(s, w, job_s)
    assert w.start <= sched.start <= w.end
    t = w.start
    while t <= w.end:
        assert sched.intensity_g_per_kwh <= s.intensity_over(t, job_s) + 1e-9
        t += dt.timedelta(minutes=5)
    assert sched.intensity_g_per_kwh == pytest.approx(s.intensity_over(sched.start, job_s))
    assert sched.saving_fraction >= 0


@pytest.mark.parametrize("seed", range(6))
def test_interruptible_is_the_cleanest_hours_and_never_worse(seed):
    rng = random.Random(100 + seed)
    s = _random_series(rng, 48)
    hours = rng.randrange(1, 8)
    w = Window(T0, T0 + rng.randrange(0, 24) * H)
    inter = cleanest_hours(s, w, hours * 3600)
    slots = [s.intensity_over(w.start + k * H, 3600) for k in range(int(w.hours) + hours)]
    assert inter.intensity_g_per_kwh == pytest.approx(sum(sorted(slots)[:hours]) / hours)
    assert inter.intensity_g_per_kwh <= best_start(s, w, hours * 3600).intensity_g_per_kwh + 1e-9
    assert all(w.start <= seg.start and seg.end <= w.end + hours * H for seg in inter.segments)
    ends = [seg.end for seg in inter.segments][:-1]
    assert all(e < nxt.start for e, nxt in zip(ends, inter.segments[1:], strict=True))  # merged, paused between


def test_window_rules():
    s = _series([100.0] * 10)
    assert parse_window("2024-06-01T00:00Z/2024-06-01T03:00Z") == Window(T0, T0 + 3 * H)
    assert parse_window("2024-06-01T02:00+02:00/2024-06-01T03:00Z").start == T0  # offsets converted
    with pytest.raises(ContractError, match="--window: END 2024-06-01T00:00:00Z is before START 2024-06-01T01:00:00Z"):
        parse_window("2024-06-01T01:00Z/2024-06-01T00:00Z")
    with pytest.raises(ContractError, match="is not START/END"):
        parse_window("2024-06-01T01:00Z")
    with pytest.raises(ContractError, match="START: 'tomorrow' is not an ISO date"):
        parse_window("tomorrow/2024-06-01T00:00Z")
    with pytest.raises(ContractError, match=r"test\.csv: start: .* is outside the series"):
        schedule(s, Window(T0 + 5 * H, T0 + 8 * H), 3 * 3600, interruptible=False)  # the deadline is 11:00
    with pytest.raises(ContractError, match="outside the series"):
        schedule(s, Window(T0 - H, T0 + H), 3600, interruptible=True)
    with pytest.raises(ContractError, match="must be > 0 seconds"):
        best_start(s, Window(T0, T0), 0.0)


def test_a_zero_length_window_is_starting_now():
    s = _series([300, 100, 200, 50])
    sched = schedule(s, Window(T0, T0), 2 * 3600, interruptible=False)
    assert sched.start == T0 and sched.saving_fraction == 0.0
    assert schedule(s, Window(T0, T0), 2 * 3600, interruptible=True).saving_fraction == 0.0  # deadline = 2 h


@pytest.mark.skipif(not DATA.is_dir(), reason="shared Electricity Maps data not present")
@pytest.mark.parametrize(("zone", "nonint", "inter"), [("GB", 0.273, 0.281), ("US-CAL-CISO", 0.383, 0.387)])
def test_background_bounds_reproduced_4h_within_24h(zone, nonint, inter):
    # BACKGROUND.md §7: mean over every start hour t of 2024 of 1 − CI_shifted / CI_now.
    s = load_carbon_csv(DATA / f"{zone}_2024_hourly.csv")
    got_n, got_i = [], []
    for i in range(len(s) - 28 + 1):
        w = Window(s.times[i], s.times[i] + 24 * H)
        got_n.append(best_start(s, w, 4 * 3600).saving_fraction)
        got_i.append(cleanest_hours(s, w, 4 * 3600).saving_fraction)
    assert sum(got_n) / len(got_n) == pytest.approx(nonint, abs=0.0015)
    assert sum(got_i) / len(got_i) == pytest.approx(inter, abs=0.0015)
