"""Cut the GPT of :mod:`mindpipe.traces.torch_gpt` (or the Llama of :mod:`mindpipe.traces.torch_llama`) into pipeline stages.

A stage keeps the parent's module objects and names: the first virtual stage owns ``embedding``,
every stage a slice of ``blocks`` (a ModuleDict keyed by the *global* block index), the last
``final_norm`` and ``lm_head``. Parameter names therefore match the unsplit model's
(``blocks.5.attn.qkv.weight`` wherever block 5 lives), which keeps checkpoints independent of
the partition (torchtitan's convention). The loss (``lm_loss`` in the plan's ``loss_chunks``
pieces, :func:`mindpipe.traces.torch_gpt.plan_loss`) is applied by the pipeline schedule on the
last stage; under ``fused_head_loss`` the last stage's forward computes the loss itself (the head's
GEMM fused into it, given the targets), so the head's weight is gathered with the stage's by a
data-parallel wrapper, and the schedule's loss passes that output through. :meth:`StageModule.layers` lists the stage's pipeline layers in
forward order, the units the executor times (:mod:`mindpipe.executor.layer_timing`).

Which blocks a stage holds and which rank runs it are the plan rules of
:mod:`mindpipe.traces.layout`. A block that a stage boundary cuts (``Plan.stage_cuts``) becomes
a :class:`BlockPart` on each side: the earlier stage holds its ``ln1`` and ``attn`` and runs
:meth:`~mindpipe.traces.torch_gpt.Block.attention_part`, the later one its ``ln2`` and ``mlp`` and
runs :meth:`~mindpipe.traces.torch_gpt.Block.mlp_part`. The parts keep the block's attribute names,
so parameter names (``blocks.5.mlp.fc1.weight``) are the unsplit model's and each parameter lives
on exactly one stage; only the residual stream crosses the cut, one tensor as between blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import BlockPart, block_layer_name, rank_stages, stage_layout, tied_table_ranks
from mindpipe.traces.torch_gpt import GPT, Block, plan_loss
from mindpipe.traces.torch_llama import Block as LlamaBlock
from mindpipe.traces.torch_models import TransformerLM
from torch import nn


class PartialBlock(nn.Module):
    """The ``attention`` or ``mlp`` part of a block cut by a stage boundary (module docstring).

    It holds the block's own submodules for that part and runs the block's own method for it
    (:meth:`Block.attention_part` / :meth:`Block.mlp_part` read only those submodules).
    """

    def __init__(self, block: Block | LlamaBlock, part: BlockPart) -> None:
        super().__init__()
        self.part = part
        self.block_type = type(block)  # GPT's or Llama's block: whose part methods to run
        for name in ("ln1", "attn") if part == "attention" else ("ln2", "mlp"):
            self.add_module(name, getattr(block, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        run = self.block_type.attention_part if self.part == "attention" else self.block_type.mlp_part
        return run(self, x)  # type: ignore[arg-type]


class StageModule(nn.Module):
    """Blocks ``first .. first+count-1`` of a GPT, plus the embedding and/or head at the ends;
    ``first_part`` / ``last_part`` say what it runs of its first and last block (``whole`` by default)."""

    def __init__(self, gpt: TransformerLM, first: int, count: int, is_first: bool, is_last: bool,
                 first_part: BlockPart = "whole", last_part: BlockPart = "whole", fused_head: bool = False) -> None:
        super().__init__()
        # Under a plan's fused_head_loss the last stage's forward ends in the loss (head_loss, set
        # by build_stage_modules): its output is the loss, and its forward is given the targets.
        self.fused_head = fused_head
        self.head_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self.embedding = gpt.embedding if is_first else None
        parts = {first: first_part, first + count - 1: last_part}
        self.blocks = nn.ModuleDict({
            str(i): gpt.blocks[str(i)] if parts.get(i, "whole") == "whole"
            else PartialBlock(gpt.blocks[str(i)], parts[i])  # type: ignore[arg-type]
            for i in range(first, first + count)
        })
        self.final_norm = gpt.final_norm if is_last else None
        self.lm_head = gpt.lm_head if is_last else None

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The stage's output: the hidden state it sends, the logits, or under ``fused_head_loss``
        the loss of ``targets`` (torch's schedules pass the targets to every stage of the rank
        that holds the last one; the others ignore them)."""
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.blocks.values():
            x = block(x)
        if self.final_norm is None or self.lm_head is None:
            return x
        if self.fused_head:
            if self.head_loss is None or targets is None:
                raise ValueError("fused_head_loss: the last stage's forward needs its loss and the targets")
            return self.head_loss(self.final_norm(x), targets)
        return self.lm_head(self.final_norm(x))

    def layers(self) -> list[tuple[str, str, nn.Module]]:
        """The stage's pipeline layers as ``(name, kind, module)`` in forward order (as ``GPT.layers``)."""
        out: list[tuple[str, str, nn.Module]] = [("embedding", "embedding", self.embedding)] if self.embedding is not None else []
        for i, blk in self.blocks.items():
            part = blk.part if isinstance(blk, PartialBlock) else "whole"
            # A part is not a whole block: its own kind keeps it out of per-block figures.
            out.append((block_layer_name(int(i), part), "block" if part == "whole" else f"block_{part}", blk))
        if self.final_norm is not None and self.lm_head is not None:
            out += [("final_norm", "final_norm", self.final_norm), ("lm_head", "lm_head", self.lm_head)]
        return out


