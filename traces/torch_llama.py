"""The Llama model in torch, built from the :class:`mindpipe.traces.config.Model` contract (``kind: "llama"``).

A sibling of :mod:`mindpipe.traces.torch_gpt` with the same module tree (``embedding``, ``blocks``
keyed "0".."L-1" with ``ln1``/``attn``/``ln2``/``mlp``, ``final_norm``, ``lm_head.out``), so the
executor's stages, pipeline, recompute and checkpoints treat both alike. The block is Llama's
(Touvron et al. 2023; Dubey et al. 2024): RMSNorm (Zhang & Sennrich 2019) → grouped-query
attention (Ainslie et al. 2023) with rotary positions (Su et al. 2021) → residual, RMSNorm →
SwiGLU MLP (Shazeer 2020) → residual; no biases, no dropout, no position embedding.

As in the GPT, attention is written with explicit ops so that what autograd saves is exactly
what :func:`block_activation_bytes` derives. Grouped-query attention folds each K/V head's group
of ``g = num_heads / num_kv_heads`` query heads into the rows of one matmul
(``[b, kv, g·s, d] × [b, kv, d, s]``) instead of repeating K and V ``g`` times, so K and V are
saved once at their own size. Query head ``i`` uses K/V head ``i // g`` (Meta's and Hugging
Face's ``repeat_interleave`` order); head counts are read from the projections' local widths, so
DTensor tensor parallelism that splits query and K/V heads over ``tp`` needs no change here. A
plan's ``flash_attention`` runs the core as torch's fused kernel instead
(:func:`mindpipe.traces.torch_gpt.flash_core`, grouped-query through ``enable_gqa``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from mindpipe.traces.config import Model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.torch_context_parallel import ContextShard, context_attention
from mindpipe.traces.torch_gpt import TORCH_DTYPES, LMHead, PreNormBlock, causal_mask, flash_core
from torch import nn

# RMSNorm epsilon of Llama 3's config.json (``rms_norm_eps``).
RMS_NORM_EPS = 1e-5


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for 16-bit inputs (norm statistics in full precision), else the input's dtype."""
    return torch.promote_types(x.dtype, torch.float32)


class _RMSNormFunction(torch.autograd.Function):
    """y = w · x · rstd with rstd = (mean(x²) + eps)^-½ per token, statistics in fp32.

    A function of its own so that backward keeps only the input and the per-token rstd, as a
    fused RMSNorm kernel does (Transformer Engine, Apex); torch's composite ``F.rms_norm`` also
    keeps the normalised input, a second activation-sized tensor.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(_stat_dtype(x))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        dt = _stat_dtype(x)
        xhat = x.to(dt) * rstd
        gw = grad.to(dt) * weight.to(dt)
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dweight = (grad.to(dt) * xhat).reshape(-1, x.size(-1)).sum(0)
        return dx.to(x.dtype), dweight.to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:class:`_RMSNormFunction` as a function torch.fx records as one node (operator-level profiles)."""
    out: torch.Tensor = _RMSNormFunction.apply(x, weight, eps)  # type: ignore[no-untyped-call]
    return out


torch.fx.wrap("rms_norm")


