"""The LM head and the cross-entropy fused, piece by piece: no ``[tokens, V]`` logits are kept.

A plan's ``fused_head_loss`` (:class:`mindpipe.traces.config.Plan`) runs the LM head's GEMM inside
the loss, over ``loss_chunks`` pieces of tokens (torchtitan's ``ChunkedLossWrapper`` "bounds the
number of tokens processed by the LM head and loss at once"; Liger-Kernel's
``FusedLinearCrossEntropy``; Wijmans et al., "Cut your losses in large-vocabulary language
models", arXiv 2411.09009). The unfused head writes the whole ``[N, V]`` logits (N = s·b tokens),
and torch's cross-entropy keeps their fp32 log-softmax for the backward — 4·N·V bytes per
micro-batch, at a 50k vocabulary the last pipeline stage's largest tensor; ``loss_chunks`` alone
still keeps the logits in the compute dtype (d·N·V).

:class:`LinearCrossEntropy` keeps nothing but the head's input (the final norm's output, which the
unfused head keeps as well), the weight (a parameter) and the integer targets. Its backward
re-computes each piece's logits — one more ``[N/c, h]×[h, V]`` GEMM per piece, the price of the
memory (torchtitan and Liger instead run the head's backward inside the loss's forward, which
needs no re-computation but moves the head's weight gradient into the forward; a pipeline
schedule's F, B and W would then no longer be what the simulator's split of the head says). The
weight gradient is taken in the same backward pass as the input gradient — it needs each piece's
logit gradient, which is not kept — so under a split backward (zero-bubble schedules) the head's
W is done in I (:func:`mindpipe.simulator.ops.fused_head_loss_ops` prices it there).

Memory, per micro-batch (N tokens, V logits per token, h hidden, d bytes per element of the
compute dtype, c pieces; :func:`mindpipe.simulator.memory.loss_transient_bytes` prices the same):

* **forward** (autograd off inside): one piece's logits (d), their fp32 copy (none when d = 4:
  ``.float()`` returns the tensor itself) and torch's fp32 log-softmax inside ``F.cross_entropy``,
  freed piece by piece;
* **backward**: the input gradient ``[N, h]`` and the weight gradient ``[V, h]`` it returns (d
  each), and per piece the fp32 logits (a 16-bit GEMM's output is freed once upcast) and their
  fp32 softmax, which is turned into the piece's logit gradient in place and cast to the compute
  dtype (d, after the logits are freed) — at most 2·4·N·V/c at once.

The weight gradient is accumulated over the pieces in the weight's dtype with ``addmm_`` (Liger's
choice): under bf16 that rounds once per piece where the unfused head's single GEMM rounds once;
in fp32 the two agree to rounding (the parity tests).

Under tensor parallelism (a :class:`~mindpipe.traces.torch_gpt.VocabShard`) the head is Megatron's
vocabulary-parallel one: each rank holds ``V/t`` rows of the weight and computes every token's
logits over its slice; the log-softmax reduces the row maximum and the sum of exponentials over
the group per piece (:func:`~mindpipe.traces.torch_gpt.vocab_log_softmax`), a token's loss term
lives on the rank that holds its target, and the loss is summed over the group. The input
gradient of each rank is a partial sum: all-reduced over the group, or — under sequence
parallelism, where the input is the rank's ``[b, s/t, h]`` shard, all-gathered along the sequence
in the forward and again in the backward (only the shard is kept, as Megatron's column-parallel
GEMMs keep it) — reduced to the rank's shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:
    from mindpipe.traces.torch_gpt import VocabShard


def _pieces(flat: torch.Tensor, chunks: int) -> tuple[torch.Tensor, ...]:
    """Contiguous runs of tokens, sizes differing by at most one (``torch.tensor_split``, as
    :class:`mindpipe.traces.torch_gpt.ChunkedCrossEntropy` cuts them)."""
    return torch.tensor_split(flat, chunks)


def gather_sequence(shard: torch.Tensor, group: Any) -> torch.Tensor:
    """``[b, s/t, h]`` shards of the group → the whole ``[b, s, h]`` (rank order along dim 1): the
    sequence-parallel all-gather of a saved shard (here and :mod:`mindpipe.executor.sp_linear`)."""
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, shard.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def _reduce_to_shard(full: torch.Tensor, group: Any) -> torch.Tensor:
    """The group's sum of partial ``[b, s, h]`` gradients, this rank's ``[b, s/t, h]`` slice of it
    (a reduce-scatter; an all-reduce and a slice where the backend has none, as gloo)."""
    t, r = dist.get_world_size(group), dist.get_rank(group)
    if dist.get_backend(group) != "gloo":
        chunks = full.tensor_split(t, dim=1)
        out = torch.empty_like(chunks[r])
        dist.reduce_scatter_tensor(out, torch.cat([c.contiguous().reshape(-1) for c in chunks]), group=group)
        return out
    dist.all_reduce(full, group=group)
    return full.tensor_split(t, dim=1)[r].contiguous()


def _log_probs(logits: torch.Tensor, shard: VocabShard | None) -> torch.Tensor:
    """fp32 log-softmax over the whole vocabulary of one piece's (vocabulary-sharded) logits."""
    if shard is None:
        return torch.log_softmax(logits, dim=-1)
    from mindpipe.traces.torch_gpt import vocab_log_softmax

    return vocab_log_softmax(logits, shard)


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weightᵀ`` against ``targets``, ``chunks`` pieces at a time
    (module docstring); ``shard``: vocabulary-parallel over its group, ``sequence_parallel``:
    ``hidden`` is the rank's shard of the sequence."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunks: int,
                shard: VocabShard | None = None, sequence_parallel: bool = False) -> torch.Tensor:
        """The mean over all tokens of the pieces' fp32 cross-entropies (autograd is off here)."""
        full = gather_sequence(hidden, shard.group) if shard is not None and sequence_parallel else hidden
        flat, flat_targets = full.reshape(-1, full.shape[-1]), targets.reshape(-1)
        ctx.save_for_backward(hidden, weight, flat_targets)
        ctx.chunks, ctx.shard, ctx.sequence_parallel = chunks, shard, sequence_parallel
        # Per-token fp32 losses summed in fp64, as the chunked cross-entropy does: the pieces add no
        # rounding of their own to the mean.
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        for piece, t in zip(_pieces(flat, chunks), _pieces(flat_targets, chunks), strict=True):
            logits = F.linear(piece, weight).float()
            if shard is None:
                total += F.cross_entropy(logits, t, reduction="none").sum(dtype=torch.float64)
            else:  # a token's term on the rank that holds its target (the others' are IGNORED)
                local, _ = shard.local_targets(t)
                total += F.nll_loss(_log_probs(logits, shard), local, reduction="none",
                                    ignore_index=-100).sum(dtype=torch.float64)
            del logits
        if shard is not None:
            dist.all_reduce(total, group=shard.group)
        return (total / flat.shape[0]).float()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None, None, None]:
        """Per piece: logits again, (softmax − one-hot)·g/N, then its input and weight gradients."""
        hidden, weight, targets = ctx.saved_tensors
        shard: VocabShard | None = ctx.shard
        sp = shard is not None and ctx.sequence_parallel
        full = gather_sequence(hidden, shard.group) if sp else hidden  # type: ignore[union-attr]
        flat = full.reshape(-1, full.shape[-1])
        grad_full = torch.empty_like(flat)
        grad_weight = torch.zeros_like(weight)
        scale = grad_output.float() / flat.shape[0]
        pieces = zip(_pieces(flat, ctx.chunks), _pieces(targets, ctx.chunks), _pieces(grad_full, ctx.chunks),
                     strict=True)
        for piece, t, out in pieces:
            logits = F.linear(piece, weight).float()
            probs = torch.softmax(logits, dim=-1) if shard is None else _log_probs(logits, shard).exp_()
            del logits
            rows = torch.arange(t.shape[0], device=t.device)
            if shard is not None:
                t, inside = shard.local_targets(t)
                rows, t = rows[inside], t[inside]
            probs[rows, t] -= 1.0
            g = probs.mul_(scale).to(piece.dtype)
            del probs
            torch.mm(g, weight, out=out)
            grad_weight.addmm_(g.t(), piece)
            del g  # before the next piece's logits: one piece's buffers at a time
        del full, flat
        grad = grad_full.view(*hidden.shape[:-2], -1, hidden.shape[-1])
        if shard is None:
            return grad, grad_weight, None, None, None, None
        if sp:  # each rank's input gradient is a partial sum over its vocabulary slice
            return _reduce_to_shard(grad, shard.group), grad_weight, None, None, None, None
        dist.all_reduce(grad, group=shard.group)
        return grad, grad_weight, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunks: int = 1,
                         shard: VocabShard | None = None, sequence_parallel: bool = False) -> torch.Tensor:
    """Mean next-token cross-entropy of the LM head ``weight`` (``[V, h]``, or this rank's ``[V/t, h]``
    rows with ``shard``) applied to ``hidden`` (``[..., h]``; with ``sequence_parallel`` this rank's
    ``[b, s/t, h]`` shard), in fp32, fused piece by piece (:class:`LinearCrossEntropy`)."""
    out: torch.Tensor = LinearCrossEntropy.apply(hidden, weight, targets, chunks, shard, sequence_parallel)
    return out


__all__ = ["LinearCrossEntropy", "gather_sequence", "linear_cross_entropy"]
