"""``tune --objective carbon`` with an hourly series and a start window: plan and start chosen together,
reported against the throughput-optimal plan started now; bad input is one line and exit 2."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import math
import random
from pathlib import Path

import pandas as pd
import pytest
from mindpipe.simulator.carbon import load_carbon_csv, parse_time, stamp
from mindpipe.simulator.energy import J_PER_KWH

from mindpipe.cli import main as mindpipe_main

SMALL = ('{"kind":"gpt","num_layers":8,"hidden_size":1024,"num_heads":16,"seq_len":512,"vocab_size":32000,'
         '"name":"gpt-small"}')
# 16 plans: two global batches, every mesh and micro-batch, one schedule.
NARROW = ["--fix", "schedule=1f1b", "--fix", "recompute=none", "--fix", "zero_stage=0", "--fix", "comm_priority=fair",
          "--fix", "sequence_parallel=false", "--fix", "micro_batch_size=1,2", "--global-batch", "32,64"]
WINDOW = "2024-06-01T00:00Z/2024-06-02T00:00Z"
ITERATIONS = 100_000  # about 1-3 h for these plans: long enough to straddle hours, short enough for the series


@pytest.fixture(scope="module")
def csv(tmp_path_factory) -> Path:
    """Ten days of hours, dirty at night and clean around 13:00 UTC (a solar-like dip), seeded noise."""
    rng = random.Random(3)
    path = tmp_path_factory.mktemp("carbon") / "zone.csv"
    t0 = dt.datetime(2024, 6, 1)
    lines = ["Datetime (UTC),Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA)"]
    for h in range(240):
        v = 400 - 300 * max(0.0, 1 - abs(h % 24 - 13) / 4) + rng.uniform(0, 20)
        lines.append(f"{(t0 + dt.timedelta(hours=h)):%Y-%m-%d %H:%M:%S},1,{v:.1f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tune(tmp: Path, csv: Path, *extra: str, name: str = "sweep") -> tuple[int, str, str, Path]:
    out = tmp / name
    argv = ["tune", "--model", SMALL, "--cluster", "a100-sxm4-80gb:1x8", "--objective", "carbon", *NARROW,
            "--optimizer", "grid", "--budget", "100", "--workers", "1", "--no-plots", "--quiet", "--out", str(out),
            "--carbon-csv", str(csv), *extra]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = mindpipe_main(argv)
    return code, stdout.getvalue(), stderr.getvalue(), out


@pytest.fixture(scope="module")
def shifted(tmp_path_factory, csv):
    code, stdout, stderr, out = _tune(tmp_path_factory.mktemp("nonint"), csv, "--window", WINDOW, "--iterations",
                                      str(ITERATIONS), "--json")
    assert code == 0, stderr
    return json.loads(stdout), pd.read_csv(out / "evaluations.csv"), out


def _job_carbon(row: pd.Series, intensity: float) -> float:
    return row["energy_j"] * ITERATIONS / J_PER_KWH * intensity


def test_each_plan_is_priced_at_its_own_best_start(shifted, csv):
    _info, table, _ = shifted
    series = load_carbon_csv(csv)
    start = parse_time("2024-06-01T00:00Z", "t", "")
    ok = table[table.status == "ok"]
    assert len(ok) >= 8
    starts = set()
    for _, row in ok.iterrows():
        job_s = ITERATIONS * row["iteration_time_s"]
        per_hour = [series.intensity_over(start + dt.timedelta(minutes=10 * k), job_s) for k in range(24 * 6 + 1)]
        best = min(per_hour)
        got = row["carbon_per_sample_g"] * row["global_batch_size"] / (row["energy_j"] / J_PER_KWH)
        assert got <= best + 1e-9  # never worse than any start on a 10-minute grid
        assert got >= min(series.values[:48]) - 1e-9
        starts.add(round(got, 6))
    assert len(starts) > 1  # plans of different speed get different schedules


def test_json_reports_the_schedule_against_the_fastest_plan_started_now(shifted, csv):
    info, table, out = shifted
    series = load_carbon_csv(csv)
    window_start = parse_time("2024-06-01T00:00Z", "t", "")
    for key in ("start", "run_hours", "job_hours", "carbon_gco2", "carbon_gco2_if_now", "carbon_saving_fraction"):
        assert key in info
    best = info["best_metrics"]
    job_s = ITERATIONS * best["iteration_time_s"]
    start = parse_time(info["start"], "t", "")
    assert window_start <= start <= window_start + dt.timedelta(hours=24)
    assert info["job_hours"] == pytest.approx(job_s / 3600)
    assert info["carbon_gco2"] == pytest.approx(best["energy_j"] * ITERATIONS / J_PER_KWH
                                                * series.intensity_over(start, job_s))
    fastest = table[table.status == "ok"].sort_values("throughput_samples_per_s").iloc[-1]
    now = _job_carbon(fastest, series.intensity_over(window_start, ITERATIONS * fastest["iteration_time_s"]))
    assert info["carbon_gco2_if_now"] == pytest.approx(now)
    per_sample = info["carbon_gco2"] / (ITERATIONS * info["best_plan"]["global_batch_size"])
    per_sample_now = now / (ITERATIONS * fastest["global_batch_size"])
    assert info["carbon_saving_fraction"] == pytest.approx(1 - per_sample / per_sample_now, rel=1e-6)
    assert info["carbon_saving_fraction"] > 0.5  # the dip is 4x cleaner than midnight
    side = json.loads((out / "timeshift.json").read_text())
    assert side["carbon_gco2"] == info["carbon_gco2"] and len(side["timeshift"]["segments"]) == 1
    assert side["timeshift"]["segments"][-1]["until_step"] == ITERATIONS
    # run_hours: the clock hours of the series the run overlaps (from the start's hour to the finish's).
    first = start.replace(minute=0, second=0, microsecond=0)
    hours = math.ceil((start + dt.timedelta(seconds=job_s) - first).total_seconds() / 3600 - 1e-9)
    assert info["run_hours"] == [stamp(first + dt.timedelta(hours=k)) for k in range(hours)]


def test_interruptible_runs_the_cleanest_hours_and_says_when_to_pause(tmp_path, csv, shifted):
    # --job-hours: a 6-hour reservation, the same schedule for every plan (so the plan is chosen on
    # carbon per sample); the deadline is the window's end + 6 h.
    code, stdout, stderr, out = _tune(tmp_path, csv, "--window", WINDOW, "--job-hours", "6", "--interruptible")
    assert code == 0, stderr
    assert "interruptible, 6 h job" in stdout and "timeshift.json" in stdout
    side = json.loads((out / "timeshift.json").read_text())
    segs = side["timeshift"]["segments"]
    assert sum(s["hours"] for s in segs) == pytest.approx(6.0)
    deadline = parse_time("2024-06-02T06:00Z", "t", "")
    assert all(parse_time(h, "t", "") < deadline for h in side["run_hours"])
    steps = [s["until_step"] for s in segs]
    assert steps == sorted(steps) and steps[-1] > 0
    series = load_carbon_csv(csv)
    t0 = parse_time("2024-06-01T00:00Z", "t", "")
    slots = sorted(series.intensity_over(t0 + dt.timedelta(hours=k), 3600) for k in range(30))
    assert side["timeshift"]["intensity_g_per_kwh"] == pytest.approx(sum(slots[:6]) / 6)
    nonint = shifted[0]["timeshift"]
    assert side["timeshift"]["intensity_g_per_kwh"] <= min(slots[6:]) <= nonint["intensity_if_now_g_per_kwh"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--window", "2024-06-02T00:00Z/2024-06-01T00:00Z", "--job-hours", "2"],
     "--window: END 2024-06-01T00:00:00Z is before START 2024-06-02T00:00:00Z"),
    (["--window", "2023-06-01T00:00Z/2023-06-02T00:00Z", "--job-hours", "2"], "is outside the series"),
    (["--window", "2024-06-10T00:00Z/2024-06-10T20:00Z", "--job-hours", "5"], "is outside the series"),
    (["--window", WINDOW, "--job-hours", "2", "--iterations", "5"], "give exactly one of --job-hours"),
    (["--window", WINDOW], "give exactly one of --job-hours"),
    (["--job-hours", "2"], "--carbon-csv needs --window START/END"),
    (["--window", "yesterday", "--job-hours", "2"], "is not START/END"),
    (["--window", "2024-06-09T00:00Z/2024-06-10T00:00Z", "--iterations", "10000000"],
     "(no_value: the job, at that plan's speed, runs past the carbon series)"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, csv, capsys, extra, message):
    code, _out, _err, _ = _tune(tmp_path, csv, *extra)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in _err or message in err
    shown = (_err or err).strip().splitlines()
    assert len(shown) == 1


def test_wrong_csv_and_flags_without_a_csv_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("time,value\n2024-06-01 00:00:00,100\n", encoding="utf-8")
    code, _o, err, _ = _tune(tmp_path, bad, "--window", WINDOW, "--job-hours", "2")
    assert code == 2 and "no datetime column" in err and len(err.strip().splitlines()) == 1
    argv = ["tune", "--model", SMALL, "--cluster", "a100-sxm4-80gb:1x8", "--objective", "carbon", "--out",
            str(tmp_path / "x"), "--window", WINDOW]
    assert mindpipe_main(argv) == 2
    assert "--window places the job in --carbon-csv's series" in capsys.readouterr().err
    argv = ["tune", "--model", SMALL, "--cluster", "a100-sxm4-80gb:1x8", "--out", str(tmp_path / "y"),
            "--carbon-csv", str(bad), "--window", WINDOW, "--job-hours", "2"]
    assert mindpipe_main(argv) == 2
    assert "time-shifting needs --objective carbon, not throughput" in capsys.readouterr().err
