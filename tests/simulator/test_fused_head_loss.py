"""Plan key ``fused_head_loss``: the LM head's GEMM fused into the chunked loss, in the simulator,
the plan rules and the tuner's space."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.activations import final_norm_grad_bytes, weight_pass_grad_bytes
from mindpipe.simulator.costs import RooflineComputeModel, TraceComputeModel
from mindpipe.simulator.memory import head_logit_bytes, loss_transient_bytes, stage_memory
from mindpipe.simulator.ops import cross_entropy_ops, fused_head_loss_ops, lm_head_ops
from mindpipe.simulator.schedules import build_schedule
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import check_supernet_plan
from mindpipe.traces.trace import LayerRecord, Provenance, Trace
from mindpipe.tuner.keys import parse_fixes
from mindpipe.tuner.space import SearchSpace

MODEL = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=1000)
A100 = get_device("a100-sxm4-40gb")


def _gemm_flops(ops, phase: str) -> float:
    return sum(o.flops for o in ops if o.kind == "gemm" and o.phase == phase)


def test_fused_ops_run_the_head_gemm_again_in_the_backward():
    tokens, v, h = 100, 1000, 64
    ops = fused_head_loss_ops(tokens, v, h, 3)
    gemm = 2.0 * tokens * v * h
    assert _gemm_flops(ops, "forward") == pytest.approx(gemm)
    # One backward pass: the logits again, dX and dW (a split backward's W has none of the head).
    assert _gemm_flops(ops, "backward_input") == pytest.approx(3 * gemm)
    assert _gemm_flops(ops, "backward_weight") == 0
    assert sum(o.kind == "gemm" and o.phase == "forward" for o in ops) == 3  # one GEMM per piece
    assert [o.gemm_mnk for o in ops if o.kind == "gemm" and o.phase == "forward"] == [(34, v, h), (33, v, h), (33, v, h)]
    plain = cross_entropy_ops(tokens, v)
    fwd = sum(o.bytes for o in plain if o.phase == "forward")
    loss_bytes = sum(o.bytes for o in ops if o.kind == "memory")
    assert loss_bytes == pytest.approx(sum(o.bytes for o in plain) + fwd)  # the loss's forward kernels re-run
    assert lm_head_ops(MODEL, 2, 32, loss_chunks=3, fused=True) == fused_head_loss_ops(64, 1000, 64, 3)


@pytest.mark.parametrize("precision,d", [("bf16", 2), ("fp32", 4)])
def test_nothing_logits_sized_is_kept(precision, d):
    plan = Plan(pp=2, global_batch_size=4, micro_batch_size=2, precision=precision, loss_chunks=8, fused_head_loss=True)
    logits, tokens = 32 * 2 * 1000, 32 * 2
    assert head_logit_bytes(MODEL, plan) == 0
    # Backward: the head's input and weight gradients, one piece's fp32 logits and softmax.
    assert loss_transient_bytes(MODEL, plan) == d * (tokens * 64 + 1000 * 64) + 8 * logits / 8


def test_fused_loss_lowers_the_last_stage_peak_and_costs_one_head_gemm():
    plan = Plan(pp=2, global_batch_size=4, micro_batch_size=2, loss_chunks=4)
    fused = dataclasses.replace(plan, fused_head_loss=True)
    sched = build_schedule("1f1b", 2, 2)
    chunked_mem = stage_memory(MODEL, plan, A100, sched, [2, 2], reserved_bytes=0)
    fused_mem = stage_memory(MODEL, fused, A100, sched, [2, 2], reserved_bytes=0)
    assert chunked_mem[0].total_bytes == fused_mem[0].total_bytes
    logits = 32 * 2 * 1000
    assert chunked_mem[1].activations_bytes - fused_mem[1].activations_bytes == 2 * logits  # bf16 logits
    roof = RooflineComputeModel(A100)
    head, head_f = roof.layer_costs(MODEL, plan)[-1], roof.layer_costs(MODEL, fused)[-1]
    assert head_f.backward_weight_s == 0
    assert head_f.backward_input_s > head.backward_input_s + head.backward_weight_s  # the head GEMM again


def test_under_a_split_backward_the_fused_head_frees_its_input_at_i():
    """zb_h1: I takes the fused head's dW, so the last stage keeps neither the logits' gradient (the
    unfused head's, for W) nor the head's input until W."""
    from mindpipe.simulator.memory import StageMemoryModel

    plan = Plan(pp=2, global_batch_size=4, micro_batch_size=2, loss_chunks=4, schedule="zb_h1")
    fused = dataclasses.replace(plan, fused_head_loss=True)
    for p in (plan, fused):
        terms = StageMemoryModel(MODEL, p, A100, 0.0, None, split_backward=True).stage(["none"] * 2, False, True)
        logits, grad = head_logit_bytes(MODEL, p), 2 * 32 * 2 * 1000
        head_input = 2 * 32 * 2 * 64
        # both keep each parameter group's output gradient for W (two blocks', the final norm's)
        kept = 2 * weight_pass_grad_bytes(MODEL, p) + final_norm_grad_bytes(MODEL, p)
        want = terms.per_microbatch_bytes - (head_input if p.fused_head_loss else logits - grad) + kept
        assert terms.after_input_bytes == want


def test_a_trace_prices_the_rerun_of_the_whole_head_forward():
    recs = [LayerRecord(name="embedding", kind="embedding", forward_s=1e-4, backward_input_s=1e-4, backward_weight_s=1e-4),
            LayerRecord(name="block.0", kind="block", forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=1e-3),
            LayerRecord(name="lm_head", kind="lm_head", forward_s=2e-3, backward_input_s=2e-3, backward_weight_s=1e-3)]
    trace = Trace("a100-sxm4-40gb", "bf16", recs, Provenance("test"), micro_batch_size=2, seq_len=32)
    plan = Plan(micro_batch_size=2, global_batch_size=2, loss_chunks=4)
    chunked = TraceComputeModel(trace).layer_costs(MODEL, plan)[-1]
    fused = TraceComputeModel(trace).layer_costs(MODEL, dataclasses.replace(plan, fused_head_loss=True))[-1]
    # The chunked loss re-runs its own kernels; fused, the GEMM too: all of the head's forward, again.
    assert 2e-3 < chunked.backward_input_s < fused.backward_input_s
    assert fused.backward_input_s == pytest.approx(2e-3 + 2e-3, rel=0.01)


def test_fused_head_loss_rules():
    check_plan(Plan(tp=2, sequence_parallel=True, fused_head_loss=True), MODEL)  # vocabulary-parallel
    check_plan(Plan(pp=2, micro_batch_size=1, global_batch_size=2, schedule="zb_h1", fused_head_loss=True), MODEL)
    with pytest.raises(ContractError, match=r"fused_head_loss=.* must be true or false"):
        Plan(fused_head_loss=1)  # type: ignore[arg-type]
    tied = Model(kind="llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
                 seq_len=32, vocab_size=1000, tie_embeddings=True)
    with pytest.raises(ContractError, match="needs an untied LM head"):
        check_plan(Plan(fused_head_loss=True), tied, source="plan.json")
    check_plan(Plan(pp=2, micro_batch_size=1, global_batch_size=2, fused_head_loss=True), MODEL)


def test_supernets_refuse_it():
    from mindpipe.traces.builtin import load_supernet

    net = load_supernet("supernet-mini")
    with pytest.raises(ContractError, match="fused_head_loss=true is not supported for supernets"):
        check_supernet_plan(Plan(subnet_schedule="csp", subnet_window=2, fused_head_loss=True), net)


def _points(*fixes: str) -> list[dict]:
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=4)
    return SearchSpace(MODEL, cluster, [8], parse_fixes(fixes)).points


def test_the_tuner_searches_it_only_when_pinned():
    assert {p["fused_head_loss"] for p in _points()} == {False}
    both = _points("fused_head_loss=false,true")
    assert {p["fused_head_loss"] for p in both} == {False, True}
    fused = [p for p in both if p["fused_head_loss"]]
    assert {p["tp"] for p in fused} > {1} and {p["schedule"] for p in fused} >= {"zb_h1", "1f1b"}
    pinned = _points("fused_head_loss=true")
    assert pinned and all(p["fused_head_loss"] for p in pinned)


def test_tensor_parallel_collectives_of_the_fused_head():
    from mindpipe.simulator.costs import vocab_collectives

    plan = Plan(tp=2, micro_batch_size=2, global_batch_size=2, loss_chunks=4, fused_head_loss=True)
    fwd, bwd = vocab_collectives(MODEL, plan)["lm_head"]
    hidden = 2 * 32 * 64 * 2  # tokens × h × bf16
    assert [c.op for c in fwd] == ["allreduce"] * 9 and sum(c.nbytes for c in fwd[:-1]) == 2 * 4 * 64
    assert bwd[-1].op == "allreduce" and bwd[-1].nbytes == hidden  # the input gradient's partial sums
    sp = dataclasses.replace(plan, sequence_parallel=True)
    fwd, bwd = vocab_collectives(MODEL, sp)["lm_head"]
    assert (fwd[0].op, bwd[0].op, bwd[-1].op) == ("allgather", "allgather", "reducescatter")
    # Memory: the input all-gathered again in the backward under sequence parallelism.
    assert loss_transient_bytes(MODEL, sp) - loss_transient_bytes(MODEL, plan) == hidden
