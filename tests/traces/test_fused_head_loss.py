"""The LM head fused into the loss (:class:`mindpipe.traces.torch_head_loss.LinearCrossEntropy`).

The fused loss is the unfused one — ``lm_loss(head(h), targets)`` — in value and in both
gradients (the head's input and its weight), for even and uneven pieces; it keeps for the backward
only the head's input, the weight and the integer targets (no logits-sized tensor); and its
backward's temporaries are the ones :func:`mindpipe.simulator.memory.loss_transient_bytes` prices.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mindpipe.simulator.memory import loss_transient_bytes
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.torch_gpt import LMHead, lm_loss, plan_loss
from mindpipe.traces.torch_head_loss import linear_cross_entropy
from torch.utils._python_dispatch import TorchDispatchMode

B, S, H, V = 5, 5, 16, 37  # 25 tokens: 3 and 7 pieces are uneven, 25 are one token each


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(B, S, H, generator=g).to(dtype).requires_grad_()
    w = (0.3 * torch.randn(V, H, generator=g)).to(dtype).requires_grad_()
    return h, w, torch.randint(0, V, (B, S), generator=g)


@pytest.mark.parametrize("chunks", [1, 3, 7, B * S])
def test_fused_is_the_unfused_loss_and_gradients(chunks):
    h, w, t = _inputs(torch.float32)
    ref = lm_loss(F.linear(h, w), t)
    ref_grads = torch.autograd.grad(2.5 * ref, [h, w])  # a grad_output other than 1
    fused = linear_cross_entropy(h, w, t, chunks)
    grads = torch.autograd.grad(2.5 * fused, [h, w])
    assert fused.dtype == torch.float32 and fused.shape == ()
    assert abs(fused.item() - ref.item()) <= 1e-6 * ref.item()
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_bf16_fused_loss_is_close_to_the_unfused_one():
    """bf16: the loss is upcast per piece as unfused; the weight gradient accumulates in bf16 piece by piece."""
    h, w, t = _inputs(torch.bfloat16)
    ref, fused = lm_loss(F.linear(h, w), t), linear_cross_entropy(h, w, t, 7)
    assert abs(fused.item() - ref.item()) <= 1e-6 * ref.item()
    (gh, gw), (rh, rw) = torch.autograd.grad(fused, [h, w]), torch.autograd.grad(ref, [h, w])
    assert gh.dtype == gw.dtype == torch.bfloat16
    torch.testing.assert_close(gh, rh)
    torch.testing.assert_close(gw, rw, rtol=0.02, atol=2e-3)


def test_plan_loss_calls_the_head_with_the_targets():
    model = Model(kind="gpt", num_layers=1, hidden_size=H, num_heads=2, seq_len=S, vocab_size=V)
    head = LMHead(model)
    h, _, t = _inputs(torch.float32)
    loss = plan_loss(Plan(loss_chunks=3, fused_head_loss=True), head=head)(h, t)
    assert loss.item() == pytest.approx(lm_loss(head(h), t).item(), rel=1e-6)
    with pytest.raises(ValueError, match="stage that holds the LM head"):
        plan_loss(Plan(fused_head_loss=True))(h, t)


def test_the_fused_loss_keeps_only_its_input_the_weight_and_the_targets():
    h, w, t = _inputs(torch.float32)
    saved: list[torch.Tensor] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        linear_cross_entropy(h, w, t, 3)
    assert {x.untyped_storage().data_ptr() for x in saved} == {
        h.untyped_storage().data_ptr(), w.untyped_storage().data_ptr(), t.untyped_storage().data_ptr()}


class _Peak(TorchDispatchMode):
    """Peak bytes of the tensors made inside the mode that are still alive (storages counted once;
    views of the tensors in ``existing``, the loss's input and weight, are not new)."""

    def __init__(self, *existing: torch.Tensor) -> None:
        super().__init__()
        self.live: dict[int, int] = {x.untyped_storage().data_ptr(): 0 for x in existing}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim():  # scalars: 4 bytes
                st = x.untyped_storage()
                key = st.data_ptr()
                if key not in self.live and st.nbytes():
                    self.live[key] = st.nbytes()
                    import weakref

                    weakref.finalize(x, self.live.pop, key, None)
                self.peak = max(self.peak, sum(self.live.values()))
        return out


@pytest.mark.parametrize("dtype,precision", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_the_backward_temporaries_are_the_simulators(dtype, precision):
    """Measured with a dispatch mode: the two gradients it returns and one piece's buffers — the
    logits, their fp32 copy (bf16 only) and the fp32 softmax — as loss_transient_bytes says."""
    model = Model(kind="gpt", num_layers=1, hidden_size=64, num_heads=2, seq_len=32, vocab_size=1000)
    plan = Plan(micro_batch_size=2, global_batch_size=2, loss_chunks=4, fused_head_loss=True, precision=precision)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 32, 64, generator=g).to(dtype).requires_grad_()
    w = (0.1 * torch.randn(1000, 64, generator=g)).to(dtype).requires_grad_()
    loss = linear_cross_entropy(h, w, torch.randint(0, 1000, (2, 32), generator=g), 4)
    mode = _Peak(h, w)
    with mode:
        torch.autograd.grad(loss, [h, w])
    predicted = loss_transient_bytes(model, plan)
    assert abs(mode.peak - predicted) <= 0.01 * predicted, (mode.peak, predicted)
