"""Time-shifting: an interruptible job is never dirtier than the contiguous one, whatever the window."""

from __future__ import annotations

import datetime as dt
import json
import math
import random

import pytest
from mindpipe.simulator.carbon import CarbonSeries, load_carbon_csv
from mindpipe.simulator.timeshift import Window, best_start, cleanest_hours
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.target import Placement, TrainingTarget, to_target

UTC = dt.UTC
T0 = dt.datetime(2024, 6, 1, tzinfo=UTC)
H = dt.timedelta(hours=1)


def _series(values: list[float]) -> CarbonSeries:
    return CarbonSeries.of([(T0 + k * H, v) for k, v in enumerate(values)], "test.csv")


def test_half_hour_window_pauses_at_the_series_hours():
    # Window 00:30..01:30, 1 h job: a contiguous run from 01:00 sits wholly in the 10 g/kWh hour; the
    # old slots [00:30, 01:30) and [01:30, 02:30) each mixed a dirty half hour in (mean 505 / 55).
    s = _series([1000, 10, 100, 1000, 1000])
    w = Window(T0 + 0.5 * H, T0 + 1.5 * H)
    nonint = best_start(s, w, 3600)
    assert nonint.start == T0 + H and nonint.intensity_g_per_kwh == pytest.approx(10.0)
    inter = cleanest_hours(s, w, 3600)
    assert inter.intensity_g_per_kwh == pytest.approx(10.0)
    assert [(seg.start, seg.seconds) for seg in inter.segments] == [(T0 + H, 3600.0)]


@pytest.mark.parametrize("seed", range(8))
def test_interruptible_never_worse_than_contiguous_on_unaligned_windows(seed):
    rng = random.Random(7000 + seed)
    s = _series([round(rng.uniform(20, 600), 1) for _ in range(60)])
    start = T0 + dt.timedelta(minutes=rng.randrange(1, 59))
    w = Window(start, start + dt.timedelta(minutes=rng.randrange(0, 20 * 60)))
    job_s = rng.uniform(0.2, 12) * 3600
    inter = cleanest_hours(s, w, job_s)
    nonint = best_start(s, w, job_s)
    assert inter.intensity_g_per_kwh <= nonint.intensity_g_per_kwh + 1e-9
    assert sum(seg.seconds for seg in inter.segments) == pytest.approx(job_s)
    deadline = w.end + dt.timedelta(seconds=job_s)
    assert all(w.start <= seg.start and seg.end <= deadline for seg in inter.segments)
    # exact: the fractional knapsack over pieces of constant intensity, checked on a one-minute grid
    minutes = sorted(s.intensity_over(w.start + dt.timedelta(minutes=k), 60)
                     for k in range(int((deadline - w.start).total_seconds() // 60)))
    whole = int(job_s // 60)
    bound = (sum(minutes[:whole]) * 60 + minutes[whole] * (job_s - whole * 60)) / job_s if whole < len(minutes) else 0
    assert inter.intensity_g_per_kwh <= bound + 1e-6


@pytest.mark.parametrize("interruptible", [False, True])
def test_a_job_started_at_once_waits_plus_zero_hours_in_json(interruptible):
    # gpt-1.3b's reference run in a carbon_to_target sweep: the segment end, rounded to a microsecond,
    # falls 0.3 us short of the job's length, and round(-3e-7, 6) is -0.0, which JSON wrote as "-0.0".
    s = _series([100.0 + h for h in range(24)])
    t = TrainingTarget(samples=2e6, noise_scale=2000, reference_batch=512)
    it = 0.9589081977811762
    sched = Placement(s, Window(T0, T0), interruptible).schedule(t.iterations(64) * it)
    cost = to_target(t, 64, it, 2500.0, sched=sched)
    assert cost.wait_hours == 0.0 and math.copysign(1.0, cost.wait_hours) == 1.0
    assert json.dumps({"wait_hours": cost.wait_hours}) == '{"wait_hours": 0.0}'


def test_a_semicolon_separated_csv_is_named_as_such(tmp_path):
    # A European spreadsheet's export: one field per line, which matched both the Datetime and the
    # intensity column, so the refusal was "line 2: '2024-06-01 00:00:00;100' is not an ISO date and time".
    path = tmp_path / "zone.csv"
    path.write_text("Datetime (UTC);Carbon Intensity gCO2eq/kWh (LCA)\n2024-06-01 00:00:00;100\n", encoding="utf-8")
    with pytest.raises(ContractError, match=r"zone\.csv: .*line 1.*comma-separated"):
        load_carbon_csv(path)
