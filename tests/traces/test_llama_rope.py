"""The Llama rotary embedding: the composite rotation's values and gradients, nothing kept, no buffers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mindpipe.traces.config import Model  # noqa: E402
from mindpipe.traces.timing import saved_activation_bytes  # noqa: E402
from mindpipe.traces.torch_llama import apply_rope, build_llama, rope_tables  # noqa: E402


def _composite(x, cos, sin):
    """x·cos + rotate_half(x)·sin with the tables cast to x's dtype (Hugging Face's apply_rotary_pos_emb),
    the sum as one ``addcmul`` as the executor's attention wrote it before the rotation had its own backward."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat([-x2, x1], dim=-1), sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rotation_and_its_gradient_equal_the_composite(dtype):
    gen = torch.Generator().manual_seed(0)
    b, s, heads, kv, d, theta = 3, 37, 4, 2, 16, 5e5
    q = torch.randn(b, s, heads, d, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(b, s, kv, d, generator=gen).to(dtype).requires_grad_()
    gq, gk = torch.randn(b, s, heads, d, generator=gen).to(dtype), torch.randn(b, s, kv, d, generator=gen).to(dtype)
    cos, sin = rope_tables(d, 64, theta)  # a longer table, narrowed: positions 0..s-1
    ref_q, ref_k = _composite(q, cos[:s], sin[:s]), _composite(k, cos[:s], sin[:s])
    ref = torch.autograd.grad((ref_q * gq).sum() + (ref_k * gk).sum(), (q, k))
    out_q, out_k = apply_rope(q, k, theta)
    got = torch.autograd.grad((out_q * gq).sum() + (out_k * gk).sum(), (q, k))
    tol = {"atol": 0.0, "rtol": 0.0}  # bit for bit, in every dtype
    torch.testing.assert_close(out_q, ref_q, **tol)
    torch.testing.assert_close(out_k, ref_k, **tol)
    torch.testing.assert_close(got[0], ref[0], **tol)
    torch.testing.assert_close(got[1], ref[1], **tol)


def test_rotation_is_orthogonal_and_position_zero_is_identity():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 9, 3, 8, generator=gen, dtype=torch.float64)
    out, _ = apply_rope(q, q[:, :, :1], 1e4)
    torch.testing.assert_close(out.norm(dim=-1), q.norm(dim=-1))  # a rotation keeps lengths
    torch.testing.assert_close(out[:, 0], q[:, 0])  # angle 0 at position 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotation_keeps_nothing_for_backward(dtype):
    """Autograd saves no table (the composite saved cos and sin, and under mixed precision a cast
    copy of each for Q and for K per micro-batch)."""
    q = torch.randn(2, 16, 4, 8, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 16, 2, 8, dtype=dtype, requires_grad=True)
    saved, _ = saved_activation_bytes(lambda: apply_rope(q, k, 1e4), [])
    assert saved == 0
    cos, sin = rope_tables(8, 16, 1e4)
    composite, _ = saved_activation_bytes(lambda: (_composite(q, cos, sin), _composite(k, cos, sin)), [])
    assert composite > 0  # what the old per-block tables cost, for contrast


def test_the_model_holds_no_buffers():
    """No per-block rotary (or mask) tables: nothing outside the parameters lives with the model."""
    m = Model(kind="llama", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_hidden_size=48,
              seq_len=16, vocab_size=40)
    assert list(build_llama(m).buffers()) == []


def test_an_odd_head_width_is_refused_naming_the_key_not_a_shape_error_in_the_forward():
    """Rotary embeddings rotate channel pairs: hidden 60 over 4 heads (width 15) used to build and
    then fail in the first forward with "The size of tensor a (15) must match ... (16)" inside a rank."""
    from mindpipe.traces.errors import ContractError

    # Refused when the model is built (or already by the Model contract, which owns the rule too).
    with pytest.raises(ContractError, match=r"num_heads: head width hidden_size/num_heads=60/4=15 must be even"):
        build_llama(Model(kind="llama", num_layers=1, hidden_size=60, num_heads=4, num_kv_heads=2,
                          ffn_hidden_size=96, seq_len=8, vocab_size=32))
    even = Model(kind="llama", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                 seq_len=8, vocab_size=32)
    assert build_llama(even)(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 32)