def block_ranges(plan: Plan, model: Model) -> list[tuple[int, int]]:
    """(first block, block count) of every virtual stage (:func:`mindpipe.traces.layout.stage_layout`)."""
    return [(span.first_block, span.num_blocks) for span in stage_layout(plan, model)]


def build_stage_modules(gpt: TransformerLM, plan: Plan, pp_rank: int) -> dict[int, StageModule]:
    """The stage modules of ``pp_rank``, keyed by virtual stage index (a fused head's loss set on
    the last stage: :func:`mindpipe.traces.torch_gpt.plan_loss`)."""
    layout = stage_layout(plan, gpt.config)
    if tied_table_ranks(plan, gpt.config) is not None:
        # A tied head on a stage of its own holds a copy of the token table (the rule and how the
        # copies stay equal: tied_table_ranks; the executor's sum: executor/tied_table.py).
        gpt.lm_head.out.weight = nn.Parameter(gpt.embedding.tok.weight.detach().clone())
    out = {
        s: StageModule(gpt, layout[s].first_block, layout[s].num_blocks, layout[s].has_embedding, layout[s].has_head,
                       layout[s].first_part, layout[s].last_part, fused_head=plan.fused_head_loss)
        for s in rank_stages(plan, pp_rank)
    }
    for mod in out.values():
        if mod.fused_head and mod.lm_head is not None:
            mod.head_loss = plan_loss(plan, head=mod.lm_head)  # type: ignore[arg-type]
    return out


def head_major_qkv(weight: torch.Tensor, tp: int) -> torch.Tensor:
    """Reorder the rows of a fused QKV weight (or bias) so contiguous TP shards hold whole heads.

    ``Attention`` computes ``qkv(x).chunk(3, -1)``: rows [q | k | v]. Column-parallel sharding
    splits rows into ``tp`` contiguous blocks, which would hand rank 0 only query rows. After
    this permutation block r is [q_r | k_r | v_r] (the heads of rank r), so the unchanged
    ``chunk(3)`` on each rank's local output yields that rank's q, k and v — the layout
    Megatron-LM builds with its interleaved QKV weight.
    """
    q, k, v = weight.chunk(3, dim=0)
    parts = [torch.cat([q.chunk(tp)[r], k.chunk(tp)[r], v.chunk(tp)[r]]) for r in range(tp)]
    return torch.cat(parts)


def permute_qkv_for_tp(gpt: TransformerLM, tp: int) -> None:
    """Apply :func:`head_major_qkv` to every block's QKV projection, in place (GPT only: Llama's
    Q, K and V are separate linears, each split by whole heads as it is)."""
    if tp == 1 or not isinstance(gpt, GPT):
        return
    with torch.no_grad():
        for block in gpt.blocks.values():
            qkv: nn.Linear = block.attn.qkv  # type: ignore[union-attr,assignment]
            qkv.weight.copy_(head_major_qkv(qkv.weight, tp))
            qkv.bias.copy_(head_major_qkv(qkv.bias, tp))


__all__ = [
    "PartialBlock",
    "StageModule",
    "block_ranges",
    "build_stage_modules",
    "head_major_qkv",
    "permute_qkv_for_tp",
]
