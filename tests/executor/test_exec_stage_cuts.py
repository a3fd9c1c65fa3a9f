"""A pipeline whose stage boundary falls inside a block (``stage_cuts``): built, refused, and trained
to the single-process losses (issue 16 acceptance, "an intra-block cut")."""

from __future__ import annotations

import pytest
from mindpipe.executor.precheck import check_run
from mindpipe.executor.stages import PartialBlock, build_stage_modules
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.torch_gpt import build_gpt, synthetic_batch

from .conftest import TINY
from .test_exec_parity import assert_parity, launched, reference

# Block 1 is cut after its attention (even partition [2, 2]) and fully recomputed on both sides.
CUT = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b", "precision": "fp32",
       "stage_cuts": ["after_attention"], "layer_memory_policy": ["keep", "recompute", "keep", "keep"]}


def test_stages_split_the_block_and_compose_to_the_model() -> None:
    model, plan = Model(**TINY), Plan(**CUT)
    gpt = build_gpt(model, seed=3)
    first, second = build_stage_modules(gpt, plan, 0)[0], build_stage_modules(gpt, plan, 1)[1]
    assert isinstance(first.blocks["1"], PartialBlock) and isinstance(second.blocks["1"], PartialBlock)
    assert [n for n, _, _ in first.layers()] == ["embedding", "block.0", "block.1.attention"]
    assert [k for n, k, _ in second.layers()][:2] == ["block_mlp", "block"]
    # Every parameter lives on exactly one stage, under the unsplit model's name.
    names = [set(dict(m.named_parameters())) for m in (first, second)]
    assert not names[0] & names[1] and names[0] | names[1] == set(dict(gpt.named_parameters()))
    assert "blocks.1.attn.qkv.weight" in names[0] and "blocks.1.mlp.fc1.weight" in names[1]
    tokens, _ = synthetic_batch(model, 2, seed=1)
    assert second(first(tokens)).equal(gpt(tokens))


def test_selective_recompute_of_a_cut_block_is_refused() -> None:
    plan = Plan(**{**CUT, "layer_memory_policy": None, "recompute": "selective"})
    with pytest.raises(ContractError) as e:
        check_run(Model(**TINY), plan, plan.world_size, "cpu", None, source="plan.json")
    assert e.value.source == "plan.json" and e.value.key == "stage_cuts" and "not selective" in e.value.rule


def test_pp2_cut_inside_a_block_parity(tmp_path):
    trace = launched(tmp_path, CUT, 2, "--schedule-source", "torch")
    assert_parity(trace.measurement.losses, reference(CUT))
    names = [r.name for r in trace.layers]
    assert "block.1.attention" in names and "block.1.mlp" in names and "block.1" not in names
    # The measured trace prices the cut plan with its own timed parts, and the other blocks by name.
    from mindpipe.simulator.build import assign_layers
    from mindpipe.simulator.costs import TraceComputeModel

    rec = {r.name: r for r in trace.layers}
    plan = Plan(**CUT)
    first, second = assign_layers(TraceComputeModel(trace).layer_costs(trace.model, plan), trace.model, plan)
    assert [c.name for c in first] == ["embedding", "block.0", "block.1.attention"]
    assert first[-1].forward_s == rec["block.1.attention"].forward_s
    assert second[0].forward_s == rec["block.1.mlp"].forward_s and second[1].forward_s == rec["block.2"].forward_s


def test_tp2_sequence_parallel_pp2_cut_inside_a_block_parity(tmp_path):
    """The parts are tensor-parallelised like whole blocks (each takes its half of the block's layout)."""
    plan = {**CUT, "tp": 2, "sequence_parallel": True, "layer_memory_policy": None}
    trace = launched(tmp_path, plan, 4)
    assert_parity(trace.measurement.losses, reference(plan))
