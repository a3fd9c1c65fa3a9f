"""The planners' view of the simulator: stage budgets equal the memory model, swap is priced by the engine."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.planning import exposed_swap_s
from mindpipe.simulator.simulator import Simulator
from mindpipe.simulator.work import swap_out_tail_s, swap_stream_window_s
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_policies, stage_layout


@pytest.fixture(scope="module")
def sim() -> Simulator:
    return Simulator(load_model("gpt-1.3b"), load_cluster("a100-sxm4-40gb:1x4"))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb_h1"])
@pytest.mark.parametrize("policy", [
    ["keep"] * 24,
    ["recompute"] * 24,
    ["keep"] * 10 + ["swap"] * 4 + ["recompute"] * 10,
    ["swap", "keep"] * 12,
])
def test_stage_budget_equals_stage_memory(sim, schedule, policy):
    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=3, global_batch_size=24, schedule=schedule,
                partition=[5, 7, 8, 4], layer_memory_policy=policy)
    budgets = sim.stage_budgets(plan)
    pols = block_policies(plan, 24)
    for span, budget, rm in zip(stage_layout(plan, sim.model), budgets, sim.memory(plan), strict=True):
        mine = budget.memory(pols[span.first_block:span.first_block + span.num_blocks])
        assert mine == rm
        assert budget.total_bytes(pols[span.first_block:span.first_block + span.num_blocks]) == rm.total_bytes
    # zb_h1 holds activations until W (torch's I keeps the graph): min(p, m) on every rank.
    assert [b.in_flight for b in budgets] == {"1f1b": [4, 3, 2, 1], "gpipe": [8] * 4, "zb_h1": [4] * 4}[schedule]


def test_stage_budgets_refuse_interleaving(sim):
    plan = Plan(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4, schedule="interleaved_1f1b",
                virtual_stages=2)
    with pytest.raises(ContractError, match="one stage per pipeline rank"):
        sim.stage_budgets(plan)


def test_exposed_swap_closed_form():
    assert exposed_swap_s(1.0, 2.0) == 0.0  # hides in the forward
    assert exposed_swap_s(3.0, 2.0) == pytest.approx(1.0)  # longer than the forward window
    assert exposed_swap_s(2.0, 2.0) == 0.0  # out and back on separate directions of the link
    assert exposed_swap_s(1.0, 2.0, 1.0) == pytest.approx(2.0)  # backward right after its forward: the round trip
    assert exposed_swap_s(3.0, 2.0, 0.5) == pytest.approx(0.5 * 6.0 + 0.5 * 1.0)
    # the copy out streaming 2 s beside the forward: 1 s of it left after the forward, then the copy back
    assert exposed_swap_s(3.0, 2.0, 1.0, stream_s=2.0, tail_s=0.5) == pytest.approx(1.0 + 3.0)
    # never less than the last block's share, which starts at the forward's end
    assert exposed_swap_s(3.0, 9.0, 1.0, stream_s=9.0, tail_s=0.75) == pytest.approx(0.75 + 3.0)
    assert swap_stream_window_s([1.0, 2.0, 4.0], [False, True, False]) == 6.0
    assert swap_stream_window_s([1.0, 2.0], [False, False]) == 0.0
    assert swap_out_tail_s(3.0, 4) == 0.75 and swap_out_tail_s(0.0, 0) == 0.0


def test_round_trip_share_is_where_a_backward_follows_its_own_forward(sim):
    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=8)
    assert [b.round_trip_share for b in sim.stage_budgets(plan)] == [0.0, 0.0, 0.0, 1.0]
    one = Plan(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=4)
    assert [b.round_trip_share for b in sim.stage_budgets(one)] == [1.0]


def test_the_planners_swap_price_is_the_engines_on_the_last_stage():
    """Swapping every block of 1F1B's last stage: the engine's iteration grows by the exposed
    round trip per micro-batch the planners price (to within the other stages' slack)."""
    sim = Simulator(load_model("gpt-13b"), load_cluster("a100-sxm4-40gb:1x4"))
    base = Plan(dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=16, partition=[10, 10, 10, 10])
    keep = sim.run(dataclasses.replace(base, layer_memory_policy=["keep"] * 40)).iteration_time_s
    last = sim.run(dataclasses.replace(base, layer_memory_policy=["keep"] * 30 + ["swap"] * 10)).iteration_time_s
    budgets = sim.stage_budgets(base)
    blocks = [c for c in sim.layer_costs(base) if c.kind == "block"][:10]
    copy10 = sim.swap_copy_s(base, 10 * sim.swap_bytes_per_block(base))
    fwds = [c.forward_s for c in blocks]
    stream = swap_stream_window_s(fwds, [True] * 10)
    assert stream == pytest.approx(sum(fwds))
    per_mb = exposed_swap_s(copy10, sum(fwds), budgets[3].round_trip_share, stream, swap_out_tail_s(copy10, 10))
    # the copy out streams beside the forward, its last block's share after it; the copy back in the open
    assert per_mb == pytest.approx(max(copy10 / 10, copy10 - stream) + copy10)
    assert per_mb < 2 * copy10
    assert last - keep == pytest.approx(base.num_microbatches * per_mb, rel=0.1)


def test_swap_copy_is_the_host_link(sim):
    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=4)
    n = sim.swap_bytes_per_block(plan)
    t = sim.swap_copy_s(plan, n)
    assert t > n / (sim.device.pcie_bandwidth_GBps * 1e9) * 0.99
    assert sim.swap_copy_s(plan, 0.0) == 0.0


