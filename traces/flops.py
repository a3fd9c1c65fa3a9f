"""Model FLOPs of a training iteration: the numerator of MFU.

One definition for both sides of the loop: the simulator reports MFU of a simulated iteration and
the executor of a measured one (:mod:`mindpipe.traces.measured`), so the count lives in the data
contracts, which both may import. Counting follows Narayanan et al. (SC'21), Eq. 3, without the
recompute forward (model FLOPs, not hardware FLOPs: recomputation is not useful work).
"""

from __future__ import annotations

from mindpipe.traces.config import Model


def mlp_matrices(model: Model) -> int:
    """h×f weight matrices of a block's MLP: 2 for GeLU (fc1, fc2), 3 for SwiGLU (gate, up, down)."""
    return 3 if model.is_llama else 2


def block_weight_macs_per_token(model: Model) -> int:
    """Multiply-adds per token of one block's weight GEMMs: Q (h²), K and V (2·h·kv·h/a, = 2h² without
    GQA), the output projection (h²) and the MLP (2 or 3 × h·f)."""
    h = model.hidden_size
    return 2 * h * h + 2 * h * model.kv_width + mlp_matrices(model) * h * model.ffn


def forward_flops_per_token(model: Model, seq_len: int) -> float:
    """Model FLOPs of the forward pass per token (no recompute), all layers, TP-independent.

    Narayanan et al. (SC'21), Eq. 3 without the recompute forward: the whole iteration costs
    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) FLOPs for ffn = 4h, i.e. 3 × this forward count.
    Written per operator here so ffn ≠ 4h, grouped-query attention and SwiGLU are exact too: the
    weight GEMMs (:func:`block_weight_macs_per_token`) at 2 FLOPs per multiply-add, the attention
    scores and values (2·2·s·h; GQA shares K/V heads but every query head still attends) and the
    LM head (2·h·V). For Llama this is Megatron's ``num_floating_point_operations`` ÷ 3:
    12·B·s·l·h²·(1 + 3f/(2h) + kv/a + s/h + V/(2·l·h)) per iteration.
    The simulator's operator list (:func:`mindpipe.simulator.ops.block_ops`) is held to this count
    by a test.
    """
    h, L, v = model.hidden_size, model.num_layers, model.vocab_size
    per_layer = 2 * block_weight_macs_per_token(model) + 2 * 2 * seq_len * h
    return L * per_layer + 2 * h * v


def model_flops_per_iteration(model: Model, global_batch_size: int, seq_len: int | None = None) -> float:
    """Model FLOPs of one training iteration (forward + backward = 3 × forward; no recompute)."""
    s = seq_len or model.seq_len
    return 3.0 * forward_flops_per_token(model, s) * global_batch_size * s


__all__ = ["block_weight_macs_per_token", "forward_flops_per_token", "mlp_matrices", "model_flops_per_iteration"]
