"""Plan precision ``fp8``: the device rule, the kernel model's FP8 GEMMs and the FP8 memory terms."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.api import simulate
from mindpipe.simulator.costs import DTYPE_BYTES
from mindpipe.simulator.memory import activation_bytes_per_layer, model_state_bytes
from mindpipe.simulator.ops import block_ops, lm_head_ops
from mindpipe.simulator.perf.fp8 import Fp8Constants, cast_bytes, is_fp8_gemm, shipped_fp8_constants
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan, check_plan
from mindpipe.traces.errors import ContractError

H100 = get_device("h100-sxm5-80gb")
GPT = Model(kind="gpt", num_layers=4, hidden_size=4096, num_heads=32, seq_len=2048, vocab_size=51200)


@pytest.mark.parametrize("cluster", ["a100-sxm4-80gb:1x8", "cpu:1x8"])
def test_fp8_refused_on_devices_without_fp8(cluster: str) -> None:
    plan = Plan(dp=8, global_batch_size=8, precision="fp8")
    with pytest.raises(ContractError, match=r"^plan: precision 'fp8' needs FP8 tensor cores"):
        check_plan(plan, GPT, load_cluster(cluster))
    with pytest.raises(ContractError, match="needs FP8 tensor cores"):
        simulate(GPT, load_cluster(cluster), plan)


def test_fp8_runs_on_h100_and_is_faster_than_bf16() -> None:
    model, cluster = load_model("llama3-8b"), load_cluster("h100-sxm5-80gb:1x8")
    bf16 = Plan(dp=8, global_batch_size=64, precision="bf16")
    check_plan(dataclasses.replace(bf16, precision="fp8"), model, cluster)
    t16 = simulate(model, cluster, bf16).iteration_time_s
    t8 = simulate(model, cluster, dataclasses.replace(bf16, precision="fp8")).iteration_time_s
    # FP8 GEMMs at twice the peak, at ~0.64 of bf16's efficiency, plus casts: faster, far from 2x.
    assert 0.5 * t16 < t8 < t16


def test_fp8_gemms_are_the_block_linears_only() -> None:
    ops = block_ops(GPT, 1, 2048, 1, False, 2, flash_attention=True)
    assert {o.name for o in ops if is_fp8_gemm(o)} == {"qkv", "qkv_dw", "proj", "proj_dw", "mlp_fc1", "mlp_fc1_dw",
                                                       "mlp_fc2", "mlp_fc2_dw"}
    assert not any(is_fp8_gemm(o) for o in lm_head_ops(GPT, 1, 2048, 1, 2))


def test_cast_bytes_read_bf16_and_write_fp8_copy_and_transpose() -> None:
    fwd, dx, dw = [o for o in block_ops(GPT, 1, 2048, 1, False, 2) if o.name.startswith("mlp_fc1")]
    assert cast_bytes(fwd) == 4.0 * 2048 * 4096  # X[M=2048, K=4096]: 2 B read + 1 + 1 B written
    assert cast_bytes(dx) == 4.0 * 2048 * 16384  # dY[M=2048, N=16384]
    assert cast_bytes(dw) == 0.0


def test_fp8_prices_gemms_at_fp8_peak_and_everything_else_as_bf16() -> None:
    gpu = GpuComputeModel(H100, fp8=Fp8Constants(1.0), host_bound=False)
    ops = block_ops(GPT, 4, 2048, 1, False, 2, flash_attention=True)
    fc1 = next(o for o in ops if o.name == "mlp_fc1")
    # At efficiency 1 a large FP8 GEMM takes half the bf16 time, plus its cast (memory-bound).
    p16 = gpu.kernel_params("bf16")
    cast_s = cast_bytes(fc1) / p16.bandwidth_Bps + p16.kernel_overhead_s
    gemm16 = gpu.op_s(fc1, "bf16") - p16.kernel_overhead_s
    assert gpu.op_s(fc1, "fp8") - cast_s - p16.kernel_overhead_s == pytest.approx(gemm16 / 2, rel=0.02)
    for o in ops:
        if not is_fp8_gemm(o):
            assert gpu.op_s(o, "fp8") == gpu.op_s(o, "bf16"), o.name


def test_shipped_fp8_constant_is_a_fraction() -> None:
    c = shipped_fp8_constants()
    assert 0.3 <= c.gemm_efficiency <= 1.0
    with pytest.raises(ContractError, match="must be in"):
        Fp8Constants(1.5)


def test_fp8_memory_keeps_gemm_inputs_in_fp8_and_caches_fp8_weights() -> None:
    s, b, h, a = 2048, 1, 4096, 32
    bf16 = Plan(precision="bf16")
    fp8 = Plan(precision="fp8")
    # No dropout: a bf16 GPT layer keeps 32·sbh + 2·a·s²·b (Korthikanti's 34 less the two masks, 5 → 2 per a·s²·b).
    assert activation_bytes_per_layer(GPT, bf16) == 32 * s * b * h + 2 * a * s * s * b
    # fp8: the four GEMM inputs (QKV 1, proj 1, fc1 1, fc2 4 per sbh) drop from 2 bytes to 1: 32 − 7 = 25.
    assert activation_bytes_per_layer(GPT, fp8) == 25 * s * b * h + 2 * a * s * s * b
    # Full recompute keeps the bf16 layer input either way.
    full = dataclasses.replace(fp8, recompute="full")
    assert activation_bytes_per_layer(GPT, full) == DTYPE_BYTES["fp8"] * s * b * h
    # bf16 weights + FP8 copy and transpose (2 B), fp32 main grads, Adam states as bf16 mixed precision.
    assert model_state_bytes(1e9, fp8) == (4e9, 4e9, 12e9)
    assert model_state_bytes(1e9, bf16) == (2e9, 4e9, 12e9)
