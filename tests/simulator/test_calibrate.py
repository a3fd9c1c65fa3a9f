"""Calibration (issue 7): the fits recover known constants, and calibrated simulation uses them.

Synthetic "measured" runs are made from the simulator itself under a known calibration, so the
truth is known exactly: the fit must find it again, and predictions of plans it was not fitted
on must match the simulation under the true constants.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.build import optimizer_shard
from mindpipe.simulator.calibrate.features import (
    FEATURES,
    HOST_FEATURES,
    action_collectives,
    action_features,
    constants,
    rank_host_features,
    shared_core_rates,
)
from mindpipe.simulator.calibrate.fidelity import fidelity, format_calibration, plan_label, summary
from mindpipe.simulator.calibrate.fit import calibrate, fit_comm
from mindpipe.simulator.calibrate.models import CalibratedComputeModel, ReferenceOpTime, apply_calibration, host_terms
from mindpipe.simulator.calibrate.runs import MeasuredRun
from mindpipe.simulator.collectives import ring_steps, wire_bytes
from mindpipe.simulator.topology import Topology
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.calibration import (
    Calibration,
    ComputeCalibration,
    DeviceCalibration,
    LinkCalibration,
    load_calibration,
    save_calibration,
)
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import data_parallel_units
from mindpipe.traces.measured import ActionRecord, CommEvent, Measurement, RankRecord, StepRecord
from mindpipe.traces.schema import to_dict

MODEL = load_model("gpt-mini")
CPU = get_device("cpu")
TRUTH = Calibration(
    devices={"cpu": DeviceCalibration(
        kind="cpu", cpus_per_node=2, step_overhead_s=0.05,
        compute={"fp32": ComputeCalibration(scale={"gemm": 3.0, "bmm": 3.0, "memory": 3.0}, op_overhead_s=3e-4,
                                            tp_op_overhead_s=8e-4, tp_comm_cpu_s_per_byte=5e-9,
                                            dp_unit_overhead_s=1.5e-3, fresh_s_per_byte=4e-10, optimizer_s_per_param=4e-9,
                                            optimizer_overhead_s=2e-3)})},
    comm={"gloo": {"local": LinkCalibration(step_latency_s=1.2e-4, bandwidth_Bps=1.5e9, tp_wait_s=2e-3)}},
)


def _plan(**kw) -> Plan:
    return Plan(**{"global_batch_size": 16, "precision": "fp32", "micro_batch_size": 4, **kw})


def _rank_cpu_s(plan: Plan, cluster, truth: Calibration, actions: list[ActionRecord],
                params: dict[int, int]) -> dict[int, float]:
    """CPU seconds per step of each pipeline rank's first rank under ``truth``'s host constants."""
    dev, link = truth.devices["cpu"], truth.comm["gloo"]["local"]
    cal = dev.compute["fp32"]
    topo = Topology(plan, cluster, CPU)
    out = {}
    for p in range(plan.pp):
        rank = topo.global_rank(p)
        mine = [a for a in actions if a.rank == rank and a.step == 1]
        counts: dict[tuple[int, str], float] = {}
        for a in mine:
            counts[(a.stage, a.kind)] = counts.get((a.stage, a.kind), 0.0) + 1.0
        feats = rank_host_features(MODEL, plan, cluster, CPU, {p: counts})[p]
        host = float(np.dot(feats, [dev.step_cpu_s, dev.op_cpu_s, link.cpu_s_per_step, link.cpu_s_per_byte]))
        out[rank] = (sum(a.cpu_s or 0.0 for a in mine) + cal.optimizer_overhead_s + cal.optimizer_s_per_param * params[p]
                     + host)
    return out


def _synthetic_run(plan: Plan, truth: Calibration = TRUTH, with_cpu: bool = False) -> MeasuredRun:
    """A measured run as the executor would record it if the truth were the simulator's model."""
    cluster = load_cluster(f"cpu:1x{plan.world_size}")
    res = simulate(MODEL, cluster, plan, SimulationOptions(calibration=truth, timeline=True))
    cal = truth.devices["cpu"].compute["fp32"]
    feats = action_features(MODEL, plan, ReferenceOpTime(CPU))
    x = constants(cal)
    topo = Topology(plan, cluster, CPU)
    actions, steps, comms = [], [], []
    for step in (1, 2, 3):
        steps.append(StepRecord(step, 5.0, res.iteration_time_s, 1.0))
        for e in res.timeline:
            if e.thread != "compute" or e.category not in ("F", "B", "I", "W"):
                continue
            stage, kind, mb = int(e.name[0]), e.name[1], int(e.name[2:])
            work = float(np.dot(feats[(stage, kind)], x))
            for d in range(plan.dp):
                for t in range(plan.tp):
                    rank = topo.global_rank(e.rank, d, t)
                    actions.append(ActionRecord(rank, step, stage, mb, kind, e.start_s, e.end_s - e.start_s, work))
    link = truth.comm["gloo"]["local"]
    for n in (2**19, 2**20, 2**22):
        for op, k in (("allreduce", 2), ("recv", 2)):
            ring_op = "p2p" if op == "recv" else op
            t = ring_steps(ring_op, k) * link.step_latency_s + wire_bytes(ring_op, n, k) / link.bandwidth_Bps
            # Events that waited for a peer are slower; the α-β fit takes the fastest, the wait fit
            # the median beyond it, which grows with the ranks per core (oversubscription).
            over = max(1.0, plan.world_size / 2)
            for wait in (0.0, 1.0, 5.0):
                comms.append(CommEvent(0, 4, "collective", "tp" if op == "allreduce" else "pp", op, 0.0,
                                       t + wait * over * truth.comm["gloo"]["local"].tp_wait_s, n, k))
    steps.append(StepRecord(4, 5.0, 3 * res.iteration_time_s, 1.0))  # the profiled step: slower, left out
    share = min(1.0, 2 / plan.world_size)
    # Each rank's optimizer steps its own parameters, a 1/dp shard of them under ZeRO (the engine's rule).
    params = [optimizer_shard(plan, n) for n in res.extra.params_per_device_by_rank]
    cpu = _rank_cpu_s(plan, cluster, truth, actions, params) if with_cpu else {}
    # One record per rank, as the executor writes them (the contract refuses a missing one); the
    # replicas of a pipeline rank run its actions, so they spend what its first rank spends.
    ranks = []
    for g in range(plan.world_size):
        p, d, t = topo.coords(g)
        ranks.append(RankRecord(g, p, d, t, [p], "h", 0.1, 0.0, 0.0,
                                (cal.optimizer_overhead_s + cal.optimizer_s_per_param * params[p]) / share, 1,
                                "process_rss", cpu.get(topo.global_rank(p))))
    meas = Measurement(plan=plan, world_size=plan.world_size, nodes=1, backend="gloo", device_kind="cpu",
                       device_name="cpu", threads_per_rank=1, torch_version="2.13.0", schedule_source="simulator",
                       seed=0, data="synthetic", warmup_steps=0, steps=steps, tokens_per_s=1.0,
                       model_flops_per_iteration=1.0, peak_flops_per_s=1.0, devices_for_mfu=1, mfu=0.0,
                       energy_j_per_iteration=0.0, energy_source="estimated", actions=actions, comms=comms,
                       ranks=ranks, cpus_per_node=2)
    return MeasuredRun(f"{plan_label(plan)}.json", meas, MODEL, cluster, CPU, [1, 2, 3], res.iteration_time_s)


