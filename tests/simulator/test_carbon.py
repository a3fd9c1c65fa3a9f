"""Carbon series (:mod:`mindpipe.simulator.carbon`): sorted, unique, UTC, complete over the iteration."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest
from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.carbon import CarbonSeries, load_carbon_csv, parse_time
from mindpipe.simulator.energy import hourly_intensity
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError

from mindpipe.cli import main

HEADER = "Datetime (UTC),Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA)\n"
HOURS = [(f"2024-01-01 0{h}:00:00", v) for h, v in enumerate((100.0, 200.0, 300.0, 400.0, 500.0))]
UTC = dt.UTC


def _csv(tmp_path, rows, name="zone.csv") -> str:
    path = tmp_path / name
    path.write_text(HEADER + "".join(f"{t},1,{v}\n" for t, v in rows), encoding="utf-8")
    return str(path)


def _at(h: int, m: int = 0) -> dt.datetime:
    return dt.datetime(2024, 1, 1, h, m, tzinfo=UTC)


def test_order_of_rows_does_not_matter(tmp_path):
    ordered = load_carbon_csv(_csv(tmp_path, HOURS, "a.csv"))
    reversed_ = load_carbon_csv(_csv(tmp_path, HOURS[::-1], "b.csv"))
    shuffled = load_carbon_csv(_csv(tmp_path, [HOURS[i] for i in (3, 0, 4, 1, 2)], "c.csv"))
    assert ordered.times == reversed_.times == shuffled.times
    for s in (ordered, reversed_, shuffled):
        assert s.intensity_over(_at(3, 30)) == 400.0  # the LCA column


def test_a_repeated_hour_is_refused_naming_both_rows(tmp_path):
    path = _csv(tmp_path, [*HOURS, ("2024-01-01 03:00:00", 999.0)])
    with pytest.raises(ContractError, match=r"zone\.csv: line 7: 2024-01-01T03:00:00Z repeats line 5"):
        load_carbon_csv(path)
    # the same instant written with an offset is the same hour
    path = _csv(tmp_path, [*HOURS, ("2024-01-01T08:00:00+05:00", 999.0)], "tz.csv")
    with pytest.raises(ContractError, match="repeats line 5"):
        load_carbon_csv(path)


def test_offsets_are_converted_to_utc(tmp_path):
    local = [(f"2024-01-01T{h + 5:02d}:00:00+05:00", v) for h, v in enumerate(v for _, v in HOURS)]
    utc_series = load_carbon_csv(_csv(tmp_path, HOURS, "utc.csv"))
    local_series = load_carbon_csv(_csv(tmp_path, local, "local.csv"))
    assert local_series.times == utc_series.times
    assert local_series.intensity_over(_at(4)) == 500.0
    zulu = load_carbon_csv(_csv(tmp_path, [(f"2024-01-01T0{h}:00:00Z", v) for h, (_, v) in enumerate(HOURS)], "z.csv"))
    assert zulu.times == utc_series.times
    assert parse_time("2024-01-01T09:30+05:00", "--start", "") == _at(4, 30)


def test_the_iteration_span_is_priced_by_time_and_must_be_covered(tmp_path):
    s = load_carbon_csv(_csv(tmp_path, HOURS))
    assert s.intensity_over(_at(0, 30), 3600.0) == pytest.approx(150.0)  # half of 00h, half of 01h
    assert s.intensity_over(_at(4, 59), 60.0) == 500.0  # to the end of the last hour
    with pytest.raises(ContractError, match=r"start: 2024-01-01T04:30:00Z to 2024-01-01T05:30:00Z is outside the "
                                            r"series, which covers 2024-01-01T00:00:00Z to 2024-01-01T05:00:00Z"):
        s.intensity_over(_at(4, 30), 3600.0)
    with pytest.raises(ContractError, match="outside the series"):
        s.intensity_over(dt.datetime(2023, 12, 31, 23, 59, tzinfo=UTC))
    gap = load_carbon_csv(_csv(tmp_path, [HOURS[0], HOURS[4]], "gap.csv"))
    with pytest.raises(ContractError, match=r"no intensity from 2024-01-01T01:00:00Z to 2024-01-01T04:00:00Z "
                                            r"\(missing hours\)"):
        gap.intensity_over(_at(0, 30), 3600.0)


@pytest.mark.parametrize(("rows", "needle"), [
    ([], "no data rows after the header"),
    ([("2024-01-01 00:00:00", "NaN")], "line 2: 'NaN' is not a finite number"),
    ([("2024-01-01 00:00:00", "Infinity")], "line 2: 'Infinity' is not a finite number"),
    ([("2024-01-01 00:00:00", "-3")], "line 2: -3 is outside [0, 5000]"),
    ([("yesterday", "100")], "line 2: 'yesterday' is not an ISO date and time"),
    ([("2024-01-01 00:00:00", "1" * 200_000)], "line 2: malformed CSV (field larger than field limit"),
])
def test_bad_series_are_refused(tmp_path, rows, needle):
    with pytest.raises(ContractError) as e:
        load_carbon_csv(_csv(tmp_path, rows))
    assert needle in str(e.value) and str(e.value).startswith(str(tmp_path / "zone.csv"))


def test_series_built_in_python_follow_the_same_rules():
    pairs = [(dt.datetime(2024, 1, 1, h), float(v)) for h, v in ((2, 30), (0, 10), (1, 20))]
    assert hourly_intensity(pairs, dt.datetime(2024, 1, 1, 1, 30)) == 20.0
    with pytest.raises(ContractError, match="repeats point"):
        CarbonSeries.of([*pairs, (dt.datetime(2024, 1, 1, 1), 5.0)])
    with pytest.raises(ContractError, match="must be in"):
        CarbonSeries.of([(dt.datetime(2024, 1, 1), math.nan)])


def test_carbon_follows_the_mean_over_the_iteration(tmp_path):
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    plan = Plan(dp=8, global_batch_size=64)
    series = load_carbon_csv(_csv(tmp_path, HOURS))
    base = simulate(model, cluster, plan)
    start = _at(1) - dt.timedelta(seconds=base.iteration_time_s / 2)  # half in hour 0, half in hour 1
    r = simulate(model, cluster, plan, SimulationOptions(hourly_intensity=(series, start)))
    assert r.extra.carbon_intensity_g_per_kwh == pytest.approx(150.0)


def test_cli_refuses_a_start_outside_the_series_and_prints_strict_json(tmp_path, capsys):
    args = ["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x1", "--plan", "{}", "--carbon-csv",
            _csv(tmp_path, HOURS)]
    assert main([*args, "--start", "2025-01-01T00:00"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "zone.csv: start: 2025-01-01T00:00:00Z is outside the series" in err
    assert main([*args, "--start", "2024-01-01T08:30+05:00", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["extra"]["carbon_intensity_g_per_kwh"] == pytest.approx(400.0)  # 03:30 UTC


def test_published_series_reversed_gives_the_same_hour(shared_data, tmp_path):
    """The issue's example: GB at 2024-01-01T04:00Z is 92.14 g/kWh, whatever the order of the rows."""
    path = shared_data / "carbon" / "GB_2024_hourly.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    (tmp_path / "rev.csv").write_text("\n".join([lines[0], *lines[:0:-1]]) + "\n", encoding="utf-8")
    for series in (load_carbon_csv(path), load_carbon_csv(tmp_path / "rev.csv")):
        assert len(series) == 8784 and series.intensity_over(_at(4)) == 92.14
