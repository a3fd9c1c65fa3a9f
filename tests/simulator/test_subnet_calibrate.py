"""Calibrating the supernet simulator (``mindpipe calibrate`` on supernet runs).

Synthetic runs are what the executor would record if the truth were the simulator's calibrated
model (every action's duration, each rank's update and outside time): the fit must recover a
calibration that predicts them. A real short run (slow) checks the fit on this CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mindpipe.simulator.calibrate.supernet import (
    FEATURES,
    SupernetRun,
    calibrate_supernet,
    feature_costs,
    load_measured,
    supernet_fidelity,
)
from mindpipe.simulator.subnet_sim import SupernetSimulator
from mindpipe.traces.builtin import load_cluster, load_supernet
from mindpipe.traces.calibration import Calibration, ComputeCalibration, DeviceCalibration, load_calibration
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import ActionRecord, Measurement, StepRecord, SubnetRecord, SubnetStageRecord
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import sample_subnets, supernet_stage_layers
from mindpipe.traces.trace import LayerRecord, Provenance, Trace

NET = load_supernet("supernet-mini")
CPU = get_device("cpu")
CLUSTER = load_cluster("cpu:1x2")
N = 60
TRUTH = Calibration(devices={"cpu": DeviceCalibration(kind="cpu", step_overhead_s=2e-3, compute={"bf16": ComputeCalibration(
    scale={"gemm": 2.5, "bmm": 3.5, "memory": 2.0}, op_overhead_s=40e-6, optimizer_overhead_s=1e-3,
    optimizer_s_per_param=5e-9)})})


def _plan(schedule: str, mbs: int = 8) -> Plan:
    return from_dict(Plan, {"pp": 2, "micro_batch_size": mbs, "global_batch_size": mbs, "subnet_schedule": schedule})


def _synthetic(schedule: str, truth: Calibration = TRUTH, mbs: int = 8) -> SupernetRun:
    """A supernet run as the executor would record it if ``truth`` were exact (module docstring)."""
    plan = _plan(schedule, mbs)
    switching = schedule == "csp"
    sim = SupernetSimulator(NET, CLUSTER, calibration=truth).run(plan, N, context_switching=switching)
    comp = truth.devices["cpu"].compute["bf16"]
    x = np.array([*(comp.scale.get(k, 1.0) for k in FEATURES[:-1]), comp.op_overhead_s])
    feats = feature_costs(NET, plan, CPU)
    layers = supernet_stage_layers(plan, NET)
    subnets = sample_subnets(NET, N)
    actions, stages = [], []
    for s in range(2):
        first = sum(layers[:s])
        compute = trained = 0.0
        for b, ch in enumerate(subnets):
            parts = [f.stage(ch, first, layers[s], s == 0, s == 1) for f in feats]
            for kind, t in (("F", float(np.dot([p.forward_s for p in parts], x))),
                            ("B", float(np.dot([p.backward_s for p in parts], x)))):
                actions.append(ActionRecord(s, b + 1, s, b, kind, 0.0, t, t))
                compute += t
            trained += parts[-1].trained_params
        update = N * comp.optimizer_overhead_s + comp.optimizer_s_per_param * trained
        outside = N * truth.devices["cpu"].step_overhead_s
        stall = max(0.0, sim.total_time_s - compute - update - outside)
        stages.append(SubnetStageRecord(s, s, 0, compute, stall, update, 1, 1, 1, switching))
    meas = Measurement(
        plan=plan, world_size=2, nodes=1, backend="gloo", device_kind="cpu", device_name="cpu", threads_per_rank=1,
        torch_version="2.13.0", schedule_source="simulator", seed=0, data="synthetic", warmup_steps=0,
        steps=[StepRecord(b + 1, 5.0, sim.time_per_subnet_s, 1.0) for b in range(N)], tokens_per_s=1.0,
        model_flops_per_iteration=0.0, peak_flops_per_s=0.0, devices_for_mfu=1, mfu=0.0, energy_j_per_iteration=0.0,
        energy_source="estimated", actions=actions, subnets=[SubnetRecord(b, list(c), 5.0) for b, c in enumerate(subnets)],
        subnet_stages=stages, subnets_per_hour=sim.subnets_per_hour, subnet_schedule=schedule, cpus_per_node=2)
    return SupernetRun(f"{schedule}-mb{mbs}.json", meas, NET, CLUSTER, CPU)


def _write(run: SupernetRun, path: Path) -> str:
    trace = Trace(device="cpu", dtype="fp32", layers=[LayerRecord("stage.0", "pipeline_stage", 1e-3, 2e-3, 0.0)],
                  provenance=Provenance(tool="mindpipe run"), model_name=NET.label, micro_batch_size=8,
                  seq_len=NET.seq_len, backward_split="combined", measurement=run.measurement, supernet=NET)
    trace.save(path)
    return str(path)


def _predicted_sph(run: SupernetRun, cal: Calibration | None) -> float:
    sim = SupernetSimulator(run.supernet, run.cluster, calibration=cal)
    return sim.run(run.plan, run.num_subnets, context_switching=run.context_switching).subnets_per_hour


def test_fit_on_synthetic_runs_predicts_fitted_and_held_out_runs():
    fit = [_synthetic("sequential"), _synthetic("csp")]
    cal, notes = calibrate_supernet(fit)
    assert notes.warnings == []
    comp = cal.devices["cpu"].compute["bf16"]
    assert comp.samples == 2 * 2 * 2 * N  # runs × stages × (F, B) × subnets
    assert comp.fit_mape < 0.05  # the ridge tie of the kinds (fit._fit_compute_constants) leaves a little
    assert comp.optimizer_s_per_param == pytest.approx(5e-9, rel=0.02)
    assert cal.devices["cpu"].step_overhead_s == pytest.approx(2e-3)
    # Held out: another micro-batch size (the operators' reference times change, the constants do not).
    for run in [*fit, _synthetic("csp", mbs=4), _synthetic("sequential", mbs=16)]:
        measured = run.measurement.subnets_per_hour
        assert _predicted_sph(run, cal) == pytest.approx(measured, rel=0.05)
        assert abs(_predicted_sph(run, None) / measured - 1) > 0.3  # the uncalibrated model is far off


def test_calibration_replaces_the_trace_and_adds_the_outside_time():
    plan = _plan("csp")
    base = SupernetSimulator(NET, CLUSTER, calibration=TRUTH).run(plan, N)
    assert base.cost_source == "calibrated"
    more = Calibration(devices={"cpu": DeviceCalibration(kind="cpu", step_overhead_s=4e-3,
                                                         compute=TRUTH.devices["cpu"].compute)})
    slower = SupernetSimulator(NET, CLUSTER, calibration=more).run(plan, N)
    # 2 ms more per subnet on each stage: the span grows by at least N × 2 ms / 2 stages' overlap.
    assert slower.total_time_s > base.total_time_s + N * 2e-3 * 0.9


def test_calibrate_command_on_supernet_runs_and_refusals(tmp_path, capsys):
    from mindpipe.cli import main
    from tests.simulator.test_calibrate import FIT_PLANS, _synthetic_run, _write_measured

    fit = [_write(_synthetic(s), tmp_path / f"{s}.json") for s in ("sequential", "csp")]
    held = [_write(_synthetic("csp", mbs=4), tmp_path / "held.json")]
    out = tmp_path / "cal.json"
    assert main(["calibrate", *fit, "--out", str(out), "--holdout", *held, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["holdout"]["n"] == 1 and doc["holdout"]["mape_calibrated_pct"] < 3.0
    assert doc["holdout"]["mape_uncalibrated_pct"] > 30.0
    cal = load_calibration(out)
    assert cal.devices["cpu"].compute["bf16"].samples == 8 * N  # 2 runs × 2 stages × (F, B) × N
    rows = supernet_fidelity(load_measured(held)[1], cal)
    assert rows[0].calibrated_error is not None and abs(rows[0].calibrated_error) < 0.03
    # simulate --calibration uses it.
    plan = json.dumps(to_dict(_plan("csp", 4)))
    assert main(["simulate", "--model", "supernet-mini", "--cluster", "cpu:1x2", "--plan", plan, "--subnets", str(N),
                 "--calibration", str(out), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["cost_source"] == "calibrated"
    # GPT and supernet runs in one fit, or as fit and held out, are refused with one line.
    gpt = _write_measured(_synthetic_run(FIT_PLANS[0]), tmp_path / "gpt.json")
    for argv in ([*fit, gpt, "--out", str(out)], [*fit, "--out", str(out), "--holdout", gpt]):
        assert main(["calibrate", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("GPT run" in err[0] or "kind fitted on" in err[0])
    with pytest.raises(ContractError, match="calibrate them separately"):
        load_measured([gpt, *fit])


@pytest.mark.slow
@pytest.mark.alone
def test_real_short_runs_calibrated_error_below_uncalibrated(tmp_path):
    """pp=2 CPU runs of supernet-mini (sequential and csp, 120 subnets, micro-batch 8).

    Each run calibrated on itself is predicted within 30 % — the bound for runs this short (overheads
    dominate at micro-batch 8; on the loaded 2-core machine they came out at +8 % and +20 %, and the
    300-subnet runs of benchmarks/supernet_fidelity.py within 10 %) — and closer than uncalibrated.
    Calibrated on both, each is still closer than uncalibrated (the two runs may meet different host
    loads, so no tighter bound holds for the pooled fit; the benchmark gives the held-out figure).
    """
    from tests.executor.conftest import mindpipe, run_env

    files = []
    for s in ("sequential", "csp"):
        plan = json.dumps(to_dict(_plan(s)))
        path = tmp_path / f"{s}.json"
        res = mindpipe("run", plan, "--nproc", "2", "--steps", "120", "--model", "supernet-mini", "--device", "cpu",
                       "--out", str(path), "--run-timeout", "300", "--timeout", "120", env=run_env())
        assert res.returncode == 0, res.stderr[-2000:]
        files.append(str(path))
    runs = load_measured(files)[1]
    pooled, _ = calibrate_supernet(runs)
    for run in runs:
        measured = run.measurement.subnets_per_hour
        before = abs(_predicted_sph(run, None) / measured - 1)
        alone = abs(_predicted_sph(run, calibrate_supernet([run])[0]) / measured - 1)
        assert alone < 0.30, (run.name, alone)
        assert alone < before
        assert abs(_predicted_sph(run, pooled) / measured - 1) < before


PROFILE_SPEEDUP = 1.5  # the synthetic profile times each part 1.5× faster than the runs ran it


def _profile(net=NET, mbs: int = 8, speedup: float = PROFILE_SPEEDUP) -> Trace:
    """A per-candidate trace of ``net`` whose parts are TRUTH's ÷ ``speedup`` (what a profiler timing
    each candidate alone, outside the pipelined executor, would record)."""
    costs = SupernetSimulator(net, CLUSTER, calibration=TRUTH).costs(_plan("csp", mbs))

    def rec(name: str, kind: str, p) -> LayerRecord:  # type: ignore[no-untyped-def]
        return LayerRecord(name, kind, p.forward_s / speedup, p.backward_input_s / speedup, p.backward_weight_s / speedup,
                           activation_bytes=int(p.activation_bytes), output_bytes=int(p.output_bytes),
                           param_count=p.param_count)

    layers = [rec("embedding", "embedding", costs.embedding),
              *(rec(f"candidate.{c.name}", c.op, pc) for c, pc in zip(net.candidates, costs.candidates, strict=True)),
              rec("head", "lm_head", costs.head)]
    return Trace(device="cpu", dtype="fp32", layers=layers, provenance=Provenance(tool="mindpipe profile"),
                 model_name=net.label, micro_batch_size=mbs, seq_len=net.seq_len, granularity="candidate",
                 backward_split="measured", supernet=net)


def test_trace_scale_is_the_runs_over_the_profile_and_scales_the_trace():
    fit = [_synthetic("sequential"), _synthetic("csp")]
    profile = _profile()
    cal, _ = calibrate_supernet(fit, [profile])
    comp = cal.devices["cpu"].compute["bf16"]
    assert comp.trace_scale == pytest.approx(PROFILE_SPEEDUP, rel=1e-9)
    assert calibrate_supernet(fit)[0].devices["cpu"].compute["bf16"].trace_scale == 0.0  # no trace given: not fitted
    for run in [*fit, _synthetic("csp", mbs=4)]:
        with_trace = SupernetSimulator(NET, CLUSTER, trace=profile, calibration=cal).run(
            run.plan, N, context_switching=run.context_switching)
        assert with_trace.cost_source == "calibrated trace"
        # trace × 1.5 is TRUTH's operator costs again (at micro-batch 4 too: the trace scales linearly
        # and TRUTH's per-operator overhead does not, so only roughly there).
        assert with_trace.subnets_per_hour == pytest.approx(run.measurement.subnets_per_hour,
                                                            rel=1e-6 if run.plan.micro_batch_size == 8 else 0.3)
        alone = SupernetSimulator(NET, CLUSTER, trace=profile).run(run.plan, N, context_switching=run.context_switching)
        assert alone.cost_source == "trace" and alone.subnets_per_hour > with_trace.subnets_per_hour * 1.2
    # Without a trace the calibration prices operators; a calibration without trace_scale ignores a trace.
    assert SupernetSimulator(NET, CLUSTER, calibration=cal).run(_plan("csp"), N).cost_source == "calibrated"
    assert SupernetSimulator(NET, CLUSTER, trace=profile, calibration=TRUTH).run(_plan("csp"), N).cost_source == "calibrated"


def test_trace_scale_refuses_traces_of_nothing_that_ran():
    fit = [_synthetic("sequential")]
    other = load_supernet("naspipe-c1")
    with pytest.raises(ContractError, match="no run is of a supernet and device a trace profiled"):
        calibrate_supernet(fit, [_profile(other)])
    layer_trace = Trace(device="cpu", dtype="fp32", layers=[LayerRecord("stage.0", "pipeline_stage", 1e-3, 2e-3, 0.0)],
                        provenance=Provenance(tool="mindpipe profile"), model_name="x", micro_batch_size=8, seq_len=32)
    with pytest.raises(ContractError, match="per-candidate trace"):
        calibrate_supernet(fit, [layer_trace])


def test_calibrate_trace_option(tmp_path, capsys):
    from mindpipe.cli import main
    from tests.simulator.test_calibrate import FIT_PLANS, _synthetic_run, _write_measured

    fit = [_write(_synthetic(s), tmp_path / f"{s}.json") for s in ("sequential", "csp")]
    profile = tmp_path / "profile.json"
    _profile().save(profile)
    out = tmp_path / "cal.json"
    assert main(["calibrate", *fit, "--trace", str(profile), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"]["devices"]["cpu"]["compute"]["bf16"]["trace_scale"] == pytest.approx(PROFILE_SPEEDUP)
    assert doc["fitted"]["mape_calibrated_pct"] < 1.0
    plan = json.dumps(to_dict(_plan("csp")))
    assert main(["simulate", "--model", "supernet-mini", "--cluster", "cpu:1x2", "--plan", plan, "--subnets", str(N),
                 "--trace", str(profile), "--calibration", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost_source"] == "calibrated trace"
    gpt = _write_measured(_synthetic_run(FIT_PLANS[0]), tmp_path / "gpt.json")
    assert main(["calibrate", gpt, "--trace", str(profile), "--out", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "supernet runs only" in err[0]
