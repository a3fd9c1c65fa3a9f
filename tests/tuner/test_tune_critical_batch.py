"""The measured gradient noise scale: measured.json → calibrate → tune --objective goodput.

A measured run records ``measurement.gradient_noise`` (:mod:`mindpipe.traces.noise_scale`);
``mindpipe calibrate`` keeps the sample-weighted noise scale of its runs; ``mindpipe tune
--objective goodput`` uses it as the critical batch unless ``--critical-batch`` is typed, and says
which it used.
"""

from __future__ import annotations

import json

import pytest
from mindpipe.simulator.calibrate.noise import fit_noise
from mindpipe.simulator.calibrate.runs import MeasuredRun
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.calibration import (
    Calibration,
    LinkCalibration,
    NoiseCalibration,
    load_calibration,
    save_calibration,
)
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import Measurement, StepRecord
from mindpipe.traces.noise_scale import NoiseScaleEstimator
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.tuner.objectives import Objective, critical_batch_for, statistical_efficiency

from mindpipe.cli import main

MODEL = load_model("gpt-mini")


def _measurement(noise_scale: float | None, steps: int, data: str = "synthetic") -> Measurement:
    plan = Plan(dp=2, micro_batch_size=1, global_batch_size=8)
    noise = None
    if noise_scale is not None:
        est = NoiseScaleEstimator("data_parallel")
        # E|G_B|² = |G|² + tr(Σ)/B with |G|² = 1 and tr(Σ) = noise_scale: exact, so every step agrees.
        for s in range(1, steps + 1):
            est.update(s, 1 + noise_scale / 4, 1 + noise_scale / 8, 4, 8)
        noise = est.result
    return Measurement(
        plan=plan, world_size=2, nodes=1, backend="gloo", device_kind="cpu", device_name="cpu", threads_per_rank=1,
        torch_version="2.13.0", schedule_source="torch", seed=0, data=data, warmup_steps=0,
        steps=[StepRecord(s, 4.0, 0.1, 100.0) for s in range(1, steps + 1)], tokens_per_s=100.0,
        model_flops_per_iteration=1e9, peak_flops_per_s=1e11, devices_for_mfu=1, mfu=0.1,
        energy_j_per_iteration=1.0, energy_source="estimated", gradient_noise=noise)


def _run(source: str, noise_scale: float | None, steps: int, data: str = "synthetic") -> MeasuredRun:
    return MeasuredRun(source, _measurement(noise_scale, steps, data), MODEL, load_cluster("cpu:1x2"),
                       get_device("cpu"), list(range(1, steps + 1)), 0.1)


def test_measured_json_keeps_the_noise_record():
    m = _measurement(30.0, 5)
    again = from_dict(Measurement, json.loads(json.dumps(to_dict(m))), "measured.json")
    assert again.gradient_noise == m.gradient_noise
    assert again.gradient_noise is not None and again.gradient_noise.noise_scale == pytest.approx(30.0)
    assert [s.step for s in again.gradient_noise.steps] == [1, 2, 3, 4, 5]


def test_calibration_weights_runs_by_samples():
    warnings: list[str] = []
    noise = fit_noise([_run("a.json", 10.0, 10), _run("b.json", 40.0, 30), _run("c.json", None, 50)], warnings)
    assert noise is not None
    # 10 steps × 8 samples at 10, 30 steps × 8 samples at 40: (10·80 + 40·240) / 320 = 32.5.
    assert noise.noise_scale == pytest.approx(32.5) and noise.samples == 320
    assert noise.runs == ["a.json", "b.json"] and noise.model == MODEL
    assert warnings == ["c.json: no gradient noise scale (one replica and one micro-batch: no two batch sizes to compare)"]
    assert fit_noise([_run("c.json", None, 5)], []) is None


def test_calibration_file_round_trip(tmp_path):
    cal = Calibration(devices={}, comm={"gloo": {"local": LinkCalibration(1e-5, 1e9)}},
                      gradient_noise=NoiseCalibration(25.0, 800, MODEL, ["a.json"], ["synthetic"]))
    save_calibration(cal, tmp_path / "cal.json")
    assert load_calibration(tmp_path / "cal.json") == cal
    with pytest.raises(ContractError, match="noise_scale"):
        NoiseCalibration(0.0, 800, MODEL)
    # A calibration may carry only the noise scale (runs whose compute could not be fitted).
    alone = Calibration(devices={}, gradient_noise=NoiseCalibration(25.0, 800, MODEL))
    save_calibration(alone, tmp_path / "noise.json")
    assert load_calibration(tmp_path / "noise.json") == alone
    with pytest.raises(ContractError, match="at least one device or link"):
        Calibration(devices={})


