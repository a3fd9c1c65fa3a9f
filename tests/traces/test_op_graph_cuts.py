"""The operator-level profile: what a cut between two operators of a block must carry.

``output_bytes`` of an operator unit is every tensor live across a cut right after it. A tensor
whose only later use is a read of its shape (``x.size()``, ``x.shape``, ``x.dtype``) is not
sent: only those numbers cross, and they are not tensor bytes.
"""

from __future__ import annotations

import pytest
from mindpipe.traces.config import Model
from mindpipe.traces.profiler import ProfileOptions, profile_model

B, S = 2, 16


@pytest.fixture(scope="module")
def ops() -> dict[str, object]:
    model = Model(kind="gpt", num_layers=1, hidden_size=32, num_heads=4, seq_len=S, vocab_size=64, name="tiny")
    trace = profile_model(model, ProfileOptions(micro_batch_size=B, granularity="op", warmup=0, repeats=1,
                                                step_repeats=1), command="test")
    return {r.name: r for r in trace.layers}


def test_cut_after_qkv_carries_residual_and_qkv_only(ops: dict) -> None:
    # The attention reads b and s from the LayerNorm output's size(); its values are not needed
    # after the QKV projection. Live: the residual stream x [b, s, h] and qkv [b, s, 3h], fp32.
    h = 32
    assert ops["block.0.attn_qkv"].output_bytes == (B * S * h + B * S * 3 * h) * 4


def test_cut_after_first_layernorm_still_carries_its_output(ops: dict) -> None:
    # The QKV projection reads the LayerNorm output's values: x and ln1's output cross.
    assert ops["block.0.ln1"].output_bytes == 2 * B * S * 32 * 4
    assert ops["block.0.add_1"].output_bytes == B * S * 32 * 4  # the attention cut: the residual stream


def test_cut_after_a_tuple_valued_operator_carries_its_tensors() -> None:
    """Llama's rotary embedding is one operator returning (q, k): a cut right after it sends both.

    Live after ``apply_rope``: the residual stream x [b, s, h], the RMSNorm output (the V
    projection still reads it), and the rotated q [b, s, h] and k [b, s, kv·d], all fp32.
    """
    h, heads, kv = 32, 4, 2
    model = Model(kind="llama", num_layers=1, hidden_size=h, num_heads=heads, num_kv_heads=kv, ffn_hidden_size=64,
                  seq_len=S, vocab_size=64, name="tiny-llama")
    trace = profile_model(model, ProfileOptions(micro_batch_size=B, granularity="op", warmup=0, repeats=1,
                                                step_repeats=1), command="test")
    ops = {r.name: r for r in trace.layers}
    d = h // heads
    assert ops["block.0.apply_rope"].output_bytes == (B * S * h * 3 + B * S * kv * d) * 4


def test_llama_units_add_up_to_the_block() -> None:
    """Every unit's backward is timed and counted: the QK^T matmul reads apply_rope's (q, k) tuple.

    Summed over a block's units, backward FLOPs equal the block's (as for GPT), and the rotary
    embedding and the QK^T matmul have a backward.
    """
    model = Model(kind="llama", num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
                  seq_len=S, vocab_size=64, name="tiny-llama")
    fast = {"micro_batch_size": B, "warmup": 0, "repeats": 1, "step_repeats": 1}
    ops = profile_model(model, ProfileOptions(granularity="op", **fast), command="test").layers
    block = next(r for r in profile_model(model, ProfileOptions(**fast), command="test").layers if r.kind == "block")
    units = [r for r in ops if r.name.startswith("block.0.")]
    assert sum(r.forward_flops for r in units) == block.forward_flops
    assert sum(r.backward_flops for r in units) == block.backward_flops
    assert sum(r.activation_bytes for r in units) == block.activation_bytes
    by_name = {r.name: r for r in units}
    assert by_name["block.0.matmul"].backward_flops == 2 * by_name["block.0.matmul"].forward_flops > 0
    assert by_name["block.0.apply_rope"].backward_input_s > 0


def test_llama_norm_weights_belong_to_their_units() -> None:
    """Llama's RMSNorm is a function of the block's ``ln1.weight`` (a ``get_attr`` node, not a
    module call): the unit holds that weight, so the units' parameters sum to the block's (and the
    norm's weight gradient is timed as its W, as a LayerNorm module's is)."""
    h = 32
    model = Model(kind="llama", num_layers=1, hidden_size=h, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
                  seq_len=S, vocab_size=64, name="tiny-llama")
    trace = profile_model(model, ProfileOptions(micro_batch_size=B, granularity="op", warmup=0, repeats=1,
                                                step_repeats=1), command="test")
    units = [r for r in trace.layers if r.name.startswith("block.0.")]
    assert sum(r.param_count for r in units) == model.block_param_count()
    norms = [r for r in units if r.kind == "rms_norm"]
    assert [r.param_count for r in norms] == [h, h]
