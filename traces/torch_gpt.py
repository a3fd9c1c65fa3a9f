"""The GPT model in torch, built from the :class:`mindpipe.traces.config.Model` contract.

One implementation serves the profiler and the executor. It is a pre-LN decoder (GPT-2 layout):
token + learned position embeddings, ``num_layers`` blocks (LayerNorm → causal self-attention →
residual, LayerNorm → GeLU MLP → residual), a final LayerNorm and an untied LM head.

Attention is written with explicit ops (QKᵀ, softmax, dropout, ·V) rather than a fused kernel so
that the tensors autograd saves are exactly the ones Korthikanti et al. (2022, arXiv 2205.05198,
§4.1) count; see :func:`block_activation_bytes`. A plan's ``flash_attention`` switches the core to
torch's fused ``scaled_dot_product_attention`` (:func:`flash_core`, set on a built model by
:func:`mindpipe.traces.torch_models.use_flash_attention`). The head count is taken from the
projection's local width (``view(..., -1, head_dim)``, as torchtitan does) so DTensor tensor
parallelism can shard heads without changing this code.

This module imports torch; nothing in ``traces/__init__`` imports it, so the simulator stays
torch-free.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.torch_context_parallel import ContextShard, context_attention
from mindpipe.traces.torch_head_loss import linear_cross_entropy
from torch import nn
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


class Embedding(nn.Module):
    """Token + learned position embedding, then dropout."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.tok = nn.Embedding(model.vocab_size, model.hidden_size)
        self.pos = nn.Embedding(model.seq_len, model.hidden_size)
        self.dropout = model.dropout
        # The plan's context parallelism: the tokens' global positions (use_context_parallel).
        self.context: ContextShard | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = (torch.arange(tokens.shape[-1], device=tokens.device) if self.context is None
                     else self.context.positions(tokens.shape[-1], tokens.device))
        x = self.tok(tokens) + self.pos(positions)
        return F.dropout(x, self.dropout, self.training) if self.dropout else x


def causal_mask(s: int, like: torch.Tensor) -> torch.Tensor:
    """The additive causal mask ``[s, s]`` (−inf above the diagonal) in ``like``'s dtype and device.

    Made per call: ``scores + mask`` saves nothing for backward (unlike ``masked_fill``), so the
    mask is a transient of the forward. It used to be an fp32 ``[seq_len, seq_len]`` buffer in every
    attention module, which nothing in the memory model counts: 4 MiB per block at s = 512 (seen
    in the H100 allocator's peak), 256 MiB per block at s = 8,192 (8 GiB for llama3-8b's 32).
    """
    return torch.full((s, s), float("-inf"), dtype=like.dtype, device=like.device).triu(1)


def flash_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, gqa: bool) -> torch.Tensor:
    """Causal attention as one fused kernel: ``[b, heads, s, d]`` q against ``[b, kv, s, d]`` k and v.

    torch's ``scaled_dot_product_attention`` with ``is_causal`` (the mask is the kernel's own) and,
    with ``gqa`` (``kv`` divides ``heads``), ``enable_gqa``: query head ``i`` uses K/V head
    ``i // (heads/kv)``, the ``repeat_interleave`` order, and K and V are not repeated. ``gqa`` is
    a Python bool, not a comparison of sizes, so torch.fx records the kernel as one node. The
    default scale is ``d^-½``, the explicit core's.

    Which kernel runs is torch's choice per device and arguments (FlashAttention-2, Dao 2023, on
    CUDA). On CPU (torch 2.13) it is ``_scaled_dot_product_flash_attention_for_cpu`` when
    ``dropout_p`` is 0, which saves for backward only q, k, v, the output and the per-row
    log-sum-exp (``[b, heads, s]``): no a·s² tensor. With ``dropout_p > 0`` and gradients on, torch
    falls back to its math backend, which saves the probabilities, the dropout mask and the
    dropped-out probabilities (three a·s² tensors, as the explicit core does). So a CPU run
    measures the fused kernel's memory only for a model without attention dropout.
    """
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa)