def test_critical_batch_typed_overrides_measured():
    cal = Calibration(devices={}, comm={"gloo": {"local": LinkCalibration(1e-5, 1e9)}},
                      gradient_noise=NoiseCalibration(25.0, 800, MODEL, ["a.json"], ["synthetic"]))
    measured = critical_batch_for(None, cal, MODEL, needed=True)
    assert (measured.value, measured.source) == (25.0, "measured") and "800 samples" in measured.note
    assert critical_batch_for(64.0, cal, MODEL, needed=True).source == "typed"
    # Not asked for: the calibration's value stays out (no goodput columns for other objectives).
    assert critical_batch_for(None, cal, MODEL, needed=False).value is None
    with pytest.raises(ContractError, match="measured on gpt-mini"):
        critical_batch_for(None, cal, load_model("gpt3-175b"), needed=True)
    obj = Objective("goodput", measured.value)
    assert obj.critical_batch == 25.0 and statistical_efficiency(25, 25.0) == 0.5


def test_calibrate_then_tune_goodput_uses_the_measured_noise_scale(tmp_path, capsys):
    """The CLI path: a calibration carrying a noise scale drives goodput; --critical-batch overrides it."""
    cal = Calibration(devices={}, comm={"gloo": {"local": LinkCalibration(1e-5, 1e9)}},
                      gradient_noise=NoiseCalibration(24.0, 800, MODEL, ["a.json"], ["synthetic"]))
    save_calibration(cal, tmp_path / "cal.json")
    common = ["tune", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--objective", "goodput", "--budget", "2",
              "--workers", "1", "--quiet", "--no-plots", "--calibration", str(tmp_path / "cal.json"), "--json"]
    assert main([*common, "--out", str(tmp_path / "t1")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["critical_batch"]["source"] == "measured" and out["critical_batch"]["value"] == 24.0
    assert main([*common, "--out", str(tmp_path / "t2"), "--critical-batch", "100"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["critical_batch"] == {"value": 100.0, "source": "typed", "note": "--critical-batch (typed)"}
    assert json.loads((tmp_path / "t2" / "summary.json").read_text()) == out  # the file says it too


def _write_measured(m: Measurement, path) -> str:
    """A measured trace file as `mindpipe run --out` writes it (layer records abridged, no actions)."""
    from mindpipe.traces.trace import Trace

    data = {"device": "cpu", "dtype": "fp32", "provenance": {"tool": "mindpipe run"}, "backward_split": "combined",
            "model": to_dict(MODEL),
            "layers": [{"name": n, "kind": k, "forward_s": 1e-3, "backward_input_s": 2e-3, "backward_weight_s": 0.0}
                       for n, k in (("embedding", "embedding"), ("block.0", "block"), ("lm_head", "lm_head"))],
            "measurement": to_dict(m)}
    Trace.from_dict(data, str(path)).save(path)
    return str(path)


def test_calibrate_command_carries_the_noise_scale_to_tune(tmp_path, capsys):
    """measured.json files → `mindpipe calibrate` → `mindpipe tune --objective goodput`: the sample-weighted value."""
    files = [_write_measured(_measurement(10.0, 10), tmp_path / "a.json"),
             _write_measured(_measurement(40.0, 30), tmp_path / "b.json")]
    assert main(["calibrate", *files, "--out", str(tmp_path / "cal.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["calibration"]["gradient_noise"]["noise_scale"] == pytest.approx(32.5)
    assert main(["tune", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--objective", "goodput", "--budget", "2",
                 "--workers", "1", "--quiet", "--no-plots", "--calibration", str(tmp_path / "cal.json"),
                 "--out", str(tmp_path / "t")]) == 0
    text = capsys.readouterr().out
    assert "critical batch   32.5 samples: measured gradient noise scale (2 runs, 320 samples" in text
