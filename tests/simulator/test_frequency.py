"""The frequency model: power in clock and load, time stretch per op kind, clocks in the simulator."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from mindpipe.simulator.frequency import (
    PowerModel,
    StageSeconds,
    apply_clocks,
    build_clock_table,
    clocked_device,
    split_compute,
)
from mindpipe.simulator.perf.kernels import KernelParams, Tile, gemm_s, memory_s
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.frequency import frequency_spec

A100 = get_device("a100-sxm4-80gb")


def test_power_is_monotone_in_clock_and_load_and_hits_the_limit_at_max() -> None:
    pm = PowerModel.of(A100)
    clocks = frequency_spec(A100.name).clocks()
    for rho in (0.0, 0.5, 1.0):
        powers = [pm.busy_power_w(f, rho) for f in clocks]  # descending clocks
        assert all(a > b for a, b in itertools.pairwise(powers))
    for f in clocks:
        assert pm.busy_power_w(f, 0.3) >= pm.blocked_power_W
        if f >= frequency_spec(A100.name).base_sm_clock_MHz:
            # Above the knee a GEMM out-draws a memory-bound kernel; far below it HBM power, which
            # the SM clock does not scale, dominates.
            assert pm.busy_power_w(f, 1.0) >= pm.busy_power_w(f, 0.3)
    assert pm.busy_power_w(1410, 1.0) == pytest.approx(A100.max_power_W)
    assert pm.blocked_power_W == 85


def test_compute_bound_energy_is_u_shaped_with_its_bottom_at_the_knee() -> None:
    """A purely compute-bound op: t ∝ 1/f, so E ∝ P(f)/f falls to the base clock and rises below it."""
    pm = PowerModel.of(A100)
    clocks = frequency_spec(A100.name).clocks()
    energy = {f: pm.busy_power_w(f, 1.0) / f for f in clocks}
    assert min(energy, key=energy.__getitem__) == frequency_spec(A100.name).base_sm_clock_MHz


def _params(dev) -> KernelParams:
    return KernelParams(peak_flops=dev.peak_flops("bf16"), sm_count=108, gemm_ceiling=0.8, tiles=(Tile(256, 128, 1.0),),
                        k_overhead=0.0, max_split_k=1, bandwidth_Bps=1.6e12, flash_efficiency=0.6, kernel_overhead_s=0.0)


def test_compute_bound_time_scales_as_one_over_f_and_memory_bound_time_is_flat() -> None:
    big = (8192, 8192, 8192)
    t_max = gemm_s(*big, 1, 2, _params(A100))
    for f in (1200, 1095, 705):
        dev = clocked_device(A100, f)
        assert gemm_s(*big, 1, 2, _params(dev)) == pytest.approx(t_max * 1410 / f, rel=1e-9)
        assert memory_s(1e9, _params(dev)) == memory_s(1e9, _params(A100))


def test_split_compute_recovers_a_two_part_phase() -> None:
    c, m = 0.3, 0.2
    t = lambda f: c * 1410 / f + m  # noqa: E731
    assert split_compute(t(1410), t(210), 1410, 210) == pytest.approx((c, m))


@pytest.fixture(scope="module")
def sim() -> Simulator:
    return Simulator(load_model("gpt-1.3b"), Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=8))


PLAN = Plan(dp=2, tp=1, pp=4, micro_batch_size=1, global_batch_size=16, schedule="1f1b")


def test_default_clocks_equal_no_clocks_and_lower_clocks_stretch_time(sim: Simulator) -> None:
    base = sim.run(PLAN)
    same = sim.run(dataclasses.replace(PLAN, stage_clocks_mhz=[1410] * 4))
    assert same.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-12)
    assert same.energy_j == pytest.approx(base.energy_j, rel=1e-12)
    slow = sim.run(dataclasses.replace(PLAN, stage_clocks_mhz=[1095] * 4))
    assert base.iteration_time_s < slow.iteration_time_s < base.iteration_time_s * 1410 / 1095
    assert slow.extra.device_energy_j < base.extra.device_energy_j


def test_a_bubble_free_pipeline_saves_no_time_neutral_energy(sim: Simulator) -> None:
    """pp=1 has no bubble: any lower clock on a model with compute-bound ops costs time."""
    plan = Plan(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8, schedule="1f1b")
    base = sim.run(plan)
    for f in (1395, 1305):
        r = sim.run(dataclasses.replace(plan, stage_clocks_mhz=[f]))
        assert r.iteration_time_s > base.iteration_time_s * (1 + 1e-4)


def test_a_stage_with_slack_runs_at_a_lower_clock_for_free() -> None:
    """Uneven partition: the short stage can slow down to the long stage's pace at no time cost."""
    sim = Simulator(load_model("gpt-1.3b"), Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=2))
    plan = Plan(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=32, schedule="gpipe", partition=[8, 16])
    base = sim.run(plan)
    slack = sim.run(dataclasses.replace(plan, stage_clocks_mhz=[1095, 1410]))
    # Only the fill and drain see stage 0's longer forward and backward: one micro-batch of m=32.
    assert slack.iteration_time_s <= base.iteration_time_s * 1.01
    assert slack.extra.device_energy_j < base.extra.device_energy_j * 0.97