class Attention(nn.Module):
    """Causal multi-head self-attention with explicit softmax, or the fused kernel when ``flash``."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        h = model.hidden_size
        self.head_dim = model.head_dim
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.dropout = model.dropout
        # The plan's flash_attention (set by mindpipe.traces.torch_models.use_flash_attention).
        self.flash = False
        # The plan's context parallelism (mindpipe.traces.torch_models.use_context_parallel).
        self.context: ContextShard | None = None

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core, ``[b, heads, s, d]`` in and out: Q·Kᵀ, mask, softmax, dropout, ·V.

        A method of its own so selective recompute (Korthikanti et al. 2022 §5) can checkpoint
        exactly this part, as Megatron does. With ``self.flash`` it is :func:`flash_core` (the
        attention dropout only in training, as ``F.dropout`` here); under context parallelism,
        :func:`~mindpipe.traces.torch_context_parallel.context_attention` (a fused kernel too).
        """
        if self.context is not None:
            return context_attention(q, k, v, self.context, self.dropout if self.training else 0.0)
        if self.flash:  # a Python bool: torch.fx traces the branch taken
            return flash_core(q, k, v, self.dropout if self.training else 0.0, gqa=False)
        s = q.size(2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (self.head_dim**-0.5)
        scores = scores + causal_mask(s, scores)
        probs = torch.softmax(scores, dim=-1)
        if self.dropout:
            probs = F.dropout(probs, self.dropout, self.training)
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.size(0), x.size(1)  # size() rather than unpacking: keeps torch.fx tracing possible
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # [b, s, heads, d] -> [b, heads, s, d]; `-1` keeps this valid for the local heads under TP.
        q = q.view(b, s, -1, self.head_dim).transpose(1, 2)
        k = k.view(b, s, -1, self.head_dim).transpose(1, 2)
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)
        ctx = self.core(q, k, v).transpose(1, 2).reshape(b, s, -1)
        out = self.proj(ctx)
        return F.dropout(out, self.dropout, self.training) if self.dropout else out


class MLP(nn.Module):
    """Two-layer GeLU MLP."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.fc1 = nn.Linear(model.hidden_size, model.ffn)
        self.fc2 = nn.Linear(model.ffn, model.hidden_size)
        self.dropout = model.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc2(F.gelu(self.fc1(x)))
        return F.dropout(out, self.dropout, self.training) if self.dropout else out


class PreNormBlock(nn.Module):
    """A pre-norm residual block's two sub-layers (``ln1``/``attn`` then ``ln2``/``mlp``, set by subclasses)."""

    ln1: nn.Module
    attn: nn.Module
    ln2: nn.Module
    mlp: nn.Module

    def attention_part(self, x: torch.Tensor) -> torch.Tensor:
        """Norm → attention → residual add (ends at the ``after_attention`` cut)."""
        return x + self.attn(self.ln1(x))

    def mlp_part(self, x: torch.Tensor) -> torch.Tensor:
        """Norm → MLP → residual add."""
        return x + self.mlp(self.ln2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_part(self.attention_part(x))


class Block(PreNormBlock):
    """Pre-LN transformer block: its attention sub-layer, then its MLP sub-layer.

    The two sub-layers are methods of their own so that a pipeline stage boundary inside the
    block (``Plan.stage_cuts``, :mod:`mindpipe.traces.layout`) runs exactly this code on either
    side (:mod:`mindpipe.executor.stages`); ``torch.fx`` traces through them, so the operator
    graph (and its unit names) is the same as one forward's.
    """

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(model.hidden_size)
        self.attn = Attention(model)
        self.ln2 = nn.LayerNorm(model.hidden_size)
        self.mlp = MLP(model)


class LMHead(nn.Module):
    """Output projection to the vocabulary (its weight is the token table's when the model ties them).

    Called with ``targets`` it returns the loss instead of the logits, the head's GEMM fused into
    the cross-entropy over ``chunks`` pieces of tokens (a plan's ``fused_head_loss``;
    :mod:`mindpipe.traces.torch_head_loss`). The loss is then computed inside this module's
    forward, so a data-parallel wrapper of the head gathers its weight for it as for the logits.
    Under tensor parallelism the executor sets ``shard`` (the weight is then a ``Shard(0)`` DTensor
    of this rank's rows) and ``sequence_parallel`` (the input is this rank's sequence shard).
    """

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.out = nn.Linear(model.hidden_size, model.vocab_size, bias=False)
        self.shard: VocabShard | None = None
        self.sequence_parallel = False

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None, chunks: int = 1) -> torch.Tensor:
        if targets is None:
            return self.out(x)
        w: Any = self.out.weight
        local_w = w.to_local() if hasattr(w, "to_local") else w
        local_x = x.to_local() if hasattr(x, "to_local") else x  # type: ignore[operator]
        return linear_cross_entropy(local_x, local_w, targets, chunks, self.shard, self.sequence_parallel)


