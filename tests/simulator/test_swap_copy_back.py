"""``Plan.swap_copy_back``: a stage's swapped blocks prefetched (vPipe) or copied back as asked.

One rule (:func:`mindpipe.simulator.actions.prefetched_backward` with the plan's lazy stages) for
the memory model, the engine, the planners' price and the executor; DawnPiper's planner takes the
lazy copy where nothing fits with the prefetch (its exposed swap).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from mindpipe.simulator.actions import Action, prefetched_backward
from mindpipe.simulator.planning import exposed_swap_s
from mindpipe.simulator.schedules import build_schedule
from mindpipe.simulator.simulator import Simulator
from mindpipe.simulator.work import swap_out_tail_s, swap_stream_window_s
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_policies, lazy_copy_back, stage_layout
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.tuner.materialize import Problem, materialize
from mindpipe.tuner.maxbatch import base_point, point_at

SWAP_STAGE0 = ["swap"] * 10 + ["keep"] * 30


@pytest.fixture(scope="module")
def sim() -> Simulator:
    return Simulator(load_model("gpt-13b"), load_cluster("a100-sxm4-40gb:1x4"))


def _plan(**kw) -> Plan:
    return Plan(dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=16, partition=[10, 10, 10, 10], **kw)


def test_contract_round_trip_and_refusals() -> None:
    plan = Plan(pp=2, global_batch_size=4, swap_copy_back=["lazy", "prefetch"])
    assert from_dict(Plan, json.loads(json.dumps(to_dict(plan))), "plan.json") == plan
    assert lazy_copy_back(plan) == {0} and lazy_copy_back(Plan(pp=2, global_batch_size=4)) == frozenset()
    for data, key, rule in [
        ({"pp": 2, "swap_copy_back": ["lazy"]}, "swap_copy_back", "expected one per stage pp×virtual_stages=2"),
        ({"pp": 2, "swap_copy_back": ["lazy", "eager"]}, "swap_copy_back[1]", "is not one of prefetch, lazy"),
        ({"pp": 2, "swap_copy_back": "lazy"}, "swap_copy_back", "must be a list"),
    ]:
        with pytest.raises(ContractError) as e:
            from_dict(Plan, {"global_batch_size": 4, **data}, "plan.json")
        assert e.value.source == "plan.json" and e.value.key == key and rule in e.value.rule


def test_a_lazy_stage_is_never_prefetched() -> None:
    s = build_schedule("1f1b", 4, 8)
    first = s.orders[0]
    assert prefetched_backward(first, 3) == Action(0, "B", 0)
    assert prefetched_backward(first, 3, {0}) is None
    assert prefetched_backward(first, 3, {1}) == Action(0, "B", 0)  # another stage's choice
    assert [s.prefetched_sets(i, {0, 2}) for i in range(4)] == [0, 2, 0, 0]


def test_lazy_stage_memory_is_the_budget_and_below_the_prefetch(sim) -> None:
    prefetch = _plan(layer_memory_policy=SWAP_STAGE0)
    lazy = dataclasses.replace(prefetch, swap_copy_back=["lazy", "prefetch", "prefetch", "prefetch"])
    a, b = sim.memory(prefetch), sim.memory(lazy)
    assert b[0].total_bytes < a[0].total_bytes  # no block back whole before the backward, none one ahead
    assert [r.total_bytes for r in a[1:]] == [r.total_bytes for r in b[1:]]
    pols = block_policies(lazy, 40)
    for span, budget, rm in zip(stage_layout(lazy, sim.model), sim.stage_budgets(lazy), b, strict=True):
        assert budget.memory(pols[span.first_block:span.first_block + span.num_blocks]) == rm
    # StageBudget.lazy() is the planners' way to the same figure without a plan
    assert sim.stage_budgets(prefetch)[0].lazy().memory(["swap"] * 10 + []) == b[0]  # type: ignore[list-item]


def test_lazy_copy_back_runs_at_the_backward_in_the_open_as_priced(sim) -> None:
    """The engine starts a lazy stage's copies back at its backward, which waits for all of them:
    the iteration grows by what :func:`exposed_swap_s` prices for the stage per micro-batch."""
    keep = sim.run(_plan(layer_memory_policy=["keep"] * 40), timeline=True)
    prefetch = sim.run(_plan(layer_memory_policy=SWAP_STAGE0), timeline=True)
    plan = _plan(layer_memory_policy=SWAP_STAGE0, swap_copy_back=["lazy", "prefetch", "prefetch", "prefetch"])
    lazy = sim.run(plan, timeline=True)
    assert keep.iteration_time_s < prefetch.iteration_time_s < lazy.iteration_time_s
    blocks = [c for c in sim.layer_costs(plan) if c.kind == "block"][:10]
    fwd = sum(c.forward_s for c in blocks) + sum(c.forward_s for c in sim.layer_costs(plan) if c.kind == "embedding")
    copy10 = sim.swap_copy_s(plan, 10 * sim.swap_bytes_per_block(plan))
    stream = swap_stream_window_s([c.forward_s for c in blocks], [True] * 10)
    per_mb = exposed_swap_s(copy10, fwd, 0.0, stream, swap_out_tail_s(copy10, 10), lazy=True)
    assert per_mb == copy10
    # stage 0's slack in 1F1B absorbs a little of it (0.908 of m × copy here)
    assert lazy.iteration_time_s - keep.iteration_time_s == pytest.approx(plan.num_microbatches * per_mb, rel=0.15)

    def starts(res, label: str) -> dict[str, float]:
        return {e.name.split()[1]: e.start_s for e in res.timeline
                if e.rank == 0 and e.name.startswith(label) and not e.name.endswith("(during)")}

    # two swapped blocks: their copy out keeps up with the forwards, so a prefetch runs ahead
    two = _plan(layer_memory_policy=["swap"] * 2 + ["keep"] * 38)
    runs = [sim.run(two, timeline=True), sim.run(dataclasses.replace(two, swap_copy_back=plan.swap_copy_back),
                                                 timeline=True)]
    for res, ahead in zip(runs, (True, False), strict=True):
        computes = sorted((e.start_s, e.end_s, e.name) for e in res.timeline if e.rank == 0 and e.thread == "compute")
        back = starts(res, "swap-in")
        assert back
        for name, t in back.items():
            i = next(k for k, c in enumerate(computes) if c[2] == name)
            # prefetched: under the action before the backward; lazy: from the backward's turn on
            assert (t < computes[i - 1][1]) if ahead else (t >= computes[i - 1][1] - 1e-12), (name, ahead)


def test_dawnpiper_copies_back_lazily_only_where_the_prefetch_cannot_fit() -> None:
    """gpt-1.3b on 4 A100-40GB, the fused head loss, 95 samples per micro-batch: nothing fits
    vPipe's rule (it prefetches), DawnPiper's plan fits by copying back lazily on the first three
    stages, and the same plan prefetching does not fit (the simulator's memory)."""
    problem = Problem(load_model("gpt-1.3b"), load_cluster("a100-sxm4-40gb:1x4"))
    fixes = {"loss_chunks": 16, "fused_head_loss": True}
    dawn = materialize(problem, point_at(base_point(1, 1, 4, "dawnpiper", fixes), 95, 4))
    assert dawn.fits and dawn.plan.swap_copy_back is not None
    lazy = lazy_copy_back(dawn.plan)
    assert lazy and 3 not in lazy  # 1F1B's last stage prefetches nothing anyway
    pols = block_policies(dawn.plan, 24)
    spans = stage_layout(dawn.plan, problem.gpt)
    assert all(any(pols[b] == "swap" for b in spans[s].blocks) for s in lazy)
    sim = problem.simulator()
    eager = sim.memory(dataclasses.replace(dawn.plan, swap_copy_back=None))
    assert not all(r.fits for r in eager)
    assert not materialize(problem, point_at(base_point(1, 1, 4, "vpipe", fixes), 95, 4)).fits
    # where the prefetch fits, DawnPiper prefetches
    assert materialize(problem, point_at(base_point(1, 1, 4, "dawnpiper", fixes), 40, 4)).plan.swap_copy_back is None


def test_swapped_activations_are_held_on_the_host_and_must_fit_there() -> None:
    """Each swapped micro-batch's copies stay on the host until its backward: 1F1B's stage s holds
    min(p − s, m) of them. A plan whose copies exceed the host memory per device (the DGX A100
    640GB's 2 TiB over 8 GPUs) does not fit, though the device does; the message names the host."""
    sim = Simulator(load_model("gpt-13b"), load_cluster("a100-sxm4-80gb:1x4"))
    policy = ["swap"] * 10 + ["recompute"] * 30
    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=8, global_batch_size=128, partition=[10] * 4,
                layer_memory_policy=policy)
    per_mb = 10 * sim.swap_bytes_per_block(plan)
    mem = sim.memory(plan)
    assert mem[0].host_bytes == 4 * per_mb and [r.host_bytes for r in mem[1:]] == [0.0] * 3
    assert mem[0].host_capacity_bytes == 256 * 2**30 and mem[0].fits
    big = dataclasses.replace(plan, micro_batch_size=15, global_batch_size=240)
    over = sim.memory(big)[0]
    assert over.host_bytes == 15 / 8 * 4 * per_mb > over.host_capacity_bytes and over.total_bytes <= over.capacity_bytes
    assert not over.fits
    res = sim.run(big)
    assert not res.fits_in_memory and res.extra.fits_in_device_memory
    assert res.extra.host_memory_by_stage_gib[0] == over.host_bytes / 2**30
    with pytest.raises(ContractError, match=r"pipeline rank 0 swaps an estimated 375\.00 GiB of activations to host "
                                            r"memory, but a100-sxm4-80gb's host has 256\.00 GiB per device"):
        sim.refuse_unless_fits(big)
    assert sim.run(dataclasses.replace(plan, layer_memory_policy=["recompute"] * 40)).extra.host_memory_by_stage_gib == []


