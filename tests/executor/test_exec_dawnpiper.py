"""A plan the ``dawnpiper`` partitioner makes with a stage boundary inside a block trains to the
single-process losses on CPU/gloo (issue 16: the planner's cuts inside blocks run)."""

from __future__ import annotations

import dataclasses

from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_cluster
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.trace import Trace
from mindpipe.tuner.memsplit import memory_partition

from .conftest import TINY_TEXT, assert_layer_times, run_plan
from .test_exec_parity import assert_parity, reference


def dawnpiper_plan() -> Plan:
    """dawnpiper's pp=2 plan of the 256-symbol tiny model on two CPU ranks: its LM head outweighs a
    block, so the compute-balanced boundary falls after block 2's attention."""
    plan = Plan(pp=2, micro_batch_size=2, global_batch_size=8, schedule="1f1b", precision="fp32")
    mp = memory_partition("dawnpiper", Simulator(Model(**TINY_TEXT), load_cluster("cpu:1x2")), plan)
    assert mp.fits and mp.swap_copy_back is None  # a CPU has no host link to swap over
    return dataclasses.replace(plan, partition=mp.partition, layer_memory_policy=list(mp.policy),
                               stage_cuts=mp.stage_cuts)


def test_dawnpiper_plan_cut_inside_a_block_trains(tmp_path):
    plan = dawnpiper_plan()
    assert plan.stage_cuts == ["after_attention"] and plan.partition == [3, 1]
    keys = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b", "precision": "fp32",
            "partition": plan.partition, "layer_memory_policy": plan.layer_memory_policy,
            "stage_cuts": plan.stage_cuts}
    assert Plan(**keys) == plan
    res = run_plan(tmp_path, keys, 2, model=TINY_TEXT)
    assert res.returncode == 0, res.stderr[-4000:]
    trace = Trace.load(tmp_path / "measured.json")
    assert_layer_times(trace)
    names = [r.name for r in trace.layers]
    assert "block.2.attention" in names and "block.2.mlp" in names and "block.2" not in names
    assert_parity(trace.measurement.losses, reference(keys, TINY_TEXT))
