"""Cut the GPT of :mod:`mindpipe.traces.torch_gpt` into pipeline stages.

A stage keeps the parent's module objects and names: the first virtual stage owns ``embedding``,
every stage a slice of ``blocks`` (a ModuleDict keyed by the *global* block index), the last
``final_norm`` and ``lm_head``. Parameter names therefore match the unsplit model's
(``blocks.5.attn.qkv.weight`` wherever block 5 lives), which keeps checkpoints independent of
the partition (torchtitan's convention). The loss (``lm_loss``) is applied by the pipeline
schedule on the last stage.

Stage placement: virtual stage s runs on pipeline rank s mod pp ("loop", Megatron/torch
interleaving), or in a "V" for ``zbv``/``dualpipev`` (rank r holds stages r and 2·pp−1−r;
Qi et al. ICLR'24, torch ``generate_stage_to_rank_mapping(style="v")``).
"""

from __future__ import annotations

import torch
from mindpipe.simulator.actions import loop_stage_to_rank, v_stage_to_rank
from mindpipe.traces.config import V_SCHEDULES, Model, Plan, stage_layers
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


def stage_to_rank(plan: Plan) -> list[int]:
    """Pipeline rank of every virtual stage for the plan's schedule."""
    if plan.schedule in V_SCHEDULES:
        return v_stage_to_rank(plan.pp, plan.num_stages)
    return loop_stage_to_rank(plan.pp, plan.num_stages)


def local_stages(plan: Plan, pp_rank: int) -> list[int]:
    """Virtual stages of ``pp_rank``, ascending."""
    return [s for s, r in enumerate(stage_to_rank(plan)) if r == pp_rank]


def block_ranges(plan: Plan, model: Model) -> list[tuple[int, int]]:
    """(first block, block count) of every virtual stage."""
    counts = stage_layers(plan, model)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return list(zip(starts, counts, strict=True))


def build_stage_modules(gpt: GPT, plan: Plan, pp_rank: int) -> dict[int, StageModule]:
    """The stage modules of ``pp_rank``, keyed by virtual stage index."""
    ranges = block_ranges(plan, gpt.config)
    last = plan.num_stages - 1
    return {
        s: StageModule(gpt, ranges[s][0], ranges[s][1], is_first=s == 0, is_last=s == last)
        for s in local_stages(plan, pp_rank)
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
    "local_stages",
    "permute_qkv_for_tp",
    "stage_to_rank",
]
