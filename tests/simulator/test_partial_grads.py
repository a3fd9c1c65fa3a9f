"""Sequence parallelism's norm gradients: one all-reduce per stage and iteration (Megatron's
``_allreduce_layernorm_grads``, the executor's ``executor/partial_grads.py``), of the norms the
stage holds, after the rank's backward and before its step."""

from __future__ import annotations

from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.build import build_work
from mindpipe.simulator.calibrate.features import stage_structure_costs
from mindpipe.simulator.costs import RooflineComputeModel, partial_grad_params
from mindpipe.simulator.topology import Topology
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import stage_to_rank


def test_the_norms_of_blocks_parts_and_the_final_norm_count():
    gpt = Model(kind="gpt", num_layers=4, hidden_size=32, num_heads=4, seq_len=16, vocab_size=64)
    llama = Model(kind="llama", num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
                  seq_len=16, vocab_size=64)
    sp = Plan(tp=2, sequence_parallel=True)
    layers = stage_structure_costs(gpt, sp)
    # 4 blocks × 2 LayerNorms + the final one, 2h parameters each; Llama's RMSNorms hold h.
    assert partial_grad_params(gpt, sp, layers) == 9 * 2 * 32
    assert partial_grad_params(llama, sp, stage_structure_costs(llama, sp)) == 9 * 32
    block = next(c for c in layers if c.kind == "block")
    assert partial_grad_params(gpt, sp, block.parts) == 2 * 2 * 32  # a cut block: one norm per part
    assert partial_grad_params(gpt, sp, [block.parts[1]]) == 2 * 32
    # Without sequence parallelism every TP rank computes the whole gradient: nothing to reduce.
    assert partial_grad_params(gpt, Plan(tp=2), stage_structure_costs(gpt, Plan(tp=2))) == 0


def test_each_rank_reduces_its_stages_norms_once_before_its_step():
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    base = {"tp": 4, "pp": 2, "micro_batch_size": 1, "global_batch_size": 8, "schedule": "1f1b"}
    sp = simulate(model, cluster, Plan(**base, sequence_parallel=True), SimulationOptions(timeline=True))
    events = [e for e in sp.timeline if e.name == "norm gradients all-reduce"]
    assert sorted(e.rank for e in events) == [0, 1] and all(e.category == "tp" for e in events)
    for e in events:
        mine = [x for x in sp.timeline if x.rank == e.rank]
        last_backward = max(x.end_s for x in mine if x.category in ("B", "W"))
        optimizer = next(x for x in mine if x.name == "optimizer")
        assert last_backward <= e.start_s < e.end_s <= optimizer.start_s
    plain = simulate(model, cluster, Plan(**base), SimulationOptions(timeline=True))
    assert not [e for e in plain.timeline if e.name == "norm gradients all-reduce"]
    # Interleaved: two stages per rank, each reduced in its own message (as the executor does).
    inter = simulate(model, cluster, Plan(**{**base, "schedule": "interleaved_1f1b", "virtual_stages": 2},
                                          sequence_parallel=True), SimulationOptions(timeline=True))
    assert sorted(e.rank for e in inter.timeline if e.name == "norm gradients all-reduce") == [0, 1]
    plan = Plan(**{**base, "schedule": "interleaved_1f1b", "virtual_stages": 2}, sequence_parallel=True)
    device = get_device(cluster.gpu)
    owner = stage_to_rank(plan)
    _, ranks, _ = build_work(model, plan, stage_structure_costs(model, plan), RooflineComputeModel(device),
                             Topology(plan, cluster, device, rank_order=plan.rank_order), owner)
    one = Topology(plan, cluster, device).collective("allreduce", 1.0, "tp", 0)
    for r, work in enumerate(ranks):
        held = [s for s, rank in enumerate(owner) if rank == r]
        assert len(work.partial_grad_reduce) == len(held) * len(one)
        assert sum(f.nbytes for ph in work.partial_grad_reduce for f in ph.flows) > 0
