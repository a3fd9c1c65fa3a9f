"""A block a stage boundary cuts cannot re-run only part of itself: the Plan's rule, so simulate and tune refuse
what ``mindpipe run`` refuses (before, only the executor's pre-check knew it and ``simulate`` priced the plan)."""

from __future__ import annotations

import pytest
from mindpipe.simulator.api import simulate
from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import cut_block_refusal
from mindpipe.traces.schema import from_dict

MODEL = load_model("gpt-mini")
CUT = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "stage_cuts": ["after_attention"]}


@pytest.mark.parametrize("extra,policy", [
    ({"layer_memory_policy": ["keep", "selective", "keep", "keep"]}, "selective"),
    ({"layer_memory_policy": ["keep", "nongemm", "keep", "keep"]}, "nongemm"),
    ({"recompute": "selective"}, "selective"),
])
def test_a_cut_block_with_a_partial_recompute_is_refused(extra, policy):
    plan = from_dict(Plan, {**CUT, **extra})
    assert cut_block_refusal(plan, MODEL) == (f"block 1 is cut by a stage boundary: give it recompute none, full or "
                                              f"swap, not {policy}")
    with pytest.raises(ContractError, match=f"stage_cuts: block 1 is cut by a stage boundary.*not {policy}"):
        check_plan(plan, MODEL, source="p.json")
    with pytest.raises(ContractError, match="cut by a stage boundary"):
        simulate(MODEL, "cpu:1x2", plan)


@pytest.mark.parametrize("policy", ["keep", "recompute", "swap"])
def test_whole_block_policies_on_a_cut_block_and_partial_ones_elsewhere_pass(policy):
    plan = from_dict(Plan, {**CUT, "layer_memory_policy": ["selective", policy, "keep", "nongemm"]})
    assert cut_block_refusal(plan, MODEL) is None
    check_plan(plan, MODEL)