FIT_PLANS = [_plan(dp=2, pp=2), _plan(tp=2, pp=2, schedule="gpipe"), _plan(dp=4, micro_batch_size=2),
             _plan(tp=2, micro_batch_size=8), _plan(pp=2, micro_batch_size=2), _plan(dp=2, micro_batch_size=4, zero_stage=1),
             _plan(pp=2, micro_batch_size=2, stage_cuts=["after_attention"]),
             # micro-batch 64: the MLP's 32 MiB results are fresh allocations (fresh_s_per_byte).
             _plan(dp=2, micro_batch_size=64, global_batch_size=128)]
HELD_OUT = [_plan(pp=4, micro_batch_size=2), _plan(dp=2, tp=2), _plan(pp=2, schedule="interleaved_1f1b", virtual_stages=2),
            _plan(tp=4, micro_batch_size=8), _plan(pp=2, schedule="zb_h1"), _plan(dp=4, micro_batch_size=2, zero_stage=2),
            _plan(pp=4, micro_batch_size=2, stage_cuts=["after_attention", "between_blocks", "after_attention"])]


@pytest.fixture(scope="module")
def fitted() -> tuple[Calibration, object]:
    return calibrate([_synthetic_run(p) for p in FIT_PLANS])


# The same truth, plus what a CPU rank spends outside its actions (host CPU, fit step 3).
TRUTH_HOST = dataclasses.replace(
    TRUTH,
    devices={"cpu": dataclasses.replace(TRUTH.devices["cpu"], op_cpu_s=1e-4, step_cpu_s=0.03)},
    comm={"gloo": {"local": dataclasses.replace(TRUTH.comm["gloo"]["local"], cpu_s_per_step=3e-4,
                                                cpu_s_per_byte=2e-9)}},
)


@pytest.fixture(scope="module")
def fitted_host() -> tuple[Calibration, object]:
    return calibrate([_synthetic_run(p, TRUTH_HOST, with_cpu=True) for p in FIT_PLANS])


def test_host_terms_count_algorithm_steps_and_wire_bytes():
    from mindpipe.simulator.topology import Phase

    n = 1 << 20
    # gloo runs an all-reduce of 4 ranks as a ring: 2(k−1) = 6 steps, 2(k−1)/k·n bytes per rank.
    assert host_terms(Phase("allreduce", 4, "local", (), n, count=3), "gloo") == pytest.approx((18.0, 3 * 1.5 * n))
    assert host_terms(Phase("p2p", 2, "local", (), n), "gloo") == pytest.approx((1.0, n))


def test_fit_recovers_the_host_cpu_constants(fitted_host):
    cal, notes = fitted_host
    got, want = cal.devices["cpu"], TRUTH_HOST.devices["cpu"]
    assert got.op_cpu_s == pytest.approx(want.op_cpu_s, rel=0.02)
    assert got.step_cpu_s == pytest.approx(want.step_cpu_s, rel=0.02)
    link, want_link = cal.comm["gloo"]["local"], TRUTH_HOST.comm["gloo"]["local"]
    assert link.cpu_s_per_step == pytest.approx(want_link.cpu_s_per_step, rel=0.05)
    assert link.cpu_s_per_byte == pytest.approx(want_link.cpu_s_per_byte, rel=0.05)
    assert got.host_fit_mape < 1e-3 and got.host_samples >= 2 * len(HOST_FEATURES)
    # With the host CPU in, the model explains the runs: no step overhead is left over.
    assert got.step_overhead_s == pytest.approx(TRUTH_HOST.devices["cpu"].step_overhead_s, abs=0.005)
    assert not [w for w in notes.warnings if "host CPU" in w]


def test_host_cpu_predicts_held_out_plans(fitted_host):
    cal, _ = fitted_host
    rows = fidelity([_synthetic_run(p, TRUTH_HOST, with_cpu=True) for p in HELD_OUT], cal)
    assert (summary(rows).mape_calibrated_pct or 99.0) < 3.0
    # Leaving the host CPU out (the compute-only fit of the same runs) predicts them worse.
    bare = dataclasses.replace(cal, devices={"cpu": dataclasses.replace(cal.devices["cpu"], op_cpu_s=0.0, step_cpu_s=0.0)})
    assert (summary(fidelity([_synthetic_run(p, TRUTH_HOST) for p in HELD_OUT], bare)).mape_calibrated_pct or 0.0) > 5.0


def test_transfers_between_cpu_ranks_cost_their_host_cpu_on_the_cores():
    """tp=2 on two cores: each rank has a core, so every tp collective's host CPU adds to the iteration."""
    plan = _plan(tp=2, micro_batch_size=8)
    cluster = load_cluster("cpu:1x2")
    per_byte = [1e-9, 3e-9]
    times = []
    for c in per_byte:
        link = LinkCalibration(step_latency_s=1e-4, bandwidth_Bps=1e9, cpu_s_per_step=1e-4, cpu_s_per_byte=c)
        cal = dataclasses.replace(TRUTH, comm={"gloo": {"local": link}})
        times.append(simulate(MODEL, cluster, plan, SimulationOptions(calibration=cal)).iteration_time_s)
    counts = {(0, "F"): 2.0, (0, "B"): 2.0}  # two micro-batches, one stage
    wire = rank_host_features(MODEL, plan, cluster, CPU, {0: counts})[0][HOST_FEATURES.index("comm_bytes")]
    assert wire > 0
    assert times[1] - times[0] == pytest.approx(wire * (per_byte[1] - per_byte[0]), rel=1e-6)


