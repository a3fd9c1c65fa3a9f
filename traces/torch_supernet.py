"""The supernet in torch, built from the :class:`mindpipe.traces.supernet.Supernet` contract.

One implementation serves the profiler and the executor (like :mod:`mindpipe.traces.torch_gpt`).
The shared parts are token + learned position embeddings before the stack and a final LayerNorm,
an untied LM head and the cross-entropy after it. Every candidate of every choice layer is a
pre-norm residual branch ``x + op(LayerNorm(x))`` with its own LayerNorm (NASPipe moves "the chosen
op's parameters + LayerNorm" together, BACKGROUND.md §5):

* ``attention``: causal multi-head self-attention (``num_heads``), QKV and output projections;
* ``ffn``: Linear(h→f) → GELU → Linear(f→h);
* ``conv``: causal 1-D convolution over the sequence, left-padded by ``k−1`` so position t sees
  only positions ≤ t: ``standard`` Conv1d(h→h), ``separable`` depthwise Conv1d(groups=h) +
  pointwise Linear, ``lightweight`` one depthwise kernel per group of h/``conv_heads`` channels
  (Wu et al., ICLR'19), no bias.

Initialisation is seeded per part: candidate ``(layer, k)`` draws from its own stream
(:func:`part_seed`), so any pipeline stage builds exactly its own parameters and they equal those
of a single-process build. Shared parts are frozen (``requires_grad=False``) unless
``train_shared`` (see :mod:`mindpipe.traces.supernet` for why).

This module imports torch; nothing in ``traces/__init__`` imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from mindpipe.traces.supernet import Candidate, Choices, Supernet
from torch import nn

_EMBEDDING, _HEAD = -1, -2  # pseudo layer indices of the shared parts' seed streams


def part_seed(seed: int, layer: int, candidate: int) -> int:
    """The initialisation seed of one part: candidate ``candidate`` of ``layer`` (or a shared part)."""
    return int(np.random.SeedSequence([seed, layer + 2, candidate]).generate_state(1)[0])


class CausalAttention(nn.Module):
    """Causal multi-head self-attention (fused scaled-dot-product kernel)."""

    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.num_heads, h // self.num_heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(ctx.transpose(1, 2).reshape(b, s, h))


class FeedForward(nn.Module):
    """Two-layer GELU MLP."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden)
        self.fc2 = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class CausalConv(nn.Module):
    """Causal convolution over the sequence: standard, separable or lightweight (see module docstring)."""

    def __init__(self, hidden: int, kernel: int, kind: str, heads: int | None) -> None:
        super().__init__()
        self.kind, self.kernel, self.heads = kind, kernel, heads
        self.conv: nn.Module | None = None
        self.pointwise: nn.Module | None = None
        if kind == "standard":
            self.conv = nn.Conv1d(hidden, hidden, kernel)
        elif kind == "separable":
            self.conv = nn.Conv1d(hidden, hidden, kernel, groups=hidden)
            self.pointwise = nn.Linear(hidden, hidden)
        else:
            r = heads or 1
            self.weight = nn.Parameter(torch.empty(r, 1, kernel))
            nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1]
        y = F.pad(x.transpose(1, 2), (self.kernel - 1, 0))  # [b, h, s + k − 1]: left padding keeps it causal
        if self.conv is not None:
            out = self.conv(y).transpose(1, 2)
            return self.pointwise(out) if self.pointwise is not None else out
        r = self.heads or 1
        # Lightweight: channel c uses kernel c // (h/r); run as a depthwise conv with the kernels repeated.
        w = self.weight.repeat_interleave(h // r, dim=0)
        return F.conv1d(y, w, groups=h).transpose(1, 2)


class CandidateBlock(nn.Module):
    """One candidate of one choice layer: ``x + op(LayerNorm(x))``."""

    def __init__(self, net: Supernet, cand: Candidate) -> None:
        super().__init__()
        h = net.hidden_size
        self.norm = nn.LayerNorm(h)
        self.op: nn.Module
        if cand.op == "attention":
            self.op = CausalAttention(h, cand.num_heads or 1)
        elif cand.op == "ffn":
            self.op = FeedForward(h, cand.ffn_hidden_size or 1)
        else:
            self.op = CausalConv(h, cand.kernel_size or 1, cand.conv_kind, cand.conv_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.op(self.norm(x))


class SupernetEmbedding(nn.Module):
    """Token + learned position embeddings (shared by every subnet)."""

    def __init__(self, net: Supernet) -> None:
        super().__init__()
        self.tok = nn.Embedding(net.vocab_size, net.hidden_size)
        self.pos = nn.Embedding(net.seq_len, net.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[-1], device=tokens.device))


class SupernetHead(nn.Module):
    """Final LayerNorm and untied LM head; :meth:`loss` adds the mean next-token cross-entropy."""

    def __init__(self, net: Supernet) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(net.hidden_size)
        self.lm_head = nn.Linear(net.hidden_size, net.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))

    def loss(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the logits of ``x`` against ``target`` ``[b, s]``."""
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _seeded(seed: int, build: type[nn.Module], *args: object) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(*args)


def candidate_key(layer: int, k: int) -> str:
    """The module name of candidate ``k`` of ``layer`` inside a :class:`SupernetStage`."""
    return f"L{layer}_{k}"


class SupernetStage(nn.Module):
    """The choice layers ``first_layer .. first_layer+num_layers−1`` of a supernet, every candidate each holds.

    The first stage also holds the embeddings, the last the final norm and LM head. A forward runs
    one subnet's chosen candidates (:meth:`forward`); the others are untouched.

    Args:
        net: The supernet.
        first_layer, num_layers: The stage's choice layers.
        first, last: Whether the stage holds the embeddings / the head.
        seed: Initialisation seed (per part: :func:`part_seed`).
    """

    def __init__(self, net: Supernet, first_layer: int, num_layers: int, first: bool, last: bool, seed: int) -> None:
        super().__init__()
        self.net = net
        self.layers = range(first_layer, first_layer + num_layers)
        self.candidates = nn.ModuleDict({
            candidate_key(layer, k): _seeded(part_seed(seed, layer, k), CandidateBlock, net, net.candidates[k])
            for layer in self.layers for k in sorted(net.layer_choices(layer))})
        self.embedding: SupernetEmbedding | None = (
            _seeded(part_seed(seed, _EMBEDDING, 0), SupernetEmbedding, net) if first else None)  # type: ignore[assignment]
        self.head: SupernetHead | None = (
            _seeded(part_seed(seed, _HEAD, 0), SupernetHead, net) if last else None)  # type: ignore[assignment]
        for shared in (self.embedding, self.head):
            if shared is not None:
                shared.requires_grad_(net.train_shared)

    def block(self, layer: int, k: int) -> CandidateBlock:
        """Candidate ``k`` of choice layer ``layer`` (one of this stage's)."""
        return self.candidates[candidate_key(layer, k)]  # type: ignore[return-value]

    def chosen(self, choices: Choices) -> list[nn.Module]:
        """The modules a subnet trains on this stage: its candidates, and trained shared parts."""
        mods: list[nn.Module] = [self.block(layer, choices[layer]) for layer in self.layers]
        if self.net.train_shared:
            mods += [m for m in (self.embedding, self.head) if m is not None]
        return mods

    def forward(self, x: torch.Tensor, choices: Choices) -> torch.Tensor:
        """Tokens (first stage) or hidden states in; hidden states out (the head is :meth:`loss`'s)."""
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in self.layers:
            x = self.block(layer, choices[layer])(x)
        return x

    def loss(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The head's loss (last stage only)."""
        if self.head is None:
            raise ValueError("loss() is the last stage's")
        return self.head.loss(x, target)


def build_supernet_stages(net: Supernet, stage_layers: Sequence[int], seed: int) -> list[SupernetStage]:
    """Every pipeline stage of the supernet (``stage_layers``: choice layers per stage)."""
    out, first = [], 0
    for s, n in enumerate(stage_layers):
        out.append(SupernetStage(net, first, n, s == 0, s == len(stage_layers) - 1, seed))
        first += n
    return out


def synthetic_tokens(net: Supernet, seed: int, subnet: int, rows: int) -> torch.Tensor:
    """Subnet ``subnet``'s batch: ``rows`` sequences of ``seq_len + 1`` tokens from the stream (seed, subnet)."""
    rng = np.random.default_rng([seed, subnet, 7])
    return torch.from_numpy(rng.integers(0, net.vocab_size, size=(rows, net.seq_len + 1), dtype=np.int64))


__all__ = [
    "CandidateBlock",
    "CausalAttention",
    "CausalConv",
    "FeedForward",
    "SupernetEmbedding",
    "SupernetHead",
    "SupernetStage",
    "build_supernet_stages",
    "candidate_key",
    "part_seed",
    "synthetic_tokens",
]
