"""``lm_loss`` in ``loss_chunks`` pieces (:class:`mindpipe.traces.torch_gpt.ChunkedCrossEntropy`).

The chunked loss is the unchunked one, value and logits gradient, and autograd keeps only the
logits (in their dtype) and the integer targets for it: no fp32 tensor of the logits' size, which
the unchunked loss keeps (its fp32 log-softmax). Token counts here are not multiples of the
chunks, so the pieces are uneven (``torch.tensor_split``).
"""

from __future__ import annotations

import pytest
import torch
from mindpipe.traces.config import Plan
from mindpipe.traces.torch_gpt import lm_loss, plan_loss

B, S, V = 5, 5, 37  # 25 tokens: 2, 3 and 7 leave uneven pieces; 25 pieces are one token each


def _logits(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(B, S, V, generator=g)).to(dtype).requires_grad_()
    return logits, torch.randint(0, V, (B, S), generator=g)


def _loss_and_grad(logits: torch.Tensor, targets: torch.Tensor, chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    loss = lm_loss(logits, targets, chunks)
    (grad,) = torch.autograd.grad(2.5 * loss, logits)  # a grad_output other than 1
    return loss.detach(), grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunks", [2, 3, 7, B * S])
def test_chunked_loss_is_the_unchunked_one(dtype, chunks):
    logits, targets = _logits(dtype)
    loss, grad = _loss_and_grad(logits, targets, 1)
    chunked, chunked_grad = _loss_and_grad(logits, targets, chunks)
    assert chunked.dtype == torch.float32 and chunked.shape == ()
    assert abs(chunked.item() - loss.item()) <= 1e-6 * abs(loss.item()), (chunked, loss)
    assert chunked_grad.dtype == dtype and chunked_grad.shape == logits.shape
    torch.testing.assert_close(chunked_grad, grad)  # fp32: rtol 1.3e-6; bf16: its own tolerance


def test_the_mean_is_over_all_tokens_not_the_pieces():
    """Pieces of 4 and 3 tokens: a mean of the pieces' means would weigh them differently."""
    logits = torch.zeros(1, 7, 4)
    logits[0, :4, 0] = 10.0  # the first four tokens predict their targets, the last three do not
    targets = torch.zeros(1, 7, dtype=torch.long)
    assert lm_loss(logits, targets, 2).item() == pytest.approx(lm_loss(logits, targets).item(), rel=1e-6)


def test_plan_loss_runs_the_plans_chunks():
    logits, targets = _logits(torch.float32)
    for chunks in (1, 3):
        fn = plan_loss(Plan(loss_chunks=chunks))
        assert torch.equal(fn(logits, targets), lm_loss(logits, targets, chunks))


def _saved(loss_fn) -> list[torch.Tensor]:
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn()
    return saved


def _storages(tensors: list[torch.Tensor]) -> dict[int, tuple[torch.dtype, int]]:
    """Floating-point storages among ``tensors`` (counted once each, as the executor's accounting does)."""
    return {t.untyped_storage().data_ptr(): (t.dtype, t.untyped_storage().nbytes()) for t in tensors
            if t.is_floating_point()}


@pytest.mark.parametrize("dtype,dbytes", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_the_chunked_loss_keeps_only_the_logits_and_targets(dtype, dbytes):
    h = torch.randn(B, S, 8, dtype=dtype, requires_grad=True)
    head = torch.nn.Linear(8, V, bias=False).to(dtype)
    logits, targets = head(h), torch.randint(0, V, (B, S))  # not a leaf, as a stage's output
    n = B * S * V
    saved = _saved(lambda: lm_loss(logits, targets, 4))
    assert _storages(saved) == {logits.untyped_storage().data_ptr(): (dtype, dbytes * n)}  # d·s·b·V bytes
    assert all(t.dtype == torch.long and t.numel() == B * S for t in saved if not t.is_floating_point())
    assert len(saved) == 2
    # Unchunked: the fp32 log-softmax (4·s·b·V bytes) whatever the logits' dtype, and nll_loss's
    # fp32 total weight (a scalar); the logits themselves are not kept.
    whole = _storages(_saved(lambda: lm_loss(logits, targets)))
    assert sorted(whole.values(), key=lambda v: v[1]) == [(torch.float32, 4), (torch.float32, 4 * n)]