def test_first_stage_runs_its_whole_backward_in_w():
    """torch's pipelining computes no input gradient for stage 0 (token ids): I is empty, W is all of B."""
    feats = action_features(MODEL, _plan(pp=2, schedule="zb_h1"), ReferenceOpTime(CPU))
    assert not any(feats[(0, "I")]) and feats[(0, "W")] == feats[(0, "B")]
    assert any(feats[(1, "I")]) and feats[(1, "W")] != feats[(1, "B")]
    # A measured stage-0 I of a few microseconds (the runtime's bookkeeping) must not sway the fit.
    zb = _synthetic_run(_plan(pp=2, schedule="zb_h1"))
    zb.measurement.actions = [dataclasses.replace(a, cpu_s=2e-5) if (a.stage, a.kind) == (0, "I") else a
                              for a in zb.measurement.actions]
    cal, _ = calibrate([_synthetic_run(p) for p in FIT_PLANS] + [zb])
    got, want = cal.devices["cpu"].compute["fp32"], TRUTH.devices["cpu"].compute["fp32"]
    assert got.op_overhead_s == pytest.approx(want.op_overhead_s, rel=0.02)
    assert got.scale["gemm"] == pytest.approx(want.scale["gemm"], rel=0.02)


def test_shared_core_rates_follow_processor_sharing():
    # Three ranks on one core slot: A overlaps B then C, each overlap halves the speed.
    acts = [ActionRecord(0, 1, 0, 0, "F", 0.0, 2.0), ActionRecord(1, 1, 0, 0, "F", 0.0, 1.0),
            ActionRecord(2, 1, 0, 0, "F", 1.0, 1.0)]
    assert shared_core_rates(acts, 1.0) == pytest.approx([0.5, 0.5, 0.5])
    # Two slots: only the overlap of three ranks is slowed (to 2/3); actions alone run at full speed.
    acts = [ActionRecord(r, 1, 0, 0, "F", 0.0, 1.0) for r in range(3)] + [ActionRecord(0, 1, 0, 1, "F", 1.0, 1.0)]
    assert shared_core_rates(acts, 2.0) == pytest.approx([2 / 3, 2 / 3, 2 / 3, 1.0])


def test_fit_recovers_the_compute_constants(fitted):
    cal, _ = fitted
    got, want = cal.devices["cpu"].compute["fp32"], TRUTH.devices["cpu"].compute["fp32"]
    for kind in ("gemm", "bmm", "memory"):
        assert got.scale[kind] == pytest.approx(want.scale[kind], rel=0.02)
    assert got.op_overhead_s == pytest.approx(want.op_overhead_s, rel=0.02)
    assert got.tp_op_overhead_s == pytest.approx(want.tp_op_overhead_s, rel=0.02)
    assert got.tp_comm_cpu_s_per_byte == pytest.approx(want.tp_comm_cpu_s_per_byte, rel=0.02)
    assert got.dp_unit_overhead_s == pytest.approx(want.dp_unit_overhead_s, rel=0.02)
    assert got.fresh_s_per_byte == pytest.approx(want.fresh_s_per_byte, rel=0.02)
    assert got.optimizer_s_per_param == pytest.approx(want.optimizer_s_per_param, rel=0.02)
    assert got.optimizer_overhead_s == pytest.approx(want.optimizer_overhead_s, rel=0.05)
    assert got.fit_mape < 1e-3 and got.samples > len(FEATURES)
    assert cal.devices["cpu"].cpus_per_node == 2


def test_fit_recovers_alpha_beta_from_the_fastest_events(fitted):
    cal, _ = fitted
    link, want = cal.comm["gloo"]["local"], TRUTH.comm["gloo"]["local"]
    assert link.step_latency_s == pytest.approx(want.step_latency_s, rel=0.02)
    assert link.bandwidth_Bps == pytest.approx(want.bandwidth_Bps, rel=0.02)
    # Each run's median wait beyond its fastest event, over its oversubscription (2 or 4 ranks on 2 cores).
    assert link.tp_wait_s == pytest.approx(want.tp_wait_s, rel=1e-9)


def test_tp_wait_is_wall_time_per_blocking_collective_off_the_cores():
    plan = _plan(tp=2)
    cluster = load_cluster("cpu:1x2")
    without = dataclasses.replace(TRUTH, comm={"gloo": {"local": dataclasses.replace(TRUTH.comm["gloo"]["local"], tp_wait_s=0.0)}})
    t = simulate(MODEL, cluster, plan, SimulationOptions(calibration=TRUTH)).iteration_time_s
    t0 = simulate(MODEL, cluster, plan, SimulationOptions(calibration=without)).iteration_time_s
    colls = action_collectives(MODEL, plan)
    per_microbatch = len(colls[(0, "F")]) + len(colls[(0, "B")])
    assert per_microbatch > 0
    # One rank, nothing to overlap: the iteration grows by the wait of every collective it issues.
    assert t - t0 == pytest.approx(TRUTH.comm["gloo"]["local"].tp_wait_s * plan.num_microbatches * per_microbatch, rel=1e-6)
    # Without tensor parallelism only the step's gradient all-reduce (one bucket here) waits.
    one = _plan(dp=2)
    buckets = simulate(MODEL, cluster, one, SimulationOptions(calibration=TRUTH, timeline=True)).timeline
    n = sum(1 for e in buckets if e.rank == 0 and e.name.startswith("grad-reduce"))
    assert n >= 1
    assert (simulate(MODEL, cluster, one, SimulationOptions(calibration=TRUTH)).iteration_time_s
            - simulate(MODEL, cluster, one, SimulationOptions(calibration=without)).iteration_time_s
            == pytest.approx(n * TRUTH.comm["gloo"]["local"].tp_wait_s, rel=1e-6))
    # Dedicated devices (no calibrated host) never pay it.
    gpu = simulate(MODEL, load_cluster("a100-sxm4-80gb:1x2"), plan, SimulationOptions(calibration=TRUTH))
    assert gpu.iteration_time_s == simulate(MODEL, load_cluster("a100-sxm4-80gb:1x2"), plan,
                                            SimulationOptions(calibration=without)).iteration_time_s


