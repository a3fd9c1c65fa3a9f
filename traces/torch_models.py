"""The torch network of a model contract: :class:`~mindpipe.traces.torch_gpt.GPT` or :class:`~mindpipe.traces.torch_llama.Llama`.

The one place that maps ``Model.kind`` to an implementation; the profiler, the executor and its
single-process reference build through it. Both classes have the same module tree (``embedding``,
``blocks`` with ``ln1``/``attn``/``ln2``/``mlp`` and ``attention_part``/``mlp_part``, ``final_norm``,
``lm_head``) and the same ``layers()``, so the code after the build does not branch on the kind.
"""

from __future__ import annotations

from typing import TypeAlias

import torch
from mindpipe.traces.config import Model
from mindpipe.traces.torch_gpt import GPT, build_gpt
from mindpipe.traces.torch_llama import Llama, build_llama

TransformerLM: TypeAlias = GPT | Llama
"""A built network of either family."""


def build_model(model: Model, *, seed: int = 0, dtype: str = "fp32", device: str | torch.device = "cpu") -> TransformerLM:
    """Build the network ``model`` describes, deterministically (same seed ⇒ same weights on every rank).

    Args:
        model: The model contract (``kind`` ``gpt`` or ``llama``).
        seed: Seed for parameter initialisation.
        dtype: ``fp32``, ``bf16`` or ``fp16`` parameters.
        device: Where to place parameters.
    """
    build = build_llama if model.is_llama else build_gpt
    return build(model, seed=seed, dtype=dtype, device=device)


__all__ = ["TransformerLM", "build_model"]
