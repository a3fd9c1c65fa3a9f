"""``tune --objective carbon`` with a start window and ``--clocks``: the schedule, its steps and its
carbon describe the plan written to ``best_plan.json`` (with its clocks), not that plan at default clocks."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import math
from pathlib import Path

import pytest
from mindpipe.simulator.energy import J_PER_KWH
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_cluster, load_model, load_plan

from mindpipe.cli import main as mindpipe_main

WINDOW = "2024-06-01T00:00Z/2024-06-02T00:00Z"
ITERATIONS = 20_000
ARGS = ["--model", "gpt-1.3b", "--cluster", "a100-sxm4-80gb:1x8", "--objective", "carbon", "--fix", "pp=4",
        "--fix", "tp=1", "--fix", "schedule=1f1b", "--fix", "micro_batch_size=4", "--global-batch", "32",
        "--optimizer", "grid", "--budget", "12", "--workers", "1", "--no-plots", "--quiet"]


@pytest.fixture(scope="module")
def csv(tmp_path_factory) -> Path:
    """Two days of hours with a clean dip at 12:00-15:00 UTC."""
    path = tmp_path_factory.mktemp("carbon") / "zone.csv"
    t0 = dt.datetime(2024, 6, 1)
    lines = ["Datetime (UTC),Carbon Intensity gCO₂eq/kWh (LCA)"]
    for h in range(72):
        v = 60.0 + h % 24 if 12 <= h % 24 < 15 else 300.0 + 7 * (h % 5)
        lines.append(f"{(t0 + dt.timedelta(hours=h)):%Y-%m-%d %H:%M:%S},{v:.1f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tune(out: Path, csv: Path, *extra: str) -> dict:
    argv = ["tune", *ARGS, "--out", str(out), "--carbon-csv", str(csv), "--window", WINDOW,
            "--iterations", str(ITERATIONS), "--json", *extra]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = mindpipe_main(argv)
    assert code == 0, stderr.getvalue()
    return json.loads(stdout.getvalue())


@pytest.mark.parametrize("interruptible", [False, True])
def test_shifted_job_is_the_clocked_plans_job(tmp_path, csv, interruptible):
    out = tmp_path / "sweep"
    summary = _tune(out, csv, "--clocks", "perseus", *(["--interruptible"] if interruptible else []))
    plan = load_plan(out / "best_plan.json")
    assert plan.stage_clocks_mhz is not None and max(plan.stage_clocks_mhz) > min(plan.stage_clocks_mhz)
    sim = Simulator(load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8"))
    clocked = sim.run(plan)
    # the job is N iterations of the plan the operator runs, at its (clocked) speed and power
    assert summary["job_hours"] == pytest.approx(ITERATIONS * clocked.iteration_time_s / 3600, rel=1e-9)
    shift = json.loads((out / "timeshift.json").read_text())
    assert shift["job_hours"] == pytest.approx(summary["job_hours"], rel=1e-12)
    kwh = clocked.energy_j * ITERATIONS / J_PER_KWH
    assert summary["timeshift"]["energy_kwh"] == pytest.approx(kwh, rel=1e-9)
    assert summary["carbon_gco2"] == pytest.approx(kwh * summary["timeshift"]["intensity_g_per_kwh"], rel=1e-9)
    # each segment's step is what the clocked plan reaches by the segment's end
    done = 0.0
    for seg in summary["timeshift"]["segments"]:
        done += seg["hours"] * 3600
        assert seg["until_step"] == min(ITERATIONS, math.floor(done / clocked.iteration_time_s + 1e-9))
    assert summary["timeshift"]["segments"][-1]["until_step"] == ITERATIONS
    assert shift == {k: summary[k] for k in shift}  # the file says what --json says


def test_a_reference_whose_job_runs_past_the_series_falls_back_to_the_fastest_that_fits(tmp_path, csv):
    # --iterations 5000: the gb-256 plan (the throughput optimum, ~3.4 s an iteration) runs ~4.7 h, past
    # the series' end (2024-06-04T00:00) from the window's start 20:00, so it cannot be the "now" run;
    # the gb-32 plan (~0.46 s, 0.64 h) is valued and chosen. The sweep used to end in exit 2, writing nothing.
    out = tmp_path / "late"
    argv = ["tune", "--model", "gpt-1.3b", "--cluster", "a100-sxm4-80gb:1x8", "--objective", "carbon",
            "--fix", "tp=1", "--fix", "pp=1", "--fix", "schedule=1f1b", "--fix", "recompute=none",
            "--fix", "zero_stage=1", "--fix", "micro_batch_size=4", "--global-batch", "32,256", "--optimizer", "grid",
            "--budget", "10", "--workers", "1", "--no-plots", "--quiet", "--out", str(out), "--carbon-csv", str(csv),
            "--window", "2024-06-03T20:00Z/2024-06-03T21:00Z", "--iterations", "5000"]
    for extra in ([], ["--json"]):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = mindpipe_main([*argv, *extra, *(["--resume"] if extra else [])])
        assert code == 0, stderr.getvalue()
        if not extra:
            assert "gCO2 for the fastest plan the series covers started now" in stdout.getvalue()
    summary = json.loads(stdout.getvalue())
    ref = summary["timeshift"]["reference"]
    assert ref["plan_point"]["global_batch_size"] == 32 and "runs past" in ref["what"]
    assert ref["job_hours"] == pytest.approx(summary["job_hours"])  # the same plan, so the same job
    assert summary["carbon_gco2_if_now"] == pytest.approx(summary["timeshift"]["carbon_gco2_same_plan_if_now"])
    assert (out / "best_plan.json").exists() and (out / "timeshift.json").exists()
