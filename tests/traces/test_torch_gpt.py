"""The torch GPT: parameter count, determinism, and the activation-memory relation to Korthikanti et al."""

from __future__ import annotations

import pytest
import torch
from mindpipe.traces.config import Model
from mindpipe.traces.timing import saved_activation_bytes
from mindpipe.traces.torch_gpt import (
    block_activation_bytes,
    build_gpt,
    dropout_mask_bytes,
    korthikanti_bytes,
    lm_loss,
    synthetic_batch,
)


def _measured_block_bytes(model: Model, dtype: str, b: int, s: int) -> int:
    net = build_gpt(model, dtype=dtype)
    net.train()
    blk = net.blocks["0"]
    x = torch.randn(b, s, model.hidden_size, dtype=net.lm_head.out.weight.dtype, requires_grad=True)
    state = list(net.parameters()) + list(net.buffers())
    measured, _ = saved_activation_bytes(lambda: blk(x), state)
    return measured


def test_param_count_matches_torch(tiny_model):
    net = build_gpt(tiny_model)
    assert sum(p.numel() for p in net.parameters()) == tiny_model.param_count()
    assert sum(p.numel() for p in net.blocks["0"].parameters()) == tiny_model.block_param_count()


def test_build_is_deterministic_and_trains(tiny_model):
    a, b = build_gpt(tiny_model, seed=3), build_gpt(tiny_model, seed=3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    tokens, targets = synthetic_batch(tiny_model, 2, seed=1)
    loss = lm_loss(a(tokens), targets)
    # Near-uniform initial predictions: loss ≈ ln(V).
    assert abs(loss.item() - torch.log(torch.tensor(float(tiny_model.vocab_size))).item()) < 0.2
    loss.backward()
    assert all(p.grad is not None for p in a.parameters())


@pytest.mark.parametrize("dtype,dbytes", [("fp32", 4), ("bf16", 2)])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("shape", [(64, 4, 32, 3), (96, 8, 16, 2), (128, 2, 24, 1)])
def test_block_saves_exactly_the_derived_bytes(dtype, dbytes, dropout, shape):
    h, a, s, b = shape
    model = Model(kind="gpt", num_layers=1, hidden_size=h, num_heads=a, seq_len=s, vocab_size=50, dropout=dropout)
    mask = dropout_mask_bytes("cpu", dbytes) if dropout else None
    assert _measured_block_bytes(model, dtype, b, s) == block_activation_bytes(model, b, s, dbytes, mask)


@pytest.mark.parametrize("shape", [(64, 4, 32, 3), (2048, 16, 1024, 1), (12288, 96, 2048, 1)])
def test_derivation_reduces_to_korthikanti(shape):
    """With 2-byte activations and 1-byte masks (GPU, fp16/bf16) our block's saved bytes are
    Korthikanti et al.'s s·b·h·(34 + 5·a·s/h) plus the LayerNorm statistics the paper omits."""
    h, a, s, b = shape
    model = Model(kind="gpt", num_layers=1, hidden_size=h, num_heads=a, seq_len=s, vocab_size=50, dropout=0.1)
    ln_stats = 2 * 2 * 2 * s * b
    assert block_activation_bytes(model, b, s, 2, 1) == korthikanti_bytes(model, b, s) + ln_stats


def test_ffn_width_scales_mlp_terms():
    model = Model(kind="gpt", num_layers=1, hidden_size=64, num_heads=4, seq_len=16, vocab_size=50, ffn_hidden_size=128)
    assert _measured_block_bytes(model, "fp32", 2, 16) == block_activation_bytes(model, 2, 16, 4, None)


def test_shorter_sequence_than_model(tiny_model):
    net = build_gpt(tiny_model)
    tokens, _ = synthetic_batch(tiny_model, 2, seq_len=8)
    assert net(tokens).shape == (2, 8, tiny_model.vocab_size)
