"""The per-layer cost cache (:meth:`Simulator.layer_costs`) is keyed on :data:`COST_FIELDS`: every Plan
field a compute model reads while pricing layers must be in it, or a plan is priced with the costs
of another that differs only in that field (stop 39 added ``cp_comm_type`` without it, and a tuner
worker priced ring plans with the all-gather's costs or the reverse, depending on what it had
simulated before)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from mindpipe.simulator.simulator import COST_FIELDS, Simulator
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Plan
from mindpipe.traces.data import load_shipped_trace

FIELDS = {f.name for f in dataclasses.fields(Plan)}


class _Recording(Plan):
    """A Plan that records which of its fields are read (properties read them through here too)."""

    def __getattribute__(self, name: str) -> Any:
        if name in FIELDS:
            object.__getattribute__(self, "__dict__").setdefault("_read", set()).add(name)
        return object.__getattribute__(self, name)


def _read_by_layer_costs(sim: Simulator, plan: Plan) -> set[str]:
    rec = _Recording(**{f: getattr(plan, f) for f in FIELDS})
    object.__getattribute__(rec, "__dict__").pop("_read", None)
    sim.compute.layer_costs(sim.model, rec)
    return set(object.__getattribute__(rec, "__dict__").get("_read", set()))


CASES = [
    ("llama3-70b", "h100-sxm5-80gb:8x8", None,
     dict(dp=2, tp=4, pp=4, cp=2, cp_comm_type="p2p", flash_attention=True, sequence_parallel=True, global_batch_size=64)),
    ("llama3-70b", "h100-sxm5-80gb:8x8", None, dict(dp=4, tp=4, pp=4, precision="fp8", global_batch_size=64,
                                                    loss_chunks=4, fused_head_loss=True, tp_comm_overlap=True,
                                                    sequence_parallel=True)),
    ("gpt-13b", "a100-sxm4-80gb:8x8", None, dict(dp=8, tp=2, pp=4, micro_batch_size=2, global_batch_size=64,
                                                 recompute="selective", zero_stage=1)),
    ("llama3.2-3b", "h100-sxm5-80gb:8x2", None, dict(dp=4, pp=4, precision="bf16", global_batch_size=64)),
    ("gpt-mini", "cpu:1x2", "gpt-mini.cpu", dict(dp=2, global_batch_size=8, micro_batch_size=4, precision="fp32")),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] + "-" + c[1] for c in CASES])
def test_every_plan_field_the_layer_costs_read_is_in_the_cache_key(case: tuple[Any, ...]) -> None:
    model, cluster, trace, plan = case
    sim = Simulator(load_model(model), load_cluster(cluster), trace=load_shipped_trace(trace) if trace else None)
    read = _read_by_layer_costs(sim, Plan(**plan))
    assert read, "the recording saw no field: the check would pass vacuously"
    assert read <= set(COST_FIELDS), f"read but not in COST_FIELDS: {sorted(read - set(COST_FIELDS))}"


def test_a_worker_prices_a_ring_plan_as_a_fresh_simulator_does_after_an_allgather_one() -> None:
    model, cluster = load_model("llama3-70b"), load_cluster("h100-sxm5-80gb:8x8")
    ring = Plan(dp=2, tp=4, pp=2, cp=4, cp_comm_type="p2p", flash_attention=True, global_batch_size=64)
    warm = Simulator(model, cluster)
    warm.run(dataclasses.replace(ring, cp_comm_type="allgather"))
    assert warm.run(ring).iteration_time_s == Simulator(model, cluster).run(ring).iteration_time_s
