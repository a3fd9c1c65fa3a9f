"""Llama FLOPs, parameters per layer and activation memory against closed forms and the torch block."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest
from mindpipe.simulator.block_parts import part_params, split_ops
from mindpipe.simulator.costs import layer_params
from mindpipe.simulator.memory import activation_bytes_per_layer
from mindpipe.simulator.ops import block_ops
from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.flops import forward_flops_per_token, model_flops_per_iteration

TINY = Model(kind="llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=192,
             seq_len=32, vocab_size=100)


def _block_forward_flops(model: Model, b: int, s: int, t: int) -> float:
    return sum(o.flops for o in block_ops(model, b, s, t, dtype_bytes=2, flash_attention=False) if o.phase == "forward")


# Only the tensor-parallel degrees each model's query and key/value heads allow (check_plan refuses the rest).
_TP_CASES = [(name, t) for name in ("llama-tiny", "llama3-8b", "llama3-70b", "gpt-1.3b") for t in (1, 2, 8)
             if not (load_model(name).num_heads % t or load_model(name).kv_heads % t)]


@pytest.mark.parametrize(("name", "t"), _TP_CASES)
def test_op_list_and_model_flops_agree(name, t):
    """One count: the simulator's operator list (all TP ranks) = the MFU numerator's per-layer term."""
    m = load_model(name)
    b, s = 2, 256
    per_layer = (forward_flops_per_token(m, s) - 2 * m.hidden_size * m.vocab_size) / m.num_layers
    assert _block_forward_flops(m, b, s, t) * t == pytest.approx(per_layer * b * s, rel=1e-12)
    # Backward: input and weight gradients each cost the forward's GEMM FLOPs.
    ops = block_ops(m, b, s, t)
    bwd = sum(o.flops for o in ops if o.phase != "forward")
    assert bwd == pytest.approx(2 * _block_forward_flops(m, b, s, t), rel=1e-12)


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "llama3.1-405b"])
def test_matches_megatron_num_floating_point_operations(name):
    """Megatron-LM ``num_floating_point_operations`` (SwiGLU, GQA, no MoE):
    12·B·s·L·h²·(1 + (f/h)·(3/2) + kv/a + s/h + V/(2·L·h))."""
    m = load_model(name)
    B, s, L, h, f, V = 16, m.seq_len, m.num_layers, m.hidden_size, m.ffn, m.vocab_size
    megatron = 12 * B * s * L * h * h * (1 + f / h * 1.5 + m.kv_heads / m.num_heads + s / h + V / (2 * L * h))
    assert model_flops_per_iteration(m, B) == pytest.approx(megatron, rel=1e-12)


def test_gpt_flops_still_narayanan():
    m = load_model("gpt3-175b")
    B, s, L, h, V = 8, m.seq_len, m.num_layers, m.hidden_size, m.vocab_size
    assert model_flops_per_iteration(m, B) == pytest.approx(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)))


def test_gqa_shrinks_k_and_v_gemms_and_rope_is_elementwise():
    ops = {o.name: o for o in block_ops(TINY, 1, 32, 2, fused_elementwise=True) if o.phase == "forward"}
    assert ops["q"].gemm_mnk == (32, 32, 64) and ops["k"].gemm_mnk == (32, 16, 64) and ops["v"].gemm_mnk == (32, 16, 64)
    assert ops["rope"].kind == "memory" and ops["rope"].flops == 0
    assert {"mlp_gate", "mlp_up", "mlp_down", "swiglu"} <= set(ops) and "gelu" not in ops
    for fused in (True, False):
        attention, mlp = split_ops(block_ops(TINY, 1, 32, 2, fused_elementwise=fused))
        assert attention[-1].name == "residual1" and mlp[0].name.startswith("ln2")


def _bytes(ops, prefix, phase):
    return sum(o.bytes for o in ops if o.name.split(".")[0] == prefix and o.phase == phase)


@pytest.mark.parametrize("d", [2, 4])
def test_eager_elementwise_counts_the_executors_kernels(d):
    """Eager (the executor's PyTorch code, the default) against one fused kernel per operator: bytes
    per element of each norm, rotary and SwiGLU pass, kernel by kernel (ops.rms_norm_ops' docstring),
    and the same GEMMs."""
    b, s, t = 2, 32, 2
    eager, fused = block_ops(TINY, b, s, t, dtype_bytes=d), block_ops(TINY, b, s, t, dtype_bytes=d, fused_elementwise=True)
    n_h = b * s * 64  # elements of one RMSNorm (no sequence parallelism)
    norm_fwd, norm_bwd = (36, 100) if d == 2 else (28, 76)  # fp32: the casts are no kernels
    assert _bytes(eager, "ln1", "forward") == pytest.approx(n_h * norm_fwd + 2 * b * s * 8)  # + eps, rsqrt per token
    assert _bytes(eager, "ln1", "backward_input") == pytest.approx(n_h * norm_bwd)
    assert _bytes(fused, "ln1", "forward") == n_h * 2 * d and _bytes(fused, "ln1", "backward_input") == n_h * 4 * d
    n_q, n_k = b * s * 64 // t, b * s * 32 // t
    assert _bytes(eager, "rope_q", "forward") + _bytes(eager, "rope_k", "forward") == (n_q + n_k) * 8 * d
    assert _bytes(eager, "rope_q", "backward_input") + _bytes(eager, "rope_k", "backward_input") == (n_q + n_k) * 10 * d
    assert _bytes(fused, "rope", "forward") == (n_q + n_k) * 3 * d
    n_f = b * s * 192 // t
    assert _bytes(eager, "swiglu", "forward") == n_f * 5 * d and _bytes(eager, "swiglu", "backward_input") == n_f * 9 * d
    assert _bytes(fused, "swiglu", "forward") == n_f * 3 * d
    # One Op per kernel: 16-bit eager runs 6 + 2 per-token kernels per norm forward, 13 backward.
    assert sum(o.name.startswith("ln1.") and o.phase == "forward" for o in eager) == (8 if d == 2 else 6)
    assert sum(o.name.startswith("ln1.") and o.phase == "backward_input" for o in eager) == (13 if d == 2 else 9)
    gemms = [(o.name, o.phase, o.gemm_mnk) for o in eager if o.kind != "memory"]
    assert gemms == [(o.name, o.phase, o.gemm_mnk) for o in fused if o.kind != "memory"]


def test_fused_elementwise_only_moves_llama_time():
    """The plan key prices a Llama block's element-wise kernels (less time fused) and leaves GPT's alone."""
    from mindpipe.simulator.api import simulate
    from mindpipe.traces.config import Cluster

    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=8)
    for name, moves in (("llama3-8b", True), ("gpt-1.3b", False)):
        model = load_model(name)
        plan = Plan(dp=8, zero_stage=1, micro_batch_size=1, global_batch_size=8, flash_attention=True)
        eager = simulate(model, cluster, plan).iteration_time_s
        fused = simulate(model, cluster, dataclasses.replace(plan, fused_elementwise=True)).iteration_time_s
        assert (fused < 0.97 * eager) if moves else fused == eager


@pytest.mark.parametrize("t", [1, 2])
def test_layer_params_cover_the_model(t):
    rows = layer_params(TINY, t)
    h, v = 64, 100
    if t == 1:
        assert sum(n for _, _, n in rows) == TINY.param_count()
    parts = part_params(TINY, t)
    assert parts["attention"] == h + (2 * h * h + 2 * h * 32) // t
    assert parts["mlp"] == h + 3 * h * 192 // t
    assert rows[0][2] == -(-v // t) * h and rows[-2][2] == h and rows[-1][2] == -(-v // t) * h


def test_activation_bytes_closed_forms():
    """s·b·h·d·(6 + 2r + 4f/h) + d·a·s²·b, divided and dropped as Korthikanti's GPT terms."""
    m = load_model("llama3-70b")
    s, b, h, a, f = m.seq_len, 1, m.hidden_size, m.num_heads, m.ffn
    r = Fraction(m.kv_heads, a)
    sbh = s * b * h
    d = 2
    base = Plan(micro_batch_size=b, global_batch_size=b)
    assert activation_bytes_per_layer(m, base) == sbh * d * (6 + 2 * r + 4 * Fraction(f, h)) + d * a * s * s * b
    for t in (2, 8):
        tp = Plan(tp=t, micro_batch_size=b, global_batch_size=b)
        split = sbh * d * (2 + 2 * r + 4 * Fraction(f, h))
        assert activation_bytes_per_layer(m, tp) == pytest.approx(float(4 * d * sbh + split / t + d * a * s * s * b / t))
        sp = Plan(tp=t, sequence_parallel=True, micro_batch_size=b, global_batch_size=b)
        assert activation_bytes_per_layer(m, sp) == pytest.approx(activation_bytes_per_layer(m, base) / t)
        sel = Plan(tp=t, sequence_parallel=True, recompute="selective", micro_batch_size=b, global_batch_size=b)
        assert activation_bytes_per_layer(m, sel) == pytest.approx(float(sbh * d * (6 + 2 * r + 4 * Fraction(f, h)) / t))
        full = Plan(tp=t, sequence_parallel=True, recompute="full", micro_batch_size=b, global_batch_size=b)
        assert activation_bytes_per_layer(m, full) == d * sbh / t
    # The attention and MLP parts of a cut block sum to the whole.
    whole = activation_bytes_per_layer(m, base)
    assert activation_bytes_per_layer(m, base, part="attention") + activation_bytes_per_layer(m, base, part="mlp") == whole


@pytest.mark.parametrize("dtype,d", [("fp32", 4), ("bf16", 2)])
def test_relation_measured_on_the_torch_block(dtype, d):
    """What autograd really saves for one tiny Llama block = ours + the two RMSNorms' fp32 rstd."""
    torch = pytest.importorskip("torch")
    from mindpipe.traces.timing import saved_activation_bytes
    from mindpipe.traces.torch_llama import block_activation_bytes, build_llama

    for kv in (1, 2, 4):
        m = Model(kind="llama", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=kv, ffn_hidden_size=96,
                  seq_len=16, vocab_size=50)
        net = build_llama(m, dtype=dtype).train()
        x = torch.randn(3, 16, 64, dtype=net.lm_head.out.weight.dtype, requires_grad=True)
        measured, _ = saved_activation_bytes(lambda net=net, x=x: net.blocks["0"](x),
                                             list(net.parameters()) + list(net.buffers()))
        plan = Plan(micro_batch_size=3, global_batch_size=3, precision=dtype)
        assert measured == block_activation_bytes(m, 3, 16, d)
        assert measured == activation_bytes_per_layer(m, plan) + 2 * 4 * 16 * 3


def test_eager_kernels_inside_one_autograd_function_are_inner():
    """The eager RMSNorm and rotary embedding run each direction's kernels inside one autograd function
    (traces/torch_llama.py): only the first is an operator with host overhead of its own; SwiGLU's
    silu and product are autograd operators each; the fused kernels are operators."""
    from mindpipe.simulator.ops import rms_norm_ops, rope_ops, swiglu_ops

    for ops in (rms_norm_ops("ln1", 8, 64, 2, False), rope_ops(512, 256, 2, False)):
        for phase in ("forward", "backward_input"):
            mine = [o for o in ops if o.phase == phase]
            assert not mine[0].inner and all(o.inner for o in mine[1:])
    assert not any(o.inner for o in swiglu_ops(512, 2, False))
    assert not any(o.inner for o in block_ops(TINY, 1, 32, 2, fused_elementwise=True))


def test_calibrated_cpu_model_charges_no_operator_overhead_to_inner_kernels():
    from mindpipe.simulator.calibrate.models import CalibratedComputeModel
    from mindpipe.simulator.ops import Op
    from mindpipe.traces.calibration import ComputeCalibration
    from mindpipe.traces.catalog import get_device

    cal = ComputeCalibration(scale={"memory": 2.0}, op_overhead_s=1e-4)
    model = CalibratedComputeModel(get_device("cpu"), {"fp32": cal}, fallback=None)  # type: ignore[arg-type]
    op = Op("x", "forward", "memory", 0.0, 1e6)
    outer, inner = model.op_s(op, cal, "fp32"), model.op_s(dataclasses.replace(op, inner=True), cal, "fp32")
    assert outer == pytest.approx(inner + 1e-4) and inner > 0
