"""The profiler: record layout, exact memory and FLOP figures, op-level consistency, CUDA path."""

from __future__ import annotations

import pytest
import torch
from mindpipe.traces.errors import ContractError
from mindpipe.traces.profiler import ProfileOptions, profile_model
from mindpipe.traces.torch_gpt import block_activation_bytes
from mindpipe.traces.trace import Trace

FAST = {"warmup": 1, "repeats": 3, "step_repeats": 2}


@pytest.fixture(scope="module")
def model():
    from mindpipe.traces.config import Model

    return Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128, name="tiny")


@pytest.fixture(scope="module")
def layer_trace(model):
    return profile_model(model, ProfileOptions(micro_batch_size=2, **FAST), command="test")


@pytest.fixture(scope="module")
def op_trace(model):
    return profile_model(model, ProfileOptions(micro_batch_size=2, granularity="op", **FAST), command="test")


def test_layer_records(model, layer_trace):
    names = [r.name for r in layer_trace.layers]
    assert names == ["embedding", "block.0", "block.1", "final_norm", "lm_head"]
    assert layer_trace.device == "cpu" and layer_trace.dtype == "fp32"
    assert layer_trace.micro_batch_size == 2 and layer_trace.seq_len == 32
    assert layer_trace.provenance.torch_version == torch.__version__
    assert "CPU trace" in layer_trace.provenance.notes
    for r in layer_trace.layers:
        assert r.forward_s > 0 and r.stats["repeats"] == 3
    emb = layer_trace.layers[0]
    assert emb.backward_input_s == 0 and emb.backward_weight_s > 0  # token ids have no gradient
    blk = layer_trace.layers[1]
    assert blk.backward_input_s > 0 and blk.backward_weight_s > 0
    assert layer_trace.step is not None and layer_trace.step.forward_backward_s > 0


def test_layer_memory_params_flops_are_exact(model, layer_trace):
    b, s, h, v = 2, 32, model.hidden_size, model.vocab_size
    blk = layer_trace.layers[1]
    assert blk.activation_bytes == block_activation_bytes(model, b, s, 4, None)
    assert blk.output_bytes == b * s * h * 4
    assert blk.param_count == model.block_param_count()
    assert sum(r.param_count for r in layer_trace.layers) == model.param_count()
    # Narayanan et al.: forward GEMM FLOPs per block 24·b·s·h² + 4·b·s²·h; backward twice that.
    assert blk.forward_flops == 24 * b * s * h * h + 4 * b * s * s * h
    assert blk.backward_flops == 2 * blk.forward_flops
    assert layer_trace.layers[-1].forward_flops == 2 * b * s * h * v
    assert layer_trace.layers[-1].output_bytes == 4  # the scalar loss


def test_op_level_adds_up_to_layers(model, layer_trace, op_trace):
    ops = [r for r in op_trace.layers if r.name.startswith("block.0.")]
    assert len(ops) >= 10
    kinds = {r.kind for r in ops}
    assert {"linear", "layernorm", "matmul", "softmax", "gelu"} <= kinds
    blk = layer_trace.layers[1]
    assert sum(r.activation_bytes for r in ops) == blk.activation_bytes
    assert sum(r.param_count for r in ops) == blk.param_count
    assert sum(r.forward_flops for r in ops) == blk.forward_flops
    assert sum(r.backward_flops for r in ops) == blk.backward_flops
    # The operator graph is connected: the first op reads the embedding, each later one an earlier op.
    assert ops[0].inputs == ["embedding"]
    seen = {"embedding"}
    for r in ops:
        assert r.inputs and set(r.inputs) <= seen
        seen.add(r.name)
    # A cut after the first LayerNorm must carry both its output and the residual stream.
    assert ops[0].output_bytes == 2 * 2 * 32 * model.hidden_size * 4
    assert op_trace.granularity == "op"
    assert [r.name for r in op_trace.layers if not r.name.startswith("block.")] == ["embedding", "final_norm", "lm_head"]


def test_trace_file_roundtrip(tmp_path, op_trace):
    op_trace.save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json") == op_trace


def test_bad_options(model):
    with pytest.raises(ContractError, match=r"seq_len=64 must be in 1\.\.32"):
        profile_model(model, ProfileOptions(seq_len=64))
    with pytest.raises(ContractError, match="micro_batch_size=0 is too small"):
        profile_model(model, ProfileOptions(micro_batch_size=0))
    if not torch.cuda.is_available():
        with pytest.raises(ContractError, match="CUDA is not available"):
            profile_model(model, ProfileOptions(device="cuda"))


@pytest.mark.gpu
def test_cuda_profile(model):
    trace = profile_model(model, ProfileOptions(device="cuda", dtype="bf16", micro_batch_size=2, **FAST))
    assert trace.device != "cpu"
    blk = trace.layers[1]
    assert blk.forward_s > 0 and blk.backward_input_s > 0
    # Without dropout the bytes are the dtype's, except LayerNorm's statistics: fp32 on CUDA.
    assert blk.activation_bytes == block_activation_bytes(model, 2, 32, 2, None, stats_bytes=4)


def test_gqa_attention_flops_where_torch_has_no_gqa_formula(monkeypatch):
    """torch < 2.12's FLOP formula for the fused attention kernels asserts that K/V have as many heads
    as Q (seen on an H100 with torch 2.11 profiling llama3-8b); the profiler's counter then counts
    grouped-query attention with K/V broadcast to the query's heads, as the kernels compute it."""
    from mindpipe.traces import timing
    from torch.utils import flop_counter as fcm

    real_fwd, real_bwd = fcm.sdpa_flop_count, fcm.sdpa_backward_flop_count

    def no_gqa(real):
        def formula(*shapes):
            q, k = shapes[-3], shapes[-2]
            assert q[1] == k[1], "sdpa_flop_count: query/key/value shapes are incompatible"
            return real(*shapes)
        return formula

    monkeypatch.setattr(fcm, "sdpa_flop_count", no_gqa(real_fwd))
    monkeypatch.setattr(fcm, "sdpa_backward_flop_count", no_gqa(real_bwd))
    timing._attention_formulas.cache_clear()  # decided once per process: decide again against the patched torch
    try:
        formulas = timing._attention_formulas()
    finally:
        timing._attention_formulas.cache_clear()
    aten = torch.ops.aten
    q, kv, wide = (2, 8, 16, 4), (2, 2, 16, 4), (2, 8, 16, 4)
    assert formulas[aten._scaled_dot_product_flash_attention](q, kv, kv) == real_fwd(q, wide, wide) > 0
    assert formulas[aten._scaled_dot_product_efficient_attention_backward](q, q, kv, kv) == real_bwd(q, q, wide, wide)


def test_the_cpu_flash_kernel_counts_its_flops():
    """torch's counter has no formula for the CPU flash kernel and counted it as 0, so a
    ``profile --flash-attention`` trace on a CPU missed the attention core (s/(6h) of a block's FLOPs).
    Now it counts every query-key pair, as torch does for the GPU kernels: 4·b·h·s²·d forward,
    2.5 times that backward (the scores recomputed)."""
    from mindpipe.traces.timing import flop_counter

    b, h, s, d = 1, 4, 64, 16
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        with flop_counter() as fc:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert fc.get_total_flops() == 4 * b * h * s * s * d
        with flop_counter() as fc:
            out.sum().backward()
    assert fc.get_total_flops() == 10 * b * h * s * s * d
