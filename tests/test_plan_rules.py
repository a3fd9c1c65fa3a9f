"""One owner per plan rule: every part of MindPipe reads the same stage layout and block policies.

Hypothesis draws valid plans (partitions, schedules, recompute levels, per-layer policies); for
each, the simulator's engine work and memory, the tuner's block caps, the calibration features
and the executor's stage modules and recompute wrappers must agree with
:mod:`mindpipe.traces.layout` — which blocks each stage holds, where it runs, what each block keeps.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from mindpipe.simulator.activations import final_norm_grad_bytes, weight_pass_grad_bytes
from mindpipe.simulator.api import Simulator
from mindpipe.simulator.build import assign_layers, build_work, weight_pass_extra
from mindpipe.simulator.calibrate.features import action_collectives, stage_structure
from mindpipe.simulator.costs import DTYPE_BYTES
from mindpipe.simulator.memory import (
    activation_bytes_per_layer,
    embedding_activation_bytes,
    head_activation_bytes,
    head_logit_bytes,
    logit_count,
    stage_memory,
)
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_layer_name, block_policies, one_weight_pass, stage_layout, weight_groups
from mindpipe.traces.schedule_rules import SPLIT_BACKWARD_SCHEDULES, V_SCHEDULES

MASK_CPU = 4  # fp32 plans on the CPU keep dtype-sized dropout masks


@st.composite
def plans(draw: st.DrawFn) -> tuple[Model, Plan]:
    """A small model and a valid plan with a random partition and random block policies."""
    layers = draw(st.integers(2, 8))
    model = Model(kind="gpt", num_layers=layers, hidden_size=32, num_heads=4, seq_len=16, vocab_size=64,
                  dropout=draw(st.sampled_from([0.0, 0.1])))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev"]))
    v = 2 if schedule in V_SCHEDULES or schedule == "interleaved_1f1b" else 1
    pp = draw(st.integers(1, max(1, layers // v)))
    if pp == 1 and schedule in V_SCHEDULES:
        schedule = "1f1b"
        v = 1
    stages = pp * v
    cuts = sorted(draw(st.sets(st.integers(1, layers - 1), min_size=stages - 1, max_size=stages - 1))) if stages > 1 else []
    bounds = [0, *cuts, layers]
    partition = [b - a for a, b in itertools.pairwise(bounds)]
    tp = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 3)) * max(1, 2 * pp)
    policy = draw(st.one_of(st.none(), st.lists(st.sampled_from(["keep", "recompute", "swap"]), min_size=layers,
                                                max_size=layers)))
    plan = Plan(tp=tp, pp=pp, micro_batch_size=1, global_batch_size=m, schedule=schedule, virtual_stages=v,
                recompute=draw(st.sampled_from(["none", "selective", "full"])) if policy is None else "none",
                precision="fp32",
                sequence_parallel=tp > 1 and draw(st.booleans()), partition=partition, layer_memory_policy=policy)
    return model, plan


def _cluster(plan: Plan) -> Cluster:
    return load_cluster(f"cpu:1x{plan.world_size}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_simulator_memory_and_calibration_follow_the_layout(case: tuple[Model, Plan]) -> None:
    model, plan = case
    layout = stage_layout(plan, model)
    policies = block_policies(plan, model.num_layers)
    sim = Simulator(model, _cluster(plan))
    costs = sim.layer_costs(plan)
    # Stage layout: the engine's stages, calibration's structure and the schedule's placement.
    names = [span.layer_names() for span in layout]
    assert [[c.name for c in layers] for layers in assign_layers(costs, model, plan)] == names
    assert [[c.name for c in layers] for layers in stage_structure(model, plan)] == names
    assert sim.schedule(plan).stage_to_rank == [span.rank for span in layout]
    # Block policies: the engine's re-run forward and the calibration's re-issued TP collectives.
    schedule = sim.schedule(plan)
    stages, _, _ = build_work(model, plan, costs, sim.compute, sim.topology(plan), schedule.stage_to_rank,
                              split_backward=schedule.split_backward)
    assert schedule.split_backward == (plan.schedule in SPLIT_BACKWARD_SCHEDULES)
    by_name = {c.name: c for c in costs}
    colls = action_collectives(model, plan)
    for span, work in zip(layout, stages, strict=True):
        # A split backward's W (every stage but the first): one pass re-runs the recomputed part and
        # walks the blocks' input gradients again; torch's pass per group re-runs a full block per group.
        own_blocks = [by_name[block_layer_name(b, part)] for b, part in span.parts()]
        own = [policies[b] for b in span.blocks]
        blocks = [by_name[f"block.{b}"] for b in span.blocks]
        expect = sum(c.forward_s if p == "full" else c.recompute_selective_s if p == "selective" else 0.0
                     for c, p in zip(blocks, own, strict=True))
        if schedule.split_backward and span.stage == 0:
            # The first stage's I computes nothing (its input is token ids); its W is the whole
            # backward, re-runs included, as torch runs it and the calibration's features count it.
            layers = [by_name[n] for n in span.layer_names()]
            assert work.input_s == 0.0 and work.recompute_s == 0.0
            assert work.weight_rerun_s == pytest.approx(expect + sum(c.backward_input_s for c in layers),
                                                        rel=1e-12, abs=1e-18)
            continue
        if not schedule.split_backward:
            assert work.weight_rerun_s == 0.0
        elif one_weight_pass(model, span, policies):
            assert work.weight_rerun_s == pytest.approx(
                work.recompute_s + sum(c.backward_input_s for c in own_blocks), rel=1e-12, abs=1e-18)
        else:
            assert work.weight_rerun_s == pytest.approx(sum(
                weight_groups(model, part) * c.forward_s
                for c, (b, part) in zip(own_blocks, span.parts(), strict=True) if policies[b] == "full"),
                rel=1e-12, abs=1e-18)
        assert work.recompute_s == pytest.approx(expect, rel=1e-12, abs=1e-18)
        if span.stage > 0:  # stage 0's I does nothing under a split backward (its W is the whole backward)
            # Every layer of the stage: the blocks' and the vocabulary-parallel layers' (costs.vocab_collectives).
            layers = [by_name[n] for n in span.layer_names()]
            fwd_tp = sum(len(c.forward_comm) for c in layers)
            redone = sum(len(c.forward_comm) for c, p in zip(blocks, own, strict=True) if p == "full")
            assert len(colls[(span.stage, "B")]) == redone + sum(len(c.backward_comm) for c in layers)
            extra = weight_pass_extra(model, span, [by_name[n] for n in span.layer_names()], policies, True)[1]
            assert colls[(span.stage, "W")] == extra  # calibration's W features: the engine's W collectives
            assert bool(work.rerun_tp) == (schedule.split_backward and bool(extra))
            assert len(colls[(span.stage, "F")]) == fwd_tp
    # Memory: each rank's activations are Σ in-flight × (its blocks under their policies + extras);
    # between a split backward's I and W a micro-batch holds the same less the loss's log-softmax,
    # which I frees, plus the gradients I keeps for W: the logits' (the LM head's) and each parameter
    # group's output gradient (not on the first stage, whose I does nothing).
    per_mb, after_input = [], []
    for span in layout:
        acts = sum(activation_bytes_per_layer(model, plan, policy=policies[b], mask_bytes=MASK_CPU) for b in span.blocks)
        acts += embedding_activation_bytes(model, plan, mask_bytes=MASK_CPU) if span.has_embedding else 0.0
        acts += head_activation_bytes(model, plan) if span.has_head else 0.0
        per_mb.append(acts)
        grad = DTYPE_BYTES[plan.precision] * logit_count(model, plan)
        # ... and every parameter group's output gradient, which torch's I keeps for W (weight_pass_groups)
        kept = 0.0 if span.has_embedding else (sum(weight_pass_grad_bytes(model, plan, part=part) for _, part in span.parts())
                                               + (final_norm_grad_bytes(model, plan) if span.has_head else 0.0))
        after_input.append(acts + kept - (head_logit_bytes(model, plan) - grad if span.has_head and not span.has_embedding
                                          else 0.0))
    schedule = sim.schedule(plan)
    for rm in sim.memory(plan):
        timeline = schedule.held_timeline(rm.rank)
        points = [sum(h.awaiting_input * per_mb[s] + h.awaiting_weight * after_input[s] for s, h in held.items())
                  for held in timeline] or [0.0]
        # The peak is at one point of the timeline (activations plus the gradients that exist there).
        assert any(rm.activations_bytes == pytest.approx(p, rel=1e-12) for p in points)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(), st.sampled_from(["a100-sxm4-40gb", "cpu"]), st.integers(0, 3), st.sampled_from([1, 4, 16, 64]))
def test_tuner_block_caps_agree_with_the_simulator_memory(case: tuple[Model, Plan], device: str, which: int,
                                                          mbs: int) -> None:
    model, plan = case
    plan = dataclasses.replace(plan, layer_memory_policy=None, micro_batch_size=mbs,
                               global_batch_size=mbs * plan.global_batch_size)
    if plan.virtual_stages != 1:
        plan = dataclasses.replace(plan, schedule="1f1b", virtual_stages=1, partition=None)
    big = dataclasses.replace(model, num_layers=96, hidden_size=4096, num_heads=32, seq_len=2048, vocab_size=50304)
    cluster = Cluster(gpu=device, num_nodes=1, gpus_per_node=plan.world_size)
    sim = Simulator(big, cluster)
    caps = sim.block_caps(plan)
    assert caps is not None and len(caps) == plan.pp
    s = which % plan.pp
    others = plan.pp - 1
    checked = 0
    for n in (caps[s], caps[s] + 1):
        rest = big.num_layers - n
        if n < 1 or rest < others or (others == 0 and rest > 0):
            continue
        part = [1] * plan.pp
        part[s] = n
        part[(s + 1) % plan.pp] += rest - others if others else 0
        mem = stage_memory(big, dataclasses.replace(plan, partition=part), sim.device, sim.schedule(plan), part)
        assert mem[s].fits == (n <= caps[s]), (n, caps, part)
        checked += 1
    event(f"block caps checked at {checked} counts")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_executor_builds_and_wraps_what_the_layout_says(case: tuple[Model, Plan]) -> None:
    torch = pytest.importorskip("torch")
    from mindpipe.executor.parallelize import apply_recompute
    from mindpipe.executor.stages import build_stage_modules
    from mindpipe.traces.torch_gpt import build_gpt

    del torch
    model, plan = case
    layout = stage_layout(plan, model)
    policies = block_policies(plan, model.num_layers)
    for rank in range(plan.pp):
        gpt = build_gpt(model, seed=0)
        modules = build_stage_modules(gpt, plan, rank)
        assert sorted(modules) == [span.stage for span in layout if span.rank == rank]
        for s, mod in modules.items():
            span = layout[s]
            assert [int(k) for k in mod.blocks] == list(span.blocks)
            assert (mod.embedding is not None, mod.lm_head is not None) == (span.has_embedding, span.has_head)
            apply_recompute(mod, policies)
            for k, block in mod.blocks.items():
                wrapped = block.__dict__.get("forward")
                core = block.attn.__dict__.get("core")
                kind = ("full" if wrapped is not None and "checkpoint" in wrapped.__qualname__ else
                        "swap" if wrapped is not None else "selective" if core is not None else "none")
                assert kind == policies[int(k)], (k, kind, policies)


def test_keep_under_selective_gives_one_memory_and_one_time_everywhere() -> None:
    """gpt-1.3b, tp2·pp4, every block ``keep``: keep means nothing recomputed.

    The simulator's memory had kept the selective figure of ``recompute=selective`` beside such a
    list while its time dropped the recompute; now a level beside per-block policies is refused (the
    Plan's rule), and memory and time of the list are those of ``recompute=none`` through every path.
    """
    from mindpipe.tuner.evaluate import evaluate
    from mindpipe.tuner.materialize import Problem

    model = load_model("gpt-1.3b")
    cluster = load_cluster("a100-sxm4-80gb:1x8")
    base = Plan(tp=2, pp=4, micro_batch_size=1, global_batch_size=16, schedule="1f1b")
    with pytest.raises(ContractError, match="recompute='selective' beside layer_memory_policy"):
        dataclasses.replace(base, recompute="selective", layer_memory_policy=["keep"] * model.num_layers)
    keep = dataclasses.replace(base, layer_memory_policy=["keep"] * model.num_layers)
    none = dataclasses.replace(base, recompute="none")
    selective = dataclasses.replace(base, recompute="selective")
    sim = Simulator(model, cluster)
    r_keep, r_none, r_sel = sim.run(keep), sim.run(none), sim.run(selective)
    assert r_keep.iteration_time_s == r_none.iteration_time_s < r_sel.iteration_time_s
    assert r_keep.memory_by_stage_gib == r_none.memory_by_stage_gib
    assert r_keep.peak_memory_gib > r_sel.peak_memory_gib
    assert [rm.total_gib for rm in sim.memory(keep)] == r_keep.memory_by_stage_gib
    assert sim.refuse_unless_fits(keep) == r_keep.memory_by_stage_gib  # what the executor's pre-check is given
    # The tuner: a point with the same pinned policies evaluates to the same time and memory.
    point = dict(dp=1, tp=2, pp=4, micro_batch_size=1, global_batch_size=16, schedule="1f1b", virtual_stages=1,
                 recompute="none", sequence_parallel=False, zero_stage=0, comm_priority="fair", precision="bf16",
                 overlap_grad_reduce=False, tp_comm_overlap=False, overlap_param_gather=False, rank_order="tp-dp-pp",
                 partitioner="even")
    record = evaluate(Problem(model, cluster, pinned={"layer_memory_policy": ["keep"] * model.num_layers}), point)
    assert record.metrics.iteration_time_s == r_keep.iteration_time_s
    assert record.metrics.peak_memory_gib == r_keep.peak_memory_gib