def test_the_planners_keep_the_swapped_copies_within_the_host() -> None:
    """gpt-13b on 8 A100-40GB: a plan they return that fits keeps its swapped copies within the
    host memory per GPU (the simulator's verdict is theirs); at 8 samples per micro-batch
    DawnPiper's plan fits using most of the host's 128 GiB on some rank."""
    problem = Problem(load_model("gpt-13b"), load_cluster("a100-sxm4-40gb:1x8"))
    sim = problem.simulator()
    for name in ("vpipe", "dawnpiper"):
        for mbs in (4, 8):
            mat = materialize(problem, point_at(base_point(1, 1, 8, name, {}), mbs, 8))
            mem = sim.memory(mat.plan)
            assert mat.fits == all(r.fits for r in mem)
            if mat.fits:
                assert all(r.host_bytes <= r.host_capacity_bytes for r in mem)
    dawn = materialize(problem, point_at(base_point(1, 1, 8, "dawnpiper", {}), 8, 8))
    assert dawn.fits and max(r.host_bytes for r in sim.memory(dawn.plan)) > 0.75 * 128 * 2**30


def test_a_split_backwards_w_copies_its_swapped_gemm_inputs_back_in_the_open(sim) -> None:
    """Under ZB-H1 (I and W apart) torch keeps I's graph for W, and W's weight-gradient GEMMs
    unpack their inputs X again (dW = Xᵀ·dY): on a GPU the executor copies them back on the compute
    stream, so each W of a swapped stage waits for ``swapped × swap_weight_reread_bytes`` on the host
    link. The engine runs that copy before W's compute and the planners' stage price adds it."""
    from mindpipe.simulator.costs import swap_weight_reread_bytes
    from mindpipe.tuner.memsplit import stage_model

    plan = _plan(layer_memory_policy=SWAP_STAGE0, schedule="zb_h1")
    reread = sim.swap_reread_bytes_per_block(plan)
    assert reread == swap_weight_reread_bytes(sim.model, plan) > 0
    assert sim.swap_reread_bytes_per_block(_plan(layer_memory_policy=SWAP_STAGE0)) == 0.0  # 1F1B: B unpacks once
    res = sim.run(plan, timeline=True)
    copy = sim.swap_copy_s(plan, 10 * reread)
    w_copies = {e.name.split()[1]: e for e in res.timeline if e.rank == 0 and e.category == "swap"
                and e.name.startswith("swap-in") and "W" in e.name}
    ws = {e.name: e for e in res.timeline if e.rank == 0 and e.thread == "compute" and e.name.startswith("0W")}
    assert sorted(w_copies) == sorted(ws) and len(ws) == plan.num_microbatches
    for name, e in w_copies.items():
        assert e.end_s - e.start_s >= copy * (1 - 1e-9)  # alone or sharing the link, never faster
        assert ws[name].start_s >= e.end_s - 1e-12  # W's compute waits for it
    # no copy for the stages that swap nothing, nor without a split backward
    assert not any(e.rank != 0 and e.category == "swap" for e in res.timeline)
    one_f1b = sim.run(_plan(layer_memory_policy=SWAP_STAGE0), timeline=True)
    assert not any("W" in e.name for e in one_f1b.timeline if e.category == "swap")
    # the planners price the same copy per micro-batch on the stage
    sm = stage_model(sim, plan)
    assert sm.reread_bytes == reread
    with_w = sm.time_of(0, 0, 10, ["swap"] * 10)
    sm.reread_bytes = 0.0
    assert with_w - sm.time_of(0, 0, 10, ["swap"] * 10) == pytest.approx(copy)
