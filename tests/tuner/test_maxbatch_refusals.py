"""``tune --objective max_batch``: a trace pins the plan to how it was profiled, and a partitioner
that cannot plan a mesh says why instead of reporting that nothing fits.

Before: with an fp32 CPU trace the search returned a bf16 plan priced with fp32 times (the
simulator then warned "trace profiled in fp32, the plan runs bf16") and ``made_for.trace`` was
null; ``--partitioner dawnpiper`` with an interleaved or V schedule, which the memory planners
refuse (one stage per rank), answered "no plan of gpt-mini fits one sample per micro-batch", and
``--microbatches 1`` on pp=4 answered "every dp x tp x pp mesh it allows breaks a plan rule" with
no rule named (the example was checked at pp micro-batches).
"""

from __future__ import annotations

import pytest
from mindpipe.traces.data import load_shipped_trace
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.maxbatch import tune_max_batch


def test_trace_pins_precision_and_is_named_in_made_for(tmp_path):
    trace = load_shipped_trace("gpt-mini.cpu")
    summary = tune_max_batch("gpt-mini", "cpu:1x2", out=tmp_path, partitioners=["dawnpiper"], fixes=["pp=2"],
                             trace=trace, trace_source="gpt-mini.cpu")
    plan = summary.best_plan
    assert plan is not None and plan.precision == trace.dtype == "fp32"
    assert plan.flash_attention is trace.flash_attention
    assert plan.made_for is not None and plan.made_for.trace is not None
    assert plan.made_for.trace.startswith("gpt-mini.cpu sha256:")


def test_trace_refuses_another_precision(tmp_path):
    with pytest.raises(ContractError, match="profiled in fp32"):
        tune_max_batch("gpt-mini", "cpu:1x2", out=tmp_path, partitioners=["vpipe"], fixes=["precision=bf16"],
                       trace=load_shipped_trace("gpt-mini.cpu"))


@pytest.mark.parametrize("fixes", [["pp=2", "schedule=interleaved_1f1b", "virtual_stages=2"],
                                   ["pp=2", "schedule=zbv", "virtual_stages=2"]])
def test_memory_planner_with_chunks_names_its_rule(tmp_path, fixes):
    with pytest.raises(ContractError) as e:
        tune_max_batch("gpt-mini", "cpu:1x4", out=tmp_path, partitioners=["dawnpiper"], fixes=fixes)
    assert "one stage per pipeline rank" in str(e.value)
    assert "fits one sample" not in str(e.value)


def test_memory_planner_is_not_dropped_beside_another(tmp_path):
    with pytest.raises(ContractError) as e:
        tune_max_batch("gpt-mini", "cpu:1x4", out=tmp_path, partitioners=["balanced", "vpipe"],
                       fixes=["pp=2", "schedule=interleaved_1f1b", "virtual_stages=2"])
    assert "vpipe" in str(e.value) and "one stage per pipeline rank" in str(e.value)


def test_too_few_microbatches_names_the_rule(tmp_path):
    with pytest.raises(ContractError) as e:
        tune_max_batch("gpt-mini", "cpu:1x4", out=tmp_path, partitioners=["vpipe"], fixes=["pp=4"],
                       num_microbatches=1)
    assert "m=1 >= pp=4" in str(e.value)
