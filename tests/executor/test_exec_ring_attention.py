"""Ring attention (the plan's ``cp_comm_type=p2p``, :mod:`mindpipe.traces.torch_context_parallel`) on
gloo ranks: the output and the q, k, v gradients of every rank's share equal torch's causal
attention on the whole sequence (fp64, multi-head and grouped-query, on the default group and a
group of its own, the blocks in torch's CPU FlashAttention kernel and op by op), and with dropout the backward is the forward's derivative (a central
difference of the loss summed over ranks) while dropout does change the output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, free_port, run_env

HARNESS = Path(__file__).with_name("ring_harness.py")



@pytest.mark.parametrize("cp", [2, 3, 4])
def test_ring_attention_equals_causal_attention_and_its_backward_is_the_forwards_derivative(tmp_path, cp: int) -> None:
    out, port = tmp_path / "ring.json", free_port()
    procs = [subprocess.Popen([sys.executable, str(HARNESS), str(r), str(cp), str(port), str(out)], env=run_env(),
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(cp)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    worst = json.loads(out.read_text())
    for key in ("world_mha", "world_gqa", "subgroup_mha", "subgroup_gqa", "math_gqa"):
        assert worst[key] <= 1e-12, worst
    assert worst["dropout_rel"] <= 1e-6, worst
    assert worst["dropout_change"] > 0.1, worst  # the masks are applied


def _one_block(device: str, dtype: Any, causal: bool, fused: bool) -> tuple[Any, ...]:
    """A whole attention as one ring block (its merged output and log-sum-exp are its own): the
    block's output and gradients, and torch's SDPA on the same inputs."""
    import torch
    import torch.nn.functional as F
    from mindpipe.traces import torch_context_parallel as tcp

    gen = torch.Generator().manual_seed(3)
    q, k, v, g = (torch.randn(2, 4, 64, 32, generator=gen).to(device, dtype) for _ in range(4))
    acc = torch.promote_types(dtype, torch.float32)
    scale = 32 ** -0.5
    assert tcp._fused(q, 0.0) == fused
    out, lse, state = tcp._block_forward(q, k, v, causal, 0.0, scale, acc)
    grads = tcp._block_backward(g, q, k, v, out.to(dtype), lse, causal, 0.0, scale, acc, state)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal)
    ref.backward(g)
    return (out, *grads), (ref, *(t.grad for t in ref_in))


@pytest.mark.parametrize("causal", [True, False])
def test_a_ring_blocks_kernels_give_attention_and_its_gradients_on_cpu(causal: bool) -> None:
    import torch

    mine, ref = _one_block("cpu", torch.float64, causal, fused=True)
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=0, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_a_ring_blocks_flashattention_kernels_give_attention_and_its_gradients_on_cuda(causal: bool) -> None:
    import torch

    mine, ref = _one_block("cuda", torch.bfloat16, causal, fused=True)
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=2e-2, atol=2e-2)
