"""The ``stage_cuts`` plan key: its contract, its JSON round trip and the stage layout it gives."""

from __future__ import annotations

import json

import pytest
from mindpipe.traces.config import STAGE_CUTS, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import CUT_UNITS, block_layer_name, stage_layout
from mindpipe.traces.schema import from_dict, to_dict

MODEL = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=16, vocab_size=128)


def test_stage_cuts_round_trip_through_plan_json() -> None:
    plan = Plan(pp=2, global_batch_size=4, stage_cuts=["after_attention"])
    back = from_dict(Plan, json.loads(json.dumps(to_dict(plan))), "plan.json")
    assert back == plan and back.stage_cuts == ["after_attention"] and back.cuts_inside_blocks
    assert not Plan(pp=2, global_batch_size=4, stage_cuts=["between_blocks"]).cuts_inside_blocks
    assert not Plan(pp=2, global_batch_size=4).cuts_inside_blocks


@pytest.mark.parametrize(
    ("data", "key", "rule"),
    [
        ({"pp": 2, "stage_cuts": ["after_attention", "between_blocks"]}, "stage_cuts", "expected one per stage boundary"),
        ({"pp": 2, "stage_cuts": ["after_mlp"]}, "stage_cuts[0]", "is not one of between_blocks, after_attention"),
        ({"pp": 2, "stage_cuts": "after_attention"}, "stage_cuts", "must be a list"),
        ({"pp": 1, "stage_cuts": ["after_attention"]}, "stage_cuts", "pp×virtual_stages−1=0"),
    ],
)
def test_bad_stage_cuts_name_file_key_and_rule(data: dict, key: str, rule: str) -> None:
    with pytest.raises(ContractError) as e:
        from_dict(Plan, {"global_batch_size": 4, **data}, "plan.json")
    assert e.value.source == "plan.json" and e.value.key == key and rule in e.value.rule


def test_layout_of_a_cut_after_attention() -> None:
    plan = Plan(pp=2, global_batch_size=4, stage_cuts=["after_attention"])
    first, second = stage_layout(plan, MODEL)
    assert first.layer_names() == ["embedding", "block.0", "block.1.attention"]
    assert second.layer_names() == ["block.1.mlp", "block.2", "block.3", "final_norm", "lm_head"]
    assert first.parts() == [(0, "whole"), (1, "attention")] and second.parts()[0] == (1, "mlp")
    assert (first.first_part, first.last_part, second.first_part, second.last_part) == ("whole", "attention", "mlp", "whole")


def test_every_block_part_is_held_exactly_once() -> None:
    """Each block is run whole by one stage, or as attention then MLP by two consecutive stages."""
    plan = Plan(pp=4, global_batch_size=8, partition=[1, 1, 1, 1],
                stage_cuts=["after_attention", "between_blocks", "after_attention"])
    spans = stage_layout(plan, MODEL)
    held = [(b, p) for span in spans for b, p in span.parts()]
    assert held == [(0, "attention"), (0, "mlp"), (1, "whole"), (2, "attention"), (2, "mlp"), (3, "whole")]
    assert [s.layer_names()[-1] for s in spans] == ["block.0.attention", "block.1", "block.2.attention", "lm_head"]


def test_no_cuts_keeps_the_layout_of_whole_blocks() -> None:
    plan = Plan(pp=2, global_batch_size=4)
    assert stage_layout(plan, MODEL) == stage_layout(Plan(pp=2, global_batch_size=4, stage_cuts=["between_blocks"]), MODEL)
    assert all(s.first_part == s.last_part == "whole" for s in stage_layout(plan, MODEL))
    assert block_layer_name(3) == "block.3" and block_layer_name(3, "mlp") == "block.3.mlp"
    # Every cut inside a block names the operator-graph unit it follows.
    assert set(CUT_UNITS) == set(STAGE_CUTS) - {"between_blocks"} and CUT_UNITS["after_attention"] == "add_1"