def test_zero3_collectives_on_shared_cores_block_the_rank_and_wait_for_peers():
    """FSDP2 on a CPU host (gloo, no streams): every all-gather and each backward's reduce-scatter
    block the rank's thread, and each waits for its peers like a tensor-parallel collective
    (``LinkCalibration.tp_wait_s``). The reduce-scatter runs inside the backward action; the
    iteration grows by one wait per collective."""
    plan = _plan(dp=2, zero_stage=3, micro_batch_size=4, global_batch_size=16)
    assert plan.num_microbatches == 2
    cluster = load_cluster("cpu:1x2")
    without = dataclasses.replace(TRUTH, comm={"gloo": {"local": dataclasses.replace(TRUTH.comm["gloo"]["local"], tp_wait_s=0.0)}})
    r = simulate(MODEL, cluster, plan, SimulationOptions(calibration=TRUTH, timeline=True))
    mine = [e for e in r.timeline if e.rank == 0]
    backward = [e for e in mine if e.thread == "compute" and e.category == "B"]
    reduces = [e for e in mine if e.name.startswith("grad-reduce")]
    gathers = [e for e in mine if e.name.startswith("param-gather")]
    assert len(backward) == plan.num_microbatches and reduces and gathers
    for e in reduces:  # inside a backward, which ends no earlier than its reduction
        assert any(b.start_s <= e.start_s and e.end_s <= b.end_s + 1e-12 for b in backward), e
    t0 = simulate(MODEL, cluster, plan, SimulationOptions(calibration=without)).iteration_time_s
    wait = TRUTH.comm["gloo"]["local"].tp_wait_s
    # Each collective adds its wait, except that the step's first gathers run beside the step's
    # bookkeeping before the first forward and may hide part of theirs under it.
    first = data_parallel_units(plan, MODEL.num_layers)
    assert len(gathers) > first
    assert wait * (len(reduces) + len(gathers) - first) - 1e-9 <= r.iteration_time_s - t0
    assert r.iteration_time_s - t0 <= wait * (len(reduces) + len(gathers)) + 1e-9
    # Dedicated devices prefetch and overlap: no wait there.
    gpu = load_cluster("a100-sxm4-80gb:1x2")
    assert (simulate(MODEL, gpu, plan, SimulationOptions(calibration=TRUTH)).iteration_time_s
            == simulate(MODEL, gpu, plan, SimulationOptions(calibration=without)).iteration_time_s)


def test_step_overhead_and_held_out_predictions(fitted):
    cal, notes = fitted
    assert cal.devices["cpu"].step_overhead_s == pytest.approx(0.05, abs=0.01)
    held = [_synthetic_run(p) for p in HELD_OUT]
    rows = fidelity(held, cal)
    s = summary(rows)
    assert s.n == len(HELD_OUT) and s.mape_calibrated_pct is not None and s.mape_calibrated_pct < 3.0
    assert "dp1·tp1·pp4 1f1b mb2 cuts a|a" in {r.plan for r in rows}  # a cut plan, predicted as well
    # The catalog roofline with dedicated devices is far off these (synthetic) CPU runs.
    assert (s.mape_uncalibrated_pct or 0.0) > 5 * s.mape_calibrated_pct
    assert set(notes.step_residuals_s) == {f"{plan_label(p)}.json" for p in FIT_PLANS}


def test_cores_are_shared_by_the_replicas_of_a_stage():
    """dp=2 on two cores runs at full speed; dp=4 on the same two cores takes twice as long per rank.

    A lone rank gets both cores as threads: its FLOP/byte-bound work halves, its host overhead not.
    """
    # Transfers on a CPU host are host copies on the cores; make them (almost) free here.
    free = LinkCalibration(step_latency_s=0.0, bandwidth_Bps=1e12, cpu_s_per_step=1e-15)
    cal = Calibration(devices={"cpu": dataclasses.replace(TRUTH.devices["cpu"], step_overhead_s=0.0)},
                      comm={"gloo": {"local": free}})

    def pipeline_s(dp: int) -> float:
        plan = _plan(dp=dp, micro_batch_size=2, global_batch_size=2 * dp)
        res = simulate(MODEL, load_cluster(f"cpu:1x{dp}"), plan, SimulationOptions(calibration=cal))
        return res.extra.pipeline_time_s

    assert pipeline_s(4) == pytest.approx(2 * pipeline_s(2), rel=1e-6)
    assert pipeline_s(2) / 2 < pipeline_s(1) < pipeline_s(2)


def test_calibrated_compute_model_prices_ops_linearly():
    cal = TRUTH.devices["cpu"].compute["fp32"]
    model = CalibratedComputeModel(CPU, {"fp32": cal}, fallback=None)  # type: ignore[arg-type]
    feats = action_features(MODEL, _plan(tp=2), ReferenceOpTime(CPU))
    costs = model.layer_costs(MODEL, _plan(tp=2))
    block_f = next(c.forward_s for c in costs if c.kind == "block")
    # Stage 0 of a pp=1 plan holds every layer; its F feature · constants = the summed layer forwards.
    x = constants(cal)
    assert float(np.dot(feats[(0, "F")], x)) == pytest.approx(sum(c.forward_s for c in costs), rel=1e-9)
    assert block_f > 0


def test_apply_calibration_notes_what_it_cannot_cover():
    gpu = get_device("a100-sxm4-80gb")
    from mindpipe.simulator.api import default_models

    cluster = load_cluster("a100-sxm4-80gb:1x8")
    hw_compute, hw_comm = default_models(gpu, cluster)
    applied = apply_calibration(TRUTH, gpu, cluster, hw_compute, hw_comm)
    assert applied.compute is None and applied.comm is None
    assert any("no compute calibration for a100" in n for n in applied.notes)
    assert any("no nccl calibration" in n for n in applied.notes)
    # Simulating with a calibration that does not cover the device is the uncalibrated result.
    plan = Plan(tp=8, micro_batch_size=1, global_batch_size=8)
    base = simulate(load_model("gpt-1.3b"), cluster, plan).iteration_time_s
    cal = simulate(load_model("gpt-1.3b"), cluster, plan, SimulationOptions(calibration=TRUTH))
    assert cal.iteration_time_s == pytest.approx(base) and cal.extra.calibration is not None and cal.extra.calibration.notes


def test_calibration_file_roundtrip_and_errors(tmp_path):
    path = tmp_path / "cal.json"
    save_calibration(TRUTH, path)
    assert load_calibration(path) == TRUTH
    data = json.loads(path.read_text())
    data["devices"]["cpu"]["compute"]["fp32"]["scale"]["conv"] = 1.0
    path.write_text(json.dumps(data))
    with pytest.raises(ContractError, match=r"cal.json: .*conv"):
        load_calibration(path)
    data["devices"]["cpu"]["compute"]["fp32"]["scale"] = {"gemm": -1.0}
    path.write_text(json.dumps(data))
    with pytest.raises(ContractError, match="must be a positive number"):
        load_calibration(path)
    with pytest.raises(ContractError, match="at least one device or link"):
        Calibration(devices={})


def test_comm_fit_needs_two_message_sizes():
    run = _synthetic_run(_plan(dp=2))
    one_size = [c for c in run.measurement.comms if c.size_bytes == 2**20 and c.op == "allreduce"]
    run.measurement.comms = one_size
    links, table = fit_comm([run])
    assert links == {} and table == []


