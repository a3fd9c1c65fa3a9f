"""GpuComputeModel: the ComputeModel contract, the F/I/W split, host bound, devices, constants files."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from mindpipe.simulator.costs import DTYPE_BYTES, RooflineComputeModel
from mindpipe.simulator.ops import block_ops, fused_softmax_available
from mindpipe.simulator.perf import GpuComputeModel, NcclCommModel, default_models
from mindpipe.simulator.perf.constants import (
    GpuConstants,
    data_text,
    parse_constants,
    read_constants,
    shipped_constants,
)
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError

A100 = get_device("a100-sxm4-80gb")
H100 = get_device("h100-sxm5-80gb")
H200 = get_device("h200-sxm-141gb")
GPT13B = Model(kind="gpt", num_layers=4, hidden_size=5120, num_heads=40, seq_len=2048, vocab_size=51200)
SMALL = Model(kind="gpt", num_layers=2, hidden_size=256, num_heads=4, seq_len=128, vocab_size=1024)


def plan(**kw: object) -> Plan:
    base: dict[str, object] = {"micro_batch_size": 1, "global_batch_size": 64, "precision": "fp16"}
    base.update(kw)
    return Plan(**base)  # type: ignore[arg-type]


def test_layer_costs_keep_the_roofline_models_structure() -> None:
    p = plan(tp=2, sequence_parallel=True)
    ours = GpuComputeModel(A100).layer_costs(GPT13B, p)
    ref = RooflineComputeModel(A100).layer_costs(GPT13B, p)
    assert [c.name for c in ours] == [c.name for c in ref]
    for a, b in zip(ours, ref, strict=True):
        assert (a.kind, a.forward_comm, a.backward_comm, a.output_bytes, a.param_count) == (
            b.kind, b.forward_comm, b.backward_comm, b.output_bytes, b.param_count)
    blocks = [c for c in ours if c.kind == "block"]
    assert all(c.forward_s > 0 and c.backward_input_s > 0 and c.backward_weight_s > 0 for c in blocks)
    assert all(0 < c.recompute_selective_s < c.forward_s for c in blocks)
    head = ours[-1]
    assert head.kind == "lm_head" and head.backward_weight_s > 0 and head.output_bytes == 0


def test_forward_input_weight_split_sums_the_operators_of_each_phase() -> None:
    m = GpuComputeModel(A100, host_bound=False)
    ops = block_ops(GPT13B, 2, GPT13B.seq_len, 1, False, 2)
    times = m.phase_times(ops, "fp16")
    for phase, got in (("forward", times.forward_s), ("backward_input", times.backward_input_s),
                       ("backward_weight", times.backward_weight_s)):
        assert math.isclose(got, sum(m.op_s(o, "fp16") for o in ops if o.phase == phase), rel_tol=1e-12)
    # W holds only the weight-gradient GEMMs: QKV, projection, fc1, fc2 — about a third of the
    # backward GEMM work, so I > W.
    assert {o.name for o in ops if o.phase == "backward_weight"} == {"qkv_dw", "proj_dw", "mlp_fc1_dw", "mlp_fc2_dw"}
    assert times.backward_input_s > times.backward_weight_s


def test_host_issue_bounds_tiny_layers() -> None:
    m = GpuComputeModel(A100)
    ops = block_ops(SMALL, 1, SMALL.seq_len, 1, False, 2)
    t = m.phase_times(ops, "fp16")
    n_fwd = sum(1 for o in ops if o.phase == "forward")
    assert math.isclose(t.forward_s, n_fwd * m.c.host_overhead_per_kernel_s, rel_tol=1e-12)
    off = GpuComputeModel(A100, host_bound=False).phase_times(ops, "fp16")
    assert off.forward_s < t.forward_s


def test_time_grows_with_micro_batch_and_shrinks_with_tensor_parallelism() -> None:
    m = GpuComputeModel(A100)

    def block(p: Plan) -> float:
        c = next(c for c in m.layer_costs(GPT13B, p) if c.kind == "block")
        return c.forward_s + c.backward_input_s + c.backward_weight_s

    t1, t2, t4 = block(plan(micro_batch_size=1)), block(plan(micro_batch_size=2)), block(plan(micro_batch_size=4))
    assert t1 < t2 < t4
    assert 1.6 < t4 / t2 < 2.2  # near-linear in tokens at these sizes
    tp1, tp2, tp8 = block(plan(tp=1)), block(plan(tp=2)), block(plan(tp=8))
    assert tp1 > tp2 > tp8
    assert tp1 / tp8 < 8  # smaller GEMMs per rank run less efficiently


def test_flash_attention_beats_materialised_scores_at_long_sequences() -> None:
    long = dataclasses.replace(GPT13B, seq_len=8192)
    a = GpuComputeModel(A100).layer_costs(long, plan())[1]
    b = GpuComputeModel(A100).layer_costs(long, dataclasses.replace(plan(), flash_attention=True))[1]
    assert b.forward_s < a.forward_s and b.recompute_selective_s < a.recompute_selective_s


def test_h100_and_h200_scale_between_their_bandwidth_and_flops_ratios() -> None:
    big = Model(kind="gpt", num_layers=2, hidden_size=12288, num_heads=96, seq_len=2048, vocab_size=51200)
    p = plan(tp=8, micro_batch_size=2)

    def block(dev: object) -> float:
        c = GpuComputeModel(dev).layer_costs(big, p)[1]  # type: ignore[arg-type]
        return c.forward_s + c.backward_input_s + c.backward_weight_s

    a, h, h2 = block(A100), block(H100), block(H200)
    flops_ratio = H100.peak_flops("fp16") / A100.peak_flops("fp16")
    bw_ratio = H100.memory_bandwidth_GBps / A100.memory_bandwidth_GBps
    assert bw_ratio < a / h < flops_ratio
    assert 1.0 < h / h2 < H200.memory_bandwidth_GBps / H100.memory_bandwidth_GBps
    # Memory-bound ops scale exactly with bandwidth (same efficiency and overhead per kernel).
    op = next(o for o in block_ops(big, 2, 2048, 8, False, 2) if o.name == "softmax")
    ga, gh = GpuComputeModel(A100), GpuComputeModel(H100)
    oh = ga.c.kernel_overhead_s
    assert math.isclose((ga.op_s(op, "fp16") - oh) / (gh.op_s(op, "fp16") - oh), bw_ratio, rel_tol=1e-9)


def test_optimizer_step_is_memory_bound_over_its_bytes() -> None:
    m = GpuComputeModel(A100)
    eff = m.c.optimizer_bandwidth_efficiency
    assert eff is not None and eff != m.c.memory_bandwidth_efficiency  # the shipped A100 file fits its own share
    bw = A100.memory_bandwidth_GBps * 1e9 * eff
    t1, t2 = m.optimizer_step_s(10**9, plan()), m.optimizer_step_s(2 * 10**9, plan())
    assert math.isclose(t2 - t1, 10**9 * m.c.optimizer_bytes_per_param / bw, rel_tol=1e-9)
    # A constants file without that share streams the optimizer at the activation kernels' share.
    old = GpuComputeModel(A100, constants=dataclasses.replace(m.c, optimizer_bandwidth_efficiency=None))
    bw_old = A100.memory_bandwidth_GBps * 1e9 * m.c.memory_bandwidth_efficiency
    t1, t2 = old.optimizer_step_s(10**9, plan()), old.optimizer_step_s(2 * 10**9, plan())
    assert math.isclose(t2 - t1, 10**9 * m.c.optimizer_bytes_per_param / bw_old, rel_tol=1e-9)


def test_default_models_per_device_kind() -> None:
    comp, comm = default_models(A100)
    assert isinstance(comp, GpuComputeModel) and isinstance(comm, NcclCommModel)
    assert comp.sm_count == 108 and GpuComputeModel(H100).sm_count == 132
    cpu_comp, _ = default_models(get_device("cpu"))
    assert isinstance(cpu_comp, RooflineComputeModel)
    with pytest.raises(ContractError, match="needs a GPU"):
        GpuComputeModel(get_device("cpu"))


def test_shipped_constants_carry_provenance() -> None:
    for name in ("a100.json", "nccl_a100.json"):
        cf = shipped_constants(name)
        assert "-m simulator.perf.fit --data ../shared/data --write" in cf.regenerate
        for key, rec in cf.records.items():
            assert rec.unit and rec.source, key
            if rec.method == "fit":
                assert rec.fit_files and rec.holdout_files and rec.holdout_mape_percent is not None, key
                assert not set(rec.fit_files) & set(rec.holdout_files), key
    assert shipped_constants("a100.json").records["gemm_efficiency_ceiling"].method == "fit"
    # Refitted end to end on vTrain's single-node fit half (simulator/perf/refit.py).
    assert "-m simulator.perf.refit" in shipped_constants("a100.json").regenerate
    c = GpuConstants.from_file(shipped_constants("a100.json"))
    assert 0.5 < c.gemm_ceiling <= 1.0 and c.tiles


def test_bad_constants_files_name_the_key(tmp_path: Path) -> None:
    doc = json.loads(json.dumps({"format_version": 1, "family": "x", "constants": {
        "gemm_efficiency_ceiling": {"value": 0.9, "unit": "fraction", "method": "fit", "source": "s"}}}))
    with pytest.raises(ContractError, match=r"gemm_efficiency_ceiling\.fit_files"):
        parse_constants(doc, "x.json")
    doc["constants"]["gemm_efficiency_ceiling"]["method"] = "guess"
    with pytest.raises(ContractError, match="method"):
        parse_constants(doc, "x.json")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format_version": 1, "constants": {"a": {"value": 1, "unit": "u", "method": "prior",
                                                                          "source": "s", "colour": "red"}}}))
    with pytest.raises(ContractError, match=r"c\.json: constants\.a\.colour"):
        read_constants(path)
    partial = {"format_version": 1, "constants": {
        "gemm_tiles": {"value": [[128, 128, 1.0]], "unit": "u", "method": "prior", "source": "s"}}}
    with pytest.raises(ContractError, match=r"partial\.json: constants\.gemm_efficiency_ceiling: missing constant"):
        GpuConstants.from_file(parse_constants(partial, "partial.json"))


def test_dtype_bytes_follow_the_plan_precision() -> None:
    m = GpuComputeModel(A100)
    f16 = m.layer_costs(SMALL, plan(micro_batch_size=64))[1].forward_s
    f32 = m.layer_costs(SMALL, plan(micro_batch_size=64, precision="fp32"))[1].forward_s
    assert f32 > f16 and DTYPE_BYTES["fp32"] == 4


def test_sustained_matmul_rate_is_a_prior_and_optional() -> None:
    # The shipped A100 file bounds every GEMM by the A100's maximum achievable matmul FLOP/s.
    cf = shipped_constants("a100.json")
    rec = cf.records["gemm_sustained_fraction"]
    assert rec.method == "prior" and "267.9" in rec.source
    c = GpuConstants.from_file(cf)
    assert c.gemm_sustained_fraction == pytest.approx(0.859)
    assert GpuComputeModel(A100).kernel_params("fp16").sustained_fraction == pytest.approx(0.859)
    # A user's file written before the bound existed still loads, unbounded.
    doc = json.loads(data_text("a100.json"))
    del doc["constants"]["gemm_sustained_fraction"]
    assert GpuConstants.from_file(parse_constants(doc, "old.json")).gemm_sustained_fraction == 1.0
    doc["constants"]["gemm_sustained_fraction"] = {"value": 1.2, "unit": "u", "method": "prior", "source": "s"}
    with pytest.raises(ContractError, match="gemm_sustained_fraction"):
        GpuConstants.from_file(parse_constants(doc, "bad.json"))


def test_megatron_falls_back_to_unfused_softmax_when_the_kernel_cannot_run() -> None:
    """Megatron's fused causal softmax needs b·(local heads) % 4 == 0 (and 16 < s ≤ 4096): 16 heads at
    tp 8 and micro-batch 1 leave 2 attention batches, so it runs five fp32 PyTorch kernels per
    direction instead of one, and the layer gets slower; micro-batch 2 (4 batches) is fused again."""
    assert not fused_softmax_available(1, 2, 1024, 1024)
    assert fused_softmax_available(2, 2, 1024, 1024)
    assert not fused_softmax_available(4, 4, 8192, 8192)  # past the kernel's key length
    assert fused_softmax_available(2, 4, 128, 128) and not fused_softmax_available(1, 4, 128, 128)  # 8 per CTA
    gpt = Model(kind="gpt", num_layers=2, hidden_size=2048, num_heads=16, seq_len=1024, vocab_size=51200)
    names = [o.name for o in block_ops(gpt, 1, 1024, 8, False, 2) if o.phase == "forward" and o.name.startswith("softmax")]
    assert names == ["softmax_cast", "softmax_scale", "softmax_mask", "softmax", "softmax_cast_back"]
    assert [o.name for o in block_ops(gpt, 2, 1024, 8, False, 2) if o.name.startswith("softmax")] == ["softmax"] * 2
    # fp32 scores never take the fused kernel's path and keep their single-kernel pricing.
    assert [o.name for o in block_ops(gpt, 1, 1024, 8, False, 4) if o.name.startswith("softmax")] == ["softmax"] * 2
    m = GpuComputeModel(A100)

    def per_sequence_s(b: int) -> float:
        return sum(m.op_s(o, "fp16") for o in block_ops(gpt, b, 1024, 8, False, 2) if o.attention_core) / b

    assert per_sequence_s(1) > 1.5 * per_sequence_s(2)
