"""Per-candidate costs: the kernel models' operators for each candidate kind, and a per-candidate trace."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.costs import RooflineComputeModel
from mindpipe.simulator.perf import GpuComputeModel
from mindpipe.simulator.subnet_costs import candidate_ops, hardware_costs, trace_costs
from mindpipe.traces.builtin import load_supernet
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Candidate
from mindpipe.traces.trace import LayerRecord, Provenance, Trace

PLAN = Plan(pp=2, micro_batch_size=4, global_batch_size=4)


@pytest.fixture(scope="module")
def mini():
    return load_supernet("supernet-mini")


def flops(ops, phase):
    return sum(o.flops for o in ops if o.phase == phase)


def test_conv_operators(mini):
    tokens, h = 4 * mini.seq_len, mini.hidden_size
    std = candidate_ops(mini, Candidate("c", "conv", kernel_size=5, conv_type="standard"), PLAN)
    assert flops(std, "forward") == 2 * tokens * h * 5 * h  # implicit GEMM [b·s, k·h] × [k·h, h]
    assert flops(std, "backward_weight") == 2 * tokens * h * 5 * h
    sep = candidate_ops(mini, Candidate("s", "conv", kernel_size=5), PLAN)
    assert flops(sep, "forward") == 2 * 5 * tokens * h + 2 * tokens * h * h  # depthwise + pointwise GEMM
    lw = candidate_ops(mini, Candidate("l", "conv", kernel_size=5, conv_type="lightweight", conv_heads=4), PLAN)
    assert flops(lw, "forward") == 2 * 5 * tokens * h and not any(o.kind == "gemm" for o in lw)


def test_attention_and_ffn_are_the_gpt_block_parts(mini):
    att = candidate_ops(mini, mini.candidates[0], PLAN)
    ffn = candidate_ops(mini, mini.candidates[2], PLAN)
    assert {o.name for o in att} >= {"ln1", "qkv", "proj", "residual1"} and "mlp_fc1" not in {o.name for o in att}
    assert {o.name for o in ffn} >= {"ln2", "mlp_fc1", "mlp_fc2", "residual2"}
    tokens, h, f = 4 * mini.seq_len, mini.hidden_size, mini.candidates[2].ffn_hidden_size
    assert flops(ffn, "forward") == 2 * 2 * tokens * h * f


def test_hardware_costs_gpu_and_roofline(mini):
    for model, source in ((GpuComputeModel(get_device("a100-sxm4-80gb")), "gpu-model"),
                          (RooflineComputeModel(get_device("cpu")), "roofline")):
        c = hardware_costs(mini, PLAN, model)
        assert c.source == source
        for cand, cost in zip(mini.candidates, c.candidates, strict=True):
            assert cost.forward_s > 0 and cost.backward_s > 0 and cost.param_count == cand.param_count(64)
            assert cost.trained_params == cost.param_count
        # Frozen shared parts: no weight gradient; the embedding no backward at all.
        assert c.embedding.backward_s == 0 and c.embedding.trained_params == 0
        assert c.head.backward_weight_s == 0 and c.head.backward_input_s > 0
        assert c.embedding.param_count + c.head.param_count == mini.shared_param_count()
    trained = dataclasses.replace(mini, train_shared=True)
    c = hardware_costs(trained, PLAN, RooflineComputeModel(get_device("cpu")))
    assert c.embedding.backward_weight_s > 0 and c.embedding.trained_params == c.embedding.param_count


def test_stage_cost_sums_chosen_candidates(mini):
    c = hardware_costs(mini, PLAN, RooflineComputeModel(get_device("cpu")))
    choices = (0, 1, 2, 3, 4, 5, 0, 0)
    first = c.stage(choices, 0, 4, True, False)
    assert first.forward_s == pytest.approx(c.embedding.forward_s + sum(c.candidates[k].forward_s for k in choices[:4]))
    last = c.stage(choices, 4, 4, False, True)
    assert last.param_count == sum(c.candidates[k].param_count for k in choices[4:]) + c.head.param_count
    assert last.output_bytes == 0 and first.output_bytes == 4 * mini.seq_len * 64 * 2


def candidate_trace(net, mbs=2, drop=None, granularity="candidate"):
    recs = [LayerRecord("embedding", "embedding", 1e-4, 0.0, 0.0), LayerRecord("head", "head", 5e-4, 4e-4, 0.0)]
    recs += [LayerRecord(f"candidate.{c.name}", c.op, 1e-4 * (i + 1), 2e-4 * (i + 1), 0.0, activation_bytes=1000 * (i + 1))
             for i, c in enumerate(net.candidates) if c.name != drop]
    return Trace("cpu", "fp32", recs, Provenance("test"), micro_batch_size=mbs, seq_len=net.seq_len,
                 granularity=granularity, supernet=net)


def test_trace_costs_scale_linearly(mini):
    c = trace_costs(mini, PLAN, candidate_trace(mini, mbs=2))  # plan micro-batch 4: twice the trace's
    assert c.source == "trace"
    assert c.candidates[2].forward_s == pytest.approx(2 * 3e-4) and c.candidates[2].backward_input_s == pytest.approx(2 * 6e-4)
    assert c.candidates[2].activation_bytes == 2 * 3000
    assert c.head.forward_s == pytest.approx(1e-3) and c.embedding.backward_s == 0


def test_trace_round_trip_keeps_the_supernet(mini, tmp_path):
    t = candidate_trace(mini)
    t.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert back.granularity == "candidate" and back.supernet == mini


@pytest.mark.parametrize("kwargs,key", [({"drop": "attn2"}, "layers"), ({"granularity": "layer"}, "granularity")])
def test_bad_traces_are_refused(mini, kwargs, key):
    with pytest.raises(ContractError) as e:
        trace_costs(mini, PLAN, candidate_trace(mini, **kwargs))
    assert e.value.key == key


def test_trace_of_another_supernet_is_refused(mini):
    other = load_supernet("naspipe-c1")
    with pytest.raises(ContractError, match="taken for"):
        trace_costs(other, PLAN, candidate_trace(mini))
