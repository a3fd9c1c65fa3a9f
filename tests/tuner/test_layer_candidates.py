"""Per-layer candidate lists (``layer_candidates``): the contract, the sampler, conflicts, costs, memory, partition.

A space whose layers choose from their own lists (here: attention and FFN in the lower half,
convolutions in the upper half of ``supernet-mini``'s pool) must be priced, sampled and split as
the lists say, and a supernet without lists must behave exactly as before.
"""

from __future__ import annotations

import pytest
from mindpipe.simulator.subnet_costs import PartCost, SupernetCosts, hardware_costs
from mindpipe.simulator.subnet_sim import SupernetSimulator
from mindpipe.traces.builtin import load_cluster, load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import (
    Supernet,
    check_choices,
    conflict_probability,
    sample_subnets,
    stage_conflict_probability,
)
from mindpipe.tuner.subnet_partition import balanced_supernet_partition, expected_stage_loads, layer_loads

BASE = load_supernet("supernet-mini")
POOL = [c.name for c in BASE.candidates]  # attn2 attn4 ffn128 ffn256 sepconv3 lwconv5
LOWER, UPPER = POOL[:4], POOL[4:]


def _net(lists: list[list[str]] | None, **extra: object) -> Supernet:
    return from_dict(Supernet, {**to_dict(BASE), "layer_candidates": lists, **extra}, "s.json")


SPLIT = _net([LOWER] * 4 + [UPPER] * 4)


def test_lists_narrow_each_layer_and_keep_pool_indices():
    assert SPLIT.layer_choices(0) == (0, 1, 2, 3) and SPLIT.layer_choices(7) == (4, 5)
    assert not SPLIT.uniform_layers and BASE.uniform_layers
    assert _net([list(reversed(POOL))] * 8).uniform_layers  # every list holds the whole pool
    assert "2–4 per layer" in SPLIT.describe() and "per layer" not in BASE.describe()
    h = BASE.hidden_size
    lower = sum(c.param_count(h) for c in BASE.candidates[:4])
    upper = sum(c.param_count(h) for c in BASE.candidates[4:])
    assert SPLIT.param_count() == BASE.shared_param_count() + 4 * lower + 4 * upper
    assert BASE.param_count() == BASE.shared_param_count() + 8 * (lower + upper)


@pytest.mark.parametrize("lists,rule", [
    ([LOWER] * 3, r"one list of candidate names per choice layer \(8\), got 3 lists"),
    ([LOWER] * 7 + [[]], r"layer_candidates\[7\]=\[\] must be a non-empty list"),
    ([LOWER] * 7 + [["conv9"]], r"'conv9' is not a candidate name \(the pool: attn2"),
    ([POOL] * 7 + [["attn2", "attn2"]], "'attn2' is listed twice"),
    ([LOWER] * 8, "candidate 'sepconv3' is in no layer's list"),
])
def test_bad_lists_are_one_line_contract_errors(lists, rule):
    with pytest.raises(ContractError, match=rule) as e:
        _net(lists)
    assert "\n" not in str(e.value) and "layer_candidates" in str(e.value)


def test_choices_outside_a_layers_list_are_refused():
    check_choices(SPLIT, (0, 1, 2, 3, 4, 5, 4, 5))
    with pytest.raises(ContractError, match=r"choices\[7\]=0 \(attn2\) is not in layer 7's list"):
        check_choices(SPLIT, (0, 1, 2, 3, 4, 5, 4, 0))


def test_sampler_draws_uniformly_within_each_list_and_the_default_stream_is_unchanged():
    subnets = sample_subnets(SPLIT, 3000)
    for layer in range(8):
        allowed = SPLIT.layer_choices(layer)
        seen = [s[layer] for s in subnets]
        assert set(seen) == set(allowed)
        for k in allowed:  # 1/K_l each, within 4 binomial standard deviations
            p = 1 / len(allowed)
            assert abs(seen.count(k) / len(seen) - p) < 4 * (p * (1 - p) / len(seen)) ** 0.5
    # No lists: the stream is the pool-wide draw it always was.
    assert sample_subnets(_net(None), 50) == sample_subnets(BASE, 50)


def test_conflict_probability_is_one_minus_the_product_over_the_layers():
    assert stage_conflict_probability(SPLIT, 0, 4) == pytest.approx(1 - (3 / 4) ** 4)
    assert stage_conflict_probability(SPLIT, 4, 4) == pytest.approx(1 - (1 / 2) ** 4)
    assert stage_conflict_probability(SPLIT, 2, 4) == pytest.approx(1 - (3 / 4) ** 2 * (1 / 2) ** 2)
    assert stage_conflict_probability(BASE, 0, 4) == conflict_probability(6, 4)


def test_simulated_conflict_rate_matches_the_per_list_formula():
    net = _net([LOWER] * 4 + [UPPER] * 4)
    plan = from_dict(Plan, {"pp": 2, "micro_batch_size": 2, "global_batch_size": 2})
    res = SupernetSimulator(net, load_cluster("cpu:1x2")).run(plan, num_subnets=4000)
    for stage in res.stages:
        assert abs(stage.conflict_rate - stage.conflict_rate_closed_form) < 0.02
    assert [s.conflict_rate_closed_form for s in res.stages] == pytest.approx([1 - 0.75 ** 4, 1 - 0.5 ** 4])


