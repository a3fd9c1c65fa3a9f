"""The simulator with an operator-granularity trace and with stage boundaries inside a block."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.block_parts import op_blocks, part_params
from mindpipe.simulator.build import assign_layers
from mindpipe.simulator.costs import TraceComputeModel, layer_params
from mindpipe.simulator.memory import activation_bytes_per_layer
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_cluster
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import CUT_UNITS
from mindpipe.traces.profiler import ProfileOptions, profile_model
from mindpipe.traces.trace import Trace

MODEL = Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128, name="tiny")
FAST = {"warmup": 1, "repeats": 1, "step_repeats": 0}
CUT = CUT_UNITS["after_attention"]


@pytest.fixture(scope="module")
def op_trace() -> Trace:
    return profile_model(MODEL, ProfileOptions(micro_batch_size=2, granularity="op", **FAST), command="test")


def plan(cuts: list[str] | None, **kw: object) -> Plan:
    return Plan(**{"pp": 2, "global_batch_size": 4, "micro_batch_size": 2, "precision": "fp32",  # type: ignore[arg-type]
                   "stage_cuts": cuts, **kw})


def units(trace: Trace, block: int) -> list:
    return [r for r in trace.layers if r.name.startswith(f"block.{block}.")]


def test_op_trace_blocks_cost_the_sum_of_their_units(op_trace: Trace) -> None:
    costs = {c.name: c for c in TraceComputeModel(op_trace).layer_costs(MODEL, plan(None))}
    for b in range(MODEL.num_layers):
        us = units(op_trace, b)
        cut = [r.name for r in us].index(f"block.{b}.{CUT}")
        whole, (attention, mlp) = costs[f"block.{b}"], costs[f"block.{b}"].parts
        assert whole.forward_s == pytest.approx(sum(r.forward_s for r in us), rel=1e-12)
        assert whole.backward_input_s == pytest.approx(sum(r.backward_input_s for r in us), rel=1e-12)
        assert attention.forward_s == pytest.approx(sum(r.forward_s for r in us[: cut + 1]), rel=1e-12)
        assert mlp.backward_weight_s == pytest.approx(sum(r.backward_weight_s for r in us[cut + 1:]), rel=1e-12)
        assert attention.param_count + mlp.param_count == whole.param_count
        assert 0 < whole.recompute_selective_s < attention.forward_s


def test_the_cut_sends_the_residual_stream_the_trace_measured(op_trace: Trace) -> None:
    """Only the residual [b, s, h] is live after the cut unit: the crossing bytes equal a block boundary's."""
    residual = 2 * MODEL.seq_len * MODEL.hidden_size * 4
    cut_unit = next(r for r in op_trace.layers if r.name == f"block.1.{CUT}")
    assert cut_unit.output_bytes == residual
    first, second = assign_layers(TraceComputeModel(op_trace).layer_costs(MODEL, plan(["after_attention"])), MODEL,
                                  plan(["after_attention"]))
    assert [c.name for c in first] == ["embedding", "block.0.attention"]
    assert [c.name for c in second] == ["block.0.mlp", "block.1", "final_norm", "lm_head"]
    assert first[-1].output_bytes == residual
    # bf16 and micro-batch 1 scale the measured bytes like the block boundary's.
    bf16 = plan(["after_attention"], precision="bf16", micro_batch_size=1)
    costs = TraceComputeModel(op_trace).layer_costs(MODEL, bf16)
    assert costs[1].parts[0].output_bytes == costs[1].output_bytes == residual // 4


def test_a_cut_moves_work_between_stages_and_conserves_it(op_trace: Trace) -> None:
    sim = Simulator(MODEL, load_cluster("cpu:1x2"), trace=op_trace)
    whole, cut = sim.run(plan(None)), sim.run(plan(["after_attention"]))
    costs = sim.layer_costs(plan(None))
    layers_cut = assign_layers(costs, MODEL, plan(["after_attention"]))
    layers_whole = assign_layers(costs, MODEL, plan(None))
    total = [sum(c.forward_s + c.backward_input_s + c.backward_weight_s for c in s) for s in layers_whole]
    moved = [sum(c.forward_s + c.backward_input_s + c.backward_weight_s for c in s) for s in layers_cut]
    assert sum(moved) == pytest.approx(sum(total), rel=1e-12) and moved[0] < total[0]
    assert whole.iteration_time_s != cut.iteration_time_s
    # Memory follows the parts: the first stage drops block 1's MLP activations and parameters.
    assert cut.memory_by_stage_gib[0] < whole.memory_by_stage_gib[0]
    assert cut.memory_by_stage_gib[1] > whole.memory_by_stage_gib[1]


@pytest.mark.parametrize("policy", ["none", "selective", "swap"])
def test_part_activations_sum_to_the_block(policy: str) -> None:
    m = dataclasses.replace(MODEL, dropout=0.1)
    p = plan(None, tp=1)
    parts = [activation_bytes_per_layer(m, p, policy=policy, part=x, mask_bytes=1) for x in ("attention", "mlp")]
    assert sum(parts) == pytest.approx(activation_bytes_per_layer(m, p, policy=policy, mask_bytes=1), rel=1e-12)


def test_part_activations_match_what_the_profiled_units_save(op_trace: Trace) -> None:
    """The formula per part against the tensors autograd saved per unit (CPU fp32, no dropout):
    equal but for each part's LayerNorm statistics (mean and rstd, 2·4 bytes per token)."""
    p = plan(None)
    us = units(op_trace, 0)
    cut = [r.name for r in us].index(f"block.0.{CUT}")
    ln_stats = 2 * 4 * 2 * MODEL.seq_len
    for part, rs in (("attention", us[: cut + 1]), ("mlp", us[cut + 1:])):
        measured = sum(r.activation_bytes for r in rs)
        assert activation_bytes_per_layer(MODEL, p, policy="none", part=part, mask_bytes=4) + ln_stats == measured


def test_part_parameters_sum_to_a_block() -> None:
    for tp in (1, 2, 4):
        params = {n: k for n, _, k in layer_params(MODEL, tp)}
        assert sum(part_params(MODEL, tp).values()) == params["block.0"]


def test_roofline_and_layer_traces_split_blocks_too(op_trace: Trace) -> None:
    sim = Simulator(MODEL, load_cluster("a100-sxm4-80gb:1x2"))
    costs = sim.layer_costs(plan(None))
    for c in costs[1:-2]:
        a, m = c.parts
        assert a.forward_s + m.forward_s == pytest.approx(c.forward_s, rel=1e-9)
        assert a.forward_comm == [] and a.output_bytes == c.output_bytes
    assert sim.run(plan(["after_attention"])).iteration_time_s > 0


def test_op_trace_without_the_cut_unit_is_refused(op_trace: Trace) -> None:
    layers = [r for r in op_trace.layers if not r.name.endswith(f".{CUT}")]
    bad = dataclasses.replace(op_trace, layers=layers)
    with pytest.raises(ContractError) as e:
        TraceComputeModel(bad, source="t.json")
    assert e.value.source == "t.json" and CUT in e.value.rule
    assert len(op_blocks(op_trace, "t.json")) == MODEL.num_layers
