"""Context parallelism in torch: each rank holds a share of every sequence and attends over all of it.

The plan's ``cp`` ranks of one replica split each sequence into 2·cp equal chunks; rank r holds
chunks r and 2·cp − 1 − r (the load-balanced layout of Megatron-core and Llama 3: under the causal
mask an early chunk attends to few keys and a late one to many, so every rank gets one of each).
Every layer but the attention core works on the rank's s/cp tokens as it would on a short
sequence; positions (GPT's learned table, Llama's rotary angles) are the tokens' global ones.

The attention core follows Llama 3's context parallelism (Dubey et al. 2024, §3.3.2): K and V are
all-gathered over the ``cp`` group and each rank attends its own queries to the whole sequence
with the causal mask of their global positions (``scaled_dot_product_attention`` with a boolean
mask, one call per query chunk over the keys up to it). What autograd keeps is what a FlashAttention rank keeps — the rank's own q, k
and v, no s²-sized tensor and no gathered K/V: :class:`_ContextAttention` gathers K and V again in
the backward and re-runs the rank's attention forward there (FlashAttention's backward recomputes
the probabilities too, from a saved log-sum-exp this public kernel does not return), then sums
each rank's chunks of the K/V gradients back to it (a reduce-scatter; an all-reduce where an
older gloo has none). The simulator prices exactly this by default (the plan's
``cp_comm_type=allgather``): the blocking forward all-gather and backward all-gather plus
reduce-scatter on the cp group (:func:`mindpipe.simulator.costs.cp_collectives`), one kernel per
query chunk over the keys up to it (:func:`_attend`), and their forward again in the backward
(:mod:`mindpipe.simulator.ops`).
Transformer Engine's ring (``cp_comm_type=p2p``, a what-if knob) moves the same bytes in cp − 1
steps under kernels that skip the causally masked chunks.

The single owner of the layout is :class:`ContextShard`; the models read it from their attention
and embedding modules' ``context`` attribute (:func:`mindpipe.traces.torch_models.use_context_parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F


@dataclass(frozen=True)
class ContextShard:
    """This rank's place in its ``cp`` group: which two of the 2·size chunks of a sequence it holds.

    Attributes:
        group: The cp process group (None only when ``size`` is 1).
        rank: This rank's index in the group.
        size: cp.
    """

    group: Any
    rank: int
    size: int

    @classmethod
    def of(cls, group: Any) -> ContextShard:
        """The shard of this process in ``group``."""
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    @property
    def chunks(self) -> tuple[int, int]:
        """The indices of the two chunks this rank holds, in order."""
        return self.rank, 2 * self.size - 1 - self.rank

    def take(self, full: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's share of ``full`` along its sequence dimension ``dim`` (2·size must divide it)."""
        parts = full.chunk(2 * self.size, dim=dim)
        return torch.cat([parts[c] for c in self.chunks], dim=dim).contiguous()

    def positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """Global positions ``[local_len]`` (int64) of the tokens this rank holds."""
        c = local_len // 2
        return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in self.chunks])

    def gather(self, local: torch.Tensor, dim: int) -> torch.Tensor:
        """The whole sequence along ``dim`` from every rank's share, in global order (a collective)."""
        pieces = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(pieces, local.contiguous(), group=self.group)
        halves = [p.chunk(2, dim=dim) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=dim)

    def reduce_to_shares(self, full: torch.Tensor, dim: int) -> torch.Tensor:
        """Each rank's share of the sum over ranks of ``full`` (a whole-sequence tensor along ``dim``)."""
        parts = full.chunk(2 * self.size, dim=dim)
        n = 2 * self.size
        # Rank-major: rank j's two chunks next to each other, ranks in order.
        by_rank = torch.cat([torch.cat([parts[j], parts[n - 1 - j]], dim=dim) for j in range(self.size)], dim=dim)
        out = torch.empty_like(by_rank.chunk(self.size, dim=dim)[0]).movedim(dim, 0).contiguous()
        try:
            dist.reduce_scatter_tensor(out, by_rank.movedim(dim, 0).contiguous(), group=self.group)
        except (NotImplementedError, RuntimeError):
            if dist.get_backend(self.group) == "nccl":
                raise
            # an older gloo has no reduce-scatter: the sum everywhere, then this rank's part.
            dist.all_reduce(by_rank, group=self.group)
            return by_rank.chunk(self.size, dim=dim)[self.rank].contiguous()
        return out.movedim(0, dim)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: ContextShard, dropout_p: float,
            gqa: bool) -> torch.Tensor:
    """The rank's queries against the whole sequence's keys (``[b, heads, s_local, d]``, K/V ``[b, kv, S, d]``).

    One kernel per query chunk, over the keys of the chunks up to its own (the rest are causally
    masked for every one of its queries), with the causal mask of the global positions on the
    last: chunk c computes L·(c+1)·L query-key pairs, the rank's two (2·cp+1)·L² — against
    2·L·2·cp·L over the whole sequence, about half for a large cp.
    """
    size = q.size(2) // 2
    outs = []
    for i, c in enumerate(shard.chunks):
        n = (c + 1) * size
        qpos = torch.arange(c * size, n, device=q.device)
        mask = torch.arange(n, device=q.device)[None, :] <= qpos[:, None]
        outs.append(F.scaled_dot_product_attention(q[:, :, i * size:(i + 1) * size], k[:, :, :n], v[:, :, :n],
                                                   attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa))
    return torch.cat(outs, dim=2)


class _ContextAttention(torch.autograd.Function):
    """Attention over the cp group that keeps only the rank's own q, k and v (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: ContextShard,
                dropout_p: float, gqa: bool) -> torch.Tensor:
        ctx.shard, ctx.dropout_p, ctx.gqa = shard, dropout_p, gqa
        ctx.rng = _rng_state(q.device) if dropout_p else None
        ctx.save_for_backward(q, k, v)  # a Function's forward records no graph: the gathered K/V are transients
        return _attend(q, shard.gather(k, 2), shard.gather(v, 2), shard, dropout_p, gqa)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v = ctx.saved_tensors
        shard: ContextShard = ctx.shard
        with torch.enable_grad(), torch.random.fork_rng(devices=[q.device] if q.device.type == "cuda" else [],
                                                        enabled=ctx.rng is not None):
            if ctx.rng is not None:  # the forward's dropout mask again
                _set_rng_state(q.device, ctx.rng)
            qd = q.detach().requires_grad_()
            kf = shard.gather(k.detach(), 2).requires_grad_()
            vf = shard.gather(v.detach(), 2).requires_grad_()
            out = _attend(qd, kf, vf, shard, ctx.dropout_p, ctx.gqa)
            dq, dk, dv = torch.autograd.grad(out, (qd, kf, vf), grad)
        return dq, shard.reduce_to_shares(dk, 2), shard.reduce_to_shares(dv, 2), None, None, None


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(device: torch.device, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: ContextShard, dropout_p: float = 0.0,
                      gqa: bool = False) -> torch.Tensor:
    """Causal attention of this rank's queries ``[b, heads, s/cp, d]`` over the whole sequence, whose
    keys and values ``[b, kv, s/cp, d]`` are spread over the cp group (module docstring). ``gqa``:
    ``kv`` divides ``heads``, query head i uses K/V head i // (heads/kv)."""
    out: torch.Tensor = _ContextAttention.apply(q, k, v, shard, dropout_p, gqa)  # type: ignore[no-untyped-call]
    return out


__all__ = ["ContextShard", "context_attention"]