class GPT(nn.Module):
    """The whole model. ``blocks`` is a ModuleDict keyed "0".."L-1" so that pipeline stages that
    keep a subset of blocks keep stable parameter names (torchtitan's convention), which
    checkpoints rely on."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.config = model
        self.embedding = Embedding(model)
        self.blocks = nn.ModuleDict({str(i): Block(model) for i in range(model.num_layers)})
        self.final_norm = nn.LayerNorm(model.hidden_size)
        self.lm_head = LMHead(model)
        if model.tie_embeddings:  # the head reuses the token table (Megatron-LM's GPT default)
            self.lm_head.out.weight = self.embedding.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks.values():
            x = block(x)
        return self.lm_head(self.final_norm(x))

    def layers(self) -> list[tuple[str, str, nn.Module]]:
        """The model as an ordered list of ``(name, kind, module)`` pipeline layers."""
        out: list[tuple[str, str, nn.Module]] = [("embedding", "embedding", self.embedding)]
        out += [(f"block.{i}", "block", blk) for i, blk in self.blocks.items()]
        out += [("final_norm", "final_norm", self.final_norm), ("lm_head", "lm_head", self.lm_head)]
        return out


@dataclass(frozen=True)
class VocabShard:
    """This rank's slice of a vocabulary-parallel LM head's logits (Megatron's layout,
    Shoeybi et al. 2019 §3): the head's weight is split by rows over the tensor-parallel ``group``
    and the rank's logits are the columns ``offset`` .. ``offset + width`` of the whole ``[..., V]``.

    Built by :meth:`of`, which follows torch's ``Shard(0)`` split (``torch.chunk``: every rank
    but the last holds ⌈V/t⌉ rows), so that an uneven vocabulary (GPT-2's 50,257 at tp 2) works.
    """

    group: Any  # torch.distributed.ProcessGroup
    offset: int
    width: int

    @classmethod
    def of(cls, vocab_size: int, group: Any) -> VocabShard:
        """The slice rank ``dist.get_rank(group)`` holds of a ``vocab_size`` vocabulary."""
        import torch.distributed as dist

        t, r = dist.get_world_size(group), dist.get_rank(group)
        per = -(-vocab_size // t)
        lo = min(r * per, vocab_size)
        return cls(group, lo, min(per, vocab_size - lo))

    def local_targets(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(targets shifted into this slice, with :data:`IGNORED` where the target is another
        rank's; the mask of those in this slice)."""
        local = targets - self.offset
        inside = (local >= 0) & (local < self.width)
        return torch.where(inside, local, IGNORED), inside


IGNORED = -100  # ``F.nll_loss``'s default ``ignore_index``


def _all_reduce(t: torch.Tensor, shard: VocabShard, op: str) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=shard.group)
    return t


def vocab_log_softmax(x: torch.Tensor, shard: VocabShard) -> torch.Tensor:
    """Log-softmax over the whole vocabulary of fp32 logits ``x`` that hold only ``shard``'s
    columns (no autograd): the row maximum and the sum of exponentials are all-reduced over the
    tensor-parallel group, as Megatron's ``vocab_parallel_cross_entropy`` does. Besides ``x``
    and the result, one ``x``-sized temporary lives at a time."""
    m = _all_reduce(x.amax(dim=-1, keepdim=True), shard, "MAX")
    sum_exp = _all_reduce((x - m).exp_().sum(dim=-1, keepdim=True), shard, "SUM")
    return x - (m + sum_exp.log_())