class RMSNorm(nn.Module):
    """Root-mean-square norm with one learned gain vector (no bias, no centring)."""

    def __init__(self, width: int, eps: float = RMS_NORM_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_tables(head_dim: int, seq_len: int, theta: float, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", positions: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, ``[seq_len, 1, head_dim]`` (Su et al. 2021, Eq. 34).

    Frequencies θ^(−2i/d) for the pairs (i, i + d/2), the half-split layout of Hugging Face's
    Llama (``rotate_half``), each table repeated over both halves. The angles are computed in
    fp64, rounded to fp32, then cast to ``dtype``. ``positions`` (``[seq_len]``, default 0..seq_len−1)
    are the tokens' global positions (a rank's share of the sequence under context parallelism).
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim))
    pos = torch.arange(seq_len, device=device) if positions is None else positions
    angles = torch.outer(pos.to(torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return (angles.cos().float().to(dtype).unsqueeze(1), angles.sin().float().to(dtype).unsqueeze(1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + R(x)·sin with R the half swap ``(x1, x2) → (−x2, x1)``."""
    x1, x2 = x.chunk(2, dim=-1)
    # addcmul rather than `+`: a block's only `add` nodes stay the mask and the residuals.
    return torch.addcmul(x * cos, torch.cat([-x2, x1], dim=-1), sin)


def _unrotate(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The transpose of :func:`_rotate`: g·cos + Rᵀ(g)·sin, Rᵀ: ``(g1, g2) → (g2, −g1)``.

    Multiplied and added as autograd does for the composite (no fused multiply-add), so the
    gradients are the composite's bit for bit.
    """
    g1, g2 = g.chunk(2, dim=-1)
    return g * cos + torch.cat([g2, -g1], dim=-1) * sin


def check_rotary_head_dim(model: Model, source: str = "") -> None:
    """Refuse a model whose head width ``hidden_size / num_heads`` is odd: the rotary embedding turns
    pairs ``(i, i + d/2)`` of a head's channels (Su et al. 2021; Hugging Face's ``rotate_half``), so
    an odd width has one channel without a partner and the rotation cannot be built (before this
    check the first forward failed inside a rank with a shape mismatch of d against d + 1).

    Raises:
        ContractError: naming ``num_heads``, the head width and the rule.
    """
    if model.head_dim % 2:
        raise ContractError(source, "num_heads",
                            f"head width hidden_size/num_heads={model.hidden_size}/{model.num_heads}="
                            f"{model.head_dim} must be even (rotary embeddings rotate pairs of channels)")


class _RotaryFunction(torch.autograd.Function):
    """Rotate Q and K (``[b, s, heads, d]``) by the position angles; keeps nothing for backward.

    The rotation is linear and orthogonal, so its backward is the inverse rotation of the incoming
    gradients — the transposed half swap, by the same tables (equal on both halves, so they
    commute with the swap). The tables are made from ``(s, d, θ)`` in the inputs' dtype, once in
    the forward and once in the backward, and are transients of each: no module holds them (they
    used to be an fp32 buffer pair in every attention module — 8 MiB per block at s = 8,192 that
    no memory model counted) and autograd saves no copy of them (the composite ``x·cos +
    R(x)·sin`` under mixed precision saved bf16 casts of both tables for Q and for K, per
    micro-batch). Same values and gradients as the composite.
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, theta: float,
                positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.theta, ctx.positions = theta, positions
        cos, sin = rope_tables(q.size(-1), q.size(1), theta, q.dtype, q.device, positions)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    @staticmethod
    def backward(ctx: Any, gq: torch.Tensor, gk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        cos, sin = rope_tables(gq.size(-1), gq.size(1), ctx.theta, gq.dtype, gq.device, ctx.positions)
        return _unrotate(gq, cos, sin), _unrotate(gk, cos, sin), None, None


def apply_rope(q: torch.Tensor, k: torch.Tensor, theta: float,
               positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K (``[b, s, heads, d]``) rotated by the angles of ``positions`` (default 0..s−1; a
    rank's global positions under context parallelism) (:class:`_RotaryFunction`).

    One function torch.fx records as one node (operator-level profiles), like :func:`rms_norm`.
    """
    out: tuple[torch.Tensor, torch.Tensor] = _RotaryFunction.apply(q, k, theta, positions)  # type: ignore[no-untyped-call]
    return out


torch.fx.wrap("apply_rope")


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary positions and explicit softmax (fused when ``flash``)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        check_rotary_head_dim(model)
        h, kv = model.hidden_size, model.kv_width
        self.head_dim = model.head_dim
        self.group = model.num_heads // model.kv_heads
        self.wq = nn.Linear(h, h, bias=False)
        self.wk = nn.Linear(h, kv, bias=False)
        self.wv = nn.Linear(h, kv, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        # The plan's flash_attention (set by mindpipe.traces.torch_models.use_flash_attention).
        self.flash = False
        self.rope_base = model.rope_base
        # The plan's context parallelism (mindpipe.traces.torch_models.use_context_parallel).
        self.context: ContextShard | None = None

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core: q ``[b, heads, s, d]``, k and v ``[b, kv, s, d]`` → ``[b, heads, s, d]``.

        Q·Kᵀ, causal mask, softmax, ·V (selective recompute checkpoints exactly this, as in
        :class:`mindpipe.traces.torch_gpt.Attention`). The explicit core folds q to
        ``[b, kv, g·s, d]`` (the g query heads of a K/V head share its rows: head ``i`` uses K/V
        head ``i // g``) and views the product back. With ``self.flash`` it is
        :func:`~mindpipe.traces.torch_gpt.flash_core` on q as it comes, a view of the rotated
        ``[b, s, heads, d]``: the kernel lays its output out as q, so the caller's transpose to
        ``[b, s, h]`` is free and the output the kernel saves is the projection's input too.
        """
        b, kv, s = k.size(0), k.size(1), k.size(2)
        if self.context is not None:  # the whole sequence's K/V over the cp group (a fused kernel)
            return context_attention(q, k, v, self.context, 0.0, gqa=self.group > 1)
        if self.flash:  # a Python bool: torch.fx traces the branch taken
            return flash_core(q, k, v, 0.0, gqa=self.group > 1)
        q = q.reshape(b, kv, -1, self.head_dim)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (self.head_dim**-0.5)
        scores = scores.view(b, kv, self.group, s, s) + causal_mask(s, scores)
        probs = torch.softmax(scores, dim=-1).view(b, kv, -1, s)
        return torch.matmul(probs, v).view(b, -1, s, self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.size(0), x.size(1)
        # `-1` head counts: the local heads under tensor parallelism.
        positions = None if self.context is None else self.context.positions(s, x.device)
        q, k = apply_rope(self.wq(x).view(b, s, -1, self.head_dim), self.wk(x).view(b, s, -1, self.head_dim),
                          self.rope_base, positions)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        ctx = self.core(q, k, v).transpose(1, 2).reshape(b, s, -1)
        out: torch.Tensor = self.proj(ctx)
        return out


class SwiGLU(nn.Module):
    """down(silu(gate(x)) · up(x)) (Shazeer 2020), three bias-free h×f matrices."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        h, f = model.hidden_size, model.ffn
        self.gate = nn.Linear(h, f, bias=False)
        self.up = nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(F.silu(self.gate(x)) * self.up(x))
        return out


class Block(PreNormBlock):
    """Pre-norm Llama block (RMSNorm, GQA attention, SwiGLU); sub-layers from :class:`PreNormBlock`."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.ln1 = RMSNorm(model.hidden_size)
        self.attn = Attention(model)
        self.ln2 = RMSNorm(model.hidden_size)
        self.mlp = SwiGLU(model)


class Embedding(nn.Module):
    """Token embedding only (positions are rotary, applied inside attention)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.tok = nn.Embedding(model.vocab_size, model.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.tok(tokens)
        return out


class Llama(nn.Module):
    """The whole model; same attribute names and :meth:`layers` as :class:`mindpipe.traces.torch_gpt.GPT`."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.config = model
        self.embedding = Embedding(model)
        self.blocks = nn.ModuleDict({str(i): Block(model) for i in range(model.num_layers)})
        self.final_norm = RMSNorm(model.hidden_size)
        self.lm_head = LMHead(model)
        if model.tie_embeddings:
            self.lm_head.out.weight = self.embedding.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks.values():
            x = block(x)
        out: torch.Tensor = self.lm_head(self.final_norm(x))
        return out

    def layers(self) -> list[tuple[str, str, nn.Module]]:
        """The model as an ordered list of ``(name, kind, module)`` pipeline layers."""
        out: list[tuple[str, str, nn.Module]] = [("embedding", "embedding", self.embedding)]
        out += [(f"block.{i}", "block", blk) for i, blk in self.blocks.items()]
        out += [("final_norm", "final_norm", self.final_norm), ("lm_head", "lm_head", self.lm_head)]
        return out


def build_llama(model: Model, *, seed: int = 0, dtype: str = "fp32", device: str | torch.device = "cpu") -> Llama:
    """Build the Llama for ``model`` with deterministic initialisation (N(0, 0.02) weights, unit norm gains).

    The model holds no buffers: the rotary tables (:func:`apply_rope`) and the causal mask are made
    per call in the activations' dtype.
    """
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        net = Llama(model)
        for name, p in net.named_parameters():
            if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name.startswith("final_norm"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)
    finally:
        torch.random.set_rng_state(gen_state)
    return net.to(device=device, dtype=TORCH_DTYPES[dtype])


def block_activation_bytes(model: Model, micro_batch_size: int, seq_len: int, dtype_bytes: int) -> int:
    """Bytes one :class:`Block` saves for backward, derived op by op (Korthikanti et al.'s accounting).

    Per s·b·h with ``d``-byte activations, r = num_kv_heads/num_heads and f the SwiGLU width:
    RMSNorm-1 input d, Q/K/V input d (one tensor, the norm's output), Q d, K r·d, V r·d (rotated
    K and the folded Q are what Q·Kᵀ keeps; the rotation keeps nothing, :func:`apply_rope`), output
    projection input d, RMSNorm-2 input d, gate/up input d, and per f/h: gate output (SiLU's
    input), SiLU output and up output (the product's two factors), down input → 4·d·f/h. Per
    a·s²·b: the softmax output d. Each RMSNorm also keeps a per-token fp32 rstd (4 B × s·b, twice
    per block), the statistic Korthikanti et al. leave out.
    """
    s, b, h, a = seq_len, micro_batch_size, model.hidden_size, model.num_heads
    d = dtype_bytes
    per_sbh = (6 + 2 * model.kv_heads / a + 4 * model.ffn / h) * d
    rstd = 2 * 4 * s * b
    return round(per_sbh * s * b * h + d * a * s * s * b) + rstd


__all__ = [
    "RMS_NORM_EPS",
    "Attention",
    "Block",
    "Embedding",
    "Llama",
    "RMSNorm",
    "SwiGLU",
    "apply_rope",
    "block_activation_bytes",
    "build_llama",
    "check_rotary_head_dim",
    "rope_tables",
]
