"""What the last stage's LM head and loss keep and allocate per micro-batch (the memory model's
head terms, :mod:`mindpipe.simulator.memory`).

The loss: torch's ``cross_entropy(logits.float())`` keeps its fp32 log-softmax, 4·s·b·V/t per
micro-batch (Korthikanti §4.3), and its backward holds two more fp32 logits-sized gradients at once
(:func:`loss_transient_bytes`) — at a 50k vocabulary the largest tensors of the last stage, which
Korthikanti's count of kept bytes leaves out. The plan's ``loss_chunks`` upcasts the logits in
pieces instead (:func:`head_logit_bytes`), and ``fused_head_loss`` runs the head inside them.
"""

from __future__ import annotations

from mindpipe.simulator.costs import DTYPE_BYTES
from mindpipe.traces.config import Model, Plan

# Cross-entropy runs on fp32 logits (Megatron's vocab-parallel CE and our lm_loss both upcast).
LOGIT_BYTES = 4


def head_activation_bytes(model: Model, plan: Plan, *, seq_len: int | None = None) -> float:
    """Bytes the last stage keeps outside its blocks per micro-batch.

    Final-LayerNorm input and LM-head input (2·d·s·b·h, ÷t with sequence parallelism) and the
    fp32 softmax of the vocabulary-sharded logits (:func:`head_logit_bytes`): Korthikanti §4.3's
    4·s·b·h/t·(1 + V/h) at d = 2 with sequence parallelism.
    """
    return 2 * head_input_bytes(model, plan, seq_len=seq_len) + head_logit_bytes(model, plan, seq_len=seq_len)


def head_input_bytes(model: Model, plan: Plan, *, seq_len: int | None = None) -> float:
    """The LM head's saved input per micro-batch, d·s·b·h (÷t with sequence parallelism: the rank's
    shard); the final LayerNorm keeps as much again."""
    seq_shard = plan.tp if plan.sequence_parallel else 1
    return DTYPE_BYTES[plan.precision] * plan.rank_seq_len(seq_len or model.seq_len) * plan.micro_batch_size * model.hidden_size / seq_shard


def head_logit_bytes(model: Model, plan: Plan, *, seq_len: int | None = None) -> float:
    """What the loss keeps per micro-batch: the fp32 softmax of the vocabulary-sharded logits,
    4·s·b·V/t; with ``loss_chunks`` > 1 the logits themselves in the compute dtype, d·s·b·V/t (the
    pieces upcast one at a time, :func:`mindpipe.traces.torch_gpt.lm_loss`); with
    ``fused_head_loss`` nothing (the head's input, which it keeps, is counted with the head).

    It lies on the loss's side of the LM head's weight, so a split backward's ``I`` frees it
    (:meth:`mindpipe.simulator.actions.Schedule.held_timeline`).
    """
    if plan.fused_head_loss:
        return 0.0
    per_logit = DTYPE_BYTES[plan.precision] if plan.loss_chunks > 1 else LOGIT_BYTES
    return per_logit * logit_count(model, plan, seq_len=seq_len)


def logit_count(model: Model, plan: Plan, *, seq_len: int | None = None) -> float:
    """Logits of one micro-batch on one tensor-parallel rank (vocabulary-sharded), s·b·V/t."""
    return plan.rank_seq_len(seq_len or model.seq_len) * plan.micro_batch_size * model.vocab_size / plan.tp


def loss_transient_bytes(model: Model, plan: Plan, *, seq_len: int | None = None) -> float:
    """What the loss's backward allocates beyond what it keeps, per micro-batch.

    Unchunked (``loss_chunks`` 1), ``F.cross_entropy(logits.float(), targets)``'s backward holds two
    fp32 logits-sized gradients at once (the NLL's, then the log-softmax's), 2·4·s·b·V/t; measured
    with a dispatch mode that follows every tensor's storage: 12·s·b·V bytes at the peak with the
    4 kept, in fp32 and in bf16. Chunked: the logits' gradient in the compute dtype, d·s·b·V/t, and
    one piece's fp32 re-run upcast and its softmax, 2·4·s·b·V/(t·c). The loss's backward runs
    before any block of the micro-batch is redone, so it competes with the redone blocks for the
    stage's transient, not on top of them. (Megatron's fused vocabulary-parallel cross-entropy
    works in place and needs less; the executor runs torch's.) Fused with the head
    (``fused_head_loss``): the head's input gradient (all tokens: its partial sum over the
    vocabulary slice), d·s·b·h, and its weight gradient, d·V·h/t, one piece's fp32 logits and fp32
    softmax, 2·4·s·b·V/(t·c) (the logits in a 16-bit dtype are freed once upcast), and under
    sequence parallelism the input all-gathered again, d·s·b·h (:mod:`mindpipe.traces.torch_head_loss`).
    """
    logits = logit_count(model, plan, seq_len=seq_len)
    d = DTYPE_BYTES[plan.precision]
    if plan.fused_head_loss:
        h = model.hidden_size
        tokens = plan.rank_seq_len(seq_len or model.seq_len) * plan.micro_batch_size
        gathered = d * tokens * h if plan.sequence_parallel else 0.0
        return (d * (tokens * h + model.vocab_size * h / plan.tp) + gathered
                + 2 * LOGIT_BYTES * logits / plan.loss_chunks)
    if plan.loss_chunks == 1:
        return 2 * LOGIT_BYTES * logits
    return d * logits + 2 * LOGIT_BYTES * logits / plan.loss_chunks


__all__ = ["LOGIT_BYTES", "head_activation_bytes", "head_input_bytes", "head_logit_bytes", "logit_count",
           "loss_transient_bytes"]
