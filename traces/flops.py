"""Model FLOPs of a training iteration: the numerator of MFU.

One definition for both sides of the loop: the simulator reports MFU of a simulated iteration and
the executor of a measured one (:mod:`mindpipe.traces.measured`), so the count lives in the data
contracts, which both may import. Counting follows Narayanan et al. (SC'21), Eq. 3, without the
recompute forward (model FLOPs, not hardware FLOPs: recomputation is not useful work).
"""

from __future__ import annotations

from mindpipe.traces.config import Model


def forward_flops_per_token(model: Model, seq_len: int) -> float:
    """Model FLOPs of the forward pass per token (no recompute), all layers, TP-independent.

    Narayanan et al. (SC'21), Eq. 3 without the recompute forward: the whole iteration costs
    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) FLOPs for ffn = 4h, i.e. 3 × this forward count.
    Written per operator here so ffn ≠ 4h is exact too: QKV (3h²), projection (h²) and the two
    MLP GEMMs (2·h·ffn) at 2 FLOPs per multiply-add, the attention scores and values (2·2·s·h),
    and the LM head (2·h·V).
    """
    h, f, L, v = model.hidden_size, model.ffn, model.num_layers, model.vocab_size
    per_layer = 2 * (3 * h * h + h * h + 2 * h * f) + 2 * 2 * seq_len * h
    return L * per_layer + 2 * h * v


def model_flops_per_iteration(model: Model, global_batch_size: int, seq_len: int | None = None) -> float:
    """Model FLOPs of one training iteration (forward + backward = 3 × forward; no recompute)."""
    s = seq_len or model.seq_len
    return 3.0 * forward_flops_per_token(model, s) * global_batch_size * s


__all__ = ["forward_flops_per_token", "model_flops_per_iteration"]
