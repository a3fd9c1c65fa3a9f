"""``tune --objective carbon_to_target`` end to end on a small model; bad input is one line and exit 2."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import random
from pathlib import Path

import pandas as pd
import pytest
from mindpipe.simulator.carbon import load_carbon_csv
from mindpipe.simulator.energy import J_PER_KWH
from mindpipe.simulator.simulator import Simulator
from mindpipe.simulator.timeshift import parse_window, schedule
from mindpipe.traces.calibration import Calibration, NoiseCalibration, save_calibration
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.target import TrainingTarget
from mindpipe.tuner.target_front import FrontConfig, candidates, front_clocks

from mindpipe.cli import main as mindpipe_main

SMALL = ('{"kind":"gpt","num_layers":8,"hidden_size":1024,"num_heads":16,"seq_len":512,"vocab_size":32000,'
         '"name":"gpt-small"}')
NARROW = ["--fix", "schedule=1f1b", "--fix", "recompute=none", "--fix", "zero_stage=0", "--fix", "comm_priority=fair",
          "--fix", "sequence_parallel=false", "--fix", "micro_batch_size=1,2", "--fix", "pp=2,4",
          "--global-batch", "32,64"]
WINDOW = "2024-06-01T00:00Z/2024-06-02T00:00Z"
TARGET = ["--target-samples", "4e6", "--target-batch", "32", "--critical-batch", "48"]  # a few hours per plan


@pytest.fixture(scope="module")
def csv(tmp_path_factory) -> Path:
    """Ten days of hours, dirty at night and clean around 13:00 UTC, seeded noise."""
    rng = random.Random(5)
    path = tmp_path_factory.mktemp("carbon") / "zone.csv"
    t0 = dt.datetime(2024, 6, 1)
    lines = ["Datetime (UTC),Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA)"]
    for h in range(240):
        v = 400 - 300 * max(0.0, 1 - abs(h % 24 - 13) / 4) + rng.uniform(0, 20)
        lines.append(f"{(t0 + dt.timedelta(hours=h)):%Y-%m-%d %H:%M:%S},1,{v:.1f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tune(out: Path, *extra: str) -> tuple[int, str, str]:
    argv = ["tune", "--model", SMALL, "--cluster", "a100-sxm4-80gb:1x8", *NARROW, "--optimizer", "grid",
            "--budget", "100", "--workers", "1", "--quiet", "--out", str(out), *extra]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = mindpipe_main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory, csv):
    out = tmp_path_factory.mktemp("target") / "sweep"
    code, stdout, stderr = _tune(out, "--objective", "carbon_to_target", *TARGET, "--carbon-csv", str(csv),
                                 "--window", WINDOW, "--interruptible", "--json")
    assert code == 0, stderr
    return json.loads(stdout), out


def test_each_plan_is_priced_to_target_at_its_own_cleanest_hours(run, csv):
    info, out = run
    table = pd.read_csv(out / "evaluations.csv")
    ok = table[table.feasible]
    assert len(ok) >= 4
    series, window = load_carbon_csv(csv), parse_window(WINDOW)
    target = TrainingTarget(4e6, 48.0, 32.0)
    for _, row in ok.iterrows():
        iters = target.iterations(row.global_batch_size)
        assert row.iterations_to_target == pytest.approx(iters)
        sched = schedule(series, window, iters * row.iteration_time_s, True)
        kwh = iters * row.energy_j / J_PER_KWH
        assert row.energy_to_target_kwh == pytest.approx(kwh)
        assert row.carbon_to_target_g == pytest.approx(kwh * sched.intensity_g_per_kwh)
        assert row.value == pytest.approx(row.carbon_to_target_g)
    assert info["best_value"] == pytest.approx(ok.carbon_to_target_g.min())


def test_json_reports_the_choice_against_the_fastest_plan_started_now(run):
    info, out = run
    for key in ("start", "run_hours", "carbon_gco2", "carbon_gco2_if_now", "carbon_saving_fraction", "energy_kwh",
                "compute_hours", "wait_hours", "iterations_to_target", "clock_method", "front_points"):
        assert key in info
    assert info["carbon_saving_fraction"] == pytest.approx(1 - info["carbon_gco2"] / info["carbon_gco2_if_now"])
    assert info["carbon_gco2"] <= info["carbon_gco2_if_now"]
    assert info["compute_time_increase_fraction"] <= 0.03 + 1e-9
    front = pd.read_csv(out / "target_front.csv")
    assert set(front.clocks) == {"default", "perseus"}
    assert front.carbon_gco2.min() <= info["carbon_gco2"]
    on = front[front.on_front]
    assert len(on) == info["front_points"] and (out / "target_front.png").exists()
    # no row beats a front row on both hours to target and gCO2
    for _, f in on.iterrows():
        better = front[(front.hours_to_target <= f.hours_to_target) & (front.carbon_gco2 <= f.carbon_gco2)
                       & ((front.hours_to_target < f.hours_to_target) | (front.carbon_gco2 < f.carbon_gco2))]
        assert better.empty
    plan = json.loads((out / "best_plan.json").read_text())
    assert plan.get("stage_clocks_mhz") == info["stage_clocks_mhz"]
    assert plan["made_for"]["tool"] == "mindpipe tune"


def test_without_a_series_the_annual_intensity_prices_the_target(tmp_path):
    code, stdout, stderr = _tune(tmp_path / "s", "--objective", "carbon_to_target", *TARGET, "--json", "--no-plots")
    assert code == 0, stderr
    info = json.loads(stdout)
    assert info["start"] is None and info["wait_hours"] == 0
    assert info["carbon_gco2"] == pytest.approx(info["energy_kwh"] * info["carbon_gco2_if_now"]
                                                / info["energy_kwh_if_now"])
    # The text's search value is labelled as such: the carbon line after it is the front's choice.
    code, text, stderr = _tune(tmp_path / "t", "--objective", "carbon_to_target", *TARGET, "--no-plots")
    assert code == 0, stderr
    assert "(the search's best plan at default clocks, before the front's clocks and start times below)" in text


def test_the_calibrations_measured_noise_scale_sets_the_target_when_none_is_typed(tmp_path):
    model = Model(**json.loads(SMALL))
    cal = Calibration(devices={}, gradient_noise=NoiseCalibration(48.0, 800, model, ["a.json"], ["synthetic"]))
    save_calibration(cal, tmp_path / "cal.json")
    target = ["--target-samples", "4e6", "--target-batch", "32"]
    code, stdout, stderr = _tune(tmp_path / "cal", "--objective", "carbon_to_target", *target, "--calibration",
                                 str(tmp_path / "cal.json"), "--json", "--no-plots")
    assert code == 0, stderr
    info = json.loads(stdout)
    assert info["critical_batch"]["source"] == "measured" and info["critical_batch"]["value"] == 48.0
    gb = info["best_plan"]["global_batch_size"]
    assert info["iterations_to_target"] == pytest.approx(TrainingTarget(4e6, 48.0, 32.0).iterations(gb))


def test_a_device_without_frequency_data_keeps_default_clocks_and_says_so(tmp_path):
    argv = ["tune", "--model", "gpt-mini", "--cluster", "cpu:1x4", "--objective", "carbon_to_target",
            "--critical-batch", "16", "--target-samples", "1e4", "--global-batch", "8,16", "--budget", "6",
            "--optimizer", "random", "--out", str(tmp_path / "cpu"), "--quiet", "--no-plots"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert mindpipe_main([*argv, "--json"]) == 0, stderr.getvalue()
    info = json.loads(stdout.getvalue())
    assert info["clock_method"] == "default" and "no frequency data for 'cpu'" in info["clock_note"]
    assert set(pd.read_csv(tmp_path / "cpu" / "target_front.csv").clocks) == {"default"}


def test_an_explicit_clocks_default_plans_no_clocks(tmp_path):
    # --clocks default means the GPUs stay at their default clock: the front used to price Perseus
    # clocks anyway (front_config read anything but envpipe as perseus) and could choose them.
    code, stdout, stderr = _tune(tmp_path / "d", "--objective", "carbon_to_target", *TARGET, "--clocks", "default",
                                 "--json", "--no-plots")
    assert code == 0, stderr
    info = json.loads(stdout)
    assert info["clock_method"] == "default" and info["stage_clocks_mhz"] is None
    assert set(pd.read_csv(tmp_path / "d" / "target_front.csv").clocks) == {"default"}
    assert json.loads((tmp_path / "d" / "best_plan.json").read_text()).get("stage_clocks_mhz") is None
    # A planner named is the one priced beside default clocks; none named is Perseus (as before).
    code, stdout, stderr = _tune(tmp_path / "e", "--objective", "carbon_to_target", *TARGET, "--clocks", "envpipe",
                                 "--json", "--no-plots")
    assert code == 0, stderr
    assert set(pd.read_csv(tmp_path / "e" / "target_front.csv").clocks) <= {"default", "envpipe"}
    # There are no clocks for --max-slowdown to bound.
    code, _out, err = _tune(tmp_path / "f", "--objective", "carbon_to_target", *TARGET, "--clocks", "default",
                            "--max-slowdown", "0.05")
    assert code == 2 and "--max-slowdown" in err and "--clocks default" in err and len(err.strip().splitlines()) == 1


def test_the_front_prices_the_clock_methods_a_clocks_value_names():
    # The Python path: FrontConfig(front_clocks(...)) is what the CLI builds from --clocks.
    assert front_clocks(None) == ("default", "perseus")
    assert front_clocks("default") == ("default",)
    assert front_clocks("envpipe") == ("default", "envpipe")
    with pytest.raises(ContractError, match="--clocks"):
        front_clocks("perseus_action")
    sim = Simulator(Model(**json.loads(SMALL)), Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=8))
    plan = Plan(dp=2, tp=1, pp=4, micro_batch_size=1, global_batch_size=32)
    cands = candidates(sim, [plan], 0, FrontConfig(front_clocks("default")))
    assert [(c.clocks, c.plan.stage_clocks_mhz) for c in cands] == [("default", None)]


@pytest.mark.parametrize(("extra", "message"), [
    (["--objective", "carbon_to_target", "--critical-batch", "48"], "needs --target-samples N"),
    (["--objective", "carbon_to_target", "--target-samples", "1e6"], "needs the gradient noise scale: --critical-batch B "
                                                                     "or a --calibration"),
    (["--objective", "carbon_to_target", *TARGET, "--job-hours", "3"], "--job-hours is not used with"),
    (["--objective", "throughput", "--target-samples", "1e6"], "--target-samples needs --objective carbon_to_target"),
    (["--objective", "carbon_to_target", *TARGET, "--interruptible"], "--interruptible places the job"),
    (["--objective", "carbon_to_target", *TARGET, "--window", WINDOW], "needs both --carbon-csv and --window"),
    (["--objective", "carbon_to_target", "--target-samples", "-5", "--critical-batch", "4"], "--target-samples"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, message):
    code, _out, err = _tune(tmp_path / "bad", *extra)
    err = err or capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
