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
schedule's F, B and W would then no longer be what the simulator's split of the head says).

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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable


def _pieces(flat: torch.Tensor, chunks: int) -> tuple[torch.Tensor, ...]:
    """Contiguous runs of tokens, sizes differing by at most one (``torch.tensor_split``, as
    :class:`mindpipe.traces.torch_gpt.ChunkedCrossEntropy` cuts them)."""
    return torch.tensor_split(flat, chunks)


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weightᵀ`` against ``targets``, ``chunks`` pieces at a time (module docstring)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunks: int) -> torch.Tensor:
        """The mean over all tokens of the pieces' fp32 cross-entropies (autograd is off here)."""
        flat, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        ctx.save_for_backward(hidden, weight, flat_targets)
        ctx.chunks = chunks
        # Per-token fp32 losses summed in fp64, as the chunked cross-entropy does: the pieces add no
        # rounding of their own to the mean.
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        for piece, t in zip(_pieces(flat, chunks), _pieces(flat_targets, chunks), strict=True):
            total += F.cross_entropy(F.linear(piece, weight).float(), t, reduction="none").sum(dtype=torch.float64)
        return (total / flat.shape[0]).float()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        """Per piece: logits again, (softmax − one-hot)·g/N, then its input and weight gradients."""
        hidden, weight, targets = ctx.saved_tensors
        flat = hidden.reshape(-1, hidden.shape[-1])
        grad_hidden = torch.empty_like(flat)
        grad_weight = torch.zeros_like(weight)
        scale = grad_output.float() / flat.shape[0]
        pieces = zip(_pieces(flat, ctx.chunks), _pieces(targets, ctx.chunks), _pieces(grad_hidden, ctx.chunks),
                     strict=True)
        for piece, t, out in pieces:
            probs = torch.softmax(F.linear(piece, weight).float(), dim=-1)
            probs[torch.arange(t.shape[0], device=t.device), t] -= 1.0
            g = probs.mul_(scale).to(piece.dtype)
            del probs
            torch.mm(g, weight, out=out)
            grad_weight.addmm_(g.t(), piece)
            del g  # before the next piece's logits: one piece's buffers at a time
        return grad_hidden.view_as(hidden), grad_weight, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunks: int = 1) -> torch.Tensor:
    """Mean next-token cross-entropy of the LM head ``weight`` (``[V, h]``) applied to ``hidden``
    (``[..., h]``), in fp32, fused piece by piece (:class:`LinearCrossEntropy`)."""
    out: torch.Tensor = LinearCrossEntropy.apply(hidden, weight, targets, chunks)
    return out


__all__ = ["LinearCrossEntropy", "linear_cross_entropy"]
