"""Partitioners: exact against brute force, the embedding/LM-head effect, plans carry the split."""

from __future__ import annotations

import itertools
import random

import pytest
from mindpipe.simulator.api import simulate
from mindpipe.simulator.costs import LayerCost
from mindpipe.traces.builtin import load_cluster
from mindpipe.traces.config import Model, even_partition
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.materialize import Problem, materialize
from mindpipe.tuner.partition import (
    balanced_partition,
    minmax_partition,
    pipedream_partition,
    rank_loads,
    refine_for_ranks,
    stage_loads,
)


def _compositions(n: int, k: int):
    """Every way to split n blocks into k non-empty stages."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield [bounds[i + 1] - bounds[i] for i in range(k)]


def _costs(loads: list[float], first: float, last: float, out_bytes: int = 1000) -> list[LayerCost]:
    layers = [LayerCost("embedding", "embedding", first / 3, first / 3, first / 3, output_bytes=out_bytes, param_count=10)]
    layers += [LayerCost(f"block.{i}", "block", x / 3, x / 3, x / 3, output_bytes=out_bytes, param_count=100)
               for i, x in enumerate(loads)]
    layers += [LayerCost("final_norm", "final_norm", 0.0, 0.0, 0.0, output_bytes=out_bytes),
               LayerCost("lm_head", "lm_head", last / 3, last / 3, last / 3, param_count=10)]
    return layers


@pytest.mark.parametrize("seed", range(12))
def test_minmax_is_optimal_against_brute_force(seed):
    rng = random.Random(seed)
    n, k = rng.randint(3, 9), rng.randint(1, 4)
    k = min(k, n)
    loads = [rng.uniform(0.5, 2.0) for _ in range(n)]
    first, last = rng.uniform(0, 3), rng.uniform(0, 6)
    caps = [rng.randint(1, n) for _ in range(k)] if seed % 2 else None
    allowed = [p for p in _compositions(n, k) if caps is None or all(c <= cap for c, cap in zip(p, caps, strict=True))]
    if not allowed:
        with pytest.raises(ContractError):
            minmax_partition(loads, k, first, last, caps)
        return
    best = min(max(stage_loads(p, loads, first, last)) for p in allowed)
    got = minmax_partition(loads, k, first, last, caps)
    assert sum(got) == n and min(got) >= 1
    if caps is not None:
        assert all(c <= cap for c, cap in zip(got, caps, strict=True))
    assert max(stage_loads(got, loads, first, last)) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_pipedream_matches_its_recurrence_by_brute_force(seed):
    rng = random.Random(100 + seed)
    n, k = rng.randint(3, 8), rng.randint(2, 4)
    k = min(k, n)
    loads = [rng.uniform(0.5, 2.0) for _ in range(n)]
    costs = _costs(loads, rng.uniform(0, 2), rng.uniform(0, 4), out_bytes=rng.choice([0, 10**6]))
    m, dp, p2p, dpb = 4, 2, 1e8, 1e9

    def cost(part: list[int]) -> float:
        # max over stages of T(i→j) and over cuts of 2·a/B, as in PipeDream's recurrence.
        blocks = [c for c in costs if c.kind == "block"]
        comp = [c.forward_s + c.backward_input_s + c.backward_weight_s for c in blocks]
        par = [float(c.param_count) for c in blocks]
        comp[0] += sum(c.forward_s + c.backward_input_s + c.backward_weight_s for c in costs if c.kind == "embedding")
        comp[-1] += sum(c.forward_s + c.backward_input_s + c.backward_weight_s for c in costs
                        if c.kind in ("final_norm", "lm_head"))
        par[0] += 10
        par[-1] += 10
        out, i = 0.0, 0
        for s, size in enumerate(part):
            t = max(m * sum(comp[i:i + size]), 4 * (dp - 1) / dp * 4 * sum(par[i:i + size]) / dpb)
            out = max(out, t)
            i += size
            if s < len(part) - 1:
                out = max(out, m * 2 * blocks[i - 1].output_bytes / p2p)
        return out

    best = min(cost(p) for p in _compositions(n, k))
    got = pipedream_partition(costs, k, num_microbatches=m, dp=dp, p2p_Bps=p2p, dp_Bps=dpb)
    assert sum(got) == n and min(got) >= 1
    assert cost(got) == pytest.approx(best, rel=1e-9)


def test_balanced_unloads_the_stage_with_the_lm_head():
    loads = [1.0] * 8
    costs = _costs(loads, first=0.2, last=4.0)
    part = balanced_partition(costs, 2, ["none"] * 8)
    assert part == [6, 2]  # 6 + 0.2 vs 2 + 4: the bottleneck drops from 8 (even, 4 + 4) to 6.2
    assert max(stage_loads(part, loads, 0.2, 4.0)) == pytest.approx(6.2)
    assert max(stage_loads(even_partition(8, 2), loads, 0.2, 4.0)) == pytest.approx(8.0)
    # Full recompute re-runs the blocks' forward (not the head's): blocks weigh 4/3 as much, so
    # the head is worth fewer blocks and the last stage takes one more.
    assert balanced_partition(costs, 2, ["full"] * 8) == [5, 3]


def test_refine_balances_ranks_with_several_chunks():
    rng = random.Random(7)
    loads = [rng.uniform(0.9, 1.1) for _ in range(40)]
    stage_to_rank = [s % 8 for s in range(16)]  # interleaved, loop placement
    start = minmax_partition(loads, 16, 0.1, 0.8)
    refined = refine_for_ranks(start, loads, 0.1, 0.8, stage_to_rank)
    assert sum(refined) == 40 and min(refined) >= 1
    before = max(rank_loads(start, loads, 0.1, 0.8, stage_to_rank))
    after = max(rank_loads(refined, loads, 0.1, 0.8, stage_to_rank))
    assert after <= before
    assert after <= (sum(loads) + 0.9) / 8 + 1.1 + 1e-9  # within one block of the ideal share


WIDE_VOCAB = Model(kind="gpt", num_layers=8, hidden_size=512, num_heads=8, seq_len=128, vocab_size=50257,
                   name="wide-vocab")


def test_balanced_beats_even_by_15_percent_when_embedding_and_head_are_large():
    """The simulated half of issue 6's partition acceptance (benchmarks/tune_partition.py has the plans)."""
    cluster = load_cluster("cpu:1x2")
    point = dict(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=8, schedule="1f1b", virtual_stages=1,
                 recompute="none", sequence_parallel=False, zero_stage=0, comm_priority="fair", precision="fp32",
                 overlap_grad_reduce=True, rank_order="tp-dp-pp")
    problem = Problem(WIDE_VOCAB, cluster)
    even = materialize(problem, dict(point, partitioner="even"))
    bal = materialize(problem, dict(point, partitioner="balanced"))
    assert even.plan.partition == [4, 4]
    assert bal.plan.partition[-1] < bal.plan.partition[0]  # the LM-head stage gets fewer blocks
    t_even = simulate(WIDE_VOCAB, cluster, even.plan).iteration_time_s
    t_bal = simulate(WIDE_VOCAB, cluster, bal.plan).iteration_time_s
    assert t_bal <= 0.85 * t_even


