"""The torch network of a model contract: :class:`~mindpipe.traces.torch_gpt.GPT` or :class:`~mindpipe.traces.torch_llama.Llama`.

The one place that maps ``Model.kind`` to an implementation; the profiler, the executor and its
single-process reference build through it. Both classes have the same module tree (``embedding``,
``blocks`` with ``ln1``/``attn``/``ln2``/``mlp`` and ``attention_part``/``mlp_part``, ``final_norm``,
``lm_head``) and the same ``layers()``, so the code after the build does not branch on the kind.
"""

from __future__ import annotations

from typing import TypeAlias

import torch
from mindpipe.traces import torch_gpt, torch_llama
from mindpipe.traces.config import Model
from mindpipe.traces.torch_context_parallel import ContextShard
from mindpipe.traces.torch_gpt import GPT, build_gpt
from mindpipe.traces.torch_llama import Llama, build_llama
from torch import nn

TransformerLM: TypeAlias = GPT | Llama
"""A built network of either family."""


_ATTENTION = (torch_gpt.Attention, torch_llama.Attention)


def use_flash_attention(module: nn.Module, on: bool) -> None:
    """Run the attention core of every attention module in ``module`` as the fused kernel (``on``)
    or as the explicit Q·Kᵀ, mask, softmax, dropout, ·V (``Plan.flash_attention``; see
    :func:`mindpipe.traces.torch_gpt.flash_core` for which kernel torch picks and what it saves).

    ``module`` may be a whole network, a pipeline stage or one block. The switch changes no
    parameter, so it can be set before or after the model is split, sharded or wrapped. A fused
    block's torch.fx graph has no mask ``add``, so :data:`mindpipe.traces.layout.CUT_UNITS`
    (``add_1``) would not name its first residual add; ``mindpipe profile`` (the operator-level
    profiler) takes no plan and never sets it.
    """
    for m in module.modules():
        if isinstance(m, _ATTENTION):
            m.flash = on


def use_context_parallel(module: nn.Module, shard: ContextShard | None) -> None:
    """Give every attention module and GPT position embedding in ``module`` the plan's context
    parallelism (:mod:`mindpipe.traces.torch_context_parallel`): attention over the whole sequence
    spread on the cp group, positions of the rank's share; None switches it off. Like
    :func:`use_flash_attention`, it changes no parameter."""
    for m in module.modules():
        if isinstance(m, (*_ATTENTION, torch_gpt.Embedding)):
            m.context = shard


def build_model(model: Model, *, seed: int = 0, dtype: str = "fp32", device: str | torch.device = "cpu",
                flash_attention: bool = False) -> TransformerLM:
    """Build the network ``model`` describes, deterministically (same seed ⇒ same weights on every rank).

    Args:
        model: The model contract (``kind`` ``gpt`` or ``llama``).
        seed: Seed for parameter initialisation.
        dtype: ``fp32``, ``bf16`` or ``fp16`` parameters.
        device: Where to place parameters.
        flash_attention: The plan's ``flash_attention``: fused attention cores
            (:func:`use_flash_attention`); the weights are the same either way.
    """
    build = build_llama if model.is_llama else build_gpt
    net = build(model, seed=seed, dtype=dtype, device=device)
    use_flash_attention(net, flash_attention)
    return net


__all__ = ["TransformerLM", "build_model", "use_context_parallel", "use_flash_attention"]