class _VocabParallelLogSoftmax(torch.autograd.Function):
    """:func:`vocab_log_softmax` with autograd: saves its fp32 output, as torch's ``log_softmax``
    does, and its backward is torch's ``g − softmax·Σg`` with ``Σg`` all-reduced over the group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shard: VocabShard) -> torch.Tensor:
        out = vocab_log_softmax(x, shard)
        ctx.save_for_backward(out)
        ctx.shard = shard
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (out,) = ctx.saved_tensors
        total = _all_reduce(grad.sum(dim=-1, keepdim=True), ctx.shard, "SUM")
        return out.exp().mul_(total).neg_().add_(grad), None


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) in the forward, identity in the backward: every rank of the group computes
    the same loss from the sum, so each rank's share gets the loss's gradient once (Megatron's
    ``reduce_from_tensor_model_parallel_region``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shard: VocabShard) -> torch.Tensor:
        return _all_reduce(x.clone(), shard, "SUM")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def vocab_parallel_embedding(table: nn.Embedding, shard: VocabShard, tokens: torch.Tensor) -> torch.Tensor:
    """Megatron's ``VocabParallelEmbedding`` forward: ``table.weight`` is a DTensor holding this
    rank's ``shard`` of the rows; each rank looks up the tokens in its slice, zeros the others, and
    the partial outputs are summed over the group (backward: identity, :class:`_SumOverGroup`).

    Written out rather than torch's ``RowwiseParallel`` on the embedding, whose backward (torch
    2.13) produces a *replicated* full ``[V, h]`` weight gradient on every rank; here the gradient
    reaches the parameter through ``to_local`` as this rank's ``[V/t, h]`` shard, the bytes the
    simulator prices (:func:`mindpipe.simulator.costs.layer_params`)."""
    local, inside = shard.local_targets(tokens)
    out = F.embedding(torch.where(inside, local, 0), cast("DTensor", table.weight).to_local())
    return _SumOverGroup.apply(out.masked_fill_(~inside.unsqueeze(-1), 0.0), shard)


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over ``[..., V]`` logits, upcast to fp32 one piece of tokens at a time.

    torchtune's ``CEWithChunkedOutputLoss`` (``torchtune/modules/loss/ce_chunked_output_loss.py``)
    upcasts the logits to fp32 chunk by chunk so that no fp32 copy of the whole ``[tokens, V]``
    tensor exists at once; this is the same idea with the backward written out, so that autograd
    keeps only what a plan's ``loss_chunks`` says it keeps (:class:`mindpipe.traces.config.Plan`).

    Memory, per micro-batch of ``N = s·b`` tokens and ``V`` logits per token, ``d`` bytes per
    logit (the compute dtype: 2 under bf16, 4 under fp32):

    * **kept** from the forward to the backward: the logits themselves (``save_for_backward``,
      ``d·N·V`` bytes, a tensor the LM head produced anyway) and the integer targets. Nothing
      fp32 of size ``N·V`` is saved, where :func:`lm_loss` unchunked keeps the fp32 log-softmax
      (``4·N·V``) through autograd.
    * **transient** in the forward: one piece's fp32 copy and its log-softmax inside
      ``F.cross_entropy`` (``~2·4·N·V/chunks``), under no grad, freed piece by piece.
    * **transient** in the backward: the gradient of the logits in their dtype (``d·N·V``, what
      the LM head's backward consumes) plus one piece's fp32 softmax (``4·N·V/chunks``), which is
      turned into the piece's gradient in place and cast into its slice.

    The backward re-runs the softmax of every piece (the forward's log-softmax is not kept): the
    price of the memory, one more pass over ``N·V`` logits. Pieces are contiguous runs of the
    flattened tokens in ``torch.tensor_split`` order (sizes differ by at most one).

    With a :class:`VocabShard` the logits are one tensor-parallel rank's columns and each piece's
    softmax is :func:`vocab_log_softmax` (``V`` above is then the slice's width); the loss is the
    same on every rank of the group.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, chunks: int,
                shard: VocabShard | None = None) -> torch.Tensor:
        """The mean over all tokens of the pieces' fp32 cross-entropies (autograd is off here)."""
        flat, flat_targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        # The flattened targets, as the unchunked ``nll_loss`` saves them: a micro-batch's slice of
        # a non-contiguous batch is copied (s·b integers), not kept with the whole batch's storage.
        ctx.save_for_backward(logits, flat_targets)
        ctx.chunks, ctx.shard = chunks, shard
        # Per-token fp32 losses (the unchunked loss's own terms) summed in fp64: the pieces add no
        # rounding of their own, so the mean agrees with the unchunked ``nll_loss``'s to fp32 rounding.
        total = torch.zeros((), dtype=torch.float64, device=logits.device)
        for piece, t in zip(torch.tensor_split(flat, chunks), torch.tensor_split(flat_targets, chunks), strict=True):
            if shard is None:
                total += F.cross_entropy(piece.float(), t, reduction="none").sum(dtype=torch.float64)
            else:
                local, _ = shard.local_targets(t)
                total += F.nll_loss(vocab_log_softmax(piece.float(), shard), local, reduction="none",
                                    ignore_index=IGNORED).sum(dtype=torch.float64)
        if shard is not None:
            _all_reduce(total, shard, "SUM")
        return (total / flat.shape[0]).float()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        """d(mean CE)/d logits = (softmax − one-hot(target)) · grad_output / N, piece by piece."""
        logits, targets = ctx.saved_tensors
        shard: VocabShard | None = ctx.shard
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat, flat_grad = logits.reshape(-1, logits.shape[-1]), grad.view(-1, logits.shape[-1])
        scale = grad_output.float() / flat.shape[0]
        pieces = zip(torch.tensor_split(flat, ctx.chunks), torch.tensor_split(targets, ctx.chunks),
                     torch.tensor_split(flat_grad, ctx.chunks), strict=True)
        for piece, t, out in pieces:
            if shard is None:
                probs = torch.softmax(piece.float(), dim=-1)
                rows = torch.arange(t.shape[0], device=t.device)
            else:
                probs = vocab_log_softmax(piece.float(), shard).exp_()
                t, inside = shard.local_targets(t)
                rows = torch.arange(t.shape[0], device=t.device)[inside]
                t = t[inside]
            probs[rows, t] -= 1.0
            out.copy_(probs.mul_(scale))
        return grad, None, None, None


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, chunks: int = 1, shard: VocabShard | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy over all positions, in fp32.

    Args:
        logits: ``[..., V]`` scores in the compute dtype (with ``shard``, this rank's columns).
        targets: Integer targets, one per position of ``logits``.
        chunks: A plan's ``loss_chunks``. 1 upcasts the whole logits to fp32 and lets autograd
            keep the fp32 log-softmax; more runs :class:`ChunkedCrossEntropy`, which keeps the
            logits in their dtype and upcasts that many pieces of tokens one at a time. Plans
            keep ``chunks`` at most the micro-batch's tokens (:func:`mindpipe.traces.config.check_plan`);
            beyond that the extra pieces are empty and add nothing.
        shard: Set under tensor parallelism: the logits are vocabulary-parallel (Megatron's
            cross-entropy: the LM head's logits are never gathered). Unchunked, the loss is
            torch's two steps with the log-softmax taken over the group
            (:class:`_VocabParallelLogSoftmax`, which keeps its fp32 output as torch's does, then
            ``nll_loss`` on this rank's targets), so it keeps and allocates what torch's keeps and
            allocates on a 1/t slice (:func:`mindpipe.simulator.memory.loss_transient_bytes`).
    """
    if chunks > 1:
        return ChunkedCrossEntropy.apply(logits, targets, chunks, shard)
    flat, flat_targets = logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
    if shard is None:
        return F.cross_entropy(flat, flat_targets)
    local, _ = shard.local_targets(flat_targets)
    total = F.nll_loss(_VocabParallelLogSoftmax.apply(flat, shard), local, reduction="sum", ignore_index=IGNORED)
    return _SumOverGroup.apply(total, shard) / flat.shape[0]


def plan_loss(plan: Plan, shard: VocabShard | None = None,
              head: LMHead | None = None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss a run of ``plan`` computes: :func:`lm_loss` in the plan's ``loss_chunks`` pieces,
    vocabulary-parallel over ``shard``'s group when the LM head is tensor-parallel; under
    ``fused_head_loss``, ``head`` called on the final norm's output with the targets (the head's
    GEMM and the loss fused piece by piece, :meth:`LMHead.forward`).

    One owner for the executor's pipeline schedules (:mod:`mindpipe.executor.pipeline`) and the
    single-process reference they are compared with (:mod:`mindpipe.executor.reference`, no shard).
    """
    if plan.fused_head_loss:
        return functools.partial(_fused_head_loss, head, chunks=plan.loss_chunks)
    return functools.partial(lm_loss, chunks=plan.loss_chunks, shard=shard)


def _fused_head_loss(head: LMHead | None, hidden: torch.Tensor, targets: torch.Tensor, chunks: int) -> torch.Tensor:
    if head is None:  # a rank without the last stage never computes the loss
        raise ValueError("fused_head_loss: the loss runs on the stage that holds the LM head")
    loss: torch.Tensor = head(hidden, targets=targets, chunks=chunks)
    return loss


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_gpt(
    model: Model, *, seed: int = 0, dtype: str = "fp32", device: str | torch.device = "cpu"
) -> GPT:
    """Build the GPT for ``model`` with deterministic initialisation.

    Args:
        model: The model contract.
        seed: Seed for parameter initialisation (same seed ⇒ same weights on every rank).
        dtype: ``fp32``, ``bf16`` or ``fp16`` parameters.
        device: Where to place parameters.
    """
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        net = GPT(model)
        for name, p in net.named_parameters():
            # GPT-2 initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm gains.
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("final_norm"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)
    finally:
        torch.random.set_rng_state(gen_state)
    return net.to(device=device, dtype=TORCH_DTYPES[dtype])


def synthetic_batch(
    model: Model, batch_size: int, *, seed: int = 0, seq_len: int | None = None, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic random tokens and next-token targets of shape ``[batch, seq]``."""
    s = seq_len or model.seq_len
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, model.vocab_size, (batch_size, s + 1), generator=gen)
    return data[:, :-1].to(device), data[:, 1:].to(device)


def dropout_mask_bytes(device_type: str, dtype_bytes: int) -> int:
    """Bytes per element of the mask autograd keeps for dropout.

    CUDA's fused ``native_dropout`` keeps a bool mask (1 byte, as Korthikanti et al. assume); the
    CPU path keeps the scaled noise tensor in the activation dtype (observed with torch 2.13).
    """
    return 1 if device_type == "cuda" else dtype_bytes


def block_activation_bytes(
    model: Model, micro_batch_size: int, seq_len: int, dtype_bytes: int, mask_bytes: int | None,
    stats_bytes: int | None = None,
) -> int:
    """Bytes one :class:`Block` saves for backward, derived op by op.

    Korthikanti et al. (2022, Eq. 1) count, per layer, with 2-byte activations and 1-byte dropout
    masks, ``s·b·h·(34 + 5·a·s/h)``. With ``d``-byte activations and ``k``-byte masks our block
    saves, per s·b·h: LN1 input d, QKV input d, Q d, K d, V d, projection input d,
    attention-dropout mask k, LN2 input d, fc1 input d, GeLU input 4d, fc2 input 4d, MLP-dropout
    mask k → ``16·d + 2·k`` (= 34 at d = 2, k = 1); per a·s²·b: softmax output d, dropout mask k,
    dropout output d → ``2·d + k`` (= 5). Without dropout (``mask_bytes=None``) the masks vanish
    and the softmax output is the one tensor ``probs·V`` saves, so the terms become ``16·d`` and
    ``d``. One term the paper omits: each LayerNorm keeps its per-token mean and rstd
    (2 × ``stats_bytes`` × s·b, twice per block): torch's CPU kernel keeps them in the input's
    dtype (the default, ``d``), its CUDA kernel in fp32 (``stats_bytes=4``, measured on an H100).
    For ``ffn ≠ 4h`` the two 4d terms scale by ffn/h.
    """
    s, b, h, a = seq_len, micro_batch_size, model.hidden_size, model.num_heads
    d = dtype_bytes
    f_ratio = model.ffn / h
    k = mask_bytes or 0
    per_sbh = (8 + 2 * f_ratio) * d + 2 * k
    per_as2b = (2 * d + k) if mask_bytes else d
    ln_stats = 2 * 2 * (stats_bytes or d) * s * b
    return round(per_sbh * s * b * h + per_as2b * a * s * s * b) + ln_stats


def korthikanti_bytes(model: Model, micro_batch_size: int, seq_len: int) -> int:
    """Korthikanti et al.'s per-layer activation bytes, no parallelism: s·b·h·(34 + 5·a·s/h)."""
    s, b, h, a = seq_len, micro_batch_size, model.hidden_size, model.num_heads
    return round(s * b * h * (34 + 5 * a * s / h))