def test_memory_caps_turn_an_overflowing_split_into_one_that_fits():
    model = Model(kind="gpt", num_layers=24, hidden_size=2048, num_heads=16, seq_len=2048, vocab_size=51200)
    cluster = load_cluster("a100-sxm4-40gb:1x8")
    point = dict(dp=1, tp=1, pp=8, micro_batch_size=8, global_batch_size=64, schedule="1f1b", virtual_stages=1,
                 recompute="none", sequence_parallel=False, zero_stage=0, comm_priority="fair", precision="bf16",
                 overlap_grad_reduce=True, rank_order="tp-dp-pp", partitioner="balanced")
    free = materialize(Problem(model, cluster, memory_caps=False), point)
    capped = materialize(Problem(model, cluster), point)
    assert not free.fits  # time-only balance piles blocks on early stages, which hold 8 micro-batches
    assert capped.fits and sum(capped.plan.partition) == 24
    # The simulator's own memory model agrees with the partitioner's caps.
    assert simulate(model, cluster, capped.plan).fits_in_memory


def test_several_chunks_per_rank_offer_the_descent_from_equal_chunks_too():
    from mindpipe.tuner.partition import balanced_candidates

    costs = _costs([1.0] * 80, first=0.15, last=1.4)
    loop = [s % 4 for s in range(20)]  # interleaved, 4 ranks x 5 chunks
    assert len(balanced_candidates(costs, 4, ["none"] * 80, list(range(4)))) == 1  # one chunk per rank
    first, second = balanced_candidates(costs, 20, ["none"] * 80, loop)
    assert first == balanced_partition(costs, 20, ["none"] * 80, loop)
    assert min(first[:4]) == 1  # the min-max fill leaves the first chunks one block
    assert max(second) - min(second) <= 2  # the descent from equal chunks keeps them nearly equal
    loads = [1.0] * 80
    assert max(rank_loads(second, loads, 0.15, 1.4, loop)) == pytest.approx(max(rank_loads(first, loads, 0.15, 1.4, loop)))
    # Equal chunks that break the memory caps are not offered.
    assert len(balanced_candidates(costs, 20, ["none"] * 80, loop, caps=[3] * 10 + [6] * 10)) == 1


