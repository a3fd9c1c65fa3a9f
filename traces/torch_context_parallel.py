"""Context parallelism in torch: each rank holds a share of every sequence and attends over all of it.

The plan's ``cp`` ranks of one replica split each sequence into 2·cp equal chunks; rank r holds
chunks r and 2·cp − 1 − r (the load-balanced layout of Megatron-core and Llama 3: under the causal
mask an early chunk attends to few keys and a late one to many, so every rank gets one of each).
Every layer but the attention core works on the rank's s/cp tokens as it would on a short
sequence; positions (GPT's learned table, Llama's rotary angles) are the tokens' global ones.

How K and V reach every rank is the plan's ``cp_comm_type`` (:attr:`ContextShard.comm`).

``allgather`` (the default) follows Llama 3's context parallelism (Dubey et al. 2024, §3.3.2): K and V are
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

``p2p`` is the ring of Transformer Engine's ``AttnFuncWithCPAndKVP2P`` (Megatron-core's default; Liu et
al.'s Ring Attention with the balanced chunks): each rank passes the K/V chunk pair it holds to
the next rank of the group cp − 1 times, and while the next pair is in flight attends its queries
to the pair it holds — only the blocks the causal mask leaves (the rank's own pair: both diagonal
blocks and the late chunk against the early one; a pair from an earlier rank: both query chunks
against its early chunk; from a later rank: the late query chunk against both) — merging the
partial results by their log-sum-exp (:func:`_ring_forward`). It keeps what FlashAttention keeps:
q, k, v, the output and the log-sum-exp per row. The backward passes K and V round again with
the partial dK and dV of the pair, which a last step returns to its owner
(:func:`_ring_backward`); each step's dK/dV exchange runs under the next step's kernels. The
simulator prices this for ``cp_comm_type=p2p``: cp forward and cp backward kernels per layer,
each 1/cp of the causal work, the exchanges under them (:mod:`mindpipe.simulator.ops`,
:func:`mindpipe.simulator.costs.cp_collectives`).

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
        comm: How K and V reach every rank: the plan's ``cp_comm_type`` (``allgather`` or ``p2p``).
    """

    group: Any
    rank: int
    size: int
    comm: str = "allgather"

    @classmethod
    def of(cls, group: Any, comm: str = "allgather") -> ContextShard:
        """The shard of this process in ``group``, exchanging K and V as ``comm`` says."""
        return cls(group, dist.get_rank(group), dist.get_world_size(group), comm)

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


def _shift(shard: ContextShard, tensor: torch.Tensor, tag: int) -> tuple[torch.Tensor, list[Any]]:
    """Start sending ``tensor`` to the next rank of the ring and receiving the previous rank's into a
    new buffer; returns the buffer and the requests to wait on."""
    ranks = dist.get_process_group_ranks(shard.group)
    received = torch.empty_like(tensor)
    ops = [dist.P2POp(dist.isend, tensor, ranks[(shard.rank + 1) % shard.size], shard.group, tag),
           dist.P2POp(dist.irecv, received, ranks[(shard.rank - 1) % shard.size], shard.group, tag)]
    return received, dist.batch_isend_irecv(ops)


def _wait(requests: list[Any]) -> None:
    for request in requests:
        request.wait()


_KV_TAG, _DKV_TAG = 0, 1


