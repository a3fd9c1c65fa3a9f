"""A memory planner's per-block policy replaces the recompute level: the plan it writes says ``recompute=none``.

Before, ``--fix recompute=full --partitioner vpipe`` returned a plan reading ``recompute: "full"`` beside a
``layer_memory_policy`` that kept blocks, and the per-block policy is what the simulator prices and the
executor runs (:func:`mindpipe.traces.layout.block_policies`): the plan said something it did not do.
"""

from __future__ import annotations

import pytest
from mindpipe.traces.layout import block_policies
from mindpipe.tuner.api import tune
from mindpipe.tuner.sweep import SweepConfig


@pytest.mark.parametrize("partitioner", ["vpipe", "dawnpiper"])
def test_memory_planner_plans_say_recompute_none(tmp_path, partitioner):
    out = tune("gpt-mini", "cpu:1x2", out=tmp_path, partitioners=[partitioner],
               fixes={"recompute": "full", "pp": 2, "dp": 1, "micro_batch_size": 2, "global_batch_size": 8},
               config=SweepConfig(optimizer="grid", budget=4, workers=1), plots=False)
    plan = out.summary.best_plan
    assert plan.layer_memory_policy is not None and plan.recompute == "none"
    assert block_policies(plan, 4) == [{"keep": "none", "recompute": "full"}.get(p, p)
                                       for p in plan.layer_memory_policy]
