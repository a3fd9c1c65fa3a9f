"""The supernet simulator against closed forms: replay, conflict stalls, memory, determinism."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.costs import DTYPE_BYTES
from mindpipe.simulator.memory import OPTIMIZER_BYTES
from mindpipe.simulator.subnet_replay import ActionCosts, ReplayDeadlock, conflict_stalls, replay
from mindpipe.simulator.subnet_schedules import SubnetSchedule, build_subnet_schedule
from mindpipe.simulator.subnet_sim import SupernetSimulator
from mindpipe.traces.builtin import load_cluster, load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Supernet, sample_subnets, subnet_stage_operators
from mindpipe.traces.trace import LayerRecord, Provenance, Trace

GRAD = 4  # bf16 training keeps fp32 gradients (simulator.build.GRAD_BYTES)


def costs(p: int, n: int, f: float, b: float) -> ActionCosts:
    zero = [[0.0] * n for _ in range(p)]
    return ActionCosts([[f] * n for _ in range(p)], [[b] * n for _ in range(p)], zero, zero, [0.0] * p, [0.0] * p)


def disjoint_ops(p: int, n: int) -> list[list[frozenset[tuple[int, int]]]]:
    return [[frozenset({(s, b)}) for s in range(p)] for b in range(n)]


def shared_ops(p: int, n: int) -> list[list[frozenset[tuple[int, int]]]]:
    return [[frozenset({(s, 0)}) for s in range(p)] for _ in range(n)]


@pytest.mark.parametrize("p,n", [(2, 10), (4, 37), (8, 50)])
def test_sequential_is_n_p_f_plus_b(p, n):
    sched = build_subnet_schedule("sequential", disjoint_ops(p, n), p)
    rep = replay(sched, costs(p, n, 1.5, 2.5))
    assert rep.makespan_s == pytest.approx(n * p * (1.5 + 2.5))
    assert conflict_stalls(sched, rep, disjoint_ops(p, n)) == [0.0] * p


@pytest.mark.parametrize("p,n", [(4, 64), (4, 256), (8, 256)])
def test_csp_without_conflicts_is_1f1b(p, n):
    """No two subnets share an operator: CSP runs as 1F1B, (N + p − 1)(F + B), bubble (p − 1)/(N + p − 1)."""
    ops = disjoint_ops(p, n)
    sched = build_subnet_schedule("csp", ops, p, 2 * p)
    rep = replay(sched, costs(p, n, 1.0, 2.0))
    assert rep.makespan_s == pytest.approx((n + p - 1) * 3.0)
    assert 1 - sum(rep.busy_s) / (p * rep.makespan_s) == pytest.approx((p - 1) / (n + p - 1))
    assert conflict_stalls(sched, rep, ops) == [0.0] * p


def test_csp_with_every_subnet_conflicting_is_sequential_and_stalls():
    p, n = 4, 12
    ops = shared_ops(p, n)
    sched = build_subnet_schedule("csp", ops, p, 2 * p)
    rep = replay(sched, costs(p, n, 1.0, 2.0))
    assert rep.makespan_s == pytest.approx(n * p * 3.0)
    stalls = conflict_stalls(sched, rep, ops)
    # Stage 0 idles while the next subnet (arrived: every input is there) waits for the previous one's
    # update; after the last subnet's forward nothing is held back.
    idle0 = rep.makespan_s - rep.busy_s[0]
    assert idle0 == pytest.approx(n * (p - 1) * 3.0)
    assert stalls[0] == pytest.approx(idle0 * (n - 1) / n)
    # The last stage waits for data only: a subnet reaches it after its update on the previous stages.
    assert stalls[-1] == pytest.approx(0.0)


def test_replay_sends_and_update_delay_dependants():
    p, n = 2, 1
    c = dataclasses.replace(costs(p, n, 1.0, 2.0), send_forward_s=[0.5, 0.0], send_backward_s=[0.0, 0.25],
                            after_backward_s=[[0.1], [0.2]])
    rep = replay(build_subnet_schedule("sequential", disjoint_ops(p, n), p), c)
    # F0 [0,1], send .5, F1 [1.5,2.5], B1 [2.5,4.5]+.2, send back .25 from 4.5, B0 [4.75,6.75]+.1
    assert rep.forward_end_s == [[1.0], [2.5]]
    assert rep.updated_s == [[pytest.approx(6.85)], [pytest.approx(4.7)]]
    assert rep.makespan_s == pytest.approx(6.85)


def test_replay_reports_deadlock():
    from mindpipe.simulator.actions import Action

    bad = SubnetSchedule("csp", 2, 1, ((Action(0, "B", 0), Action(0, "F", 0)), (Action(1, "F", 0), Action(1, "B", 0))),
                         "each_backward")
    with pytest.raises(ReplayDeadlock):
        replay(bad, costs(2, 1, 1.0, 1.0))


# -- the simulator with a hand-built per-candidate trace ----------------------------------------


class NoOptimizer:
    """A compute model whose optimizer step is free (only the optimizer is asked when a trace is given)."""

    def layer_costs(self, model, plan):  # pragma: no cover - not asked for supernets
        raise NotImplementedError

    def optimizer_step_s(self, params_per_device, plan):
        return 0.0


def mini_trace(net: Supernet, f: float, b: float, act: int, mbs: int = 2) -> Trace:
    recs = [LayerRecord("embedding", "embedding", 0.0, 0.0, 0.0, activation_bytes=0, output_bytes=0),
            LayerRecord("head", "head", 0.0, 0.0, 0.0, activation_bytes=0, output_bytes=0)]
    recs += [LayerRecord(f"candidate.{c.name}", c.op, f, b, 0.0, activation_bytes=act, output_bytes=0)
             for c in net.candidates]
    return Trace("cpu", "bf16", recs, Provenance("test"), micro_batch_size=mbs, seq_len=net.seq_len,
                 granularity="candidate", supernet=net)


@pytest.fixture(scope="module")
def mini():
    return load_supernet("supernet-mini")


def sim_of(net, f=1e-3, b=2e-3, act=1000, mbs=2):
    return SupernetSimulator(net, load_cluster("cpu:1x2"), trace=mini_trace(net, f, b, act, mbs), compute=NoOptimizer())


def test_simulated_sequential_closed_form(mini):
    sim = sim_of(mini)
    plan = Plan(pp=2, micro_batch_size=2, global_batch_size=2, subnet_schedule="sequential")
    r = sim.run(plan, 40, context_switching=False)
    layers_per_stage = mini.num_layers // 2
    assert r.total_time_s == pytest.approx(40 * 2 * layers_per_stage * 3e-3)
    assert r.subnets_per_hour == pytest.approx(3600 * 40 / r.total_time_s)
    assert r.bubble_fraction == pytest.approx(0.5)
    assert [s.conflict_stall_s for s in r.stages] == [0.0, 0.0]


def test_trace_times_scale_with_micro_batch(mini):
    sim = sim_of(mini, mbs=2)
    one = sim.run(Plan(pp=2, micro_batch_size=2, global_batch_size=2, subnet_schedule="sequential"), 10,
                  context_switching=False)
    two = sim.run(Plan(pp=2, micro_batch_size=4, global_batch_size=4, subnet_schedule="sequential"), 10,
                  context_switching=False)
    assert two.total_time_s == pytest.approx(2 * one.total_time_s)


def test_csp_beats_sequential_and_stalls_on_conflicts(mini):
    sim = sim_of(mini)
    seq = sim.run(Plan(pp=2, micro_batch_size=2, global_batch_size=2, subnet_schedule="sequential"), 200)
    csp = sim.run(Plan(pp=2, micro_batch_size=2, global_batch_size=2, subnet_schedule="csp"), 200)
    assert seq.subnets_per_hour < csp.subnets_per_hour < 2 * seq.subnets_per_hour
    assert csp.stages[0].conflict_stall_s > 0
    for s in csp.stages:
        assert s.busy_s + s.conflict_stall_s + s.other_idle_s == pytest.approx(csp.total_time_s)


def test_memory_with_and_without_context_switching(mini):
    """Hand-computed peaks of the sequential schedule (one subnet in flight, the next one prefetched)."""
    act, n = 1000, 30
    sim = sim_of(mini, act=act)
    plan = Plan(pp=2, micro_batch_size=2, global_batch_size=2, subnet_schedule="sequential")
    h, d = mini.hidden_size, DTYPE_BYTES["bf16"]
    cand = [c.param_count(h) for c in mini.candidates]
    shared = [mini.vocab_size * h + mini.seq_len * h, 2 * h + mini.vocab_size * h]  # frozen: weights only
    subnets = sample_subnets(mini, n)
    full = sim.run(plan, n, context_switching=False)
    switched = sim.run(plan, n, context_switching=True)
    for s in range(2):
        layers = range(4 * s, 4 * s + 4)
        trained_full = 4 * sum(cand)
        trained_sw = max(sum(cand[k] for _, k in {(ly, c[ly]) for c in (subnets[b], subnets[min(b + 1, n - 1)])
                                                  for ly in layers})
                         for b in range(n))
        for r, trained in ((full, trained_full), (switched, trained_sw)):
            m = r.stages[s].memory
            assert m.param_count == shared[s] + trained
            assert m.weights_bytes == (shared[s] + trained) * d
            assert m.gradients_bytes == trained * GRAD
            assert m.optimizer_bytes == trained * OPTIMIZER_BYTES["bf16"]
            assert m.activations_bytes == 4 * act and m.in_flight_peak == 1
            assert m.other_bytes == 0.0  # a CPU reserves nothing
        assert switched.stages[s].memory.total_bytes < full.stages[s].memory.total_bytes


def test_memory_budget_refusal_flag(mini):
    sim = sim_of(mini)
    plan = Plan(pp=2, micro_batch_size=2, global_batch_size=2)
    full = sim.run(plan, 20, context_switching=False)
    budget = (max(s.memory.total_bytes for s in full.stages)) * 0.9
    assert not sim.run(plan, 20, context_switching=False, memory_budget_bytes=budget).fits_in_memory
    assert sim.run(plan, 20, context_switching=True, memory_budget_bytes=budget).fits_in_memory


def test_deterministic_and_json_ready(mini):
    sim = SupernetSimulator(mini, load_cluster("cpu:1x2"))
    plan = Plan(pp=2, micro_batch_size=4, global_batch_size=4, subnet_schedule="csp")
    a, b = sim.run(plan, 100).to_dict(), SupernetSimulator(mini, load_cluster("cpu:1x2")).run(plan, 100).to_dict()
    assert a == b
    assert a["cost_source"] == "roofline" and len(a["memory_by_stage_gib"]) == 2


def test_conflict_rate_matches_closed_form():
    net = load_supernet("naspipe-c3")
    sim = SupernetSimulator(net, load_cluster("a100-sxm4-80gb:1x4"))
    r = sim.run(Plan(pp=4, micro_batch_size=8, global_batch_size=8, subnet_schedule="sequential"), 1000)
    for s in r.stages:
        assert abs(s.conflict_rate - s.conflict_rate_closed_form) < 0.05


def test_dp_adds_an_all_reduce_per_subnet(mini):
    cluster = load_cluster("a100-sxm4-80gb:1x4")
    sim = SupernetSimulator(mini, cluster)
    one = SupernetSimulator(mini, load_cluster("a100-sxm4-80gb:1x2")).run(
        Plan(pp=2, micro_batch_size=4, global_batch_size=4, subnet_schedule="sequential"), 20)
    two = sim.run(Plan(dp=2, pp=2, micro_batch_size=4, global_batch_size=8, subnet_schedule="sequential"), 20)
    assert two.total_time_s > one.total_time_s and two.samples_per_subnet == 8


@pytest.mark.parametrize("plan,key", [
    (Plan(pp=2, tp=2, micro_batch_size=1, global_batch_size=1), "tp"),
    (Plan(pp=2, micro_batch_size=1, global_batch_size=2), "global_batch_size"),
    (Plan(pp=4, micro_batch_size=1, global_batch_size=1), "dp"),
])
def test_bad_plans_are_contract_errors(mini, plan, key):
    with pytest.raises(ContractError) as e:
        SupernetSimulator(mini, load_cluster("cpu:1x2")).run(plan, 10)
    assert e.value.key == key or key in str(e.value)


def test_sync_needs_whole_batches(mini):
    sim = SupernetSimulator(mini, load_cluster("cpu:1x2"))
    with pytest.raises(ContractError, match="multiple"):
        sim.run(Plan(pp=2, micro_batch_size=1, global_batch_size=1, subnet_schedule="sync"), 10)
    r = sim.run(Plan(pp=2, micro_batch_size=1, global_batch_size=1, subnet_schedule="sync"), 12)
    assert r.sync_batch == 4 and r.to_dict()["sync_batch"] == 4


def test_ops_come_from_the_one_owner(mini):
    """The conflict statistics use subnet_stage_operators (what CSP's rule and the executor use)."""
    plan = Plan(pp=2, micro_batch_size=1, global_batch_size=1)
    subnets = sample_subnets(mini, 50)
    ops = [subnet_stage_operators(mini, plan, c) for c in subnets]
    expected = sum(1 for b in range(49) if ops[b][0] & ops[b + 1][0]) / 49
    r = SupernetSimulator(mini, load_cluster("cpu:1x2")).run(plan, 50)
    assert r.stages[0].conflict_rate == pytest.approx(expected)


def test_context_switch_copies_prefetch_one_subnet_ahead():
    """Copies run in forward order on their own channel, each once the previous forward has started."""
    p, n = 1, 3
    c = dataclasses.replace(costs(p, n, 1.0, 1.0), swap_in_s=[[0.5, 3.0, 0.5]])
    rep = replay(build_subnet_schedule("sequential", disjoint_ops(p, n), p), c)
    # copy0 [0,.5] → F0 [.5,1.5] B0 [1.5,2.5]; copy1 from F0's start .5 to 3.5 → F1 [3.5,4.5] B1 [4.5,5.5];
    # copy2 from F1's start 3.5 to 4.0 (hidden) → F2 [5.5,6.5] B2 [6.5,7.5]
    assert [rep.start_s[0][k] for k in (0, 2, 4)] == [0.5, 3.5, 5.5]
    assert rep.makespan_s == pytest.approx(7.5)


def test_calibration_prices_candidates_and_updates(mini):
    from mindpipe.traces.calibration import Calibration, ComputeCalibration, DeviceCalibration

    overhead, update = 3e-4, 2e-3
    cal = Calibration(devices={"cpu": DeviceCalibration(
        kind="cpu", cpus_per_node=2, compute={"fp32": ComputeCalibration(
            scale={"gemm": 1.0, "bmm": 1.0, "memory": 1.0}, op_overhead_s=overhead, optimizer_overhead_s=update)})})
    plan = Plan(pp=2, micro_batch_size=4, global_batch_size=4, precision="fp32", subnet_schedule="sequential")
    plain = SupernetSimulator(mini, load_cluster("cpu:1x2"))
    tuned = SupernetSimulator(mini, load_cluster("cpu:1x2"), calibration=cal)
    assert tuned.costs(plan).source == "calibrated" and plain.costs(plan).source == "roofline"
    a = plain.run(plan, 20, context_switching=False)
    b = tuned.run(plan, 20, context_switching=False)
    # Every subnet pays at least the fixed update on both stages and the per-operator overhead.
    assert b.total_time_s - a.total_time_s > 20 * 2 * update