def _ring_block(shard: ContextShard, step: int, length: int) -> tuple[slice, slice, bool]:
    """What the rank computes at ``step`` of the ring over its ``length`` (2·L) local tokens: (rows of
    its queries, rows of the held K/V pair, causal). Step 0, its own pair: both chunks against both
    under the causal mask of local order (the early chunk precedes the late one, as globally). A
    pair from an earlier rank: every query against that rank's early chunk (its late chunk comes
    after both of ours). From a later rank: the late query chunk against both (its early chunk
    precedes them, our early chunk precedes both). Every step but the first computes L·2L pairs."""
    half = length // 2
    if step == 0:
        return slice(0, length), slice(0, length), True
    if (shard.rank - step) % shard.size < shard.rank:
        return slice(0, length), slice(0, half), False
    return slice(half, length), slice(0, length), False


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """K or V heads repeated for the query heads that share them (GQA: query head h uses kv head h // groups)."""
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def _fold(x: torch.Tensor, groups: int) -> torch.Tensor:
    """The sum over the query heads that share each K/V head (the inverse of :func:`_expand`'s repeat)."""
    if groups == 1:
        return x
    b, heads, n, d = x.shape
    return x.view(b, heads // groups, groups, n, d).sum(dim=2)


def _fused(q: torch.Tensor, dropout_p: float) -> bool:
    """Whether a block runs in torch's FlashAttention kernel, which returns the log-sum-exp the merge
    needs: on CPU (``_scaled_dot_product_flash_attention_for_cpu``), and on CUDA from Ampere on in
    fp16/bf16 with a head width that is a multiple of 8 up to 256; without dropout (whose masks the
    backward would have to replay from the kernel's own random state). Otherwise the block is
    computed op by op (:func:`_block_forward`)."""
    if dropout_p:
        return False
    if q.device.type == "cpu":
        return True
    return (q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and q.size(-1) % 8 == 0
            and q.size(-1) <= 256 and torch.cuda.get_device_capability(q.device) >= (8, 0))


def _dropout_keep(p: torch.Tensor, dropout_p: float) -> torch.Tensor:
    return torch.empty_like(p).bernoulli_(1.0 - dropout_p) / (1.0 - dropout_p)


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:  # square block: query i sees keys 0..i
        n = q.size(2)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores


def _block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout_p: float,
                   scale: float, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, tuple[Any, ...]]:
    """One block: its output (in ``acc``), log-sum-exp per row (``acc``) and what its backward needs."""
    if _fused(q, dropout_p):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if q.device.type == "cpu":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
            return out.to(acc), lse.to(acc), ()
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale)
        return out.to(acc), lse.to(acc), (cum_q, cum_k, max_q, max_k, seed, offset)
    scores = _scores(q.to(acc), k.to(acc), causal, scale)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None])
    if dropout_p:
        probs = probs * _dropout_keep(probs, dropout_p)
    return torch.matmul(probs, v.to(acc)), lse, ()


def _block_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, causal: bool, dropout_p: float, scale: float, acc: torch.dtype,
                    state: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention's backward of one block against the *merged* output and log-sum-exp: the
    probabilities are exp(scores − lse) of the whole row, and rowsum(dO ∘ O) stands for
    rowsum(P ∘ dP) (dropout or not). dq, dk, dv in ``acc``."""
    if _fused(q, dropout_p):
        grad, q, k, v, out = (t.contiguous() for t in (grad, q, k, v, out))
        if q.device.type == "cpu":
            grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, out, lse.contiguous(), 0.0, causal, scale=scale)
        else:
            cum_q, cum_k, max_q, max_k, seed, offset = state
            grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                grad, q, k, v, out, lse.float().contiguous(), cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset,
                scale=scale)
        dq, dk, dv = (g.to(acc) for g in grads[:3])
        return dq, dk, dv
    qa, ga = q.to(acc), grad.to(acc)
    scores = _scores(qa, k.to(acc), causal, scale)
    probs = torch.exp(scores - lse[..., None])
    dprobs = torch.matmul(ga, v.to(acc).transpose(-1, -2))
    kept = probs
    if dropout_p:
        keep = _dropout_keep(probs, dropout_p)
        kept, dprobs = probs * keep, dprobs * keep
    delta = (ga * out.to(acc)).sum(dim=-1, keepdim=True)
    dscores = probs * (dprobs - delta) * scale
    return (torch.matmul(dscores, k.to(acc)), torch.matmul(dscores.transpose(-1, -2), qa),
            torch.matmul(kept.transpose(-1, -2), ga))


def _ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: ContextShard, dropout_p: float
                  ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[Any, ...]]]:
    """The ring's forward: the output (q's dtype), the log-sum-exp ``[b, heads, 2L]`` (fp32 or wider)
    and each block's kernel state for the backward."""
    acc = torch.promote_types(q.dtype, torch.float32)
    groups, scale = q.size(1) // k.size(1), q.size(-1) ** -0.5
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=acc, device=q.device)
    kv = torch.stack([k, v]).contiguous()
    states = []
    for step in range(shard.size):
        nxt, requests = _shift(shard, kv, _KV_TAG) if step < shard.size - 1 else (kv, [])
        rows, cols, causal = _ring_block(shard, step, q.size(2))
        block_out, block_lse, state = _block_forward(q[:, :, rows], _expand(kv[0][:, :, cols], groups),
                                                     _expand(kv[1][:, :, cols], groups), causal, dropout_p, scale, acc)
        states.append(state)
        new = torch.logaddexp(lse[:, :, rows], block_lse)
        out[:, :, rows] = (out[:, :, rows] * torch.exp(lse[:, :, rows] - new)[..., None]
                           + block_out * torch.exp(block_lse - new)[..., None])
        lse[:, :, rows] = new
        _wait(requests)
        kv = nxt
    return out.to(q.dtype), lse, states