def test_engine_hides_a_swap_that_fits_its_window():
    """One swapped block per stage copies within the stage's forward: no slower than keeping it;
    swapping every block does not hide (exposed_swap_s > 0), and the engine's iteration grows.
    Not on the last stage: there each backward directly follows its own forward, so its swapped
    bytes make the round trip in the open (``test_first_principles``)."""
    sim = Simulator(load_model("gpt-13b"), load_cluster("a100-sxm4-40gb:1x4"))
    base = Plan(dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=16, partition=[10, 10, 10, 10])
    keep = sim.run(dataclasses.replace(base, layer_memory_policy=["keep"] * 40)).iteration_time_s
    one = (["keep"] * 9 + ["swap"]) * 3 + ["keep"] * 10
    blocks = [c for c in sim.layer_costs(base) if c.kind == "block"][:10]
    fwd = sum(c.forward_s for c in blocks)
    copy1 = sim.swap_copy_s(base, sim.swap_bytes_per_block(base))
    assert exposed_swap_s(copy1, fwd) == 0.0
    assert sim.run(dataclasses.replace(base, layer_memory_policy=one)).iteration_time_s == pytest.approx(keep, rel=1e-6)
    copy10 = sim.swap_copy_s(base, 10 * sim.swap_bytes_per_block(base))
    assert exposed_swap_s(copy10, fwd) > 0.0
    every = sim.run(dataclasses.replace(base, layer_memory_policy=["swap"] * 40)).iteration_time_s
    assert every > keep * 1.05


@pytest.mark.parametrize("cuts", [
    ["after_attention", "between_blocks", "after_attention"],
    ["after_attention"] * 3,
])
@pytest.mark.parametrize("policy", [
    ["keep"] * 24,
    ["keep"] * 5 + ["recompute"] * 2 + ["swap"] * 6 + ["recompute"] * 11,
    ["swap", "recompute", "keep"] * 8,
])
def test_stage_budget_equals_stage_memory_on_cut_plans(sim, cuts, policy):
    """A stage that starts with a block's MLP part or ends with its attention part is priced by its
    budget exactly as Simulator.memory prices it."""
    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=3, global_batch_size=24, partition=[5, 7, 8, 4],
                layer_memory_policy=policy, stage_cuts=cuts)
    pols = block_policies(plan, 24)
    spans = stage_layout(plan, sim.model)
    assert any(s.first_part == "mlp" for s in spans) and any(s.last_part == "attention" for s in spans)
    for span, budget, rm in zip(spans, sim.stage_budgets(plan), sim.memory(plan), strict=True):
        mine, parts = [pols[b] for b in span.blocks], [span.part(b) for b in span.blocks]
        assert budget.memory(mine, parts) == rm
        assert budget.total_bytes(mine, parts) == rm.total_bytes
        assert budget.fits(mine, parts) == rm.fits
