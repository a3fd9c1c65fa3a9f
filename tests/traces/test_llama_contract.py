"""The ``kind: "llama"`` model contract: keys, rules, parameter counts and built-ins."""

from __future__ import annotations

import pytest
from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import from_dict

LLAMA = {"kind": "llama", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
         "ffn_hidden_size": 192, "seq_len": 16, "vocab_size": 100}


@pytest.mark.parametrize("name,total", [
    # Meta's published totals (Llama 3 paper, Table 3; model cards: 8.03B, 70.6B, 405.9B).
    ("llama3-8b", 8_030_261_248),
    ("llama3-70b", 70_553_706_496),
    ("llama3.1-405b", 405_853_388_800),
])
def test_builtin_param_counts_match_meta(name, total):
    m = load_model(name)
    assert m.param_count() == total
    assert round(total / 1e9, 2 if total < 1e10 else 1) == {"llama3-8b": 8.03, "llama3-70b": 70.6,
                                                               "llama3.1-405b": 405.9}[name]
    assert m.kv_heads == 8 and m.rope_base == 500000.0 and not m.tie_embeddings


def test_llama_parameter_terms():
    m = from_dict(Model, LLAMA, "m.json")
    h, kv, f = 64, 2 * 16, 192
    assert m.attention_param_count() == h + 2 * h * h + 2 * h * kv
    assert m.mlp_param_count() == h + 3 * h * f
    assert m.param_count() == 100 * h + 2 * m.block_param_count() + h + 100 * h
    tied = from_dict(Model, {**LLAMA, "tie_embeddings": True}, "m.json")
    assert m.param_count() - tied.param_count() == 100 * h


def test_a_gpt_model_may_tie_its_head_as_megatron_does_by_default():
    """GPT's torch model shares the one table, and the contract counts it once."""
    import torch
    from mindpipe.traces.torch_models import build_model

    gpt = {"kind": "gpt", "num_layers": 2, "hidden_size": 32, "num_heads": 4, "seq_len": 8, "vocab_size": 96}
    untied, tied = from_dict(Model, gpt, "m.json"), from_dict(Model, {**gpt, "tie_embeddings": True}, "m.json")
    assert untied.param_count() - tied.param_count() == 96 * 32
    net = build_model(tied)
    assert net.lm_head.out.weight is net.embedding.tok.weight
    assert sum(p.numel() for p in net.parameters()) == tied.param_count()
    net(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    assert net.embedding.tok.weight.grad is not None


def test_defaults_and_gpt_unchanged():
    m = from_dict(Model, {k: v for k, v in LLAMA.items() if k != "num_kv_heads"}, "m.json")
    assert m.kv_heads == m.num_heads and m.rope_base == 10000.0
    gpt = Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=16, vocab_size=100)
    h, f = 64, 256
    assert gpt.block_param_count() == (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
    assert gpt.param_count() == 100 * h + 16 * h + 2 * gpt.block_param_count() + 2 * h + 100 * h


@pytest.mark.parametrize("change,key,rule", [
    ({"num_kv_heads": 3}, "num_kv_heads", "num_kv_heads=3 does not divide num_heads=4"),
    ({"num_kv_heads": 0}, "num_kv_heads", "must be > 0"),
    ({"ffn_hidden_size": None}, "ffn_hidden_size", "required for kind llama"),
    ({"dropout": 0.1}, "dropout", "no dropout"),
    ({"rope_theta": -1.0}, "rope_theta", "must be > 0"),
    ({"tie_embeddings": 1}, "tie_embeddings", "must be true or false"),
    ({"kind": "gpt"}, "num_kv_heads", "applies to llama models only"),
    ({"kind": "gpt", "num_kv_heads": 4, "rope_theta": 1e4}, "rope_theta", "applies to llama models only"),
])
def test_rules_name_file_key_and_rule(change, key, rule):
    with pytest.raises(ContractError) as e:
        from_dict(Model, {**LLAMA, **change}, "m.json")
    assert e.value.key == key and rule in str(e.value) and "m.json" in str(e.value)


def test_check_plan_tp_must_divide_kv_heads():
    m = load_model("llama3-70b")
    check_plan(Plan(tp=8, dp=1, global_batch_size=1), m)
    small = from_dict(Model, {**LLAMA, "num_heads": 8, "num_kv_heads": 2}, "m.json")
    with pytest.raises(ContractError, match=r"plan\.json: tp=4 does not divide num_kv_heads=2"):
        check_plan(Plan(tp=4), small, source="plan.json")
    tied = from_dict(Model, {**LLAMA, "tie_embeddings": True}, "m.json")
    for plan in (Plan(dp=2, global_batch_size=2), Plan(pp=2, global_batch_size=2), Plan(tp=2, global_batch_size=2)):
        check_plan(plan, tied)  # a tied head on its own stage holds a copy (tied_table_ranks)
    with pytest.raises(ContractError, match="fused_head_loss=true needs an untied LM head"):
        check_plan(Plan(pp=2, global_batch_size=2, fused_head_loss=True), tied)


def test_same_shape_sees_the_llama_keys():
    a = from_dict(Model, LLAMA, "a")
    assert a.same_shape(from_dict(Model, {**LLAMA, "num_kv_heads": 2}, "b"))
    assert not a.same_shape(from_dict(Model, {**LLAMA, "num_kv_heads": 4}, "b"))
    assert not a.same_shape(from_dict(Model, {**LLAMA, "rope_theta": 5e5}, "b"))
    assert "num_kv_heads=2" in a.describe()


def test_an_odd_head_width_is_refused_at_load_naming_the_file_and_key():
    """hidden 60 over 4 heads (width 15) was accepted, simulated, and crashed in the first forward
    of `mindpipe run` (rotary embeddings need channel pairs)."""
    with pytest.raises(ContractError, match=r"m\.json: num_heads: head width hidden_size/num_heads=60/4=15 must be even"):
        from_dict(Model, {**LLAMA, "hidden_size": 60}, "m.json")
    gpt = {"kind": "gpt", "num_layers": 2, "hidden_size": 60, "num_heads": 4, "seq_len": 16, "vocab_size": 100}
    assert from_dict(Model, gpt, "m.json").head_dim == 15  # learned positions: any width
