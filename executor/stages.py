"""Cut the GPT of :mod:`mindpipe.traces.torch_gpt` into pipeline stages.

A stage keeps the parent's module objects and names: the first virtual stage owns ``embedding``,
every stage a slice of ``blocks`` (a ModuleDict keyed by the *global* block index), the last
``final_norm`` and ``lm_head``. Parameter names therefore match the unsplit model's
(``blocks.5.attn.qkv.weight`` wherever block 5 lives), which keeps checkpoints independent of
the partition (torchtitan's convention). The loss (``lm_loss``) is applied by the pipeline
schedule on the last stage. :meth:`StageModule.layers` lists the stage's pipeline layers in
forward order, the units the executor times (:mod:`mindpipe.executor.layer_timing`).

Which blocks a stage holds and which rank runs it are the plan rules of
:mod:`mindpipe.traces.layout`.
"""

from __future__ import annotations

import torch
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import rank_stages, stage_layout
from mindpipe.traces.torch_gpt import GPT
from torch import nn


class StageModule(nn.Module):
    """Blocks ``first .. first+count-1`` of a GPT, plus the embedding and/or head at the ends."""

    def __init__(self, gpt: GPT, first: int, count: int, is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.embedding = gpt.embedding if is_first else None
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[str(i)] for i in range(first, first + count)})
        self.final_norm = gpt.final_norm if is_last else None
        self.lm_head = gpt.lm_head if is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.blocks.values():
            x = block(x)
        if self.final_norm is not None and self.lm_head is not None:
            x = self.lm_head(self.final_norm(x))
        return x

    def layers(self) -> list[tuple[str, str, nn.Module]]:
        """The stage's pipeline layers as ``(name, kind, module)`` in forward order (as ``GPT.layers``)."""
        out: list[tuple[str, str, nn.Module]] = [("embedding", "embedding", self.embedding)] if self.embedding is not None else []
        out += [(f"block.{i}", "block", blk) for i, blk in self.blocks.items()]
        if self.final_norm is not None and self.lm_head is not None:
            out += [("final_norm", "final_norm", self.final_norm), ("lm_head", "lm_head", self.lm_head)]
        return out


def block_ranges(plan: Plan, model: Model) -> list[tuple[int, int]]:
    """(first block, block count) of every virtual stage (:func:`mindpipe.traces.layout.stage_layout`)."""
    return [(span.first_block, span.num_blocks) for span in stage_layout(plan, model)]


def build_stage_modules(gpt: GPT, plan: Plan, pp_rank: int) -> dict[int, StageModule]:
    """The stage modules of ``pp_rank``, keyed by virtual stage index."""
    layout = stage_layout(plan, gpt.config)
    return {
        s: StageModule(gpt, layout[s].first_block, layout[s].num_blocks, layout[s].has_embedding, layout[s].has_head)
        for s in rank_stages(plan, pp_rank)
    }


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


def permute_qkv_for_tp(gpt: GPT, tp: int) -> None:
    """Apply :func:`head_major_qkv` to every block's QKV projection, in place."""
    if tp == 1:
        return
    with torch.no_grad():
        for block in gpt.blocks.values():
            qkv: nn.Linear = block.attn.qkv  # type: ignore[union-attr,assignment]
            qkv.weight.copy_(head_major_qkv(qkv.weight, tp))
            qkv.bias.copy_(head_major_qkv(qkv.bias, tp))


__all__ = [
    "StageModule",
    "block_ranges",
    "build_stage_modules",
    "head_major_qkv",
    "permute_qkv_for_tp",
]
