"""The closed-form conflict rate of a stage holding trained shared parts (``train_shared``) is 1.

Every subnet uses the trained embeddings and LM head (:data:`~mindpipe.traces.supernet.SHARED_OPERATOR`),
so consecutive subnets always conflict on the first and last stages; the drawn rate says so, and the
closed form printed beside it must too (it ignored the shared operator, e.g. 55.6 % against 100 %).
"""

from __future__ import annotations

import pytest
from mindpipe.simulator.subnet_sim import SupernetSimulator
from mindpipe.traces.builtin import load_cluster, load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import Supernet, conflict_probability, stage_conflict_probability

BASE = load_supernet("supernet-mini")
POOL = [c.name for c in BASE.candidates]


@pytest.mark.parametrize("lists", [None, [POOL[:4]] * 4 + [POOL[4:]] * 4])
def test_closed_form_is_one_where_trained_shared_parts_live(lists: list[list[str]] | None) -> None:
    net = from_dict(Supernet, {**to_dict(BASE), "layer_candidates": lists, "train_shared": True}, "s.json")
    plan = from_dict(Plan, {"pp": 4, "micro_batch_size": 2, "global_batch_size": 2, "partition": [1, 2, 3, 2]})
    result = SupernetSimulator(net, load_cluster("cpu:1x4")).run(plan, 200)
    rates = [(s.conflict_rate, s.conflict_rate_closed_form) for s in result.stages]
    assert rates[0] == (1.0, 1.0) and rates[-1] == (1.0, 1.0)
    assert rates[1][1] == stage_conflict_probability(net, 1, 2) < 1.0
    assert stage_conflict_probability(net, 0, 1, holds_shared=True) == 1.0
    frozen = from_dict(Supernet, {**to_dict(BASE), "layer_candidates": lists}, "s.json")
    assert stage_conflict_probability(frozen, 0, 1, holds_shared=True) == stage_conflict_probability(frozen, 0, 1)
    if lists is None:
        assert stage_conflict_probability(frozen, 0, 1, holds_shared=True) == conflict_probability(6, 1)