def test_clock_plans_are_refused_for_devices_without_frequency_data() -> None:
    with pytest.raises(ContractError, match="no frequency data"):
        frequency_spec("cpu")


def test_a_lower_clock_stretches_the_gemms_tp_collectives_overlap(sim: Simulator) -> None:
    plan = Plan(dp=2, tp=4, pp=1, micro_batch_size=1, global_batch_size=2, sequence_parallel=True, tp_comm_overlap=True)
    _, _, stages, _, _ = sim.work(plan)
    before = [o.gemm_s for o in stages[0].fwd_tp_overlap + stages[0].bwd_tp_overlap]
    table = sim.clock_table(plan, [1095])
    apply_clocks(stages, table, [1095])
    fwd, bwd = table.at(0, 1095)
    assert fwd.stretch > 1 and bwd.stretch > 1
    n = len(stages[0].fwd_tp_overlap)
    after = [o.gemm_s for o in stages[0].fwd_tp_overlap + stages[0].bwd_tp_overlap]
    assert after == pytest.approx([g * (fwd.stretch if i < n else bwd.stretch) for i, g in enumerate(before)])


def test_a_launch_bound_phase_pays_static_power_for_its_wall_time_and_dynamic_only_for_its_kernels() -> None:
    """Closed form: a phase of 10 ms wall (host-issue bound) whose kernels take K(f) = C·f_max/f + M,
    C = 0.5 ms, M = 0.5 ms: E(f) = P_blk·10 ms + D·[C·(f_max/f)·g(f) + M·μ·(h + (1 − h)·g(f))]."""
    pm = PowerModel.of(A100)
    spec = frequency_spec(A100.name)
    wall, c, m = 10e-3, 0.5e-3, 0.5e-3
    k = lambda f: c * 1410 / f + m  # noqa: E731
    times = {f: [StageSeconds((wall, wall), (k(f), k(f)))] for f in (1410, 1095, 210)}
    table = build_clock_table(times, 1410)
    d = A100.max_power_W - pm.blocked_power_W
    mu, h = spec.memory_bound_power_fraction, spec.memory_power_clock_independent_fraction
    for f in (1410, 1095, 210):
        fwd, _ = table.at(0, f)
        assert fwd.stretch == 1.0 and fwd.kernel_share == pytest.approx(k(f) / wall)
        g = pm.activity(f)
        expected = pm.blocked_power_W * wall + d * (c * 1410 / f * g + m * mu * (h + (1 - h) * g))
        assert pm.phase_power_w(f, fwd) * wall == pytest.approx(expected, rel=1e-12)
    # A plain (forward, backward) pair is a phase whose kernels fill its wall time, as before.
    plain = build_clock_table({f: [(k(f), k(f))] for f in (1410, 210)}, 1410)
    assert plain.at(0, 210)[0].kernel_share == 1.0


def test_a_launch_bound_model_saves_little_energy_at_a_low_clock() -> None:
    """gpt-mini's step is launch-bound: its kernels run ~5 % of the wall time at f_max. The minimum
    clock costs no time, but only those kernels' dynamic power can be saved — the model claimed 31 %
    by charging the whole wall time at a memory-bound kernel's power (274 W of 400)."""
    sim = Simulator(load_model("gpt-mini"), Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=8))
    plan = Plan(dp=8, tp=1, pp=1, micro_batch_size=4, global_batch_size=32)
    table = sim.clock_table(plan, [210])
    share = max(ph.kernel_share for ph in table.at(0, 1410))
    assert share < 0.1
    base = sim.run(plan)
    low = sim.run(dataclasses.replace(plan, stage_clocks_mhz=[210]))
    assert low.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-9)
    pm = sim.power
    # While "computing" the GPU draws blocked power plus dynamic power in the kernels' share only.
    assert base.extra.rank_busy_power_w[0] <= pm.blocked_power_W + (pm.max_power_W - pm.blocked_power_W) * share
    saving = 1.0 - low.extra.device_energy_j / base.extra.device_energy_j
    assert 0.0 < saving < 0.1


def test_a_gpu_bound_model_keeps_its_clock_table() -> None:
    """Where the host's kernel issue never binds, kernels fill the wall time and nothing changes."""
    sim = Simulator(load_model("gpt-1.3b"), Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=8))
    table = sim.clock_table(PLAN, [1095])
    for s in (1, 2):  # the middle stages: transformer blocks only
        for f in (1410, 1095, 210):
            assert all(ph.kernel_share == 1.0 for ph in table.at(s, f))
