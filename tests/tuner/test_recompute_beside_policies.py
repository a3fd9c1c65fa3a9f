"""A recompute level beside per-block policies is refused (the per-block policy is what runs), and a sweep
with pinned per-block policies searches no recompute levels it would only have to refuse."""

from __future__ import annotations

import pytest
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import from_dict
from mindpipe.tuner.api import build_space


@pytest.mark.parametrize("level", ["selective", "full"])
def test_a_level_beside_per_block_policies_is_one_line_refusal(level):
    with pytest.raises(ContractError) as e:
        from_dict(Plan, {"pp": 2, "global_batch_size": 4, "recompute": level,
                         "layer_memory_policy": ["keep", "recompute", "swap", "keep"]}, "p.json")
    assert str(e.value) == (f"p.json: recompute={level!r} beside layer_memory_policy, whose per-block "
                            "policies replace it: give the level in the list, or leave recompute out")
    from_dict(Plan, {"pp": 2, "global_batch_size": 4, "layer_memory_policy": ["keep", "recompute", "swap", "keep"]})


def test_pinned_policies_collapse_the_recompute_dimension():
    fixes = {"layer_memory_policy": ["keep", "recompute", "swap", "keep"], "pp": 2, "dp": 1}
    space = build_space(load_model("gpt-mini"), load_cluster("cpu:1x2"), 8, fixes, ["balanced"])
    points = space.points
    assert points and {p["recompute"] for p in points} == {"none"}