def test_gloo_runs_reduce_scatter_as_all_reduce():
    """gloo has no reduce-scatter: a sequence-parallel reduce-scatter costs an all-reduce's time."""
    from mindpipe.simulator.calibrate.models import CalibratedCommModel

    link = TRUTH.comm["gloo"]["local"]
    gloo = CalibratedCommModel({"local": link}, {"local": link.bandwidth_Bps}, fallback=None, backend="gloo")  # type: ignore[arg-type]
    nccl = CalibratedCommModel({"local": link}, {"local": link.bandwidth_Bps}, fallback=None, backend="nccl")  # type: ignore[arg-type]
    n, k = 2**20, 4

    def seconds(model, op):
        return model.latency_s(op, k, "local") + wire_bytes(op, n, k) / (link.bandwidth_Bps * model.efficiency(op, n, k, "local"))

    assert seconds(gloo, "reducescatter") == pytest.approx(seconds(gloo, "allreduce"))
    assert seconds(nccl, "reducescatter") == pytest.approx(seconds(nccl, "allreduce") / 2)


def _write_measured(run: MeasuredRun, path) -> str:
    """A measured trace file as `mindpipe run --out` writes it (layer records abridged)."""
    from mindpipe.traces.trace import Trace

    data = {"device": "cpu", "dtype": "fp32", "provenance": {"tool": "mindpipe run"}, "backward_split": "combined",
            "model": to_dict(MODEL),
            "layers": [{"name": n, "kind": k, "forward_s": 1e-3, "backward_input_s": 2e-3, "backward_weight_s": 0.0}
                       for n, k in (("embedding", "embedding"), ("block.0", "block"), ("lm_head", "lm_head"))],
            "measurement": to_dict(run.measurement)}
    Trace.from_dict(data, str(path)).save(path)
    return str(path)


