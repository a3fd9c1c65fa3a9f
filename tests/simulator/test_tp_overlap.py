"""NeMo's overlaps as plan keys: TE userbuffers' TP overlap, the param all-gather under the forward,
and the memory model following the compute model's FlashAttention (issue 19)."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.api import simulate
from mindpipe.simulator.collectives import overlapped_exposed_s
from mindpipe.simulator.costs import TraceComputeModel
from mindpipe.simulator.memory import FLASH_STAT_BYTES, activation_bytes_per_layer
from mindpipe.simulator.network import Transfers
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.trace import LayerRecord, Provenance, Trace

TP_PLAN = Plan(dp=1, tp=4, pp=1, micro_batch_size=2, global_batch_size=4, sequence_parallel=True, precision="bf16")


@pytest.mark.parametrize(("comm", "gemm", "k", "exposed"), [
    (1.0, 4.0, 4, 0.25),      # the GEMM is longer: one chunk of the collective stays exposed
    (4.0, 1.0, 4, 3.25),      # the collective is longer: its excess plus one chunk of the GEMM
    (2.0, 2.0, 2, 1.0),
    (3.0, 5.0, 1, 3.0),       # one chunk: nothing pipelines
    (3.0, 0.0, 8, 3.0),       # no GEMM beside it
])
def test_overlap_is_a_two_stage_pipeline_of_k_chunks(comm: float, gemm: float, k: int, exposed: float) -> None:
    assert overlapped_exposed_s(comm, gemm, k) == pytest.approx(exposed)
    # The pipeline's makespan max(C, G) + min(C, G)/k, less the GEMM.
    if k > 1 and gemm > 0:
        assert overlapped_exposed_s(comm, gemm, k) == pytest.approx(max(comm, gemm) + min(comm, gemm) / k - gemm)


def test_plan_rules_of_the_overlap_keys() -> None:
    with pytest.raises(ContractError, match="needs sequence_parallel") as e:
        Plan(tp=2, tp_comm_overlap=True)
    assert e.value.key == "tp_comm_overlap"
    with pytest.raises(ContractError, match="zero_stage 1 or 2"):
        Plan(dp=2, global_batch_size=2, overlap_param_gather=True, zero_stage=0, dp_impl="megatron")
    with pytest.raises(ContractError, match="needs dp_impl=megatron"):
        Plan(dp=2, global_batch_size=2, overlap_param_gather=True, zero_stage=2)
    executed = Plan(dp=2, global_batch_size=2, overlap_param_gather=True, zero_stage=2, dp_impl="megatron").as_executed()
    assert executed.overlap_param_gather is False and executed.dp_impl == "fsdp2"
    assert Plan(tp=2, sequence_parallel=True, tp_comm_overlap=True).as_executed().tp_comm_overlap is False


def test_tp_overlap_takes_back_exactly_what_the_gemms_hide() -> None:
    """One stage, TP inside a node: the iteration shortens by m × Σ (C − exposed(C, G, tp)) per pass."""
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x4")
    compute = GpuComputeModel(get_device(cluster.gpu))
    sim = Simulator(model, cluster, compute=compute)
    on = dataclasses.replace(TP_PLAN, tp_comm_overlap=True)
    t_off, t_on = sim.run(TP_PLAN).iteration_time_s, sim.run(on).iteration_time_s
    _, topo, stages, _, _ = sim.work(on)
    alone = Transfers(None, None, topo, sim.comm).time_alone  # type: ignore[arg-type]
    (st,) = stages
    assert len(st.fwd_tp_overlap) > 0 and all(o.chunks == 4 for o in st.fwd_tp_overlap + st.bwd_tp_overlap)
    hidden = sum(o.count * (alone(o.phases) - overlapped_exposed_s(alone(o.phases), o.gemm_s, o.chunks))
                 for o in st.fwd_tp_overlap + st.bwd_tp_overlap)
    m = on.num_microbatches
    assert t_off - t_on == pytest.approx(m * hidden, rel=1e-9)
    # It hides part of the TP collectives, never more than all of them.
    assert 0 < m * hidden < m * (alone(st.fwd_tp) + alone(st.bwd_tp))
    # Every block collective is paired with a GEMM of its own pass: 4 forward, 6 backward per block
    # (sequence parallelism gathers each sub-layer's input again for its weight gradient).
    assert sum(o.count for o in st.fwd_tp_overlap) == 4 * model.num_layers
    assert sum(o.count for o in st.bwd_tp_overlap) == 6 * model.num_layers


def test_tp_overlap_needs_per_gemm_times() -> None:
    model = load_model("gpt-1.3b")
    rec = [LayerRecord("embedding", "embedding", 1e-3, 1e-3, 0.0), LayerRecord("block.0", "block", 1e-2, 1e-2, 1e-2),
           LayerRecord("lm_head", "lm_head", 1e-3, 1e-3, 1e-3)]
    trace = Trace("a100-sxm4-80gb", "bf16", rec, Provenance("test"), micro_batch_size=2, tp=4)
    with pytest.raises(ContractError, match="per-GEMM times"):
        TraceComputeModel(trace).layer_costs(model, dataclasses.replace(TP_PLAN, tp_comm_overlap=True))


def test_a_trace_prices_only_plans_that_run_attention_as_it_was_profiled() -> None:
    model = load_model("gpt-1.3b")
    rec = [LayerRecord("embedding", "embedding", 1e-3, 1e-3, 0.0), LayerRecord("block.0", "block", 1e-2, 1e-2, 1e-2),
           LayerRecord("lm_head", "lm_head", 1e-3, 1e-3, 1e-3)]
    explicit = Trace("a100-sxm4-80gb", "bf16", rec, Provenance("test"), micro_batch_size=2, tp=4)
    fused = dataclasses.replace(explicit, flash_attention=True)
    flash_plan = dataclasses.replace(TP_PLAN, flash_attention=True)
    assert TraceComputeModel(explicit).layer_costs(model, TP_PLAN)
    assert TraceComputeModel(fused).layer_costs(model, flash_plan)
    with pytest.raises(ContractError, match="profiled without flash attention") as e:
        TraceComputeModel(explicit).layer_costs(model, flash_plan)
    assert e.value.key == "flash_attention"
    with pytest.raises(ContractError, match="profiled with flash attention"):
        TraceComputeModel(fused).layer_costs(model, TP_PLAN)


def test_param_gather_overlap_leaves_the_first_bucket_exposed() -> None:
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:2x8")
    plan = Plan(dp=16, micro_batch_size=1, global_batch_size=32, zero_stage=1, precision="bf16", dp_impl="megatron")
    sim = Simulator(model, cluster, compute=GpuComputeModel(get_device(cluster.gpu)))
    t_off = sim.run(plan).iteration_time_s
    t_on = sim.run(dataclasses.replace(plan, overlap_param_gather=True)).iteration_time_s
    _, topo, stages, ranks, _ = sim.work(plan)
    alone = Transfers(None, None, topo, sim.comm).time_alone  # type: ignore[arg-type]
    gathers = [alone(g) for g in ranks[0].param_gather]
    assert len(gathers) > 1
    # Hidden: the later buckets, up to one micro-batch's forward of the rank.
    assert t_off - t_on == pytest.approx(min(sum(gathers[1:]), stages[0].forward_s), rel=1e-6)


def test_memory_and_time_follow_the_plans_flash_attention() -> None:
    """One owner: the plan's flash_attention decides the kernels the compute model prices and what the memory model keeps."""
    model, cluster = load_model("gpt-1.3b"), load_cluster("h100-sxm5-80gb:1x2")
    plan = Plan(dp=1, tp=2, pp=1, micro_batch_size=2, global_batch_size=2, sequence_parallel=True)
    a, s, b, t = model.num_heads, model.seq_len, plan.micro_batch_size, plan.tp
    unfused = activation_bytes_per_layer(model, plan)
    fplan = dataclasses.replace(plan, flash_attention=True)
    flash = activation_bytes_per_layer(model, fplan)
    mask = 1 if model.dropout else 0
    scores = (2 * 2 + mask if model.dropout else 2) * a * s * s * b / t
    assert unfused - flash == pytest.approx(scores - FLASH_STAT_BYTES * a * s * b / t)
    # Selective recompute drops the attention core's saved tensors under both.
    sel = dataclasses.replace(plan, recompute="selective")
    assert activation_bytes_per_layer(model, sel) == activation_bytes_per_layer(
        model, dataclasses.replace(sel, flash_attention=True))
    with_flash = simulate(model, cluster, fplan)
    megatron = simulate(model, cluster, plan)
    assert with_flash.iteration_time_s < megatron.iteration_time_s
    layers = model.num_layers
    assert (megatron.memory_by_stage_gib[0] - with_flash.memory_by_stage_gib[0]) * 2**30 == pytest.approx(
        layers * (unfused - flash), rel=1e-9)


