"""Iterations to target against McCandlish et al.'s closed forms; the time-vs-carbon front and the choice."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random

import pytest
from mindpipe.simulator.carbon import CarbonSeries
from mindpipe.simulator.energy import J_PER_KWH
from mindpipe.simulator.timeshift import Window
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.tuner import target_front
from mindpipe.tuner.objectives import statistical_efficiency
from mindpipe.tuner.target import Placement, TrainingTarget, to_target
from mindpipe.tuner.target_front import Candidate, FrontPoint, choose, front, place, reference


def test_steps_and_examples_follow_mccandlish_eq_2_11():
    t = TrainingTarget(samples=1e6, noise_scale=500.0)  # samples are E_min
    assert t.min_samples == 1e6 and t.min_steps == pytest.approx(2000.0)
    assert t.iterations(500) == pytest.approx(4000.0)  # B = B_noise: twice S_min and twice E_min
    assert t.samples_at(500) == pytest.approx(2e6)
    for b in (1, 7, 64, 500, 4096, 1e5):
        s, e = t.iterations(b), t.samples_at(b)
        assert e == pytest.approx(b * s)
        # (S/S_min - 1)(E/E_min - 1) = 1 along the whole batch range.
        assert (s / t.min_steps - 1) * (e / t.min_samples - 1) == pytest.approx(1.0)
        # the same rule as goodput's statistical efficiency E_min / E(B)
        assert t.min_samples / e == pytest.approx(statistical_efficiency(b, 500.0))
    assert t.iterations(1e9) == pytest.approx(t.min_steps, rel=1e-6)  # large batch: S -> S_min


def test_samples_at_a_reference_batch_set_e_min():
    # GPT-3-like: 146.5 M sequences at batch 1536 with B_noise 3600: E_min = N / (1 + 1536/3600).
    t = TrainingTarget(samples=146.5e6, noise_scale=3600.0, reference_batch=1536.0)
    assert t.min_samples == pytest.approx(146.5e6 / (1 + 1536 / 3600))
    assert t.samples_at(1536) == pytest.approx(146.5e6)
    assert t.iterations(1536) == pytest.approx(146.5e6 / 1536)
    assert t.iterations(3072) < t.iterations(1536) and t.samples_at(3072) > t.samples_at(1536)


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"samples": 0.0, "noise_scale": 10.0}, "--target-samples"),
    ({"samples": float("nan"), "noise_scale": 10.0}, "--target-samples"),
    ({"samples": 10.0, "noise_scale": -1.0}, "--critical-batch"),
    ({"samples": 10.0, "noise_scale": 10.0, "reference_batch": -2.0}, "--target-batch"),
])
def test_bad_targets_name_the_flag(kwargs, flag):
    from mindpipe.tuner.keys import CLI_ARG_NAMES

    with pytest.raises(ContractError, match=flag):
        TrainingTarget(**kwargs, arg_names=CLI_ARG_NAMES)
    with pytest.raises(ContractError, match=r"^TrainingTarget\.(samples|noise_scale|reference_batch): "):
        TrainingTarget(**kwargs)  # from Python, the field


def _series(hours: int = 96) -> CarbonSeries:
    """Dirty (400 g/kWh) except a clean 100 g/kWh hour every day at 13:00 UTC."""
    t0 = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
    times = [t0 + dt.timedelta(hours=h) for h in range(hours)]
    return CarbonSeries(tuple(times), tuple(100.0 if h % 24 == 13 else 400.0 for h in range(hours)), source="test")


def test_cost_to_target_is_iterations_times_energy_times_intensity():
    t = TrainingTarget(samples=3600.0, noise_scale=60.0)  # S_min = 60
    cost = to_target(t, 60, iteration_time_s=30.0, energy_j=3.6e6, intensity_g_per_kwh=200.0)
    assert cost.iterations == pytest.approx(120.0) and cost.compute_hours == pytest.approx(1.0)
    assert cost.energy_kwh == pytest.approx(120.0) and cost.carbon_gco2 == pytest.approx(24_000.0)
    assert cost.wait_hours == 0.0
    # Placed: a one-hour job that may start within 24 h runs in the clean hour and waits 13 h.
    w = Window(dt.datetime(2024, 6, 1, tzinfo=dt.UTC), dt.datetime(2024, 6, 2, tzinfo=dt.UTC))
    for interruptible in (False, True):
        sched = Placement(_series(), w, interruptible).schedule(cost.compute_hours * 3600)
        placed = to_target(t, 60, 30.0, 3.6e6, sched=sched)
        assert placed.carbon_gco2 == pytest.approx(120.0 * 100.0)
        assert placed.wait_hours == pytest.approx(13.0)



def test_a_job_that_starts_at_once_waits_exactly_zero_hours():
    # All hours clean: the job starts at the window's start. Its length (iterations × a non-round
    # iteration time) is not a whole number of microseconds, which the segment ends round to.
    t0 = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
    flat = CarbonSeries(tuple(t0 + dt.timedelta(hours=h) for h in range(48)), (100.0,) * 48, source="test")
    w = Window(t0, t0 + dt.timedelta(hours=12))
    t = TrainingTarget(samples=3600.0, noise_scale=60.0)
    for interruptible in (False, True):
        cost = to_target(t, 60, 29.123456789, 3.6e6, intensity_g_per_kwh=100.0)
        sched = Placement(flat, w, interruptible).schedule(cost.compute_hours * 3600)
        placed = to_target(t, 60, 29.123456789, 3.6e6, sched=sched)
        assert sched.start == t0 and placed.wait_hours == 0.0

def _cand(name: str, it_s: float, energy_j: float, fastest: bool = False, clocks: str = "default") -> Candidate:
    plan = Plan(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=60)
    return Candidate(plan, clocks, it_s, energy_j, 300.0, fastest, name)


def test_front_has_no_dominated_point_and_dominates_the_rest():
    rng = random.Random(7)
    cands = [_cand(f"p{i}", rng.uniform(20, 40), rng.uniform(2e6, 5e6), i == 0) for i in range(6)]
    w = Window(dt.datetime(2024, 6, 1, tzinfo=dt.UTC), dt.datetime(2024, 6, 2, tzinfo=dt.UTC))
    points = place(cands, TrainingTarget(samples=3600.0, noise_scale=60.0), Placement(_series(), w, True))
    assert len(points) == 6 * 25  # every candidate at every latest start 0..24 h
    fr = front(points)

    def dominates(a: FrontPoint, b: FrontPoint) -> bool:
        return (a.hours_to_target <= b.hours_to_target and a.cost.carbon_gco2 <= b.cost.carbon_gco2
                and (a.hours_to_target < b.hours_to_target or a.cost.carbon_gco2 < b.cost.carbon_gco2))

    assert not any(dominates(a, b) for a in points for b in fr)
    assert all(any(dominates(f, p) or (f.hours_to_target, f.cost.carbon_gco2) == (p.hours_to_target,
               p.cost.carbon_gco2) for f in fr) for p in points)


def test_reference_is_the_fastest_plan_now_and_the_choice_keeps_the_time_budget():
    w = Window(dt.datetime(2024, 6, 1, tzinfo=dt.UTC), dt.datetime(2024, 6, 2, tzinfo=dt.UTC))
    cands = [_cand("fast", 30.0, 3.6e6, fastest=True), _cand("fast", 30.3, 3.0e6, fastest=True, clocks="perseus"),
             _cand("slow", 40.0, 1.0e6)]  # the slow one is cleanest but 33 % longer
    points = place(cands, TrainingTarget(samples=3600.0, noise_scale=60.0), Placement(_series(), w, False))
    ref = reference(points)
    assert ref.candidate.clocks == "default" and ref.latest_start_hours == 0 and ref.cost.wait_hours == 0
    best = choose(points, ref, 0.03)
    # 1.01 h job: 36 s before or after the clean hour cost the same; ties keep the earliest start.
    assert best.candidate.clocks == "perseus" and best.start == "2024-06-01T12:59:24Z"
    assert best.cost.compute_hours <= ref.cost.compute_hours * 1.03
    assert choose(points, ref, 0.5).candidate.name == "slow"
    energy = 120 * 3.0e6 / J_PER_KWH
    assert best.cost.carbon_gco2 == pytest.approx(energy * (3600 * 100 + 36 * 400) / 3636, rel=1e-9)


def _placed_with_clocks() -> tuple[list[FrontPoint], FrontPoint]:
    w = Window(dt.datetime(2024, 6, 1, tzinfo=dt.UTC), dt.datetime(2024, 6, 2, tzinfo=dt.UTC))
    clocked = Plan(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=60, stage_clocks_mhz=[1410, 1290])
    cands = [_cand("fast", 30.0, 3.6e6, fastest=True),
             Candidate(clocked, "perseus", 30.3, 3.0e6, 300.0, True, "fast")]
    points = place(cands, TrainingTarget(samples=3600.0, noise_scale=60.0), Placement(_series(), w, False))
    return points, reference(points)


def test_a_front_rows_clocks_are_a_json_list_of_mhz_and_a_csv_cell():
    points, ref = _placed_with_clocks()
    clocked = next(p for p in points if p.candidate.clocks == "perseus")
    row = json.loads(json.dumps(clocked.row()))  # as target.json holds it
    assert row["stage_clocks_mhz"] == [1410, 1290]
    assert ref.row()["stage_clocks_mhz"] is None  # default clocks
    assert clocked.csv_row()["stage_clocks_mhz"] == "[1410, 1290]" and ref.csv_row()["stage_clocks_mhz"] == ""
    unplaced = place([ref.candidate], TrainingTarget(samples=3600.0, noise_scale=60.0), None)[0]
    assert unplaced.row()["start"] is None and unplaced.csv_row()["start"] == ""


@pytest.mark.parametrize(("scale", "unit"), [(1e-3, "gCO2"), (1.0, "kgCO2"), (1e3, "tCO2")])
def test_the_front_plot_labels_gco2_in_the_unit_of_its_magnitude(monkeypatch, tmp_path, scale, unit):
    points, ref = _placed_with_clocks()  # ~12 to 36 kgCO2 to target
    points = [dataclasses.replace(p, cost=dataclasses.replace(p.cost, carbon_gco2=p.cost.carbon_gco2 * scale))
              for p in points]
    ref = reference(points)
    drawn = {}
    monkeypatch.setattr(target_front, "save_figure", lambda fig, path: drawn.update(ax=fig.axes[0]))
    target_front.plot(points, front(points), ref, choose(points, ref, 0.03), tmp_path / "f.png")
    ax = drawn["ax"]
    assert ax.get_ylabel() == f"{unit} to target"
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    assert 1 <= max(ys) < 1000