def test_calibrate_and_validate_commands(tmp_path, capsys):
    from mindpipe.cli import main

    fit_files = [_write_measured(_synthetic_run(p), tmp_path / f"fit{i}.json") for i, p in enumerate(FIT_PLANS)]
    held_files = [_write_measured(_synthetic_run(p), tmp_path / f"held{i}.json") for i, p in enumerate(HELD_OUT[:2])]
    cal_path, report = tmp_path / "cal.json", tmp_path / "report"
    assert main(["calibrate", *fit_files, "--out", str(cal_path), "--holdout", *held_files,
                 "--report", str(report), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["holdout"]["n"] == 2 and out["holdout"]["mape_calibrated_pct"] < 3.0
    assert (report / "fidelity.md").read_text().count("| held") == 2
    assert (report / "calibration_scatter.png").stat().st_size > 10_000
    cal = load_calibration(cal_path)
    assert cal.measurements == fit_files
    # simulate --calibration prints the calibrated prediction, which matches the held-out "measurement".
    plan = json.dumps(to_dict(HELD_OUT[0]))
    assert main(["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x4", "--plan", plan,
                 "--calibration", str(cal_path), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_time_s"] == pytest.approx(_synthetic_run(HELD_OUT[0]).iteration_s, rel=0.03)
    assert sim["extra"]["calibration"]["cores_per_rank_slots"] == 2
    # validate measured: the same table from the files alone.
    assert main(["validate", "measured", "--data", *held_files, "--calibration", str(cal_path), "--json"]) == 0
    val = json.loads(capsys.readouterr().out)
    assert val["n"] == 2 and val["mape_calibrated_pct"] == pytest.approx(out["holdout"]["mape_calibrated_pct"])
    # A file that is both fitted on and held out, and a trace without measurements, are refused.
    assert main(["calibrate", *fit_files, "--out", str(cal_path), "--holdout", fit_files[0]]) == 2
    plain = tmp_path / "plain.json"
    data = json.loads((tmp_path / "fit0.json").read_text())
    data.pop("measurement")
    plain.write_text(json.dumps(data))
    assert main(["calibrate", str(plain), "--out", str(cal_path)]) == 2
    assert "not a measured run" in capsys.readouterr().err


def test_fresh_bytes_are_cpu_results_at_or_above_the_mmap_threshold():
    from mindpipe.simulator.ops import lm_head_ops
    from mindpipe.traces.host_alloc import CPU_FRESH_ALLOC_BYTES

    tiny = load_model("gpt-tiny-8k")
    cpu, gpu = ReferenceOpTime(CPU), ReferenceOpTime(get_device("a100-sxm4-80gb"))
    logits = lambda mb: mb * tiny.seq_len * tiny.vocab_size * 4  # noqa: E731
    # micro-batch 4: 16 MiB logits stay in malloc's heap; micro-batch 8: 32 MiB are mmapped fresh.
    assert logits(4) < CPU_FRESH_ALLOC_BYTES <= logits(8)
    small = sum(cpu.fresh_bytes(o) for o in lm_head_ops(tiny, 4, tiny.seq_len, 1, 4))
    large = [o for o in lm_head_ops(tiny, 8, tiny.seq_len, 1, 4) if cpu.fresh_bytes(o) > 0]
    assert small == 0
    # The GEMM's logits, the fp32 cross-entropy's cast/subtract/exp and its three backward results.
    assert {o.name for o in large} >= {"lm_head", "ce_exp", "ce_softmax_bwd"}
    assert all(cpu.fresh_bytes(o) == logits(8) for o in large)
    assert sum(gpu.fresh_bytes(o) for o in lm_head_ops(tiny, 8, tiny.seq_len, 1, 4)) == 0


def test_a_feature_no_run_has_is_fitted_to_zero():
    # Without the micro-batch-64 plan no result is a fresh allocation: the fit must not invent a cost.
    cal, _ = calibrate([_synthetic_run(p) for p in FIT_PLANS if p.micro_batch_size < 64])
    assert cal.devices["cpu"].compute["fp32"].fresh_s_per_byte == 0.0


# -- swap (issue 16): the copies of a swapped block, fitted from runs that swap -------------------
TRUTH_SWAP = dataclasses.replace(TRUTH, devices={"cpu": dataclasses.replace(
    TRUTH.devices["cpu"], compute={"fp32": dataclasses.replace(TRUTH.devices["cpu"].compute["fp32"], swap_s_per_byte=6e-10)})})
SWAP_PLANS = [_plan(pp=2, micro_batch_size=2, layer_memory_policy=["swap", "keep", "swap", "swap"]),
              _plan(pp=2, micro_batch_size=4, schedule="zb_h1", layer_memory_policy=["keep", "swap", "swap", "keep"])]


def test_swap_bytes_are_cpu_action_features():
    """F copies a swapped block's saved bytes out, B and I copy them all back, W its GEMM inputs again."""
    from mindpipe.simulator.costs import swap_weight_reread_bytes
    from mindpipe.simulator.planning import swap_bytes_per_block

    plan = SWAP_PLANS[1]
    k = FEATURES.index("swap_bytes")
    feats = action_features(MODEL, plan, ReferenceOpTime(CPU))
    block, reread = swap_bytes_per_block(MODEL, plan), swap_weight_reread_bytes(MODEL, plan)
    # gpt-mini: the inputs of qkv, proj and fc1 (s·b·h each) and of fc2 (4·s·b·h), fp32.
    assert reread == 4 * 7 * MODEL.seq_len * plan.micro_batch_size * MODEL.hidden_size
    # Stage 1 swaps one block (block 2); stage 0's I is empty and its W the whole backward (torch).
    assert [feats[(1, kind)][k] for kind in "FBIW"] == [block, block, block, reread]
    assert [feats[(0, kind)][k] for kind in "FBIW"] == [block, block, 0.0, block]
    assert not any(row[k] for row in action_features(MODEL, plan, ReferenceOpTime(get_device("a100-sxm4-80gb"))).values())
    assert not any(row[k] for row in action_features(MODEL, _plan(pp=2), ReferenceOpTime(CPU)).values())


def test_swap_constant_is_fitted_from_runs_that_swap_and_prices_held_out_swaps():
    cal, _ = calibrate([_synthetic_run(p, TRUTH_SWAP) for p in FIT_PLANS + SWAP_PLANS])
    got = cal.devices["cpu"].compute["fp32"]
    assert got.swap_s_per_byte == pytest.approx(6e-10, rel=0.02)
    assert got.op_overhead_s == pytest.approx(3e-4, rel=0.02)
    held = _plan(pp=4, micro_batch_size=2, layer_memory_policy=["swap", "swap", "keep", "swap"])
    truth_s = _synthetic_run(held, TRUTH_SWAP).iteration_s
    assert simulate(MODEL, load_cluster("cpu:1x4"), held, SimulationOptions(calibration=cal)).iteration_time_s \
        == pytest.approx(truth_s, rel=0.02)
    # The same calibration without its swap constant prices the copies at the catalog bandwidth: too fast here.
    catalog = copy_without_swap(cal)
    assert simulate(MODEL, load_cluster("cpu:1x4"), held, SimulationOptions(calibration=catalog)).iteration_time_s \
        < 0.97 * truth_s
    assert "swap 0.6 ns per swapped byte copied (1.7 GB/s)" in format_calibration(cal)


def copy_without_swap(cal: Calibration) -> Calibration:
    """``cal`` with no swap constant fitted (the simulator then uses the catalog's memory bandwidth)."""
    dev = cal.devices["cpu"]
    comp = dataclasses.replace(dev.compute["fp32"], swap_s_per_byte=0.0)
    return dataclasses.replace(cal, devices={"cpu": dataclasses.replace(dev, compute={"fp32": comp})})


def test_no_run_swaps_leaves_the_swap_constant_at_zero_and_the_catalog_prices_copies(fitted):
    from mindpipe.simulator.costs import cpu_copy_s
    from mindpipe.simulator.simulator import Simulator

    cal, _ = fitted
    assert cal.devices["cpu"].compute["fp32"].swap_s_per_byte == 0.0
    assert "swap" not in format_calibration(cal)
    sim = Simulator(MODEL, load_cluster("cpu:1x2"), calibration=cal)
    plan = SWAP_PLANS[0]
    # A CPU copy reads and writes every byte at the catalog's memory bandwidth.
    assert sim.swap_copy_s(plan, 1e6) == pytest.approx(2e6 / (CPU.memory_bandwidth_GBps * 1e9))
    assert cpu_copy_s(CPU, 1e6, 6e-10) == pytest.approx(6e-4)
    assert Simulator(MODEL, load_cluster("cpu:1x2"), calibration=TRUTH_SWAP).swap_copy_s(plan, 1e6) == pytest.approx(6e-4)


def test_a_swapped_cpu_block_copies_inside_its_actions():
    """On a CPU the swap is synchronous: it lengthens the stage's F and B by the copies and uses no link."""
    from mindpipe.simulator.simulator import Simulator

    sim = Simulator(MODEL, load_cluster("cpu:1x2"), calibration=TRUTH_SWAP)
    keep, swap = _plan(pp=2, micro_batch_size=2), SWAP_PLANS[0]
    t_keep, t_swap = (sim.run(p, timeline=True) for p in (keep, swap))
    copy = sim.swap_copy_s(swap, sim.swap_bytes_per_block(swap))

    def durations(res, kind: str) -> dict[int, float]:
        return {e.rank: e.end_s - e.start_s for e in res.timeline
                if e.thread == "compute" and e.category == kind}

    for kind in ("F", "B"):
        # Stage 0 swaps block 0 (one copy), stage 1 blocks 2 and 3 (two).
        grown = {r: durations(t_swap, kind)[r] - durations(t_keep, kind)[r] for r in (0, 1)}
        assert grown == pytest.approx({0: copy, 1: 2 * copy}, rel=1e-6)
    assert not any(e.category == "swap" for e in t_swap.timeline)


def test_recompute_cost_is_fitted_through_the_forward_operator_constants():
    """Recompute has no constant of its own: a re-run forward is priced as forward operators, so the
    operator constants fitted from runs that recompute move the recompute term with them."""
    from mindpipe.simulator.build import assign_layers, stage_recompute
    from mindpipe.simulator.simulator import Simulator
    from mindpipe.traces.layout import block_policies

    plan = _plan(pp=2, micro_batch_size=2, layer_memory_policy=["recompute", "keep", "recompute", "recompute"])
    keep = _plan(pp=2, micro_batch_size=2)
    ref = ReferenceOpTime(CPU)
    f_re, f_keep = action_features(MODEL, plan, ref), action_features(MODEL, keep, ref)
    # A recomputed block's B and I carry its forward operators again: stage 0 re-runs one block
    # (block 0), stage 1 two (blocks 2, 3); the head is not re-run.
    grown = [np.subtract(f_re[(s, "B")], f_keep[(s, "B")]) for s in (0, 1)]
    assert np.allclose(grown[1], 2 * grown[0]) and grown[0][FEATURES.index("ops")] > 0
    assert np.allclose(np.subtract(f_re[(1, "I")], f_keep[(1, "I")]), grown[1])
    assert f_re[(1, "F")] == f_keep[(1, "F")]
    cal, _ = calibrate([_synthetic_run(p) for p in [*FIT_PLANS, plan]])

    def recompute_s(calibration: Calibration | None) -> list[float]:
        sim = Simulator(MODEL, load_cluster("cpu:1x2"), calibration=calibration)
        stages = assign_layers(sim.layer_costs(plan), MODEL, plan)
        pol = block_policies(plan, MODEL.num_layers)
        return [stage_recompute(layers, [pol[b] for b in blocks])[0]
                for layers, blocks in zip(stages, ([0, 1], [2, 3]), strict=True)]

    bare, fitted_re, truth = recompute_s(None), recompute_s(cal), recompute_s(TRUTH)
    assert fitted_re == pytest.approx(truth, rel=0.02)
    assert all(f > 2 * b for f, b in zip(fitted_re, bare, strict=True))  # moved from the catalog roofline


NV = LinkCalibration(step_latency_s=6e-6, bandwidth_Bps=1.4e11)
NIC = LinkCalibration(step_latency_s=2.5e-5, bandwidth_Bps=1.8e10)


def _truth_s(phases, links: dict[str, LinkCalibration]) -> float:
    """An all-reduce's time if each link ran at its α-β, a NIC's bandwidth shared by its flows."""
    t = 0.0
    for ph in phases:
        cal = links[ph.link_type]
        t += ring_steps(ph.op, ph.group_size) * ph.count * cal.step_latency_s
        t += max(f.nbytes * max(f.multiplicity) for f in ph.flows) / cal.bandwidth_Bps
    return t


def _multi_node_run(plan: Plan, cluster_name: str) -> MeasuredRun:
    """A measured nccl run on several GPU nodes whose collectives took the NV/NIC α-β times."""
    cluster = load_cluster(cluster_name)
    gpu = get_device(cluster.gpu)
    topo = Topology(plan, cluster, gpu)
    comms = []
    for axis, size in (("tp", plan.tp), ("dp", plan.dp)):
        for n in (2**20, 2**23, 2**26):
            t = _truth_s(topo.collective("allreduce", float(n), axis, 0), {"nvlink": NV, "nic": NIC})
            for wait in (0.0, 0.003):  # a peer that arrived late; the fit takes the fastest event
                comms.append(CommEvent(0, 4, "collective", axis, "allreduce", 0.0, t + wait, n, size))
    base = _synthetic_run(_plan(dp=2))
    ranks = [dataclasses.replace(base.measurement.ranks[0], rank=g, pp_rank=topo.coords(g)[0],
                                 dp_rank=topo.coords(g)[1], tp_rank=topo.coords(g)[2]) for g in range(plan.world_size)]
    meas = dataclasses.replace(base.measurement, plan=plan, world_size=plan.world_size, nodes=cluster.num_nodes,
                               backend="nccl", device_kind="cuda", device_name=gpu.name, comms=comms, ranks=ranks)
    return dataclasses.replace(base, source=f"{cluster_name}.json", measurement=meas, cluster=cluster, device=gpu)


def test_multi_node_all_reduces_fit_the_nics():
    """Groups inside a node fit NVLink; those spanning nodes, less their intra-node reduce-scatter
    and all-gather, fit the node's NIC — with the NIC shared by the groups that cross it at once."""
    from mindpipe.simulator.api import default_models
    from mindpipe.simulator.network import Transfers

    runs = [_multi_node_run(Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=8), "a100-sxm4-80gb:2x2"),
            _multi_node_run(Plan(dp=4, micro_batch_size=1, global_batch_size=8), "a100-sxm4-80gb:2x2"),
            _multi_node_run(Plan(dp=8, micro_batch_size=1, global_batch_size=8), "a100-sxm4-80gb:4x2")]
    links, table = fit_comm(runs)
    for link, want in (("nvlink", NV), ("nic", NIC)):
        got = links["nccl"][link]
        assert got.step_latency_s == pytest.approx(want.step_latency_s, rel=1e-6)
        assert got.bandwidth_Bps == pytest.approx(want.bandwidth_Bps, rel=1e-6)
    assert {row["link"] for row in table} == {"nvlink", "nic"}
    assert all(row["fitted_s"] == pytest.approx(row["measured_s"], rel=1e-6) for row in table)
    # The calibrated simulation prices a held-out spanning group (dp 16 over 8 nodes, tp 2: two
    # groups on each NIC) as it was measured: the NIC's fitted bandwidth is the node's capacity.
    cluster = load_cluster("a100-sxm4-80gb:8x4")
    gpu = get_device(cluster.gpu)
    hw_compute, hw_comm = default_models(gpu, cluster)
    applied = apply_calibration(Calibration(devices={}, comm=links), gpu, cluster, hw_compute, hw_comm)
    assert applied.cluster.inter_node_bandwidth_Gbps == pytest.approx(NIC.bandwidth_Bps * 8 / 1e9)
    topo = Topology(Plan(tp=2, dp=16, micro_batch_size=1, global_batch_size=16), applied.cluster, gpu)
    phases = topo.collective("allreduce", float(2**24), "dp", 0)
    assert {ph.link_type for ph in phases} == {"nvlink", "nic"} and max(phases[1].flows[0].multiplicity) == 2
    got = Transfers(None, None, topo, applied.comm).time_alone(phases)  # type: ignore[arg-type]
    assert got == pytest.approx(_truth_s(phases, {"nvlink": NV, "nic": NIC}), rel=1e-6)


def test_multi_node_runs_without_groups_inside_a_node_fit_no_nic():
    run = _multi_node_run(Plan(dp=4, micro_batch_size=1, global_batch_size=8), "a100-sxm4-80gb:2x2")
    links, _ = fit_comm([run])  # its groups span both nodes: the NVLink part cannot be taken out
    assert "nic" not in links.get("nccl", {})


def test_fidelity_table_of_one_run_says_run():
    from mindpipe.simulator.calibrate.fidelity import FidelityRow, table_markdown

    one = table_markdown([FidelityRow("r", "dp1 tp1 pp1", 1, 1.0, 1.1, None)])
    assert one.endswith(", over 1 run.")
    two = table_markdown([FidelityRow("r", "p", 1, 1.0, 1.1, None), FidelityRow("s", "p", 1, 1.0, 0.9, None)])
    assert two.endswith(", over 2 runs.")


def test_the_calibration_scatter_labels_several_ticks_and_keeps_labels_inside(monkeypatch, tmp_path):
    """The demo's scatter (0.15–1.84 s) had one labelled tick per axis, and the rightmost point's
    label ran past the axes."""
    from mindpipe.simulator.calibrate import fidelity as fid

    rows = [fid.FidelityRow("a.run1", "dp1·tp1·pp2 zb_h1 mb2", 2, 1.226, 1.84, 0.606),
            fid.FidelityRow("b.run1", "dp2 mb4", 2, 0.48, 0.15, 0.47)]
    drawn = {}
    monkeypatch.setattr(fid, "save_figure", lambda fig, path, dpi=None: drawn.update(fig=fig, ax=fig.axes[0]))
    fid.scatter_png(rows, tmp_path / "s.png")
    ax = drawn["ax"]
    drawn["fig"].canvas.draw()
    lo, hi = ax.get_xlim()
    labelled = [t.get_text() for t in ax.xaxis.get_ticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
    assert len(labelled) >= 3, labelled
    (note,) = [t for t in ax.texts if t.get_text() == "dp1·tp1·pp2 zb_h1 mb2"]
    assert note.get_ha() == "right"  # drawn to the left of its point, inside the axes


def test_fitted_constants_print_zero_for_float_noise_and_digits_for_small_values():
    from mindpipe.simulator.calibrate.fidelity import _g

    assert (_g(1.68e-16), _g(0.0), _g(0.0043), _g(68.94), _g(-2.5e-3)) == ("0", "0", "0.0043", "68.9", "-0.0025")


def test_a_spanning_group_is_placed_by_the_plans_rank_order():
    """The NIC fit places a measured run's ranks as the simulator and the executor do, by the plan's
    ``rank_order``: with dp-tp-pp on 2 nodes × 2 GPUs the dp pairs sit inside a node and the tp pairs
    span the nodes (the fit used tp-dp-pp whatever the plan said, the other way round)."""
    from mindpipe.simulator.calibrate.fit import _spanning

    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=8, rank_order="dp-tp-pp")
    run = _multi_node_run(plan, "a100-sxm4-80gb:2x2")
    for rank in range(4):
        assert _spanning(run, "dp", 2**20, 2, rank) is None
        tp = _spanning(run, "tp", 2**20, 2, rank)
        assert tp is not None and any(ph.link_type == "nic" for ph in tp)
    topo = Topology(plan, run.cluster, run.device, rank_order=plan.rank_order)
    assert [topo.coords(topo.global_rank(p, d, t)) for p, d, t in [(0, 1, 1), (0, 0, 1)]] == [(0, 1, 1), (0, 0, 1)]


TRUTH_SPLIT = dataclasses.replace(TRUTH, devices={"cpu": dataclasses.replace(
    TRUTH.devices["cpu"], compute={"fp32": dataclasses.replace(TRUTH.devices["cpu"].compute["fp32"],
                                                               split_input_op_s=1e-4, weight_pass_s=8e-5,
                                                               weight_pass_op_s=6e-7)})})
# Zero-bubble stages of 1, 2 and 3 blocks (with and without the head): W's passes and their walks vary apart.
SPLIT_PLANS = [_plan(pp=2, micro_batch_size=2, schedule="zb_h1"), _plan(pp=2, schedule="zb_h1", partition=[1, 3]),
               _plan(pp=4, micro_batch_size=2, schedule="zb_h1")]


def test_a_split_backwards_host_work_is_what_the_walks_say_and_is_fitted_from_zero_bubble_runs():
    """torch's I walks the stage's graph once, W takes a pass per parameter group walking down to the
    stage's input (split_backward_walks): features of I and W only, on every stage but the first;
    fitted from zero-bubble runs, they price a held-out zero-bubble plan; without such runs they stay
    0 and the report says so."""
    from mindpipe.simulator.build import split_backward_walks, stage_op_counts
    from mindpipe.simulator.calibrate.features import FEATURES
    from mindpipe.traces.layout import block_policies, stage_layout

    plan = _plan(pp=2, schedule="zb_h1", partition=[1, 3])
    feats = action_features(MODEL, plan, ReferenceOpTime(CPU))
    cols = [FEATURES.index(f) for f in ("split_input_ops", "weight_passes", "weight_pass_ops")]
    spans, counts = stage_layout(plan, MODEL), stage_op_counts(MODEL, plan)
    ops, passes, walked = split_backward_walks(MODEL, plan, spans[1], counts[1], block_policies(plan, MODEL.num_layers))
    # three blocks of six groups, the final norm's and the head's; group g walks its layer and those before it
    assert passes == 3 * 6 + 2 and ops == sum(c.forward_s for c in counts[1])
    per_block = counts[1][0].forward_s
    assert walked == 6 * per_block * (1 + 2 + 3) + (3 * per_block + counts[1][3].forward_s) + ops
    assert [feats[(1, "I")][k] for k in cols] == [ops, 0.0, 0.0]
    assert [feats[(1, "W")][k] for k in cols] == [0.0, passes, walked]
    assert not any(feats[(s, kind)][k] for s in (0, 1) for kind in ("F", "B") for k in cols)
    assert not any(feats[(0, kind)][k] for kind in ("I", "W") for k in cols)
    # Fitted from zero-bubble runs, they price one held out (3 blocks then 1) as the truth does.
    cal, _ = calibrate([_synthetic_run(p, TRUTH_SPLIT) for p in FIT_PLANS + SPLIT_PLANS])
    got = cal.devices["cpu"].compute["fp32"]
    assert got.split_input_op_s == pytest.approx(1e-4, rel=0.02)
    assert got.weight_pass_s == pytest.approx(8e-5, rel=0.05)
    assert got.weight_pass_op_s == pytest.approx(6e-7, rel=0.05)
    held = _plan(pp=2, schedule="zb_h1", partition=[3, 1])
    truth_s = _synthetic_run(held, TRUTH_SPLIT).iteration_s
    assert simulate(MODEL, load_cluster("cpu:1x2"), held, SimulationOptions(calibration=cal)).iteration_time_s \
        == pytest.approx(truth_s, rel=0.02)
    assert "split backward 100 µs per op I walks, 80 µs per W pass + 0.6 µs per op it walks" in format_calibration(cal)
    # Without zero-bubble runs: zero, and the same plan is priced as one backward (faster).
    plain, notes = calibrate([_synthetic_run(p, TRUTH_SPLIT) for p in FIT_PLANS])
    assert plain.devices["cpu"].compute["fp32"].weight_pass_s == 0.0
    assert any("splits its backward" in w for w in notes.warnings)
    assert simulate(MODEL, load_cluster("cpu:1x2"), held, SimulationOptions(calibration=plain)).iteration_time_s \
        < truth_s