def test_flash_attention_reaches_a_traces_recompute_shares_and_the_swap_transient() -> None:
    """A flash trace's block splits its time by the fused core's share; a swapped flash block brings
    back at most its GeLU input at once (no softmax output exists)."""
    from mindpipe.simulator.memory import StageMemoryModel

    model = dataclasses.replace(load_model("gpt-1.3b"), seq_len=8192)
    rec = [LayerRecord("embedding", "embedding", 1e-3, 1e-3, 0.0), LayerRecord("block.0", "block", 1e-2, 1e-2, 1e-2),
           LayerRecord("lm_head", "lm_head", 1e-3, 1e-3, 1e-3)]
    plan = Plan(micro_batch_size=1, global_batch_size=1, precision="bf16")
    explicit = Trace("a100-sxm4-80gb", "bf16", rec, Provenance("test"), micro_batch_size=1)
    fused = dataclasses.replace(explicit, flash_attention=True)
    sel_explicit = TraceComputeModel(explicit).layer_costs(model, plan)[1].recompute_selective_s
    sel_flash = TraceComputeModel(fused).layer_costs(model, dataclasses.replace(plan, flash_attention=True))[1].recompute_selective_s
    assert 0 < sel_flash < sel_explicit  # the fused core moves less memory than the s²-sized kernels
    dev = get_device("a100-sxm4-80gb")
    s, b, d = model.seq_len, 1, 2
    gelu = d * b * s * model.ffn
    assert StageMemoryModel(model, dataclasses.replace(plan, flash_attention=True), dev, None, None).largest_saved_bytes() == gelu
    assert StageMemoryModel(model, plan, dev, None, None).largest_saved_bytes() == d * b * model.num_heads * s * s
