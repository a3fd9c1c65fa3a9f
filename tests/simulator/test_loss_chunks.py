"""Plan key ``loss_chunks``: the simulator's memory and time of a chunked cross-entropy."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.costs import RooflineComputeModel, TraceComputeModel
from mindpipe.simulator.memory import head_logit_bytes, loss_transient_bytes, stage_memory
from mindpipe.simulator.ops import chunked_cross_entropy_ops, cross_entropy_ops, lm_head_ops
from mindpipe.simulator.schedules import build_schedule
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.trace import LayerRecord, Provenance, Trace

MODEL = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=1000)
A100 = get_device("a100-sxm4-40gb")


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_chunked_loss_keeps_the_logits_in_the_compute_dtype(precision):
    plan = Plan(pp=2, global_batch_size=4, micro_batch_size=2, precision=precision)
    chunked = dataclasses.replace(plan, loss_chunks=8)
    logits = 32 * 2 * 1000
    assert head_logit_bytes(MODEL, plan) == 4 * logits  # the fp32 log-softmax
    d = 2 if precision == "bf16" else 4
    assert head_logit_bytes(MODEL, chunked) == d * logits
    # Backward: two fp32 gradients unchunked; the compute-dtype gradient and one piece's fp32 work chunked.
    assert loss_transient_bytes(MODEL, plan) == 8 * logits
    assert loss_transient_bytes(MODEL, chunked) == d * logits + 8 * logits / 8


def test_chunked_loss_lowers_the_last_stage_peak_in_bf16():
    plan = Plan(pp=2, global_batch_size=4, micro_batch_size=2)
    sched = build_schedule("1f1b", 2, 2)
    whole = stage_memory(MODEL, plan, A100, sched, [2, 2], reserved_bytes=0)
    chunked = stage_memory(MODEL, dataclasses.replace(plan, loss_chunks=4), A100, sched, [2, 2], reserved_bytes=0)
    assert whole[0].total_bytes == chunked[0].total_bytes  # the first stage has no loss
    logits = 32 * 2 * 1000
    # The last stage holds one micro-batch: kept 4 → 2 bytes per logit, transient 8 → 2 + 8/4.
    assert whole[1].total_bytes - chunked[1].total_bytes == pytest.approx((4 + 8 - 2 - 2 - 2) * logits)


def test_chunked_cross_entropy_ops_rerun_the_forward_in_the_backward():
    tokens, v = 100, 1000
    plain = cross_entropy_ops(tokens, v)
    ops = chunked_cross_entropy_ops(tokens, v, 3)
    fwd = sum(o.bytes for o in plain if o.phase == "forward")
    bwd = sum(o.bytes for o in plain if o.phase != "forward")
    assert sum(o.bytes for o in ops if o.phase == "forward") == pytest.approx(fwd)
    assert sum(o.bytes for o in ops if o.phase != "forward") == pytest.approx(bwd + fwd)
    assert len(ops) == 3 * (len(plain) + sum(o.phase == "forward" for o in plain))  # kernels per piece
    assert lm_head_ops(MODEL, 2, 32, loss_chunks=1)[3:] == cross_entropy_ops(64, 1000)


def test_compute_models_charge_the_rerun_to_the_head_backward():
    plan = Plan(micro_batch_size=2, global_batch_size=2)
    chunked = dataclasses.replace(plan, loss_chunks=4)
    roof = RooflineComputeModel(A100)
    head, head_c = roof.layer_costs(MODEL, plan)[-1], roof.layer_costs(MODEL, chunked)[-1]
    assert head_c.forward_s == pytest.approx(head.forward_s)
    assert head_c.backward_input_s > head.backward_input_s
    assert head_c.backward_weight_s == pytest.approx(head.backward_weight_s)
    # A trace times the unchunked loss; the chunked plan adds the loss's share of the head forward.
    recs = [LayerRecord(name="embedding", kind="embedding", forward_s=1e-4, backward_input_s=1e-4, backward_weight_s=1e-4),
            LayerRecord(name="block.0", kind="block", forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=1e-3),
            LayerRecord(name="lm_head", kind="lm_head", forward_s=2e-3, backward_input_s=2e-3, backward_weight_s=1e-3)]
    trace = Trace("a100-sxm4-40gb", "bf16", recs, Provenance("test"), micro_batch_size=2, seq_len=32)
    tm = TraceComputeModel(trace)
    t_head, t_head_c = tm.layer_costs(MODEL, plan)[-1], tm.layer_costs(MODEL, chunked)[-1]
    assert t_head.backward_input_s == pytest.approx(2e-3)
    assert 2e-3 < t_head_c.backward_input_s < 2e-3 + t_head_c.forward_s


def test_loss_chunks_rules():
    with pytest.raises(ContractError, match="loss_chunks=0 must be > 0"):
        Plan(loss_chunks=0)
    with pytest.raises(ContractError, match="loss_chunks=65 exceeds the micro-batch's tokens"):
        check_plan(Plan(loss_chunks=65, micro_batch_size=2, global_batch_size=2), MODEL)
    check_plan(Plan(loss_chunks=64, micro_batch_size=2, global_batch_size=2), MODEL)


def test_gpt2_xl_sized_head_fits_a_larger_micro_batch_chunked():
    """A 50,257-token vocabulary: the loss's fp32 tensors dominate the last stage."""
    model = Model(kind="gpt", num_layers=8, hidden_size=1600, num_heads=25, seq_len=1024, vocab_size=50257)
    plan = Plan(pp=2, micro_batch_size=8, global_batch_size=16, recompute="full")
    sched = build_schedule("1f1b", 2, 2)
    whole = stage_memory(model, plan, A100, sched, [4, 4])[1].total_bytes
    chunked = stage_memory(model, dataclasses.replace(plan, loss_chunks=16), A100, sched, [4, 4])[1].total_bytes
    assert chunked < whole - 7 * 1024 * 8 * 50257  # (4 + 8) − (2 + 2 + 0.5) bytes per logit saved
