"""The supernet contract: candidates, built-ins, the seeded sampler, stage operators and plan rules."""

from __future__ import annotations

import pytest
from mindpipe.traces.builtin import load_model, load_network, load_supernet
from mindpipe.traces.config import Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import from_dict
from mindpipe.traces.supernet import (
    SHARED_OPERATOR,
    Supernet,
    check_choices,
    check_supernet_plan,
    conflict_probability,
    sample_subnet,
    sample_subnets,
    subnet_stage_operators,
    subnet_window,
)
from mindpipe.traces.supernet_builtin import supernet_names

MINI = {"kind": "supernet", "num_layers": 4, "hidden_size": 8, "seq_len": 8, "vocab_size": 16,
        "candidates": [{"name": "a2", "op": "attention", "num_heads": 2},
                       {"name": "f16", "op": "ffn", "ffn_hidden_size": 16},
                       {"name": "c3", "op": "conv", "kernel_size": 3}]}


def test_builtins_load_and_count_parameters():
    assert {"supernet-mini", "naspipe-c1", "naspipe-c2", "naspipe-c3"} <= set(supernet_names())
    assert [load_supernet(f"naspipe-c{i}").num_choices for i in (1, 2, 3)] == [12, 24, 48]
    net = load_supernet("supernet-mini")
    h = net.hidden_size
    # attention: LayerNorm 2h + QKV/out projections 4h² + 4h biases.
    assert net.candidates[0].param_count(h) == 2 * h + 4 * h * h + 4 * h
    choices = sample_subnet(net, 0)
    assert net.subnet_param_count(choices) < net.param_count()
    assert isinstance(load_network("gpt-mini"), Model)


def test_candidate_rules_are_one_line_contract_errors():
    bad = [
        ({"name": "x", "op": "attention"}, "needs num_heads"),
        ({"name": "x", "op": "ffn", "ffn_hidden_size": 8, "num_heads": 2}, "does not apply"),
        ({"name": "x", "op": "conv", "kernel_size": 3, "conv_type": "lightweight"}, "conv_heads"),
        ({"name": "x", "op": "pool", "kernel_size": 3}, "is not one of"),
        ({"name": "x", "op": "attention", "num_heads": 3}, "does not divide hidden_size=8"),
        ({"name": "x", "op": "conv", "kernel_size": 9}, "exceeds seq_len=8"),
    ]
    for cand, rule in bad:
        with pytest.raises(ContractError, match=rule):
            from_dict(Supernet, {**MINI, "candidates": [cand]}, "s.json")
    with pytest.raises(ContractError, match="used twice"):
        from_dict(Supernet, {**MINI, "candidates": MINI["candidates"] + [MINI["candidates"][0]]}, "s.json")
    with pytest.raises(ContractError, match=r"a supernet .* is needed"):
        load_supernet("gpt-mini")
    with pytest.raises(ContractError, match="takes a GPT model"):
        load_model('{"kind": "supernet"}')


def test_sampler_is_seeded_prefix_stable_and_uniform():
    net = from_dict(Supernet, MINI)
    assert sample_subnets(net, 5) == sample_subnets(net, 10)[:5]
    assert sample_subnets(net, 3, start=7) == sample_subnets(net, 10)[7:]
    other = from_dict(Supernet, {**MINI, "sampler": {"seed": 1}})
    assert sample_subnets(other, 20) != sample_subnets(net, 20)
    counts = [0, 0, 0]
    for c in sample_subnets(net, 3000):
        for k in c:
            counts[k] += 1
    assert all(abs(n / 12000 - 1 / 3) < 0.02 for n in counts)
    with pytest.raises(ContractError, match="choices\\[1\\]"):
        check_choices(net, (0, 5, 0, 0))


def test_stage_operators_follow_the_partition_and_shared_parts():
    net = from_dict(Supernet, MINI)
    plan = Plan(pp=2, partition=[1, 3], subnet_schedule="csp")
    ops = subnet_stage_operators(net, plan, (2, 0, 1, 2))
    assert ops == [frozenset({(0, 2)}), frozenset({(1, 0), (2, 1), (3, 2)})]
    shared = from_dict(Supernet, {**MINI, "train_shared": True})
    ops = subnet_stage_operators(shared, Plan(pp=3, partition=[1, 2, 1]), (2, 0, 1, 2))
    assert SHARED_OPERATOR in ops[0] and SHARED_OPERATOR in ops[2] and SHARED_OPERATOR not in ops[1]
    assert subnet_window(plan) == 4 and subnet_window(Plan(pp=2, subnet_window=7)) == 7
    assert conflict_probability(24, 12) == pytest.approx(1 - (23 / 24) ** 12)


def test_supernet_plan_rules():
    net = from_dict(Supernet, MINI)
    check_supernet_plan(Plan(dp=2, pp=2, micro_batch_size=2, global_batch_size=4, subnet_schedule="sync"), net)
    bad = [
        (Plan(tp=2), "tensor parallelism"),
        (Plan(pp=2, schedule="gpipe"), "subnet_schedule"),
        (Plan(dp=2, micro_batch_size=1, global_batch_size=4), "must equal micro_batch_size×dp=2"),
        (Plan(pp=5), "exceeds the supernet's num_layers=4"),
        (Plan(pp=2, partition=[1, 2]), "sums to 3"),
        (Plan(layer_memory_policy=["keep"] * 4), "not supported"),
    ]
    for plan, rule in bad:
        with pytest.raises(ContractError, match=rule):
            check_supernet_plan(plan, net, source="plan.json")
    with pytest.raises(ContractError, match="subnet_window applies to supernet models only"):
        check_plan(Plan(subnet_window=4), load_model("gpt-mini"))
    with pytest.raises(ContractError, match="subnet_schedule"):
        Plan(subnet_schedule="fast")
    with pytest.raises(ContractError, match="subnet_window"):
        Plan(subnet_window=0)