def _ring_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   grad: torch.Tensor, shard: ContextShard, dropout_p: float, states: list[tuple[Any, ...]]
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ring's backward, block by block: dq, dk, dv in the inputs' dtypes.

    K and V go round again; the dK/dV of the pair a rank holds is added to by every rank it passes
    and reaches its owner after cp hops, each hop under the next step's kernels. With dropout the
    caller replays the forward's random state, so the blocks draw their masks again in its order."""
    acc = lse.dtype
    groups, scale = q.size(1) // k.size(1), q.size(-1) ** -0.5
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = torch.stack([k, v]).contiguous()
    dkv = torch.zeros((2, *k.shape), dtype=acc, device=k.device)  # the held pair's dK/dV so far: none at step 0
    pending: list[Any] = []
    for step in range(shard.size):
        nxt, requests = _shift(shard, kv, _KV_TAG) if step < shard.size - 1 else (kv, [])
        rows, cols, causal = _ring_block(shard, step, q.size(2))
        dq_block, dk_block, dv_block = _block_backward(
            grad[:, :, rows], q[:, :, rows], _expand(kv[0][:, :, cols], groups), _expand(kv[1][:, :, cols], groups),
            out[:, :, rows], lse[:, :, rows], causal, dropout_p, scale, acc, states[step])
        dq[:, :, rows] += dq_block
        local = torch.zeros((2, *k.shape), dtype=acc, device=k.device)
        local[0][:, :, cols] = _fold(dk_block, groups)
        local[1][:, :, cols] = _fold(dv_block, groups)
        _wait(pending)  # the pair's dK/dV from the previous rank arrived under this step's kernels
        sending = dkv + local  # kept referenced until its send completes
        dkv, pending = _shift(shard, sending, _DKV_TAG)
        _wait(requests)
        kv = nxt
    _wait(pending)  # after cp hops: this rank's own pair, with every rank's share added
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """Transformer Engine's ring attention over the cp group (module docstring): keeps q, k, v, the
    output and the log-sum-exp."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: ContextShard,
                dropout_p: float) -> torch.Tensor:
        ctx.shard, ctx.dropout_p = shard, dropout_p
        ctx.rng = _rng_state(q.device) if dropout_p else None
        out, lse, ctx.states = _ring_forward(q, k, v, shard, dropout_p)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        with torch.random.fork_rng(devices=[q.device] if q.device.type == "cuda" else [], enabled=ctx.rng is not None):
            if ctx.rng is not None:  # the forward's dropout masks again, block by block in its order
                _set_rng_state(q.device, ctx.rng)
            dq, dk, dv = _ring_backward(q, k, v, out, lse, grad.contiguous(), ctx.shard, ctx.dropout_p, ctx.states)
        return dq, dk, dv, None, None


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(device: torch.device, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: ContextShard, dropout_p: float = 0.0,
                      gqa: bool = False) -> torch.Tensor:
    """Causal attention of this rank's queries ``[b, heads, s/cp, d]`` over the whole sequence, whose
    keys and values ``[b, kv, s/cp, d]`` are spread over the cp group, exchanged as ``shard.comm``
    says (module docstring). ``gqa``: ``kv`` divides ``heads``, query head i uses K/V head i // (heads/kv)."""
    out: torch.Tensor
    if shard.comm == "p2p":
        out = _RingAttention.apply(q, k, v, shard, dropout_p)  # type: ignore[no-untyped-call]
    else:
        out = _ContextAttention.apply(q, k, v, shard, dropout_p, gqa)  # type: ignore[no-untyped-call]
    return out


__all__ = ["ContextShard", "context_attention"]