def test_the_tuner_keeps_the_faster_candidate_with_its_simulation():
    from mindpipe.traces.builtin import load_model
    from mindpipe.tuner.keys import plan_of

    problem = Problem(load_model("llama3-70b"), load_cluster("h100-sxm5-80gb:8x8"))
    sim = problem.simulator()
    point = dict(dp=2, tp=4, pp=4, cp=2, micro_batch_size=1, global_batch_size=128, schedule="interleaved_1f1b",
                 virtual_stages=5, sequence_parallel=True, zero_stage=1, flash_attention=True, partitioner="balanced")
    mat = materialize(problem, point, sim)
    plan = plan_of(point)
    costs, s2r = sim.layer_costs(plan), sim.schedule(plan).stage_to_rank
    from mindpipe.tuner.partition import balanced_candidates

    candidates = balanced_candidates(costs, 20, ["none"] * 80, s2r, sim.block_caps(plan))
    assert len(candidates) == 2 and mat.plan.partition in candidates
    times = [sim.run(plan_of(point, None, c)).iteration_time_s for c in candidates]
    assert mat.result is not None and mat.result.iteration_time_s == pytest.approx(min(times), rel=1e-12)
    assert mat.plan.partition == candidates[times.index(min(times))]


def test_pipedream_weighs_a_tied_heads_copy_of_the_table():
    """A tied head on a stage of its own holds a copy of the token table; PipeDream's weight-sync
    term must see it (simulator/build.py with_tied_copy), as the simulated gradient reduction does."""
    import dataclasses

    from mindpipe.simulator.build import with_tied_copy
    from mindpipe.traces.builtin import load_model
    from mindpipe.tuner.keys import plan_of
    from mindpipe.tuner.partition import make_partition

    # Vocabulary 128,256 x 2,048: the table is ~21 % of the model. Short sequences, one micro-batch
    # per iteration and fused element-wise kernels make the weight sync outweigh the compute.
    model = dataclasses.replace(load_model("llama3.2-1b"), seq_len=512, name="llama3.2-1b-s512")
    assert model.tie_embeddings
    problem = Problem(model, load_cluster("a100-sxm4-80gb:8x8"))
    sim = problem.simulator()
    point = dict(dp=16, tp=1, pp=4, micro_batch_size=1, global_batch_size=16, schedule="gpipe", virtual_stages=1,
                 recompute="none", sequence_parallel=False, zero_stage=0, precision="bf16", partitioner="pipedream",
                 fused_elementwise=True)
    plan = plan_of(point)
    costs = sim.layer_costs(plan)
    tied = with_tied_copy(costs, model, plan)
    assert costs[-1].name == tied[-1].name == "lm_head"
    assert costs[-1].param_count == 0 and tied[-1].param_count == 128_256 * 2_048
    assert with_tied_copy(costs, model, plan_of(dict(point, pp=1, dp=16))) is costs  # one stage: no copy

    def part(c):
        return make_partition("pipedream", c, plan, num_layers=model.num_layers,
                              bandwidths=sim.link_bandwidths(plan))

    blind, seen = part(costs), part(tied)
    assert seen[-1] < blind[-1]  # the stage that syncs the copy's gradients gets fewer blocks
    assert materialize(problem, point, sim).plan.partition == seen
    t_blind, t_seen = (sim.run(plan_of(point, None, p)).iteration_time_s for p in (blind, seen))
    assert t_seen < t_blind
