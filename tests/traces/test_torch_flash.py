"""The fused attention core (``Plan.flash_attention``): same numbers as the explicit core, no a·s² scores saved.

GPT (dropout 0, eval) and Llama with grouped-query attention: the fused core's output and input
gradients equal the explicit core's within 1e-5 in fp32; a fused block saves exactly the explicit
block's bytes less the softmax output (d·a·s²·b) plus the kernel's fp32 log-sum-exp (4·a·s·b);
torch.fx still traces a block; :func:`use_flash_attention` reaches every attention module of a model
or a pipeline stage.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.timing import saved_activation_bytes
from mindpipe.traces.torch_gpt import lm_loss, synthetic_batch
from mindpipe.traces.torch_models import build_model, use_flash_attention

GPT: dict[str, Any] = {"kind": "gpt", "num_layers": 2, "hidden_size": 32, "num_heads": 4, "seq_len": 16,
                       "vocab_size": 64}
# 4 query heads on 2 K/V heads (g = 2), as tests/executor/test_exec_llama.py's LLAMA.
LLAMA: dict[str, Any] = {"kind": "llama", "num_layers": 2, "hidden_size": 32, "num_heads": 4, "num_kv_heads": 2,
                         "ffn_hidden_size": 64, "seq_len": 16, "vocab_size": 64}
TOL = 1e-5


def _core_outputs(attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  flash: bool) -> list[torch.Tensor]:
    """The core's output and the gradients of a fixed random projection of it w.r.t. q, k and v."""
    attn.flash = flash
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attn.core(q, k, v)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (out * weight).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]  # type: ignore[list-item]


@pytest.mark.parametrize("config", [GPT, LLAMA], ids=["gpt", "llama-gqa"])
def test_flash_core_matches_the_explicit_core(config):
    model = Model(**config)
    net = build_model(model, seed=1).eval()  # GPT's dropout is 0 here, and off in eval anyway
    attn = net.blocks["0"].attn
    b, s, d, a = 3, model.seq_len, model.head_dim, model.num_heads
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, a, s, d, generator=gen)
    k, v = (torch.randn(b, model.kv_heads, s, d, generator=gen) for _ in range(2))
    explicit, fused = _core_outputs(attn, q, k, v, False), _core_outputs(attn, q, k, v, True)
    for name, e, f in zip(("output", "dq", "dk", "dv"), explicit, fused, strict=True):
        assert e.shape == f.shape and torch.allclose(e, f, atol=TOL, rtol=TOL), (name, (e - f).abs().max())


@pytest.mark.parametrize("config", [GPT, LLAMA], ids=["gpt", "llama-gqa"])
def test_flash_model_trains_to_the_same_loss_and_gradients(config):
    model = Model(**config)
    tokens, targets = synthetic_batch(model, 2, seed=1)
    results = []
    for flash in (False, True):
        net = build_model(model, seed=1, flash_attention=flash)
        loss = lm_loss(net(tokens), targets)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in net.parameters()]))
    (loss_e, grads_e), (loss_f, grads_f) = results
    assert torch.allclose(loss_e, loss_f, atol=TOL, rtol=TOL)
    assert all(torch.allclose(ge, gf, atol=TOL, rtol=TOL) for ge, gf in zip(grads_e, grads_f, strict=True))


@pytest.mark.parametrize("dtype,dbytes", [("fp32", 4), ("bf16", 2)])
@pytest.mark.parametrize("shape", [(64, 4, 32, 3), (96, 8, 16, 2)])
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_flash_block_saves_the_explicit_bytes_less_the_scores(kind, dtype, dbytes, shape):
    """On CPU without dropout torch runs ``_scaled_dot_product_flash_attention_for_cpu``: it keeps
    q, k, v, its output (laid out as q, so also the projection's input) and an fp32 log-sum-exp per
    row, instead of the d-byte softmax output per score."""
    h, a, s, b = shape
    extra = {"num_kv_heads": a // 2, "ffn_hidden_size": 2 * h} if kind == "llama" else {}
    model = Model(kind=kind, num_layers=1, hidden_size=h, num_heads=a, seq_len=s, vocab_size=50, **extra)
    net = build_model(model, dtype=dtype)
    x = torch.randn(b, s, h, dtype=net.lm_head.out.weight.dtype, requires_grad=True)
    state = list(net.parameters()) + list(net.buffers())
    explicit, _ = saved_activation_bytes(lambda: net.blocks["0"](x), state)
    use_flash_attention(net, True)
    fused, _ = saved_activation_bytes(lambda: net.blocks["0"](x), state)
    assert fused == explicit - dbytes * a * s * s * b + 4 * a * s * b


def test_flash_with_dropout_on_cpu_falls_back_to_the_math_backend():
    """What ``executor/precheck.py`` notes for such a run: with attention dropout in training torch
    2.13's CPU kernel choice is the math backend, which keeps a·s²-sized tensors like the explicit core."""
    model = Model(**{**GPT, "num_layers": 1, "dropout": 0.1})
    net = build_model(model, flash_attention=True).train()
    b, s = 2, model.seq_len
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    x = torch.randn(b, s, model.hidden_size, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net.blocks["0"](x)
    assert b * model.num_heads * s * s in sizes


@pytest.mark.parametrize("config", [GPT, LLAMA], ids=["gpt", "llama-gqa"])
def test_flash_block_traces_with_fx(config):
    """The operator-level profiler traces blocks with torch.fx: the fused core is one node."""
    model = Model(**config)
    net = build_model(model, seed=2, flash_attention=True).eval()
    block = net.blocks["0"]
    graph = torch.fx.symbolic_trace(block)
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.nn.functional.scaled_dot_product_attention) == 1 and torch.softmax not in targets
    x = torch.randn(2, model.seq_len, model.hidden_size)
    assert torch.equal(graph(x), block(x))


def test_use_flash_attention_reaches_every_attention_module_of_a_stage():
    from mindpipe.executor.stages import build_stage_modules

    model = Model(**{**LLAMA, "num_layers": 4})
    plan = Plan(pp=2, micro_batch_size=1, global_batch_size=2, stage_cuts=["after_attention"], flash_attention=True)
    net = build_model(model)
    stage = build_stage_modules(net, plan, 0)[0]
    use_flash_attention(stage, True)
    assert [name for name, m in net.named_modules() if getattr(m, "flash", False)] == ["blocks.0.attn", "blocks.1.attn"]
    use_flash_attention(net, False)
    assert not any(getattr(m, "flash", False) for m in net.modules())