def test_costs_and_memory_hold_only_each_layers_candidates():
    plan = from_dict(Plan, {"pp": 2, "micro_batch_size": 2, "global_batch_size": 2, "subnet_schedule": "sequential"})
    costs = hardware_costs(SPLIT, plan, SupernetSimulator(SPLIT, load_cluster("cpu:1x2")).compute)
    every = [c.param_count for c in costs.candidates]
    assert costs.stage_params(0, 4, True, False)[1] == 4 * sum(every[:4])
    assert costs.stage_params(4, 4, False, True)[1] == 4 * sum(every[4:])
    sim = SupernetSimulator(SPLIT, load_cluster("cpu:1x2"))
    off = sim.run(plan, num_subnets=20, context_switching=False)
    base = SupernetSimulator(BASE, load_cluster("cpu:1x2")).run(plan, num_subnets=20, context_switching=False)
    assert [s.memory.param_count for s in off.stages] == [
        SPLIT.shared_param_count() - SPLIT.hidden_size * SPLIT.vocab_size - 2 * SPLIT.hidden_size
        + 4 * sum(every[:4]), SPLIT.hidden_size * SPLIT.vocab_size + 2 * SPLIT.hidden_size + 4 * sum(every[4:])]
    assert all(a.memory.param_count < b.memory.param_count for a, b in zip(off.stages, base.stages, strict=True))


def _costs(net: Supernet, cand: list[float], head: float = 0.0) -> SupernetCosts:
    def part(x: float) -> PartCost:
        return PartCost(forward_s=x / 3, backward_input_s=x / 3, backward_weight_s=x / 3)

    return SupernetCosts(net, tuple(part(x) for x in cand), part(0.0), part(head), "test")


def test_balanced_partition_weighs_each_layer_by_its_own_list():
    # Lower layers cost 1 in expectation, upper layers 3: min-max over 2 stages puts 6 layers on one, 2 on the other.
    costs = _costs(SPLIT, [1.0, 1.0, 1.0, 1.0, 3.0, 3.0])
    assert layer_loads(costs) == pytest.approx([1.0] * 4 + [3.0] * 4)
    part = balanced_supernet_partition(costs, 2)
    assert part == [5, 3]  # loads 4+3=7 and 9 beat the even [4, 4] (4 and 12)
    assert max(expected_stage_loads(costs, part)) == pytest.approx(9.0)
    assert max(expected_stage_loads(costs, [4, 4])) == pytest.approx(12.0)
    # Without lists every layer costs the mean of the pool: the even split.
    assert balanced_supernet_partition(_costs(BASE, [1.0, 1.0, 1.0, 1.0, 3.0, 3.0]), 2) == [4, 4]


def test_equal_layer_means_from_different_lists_split_as_the_water_fill():
    # Two lists of equal mean cost: no layer is heavier, so min-max alone would be free to pile layers up.
    net = _net([POOL[:3]] * 4 + [POOL[3:]] * 4)
    costs = _costs(net, [1.0, 2.0, 3.0, 2.0, 2.0, 2.0], head=4.0)
    assert layer_loads(costs) == pytest.approx([2.0] * 8)
    # The heavy head makes the bottleneck 6 (its stage: one layer + the head); min-max filled from the
    # back gave [1, 3, 3, 1], three layers where two do.
    assert balanced_supernet_partition(costs, 4) == balanced_supernet_partition(_costs(BASE, [2.0] * 6, 4.0), 4) \
        == [2, 2, 3, 1]


def test_unequal_layers_keep_the_bottleneck_and_spread_the_rest_evenly():
    import itertools

    from mindpipe.tuner.partition import minmax_partition, stage_loads
    from mindpipe.tuner.subnet_partition import even_minmax_partition

    rng = __import__("random").Random(7)
    for _ in range(150):
        n = rng.randint(2, 11)
        p = rng.randint(1, n)
        loads = [rng.choice([1.0, 1.5, 2.0, 3.0]) for _ in range(n)]
        first, last = rng.choice([0.0, 0.5, 3.0]), rng.choice([0.0, 2.0, 6.0])
        got = even_minmax_partition(loads, p, first, last)
        bottleneck = max(stage_loads(minmax_partition(loads, p, first, last), loads, first, last))
        assert len(got) == p and min(got) >= 1 and sum(got) == n
        assert max(stage_loads(got, loads, first, last)) <= bottleneck * (1 + 1e-9)
        best = min(sum(x * x for x in stage_loads(part, loads, first, last))
                   for cuts in itertools.combinations(range(1, n), p - 1)
                   for part in [[b - a for a, b in zip((0, *cuts), (*cuts, n), strict=True)]]
                   if max(stage_loads(part, loads, first, last)) <= bottleneck * (1 + 1e-9))
        assert sum(x * x for x in stage_loads(got, loads, first, last)) == pytest.approx(best)


def test_a_trace_of_the_same_names_with_other_settings_is_refused():
    from mindpipe.simulator.subnet_costs import check_candidate_trace
    from mindpipe.traces.trace import LayerRecord, Provenance, Trace

    data = to_dict(BASE)
    data["candidates"][2]["ffn_hidden_size"] = 96  # ffn128 profiled at another width
    other = from_dict(Supernet, data)

    def trace(net: Supernet) -> Trace:
        recs = [LayerRecord("embedding", "embedding", 1e-4, 0.0, 0.0), LayerRecord("head", "head", 1e-4, 1e-4, 0.0)]
        recs += [LayerRecord(f"candidate.{c.name}", c.op, 1e-4, 1e-4, 1e-4) for c in net.candidates]
        return Trace("cpu", "fp32", recs, Provenance("test"), micro_batch_size=1, seq_len=net.seq_len,
                     granularity="candidate", supernet=net)

    with pytest.raises(ContractError, match=r"candidate 'ffn128' was profiled as ffn \(ffn_hidden_size=96\), "
                                            r"supernet-mini has ffn \(ffn_hidden_size=128\)"):
        check_candidate_trace(trace(other), BASE)
    check_candidate_trace(trace(other), other)
    check_candidate_trace(trace(BASE), SPLIT)  # the same pool with per-layer lists: the candidates cost the same
