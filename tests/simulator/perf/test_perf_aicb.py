"""Compute model vs AICB's A100 per-layer timings: block grouping, error bounds, impossible files."""

from __future__ import annotations

from pathlib import Path

import pytest
from mindpipe.simulator.perf import GpuComputeModel
from mindpipe.simulator.perf.aicb import AICB_CASES, BlockComparison, compare_dir, measured_blocks
from mindpipe.simulator.perf.fit import compute_report
from mindpipe.traces.catalog import get_device

A100 = get_device("a100-sxm4-80gb")
G175 = "G175B-M1-C03_GPT175B_megatron_tp8_pp1_mbs1_A100.txt"
L65 = "L65B-M1-C05_Llama65B_megatron_tp8_pp1_mbs1_A100.txt"
L7 = "L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt"
G13_SP = "G13B-M1-C02_GPT13B_megatron_tp8_pp1_mbs1_sp_A100.txt"


@pytest.fixture(scope="module")
def comparisons(shared_data: Path) -> dict[str, BlockComparison]:
    model = GpuComputeModel(A100)  # compare_dir prices FlashAttention, as AICB measured
    return {c.file: c for c in compare_dir(shared_data / "traces" / "aicb_a100", model)}


def test_blocks_group_two_or_four_rows(shared_data: Path) -> None:
    d = shared_data / "traces" / "aicb_a100"
    fwd, bwd = measured_blocks(d / G175)  # attention_norm 2571 µs + mlp_norm 1584 µs
    assert fwd == pytest.approx(4155e-6) and bwd == pytest.approx(2 * (2454e-6 + 2081e-6))
    fwd_sp, _ = measured_blocks(d / G13_SP)  # column + row rows of attention and MLP
    assert fwd_sp == pytest.approx((375 + 376 + 923 + 1125) * 1e-6)


def test_every_comparable_file_is_compared(comparisons: dict[str, BlockComparison]) -> None:
    assert set(comparisons) == set(AICB_CASES)


def test_gpt175b_forward_within_5_and_backward_within_15_percent(
        comparisons: dict[str, BlockComparison]) -> None:
    # The GEMM ceiling is now fitted end to end on vTrain's single-node fit half
    # (simulator/perf/refit.py); AICB's GPT-175B block is a hold-out check of it.
    c = comparisons[G175]
    assert abs(c.forward_error) < 0.05
    assert abs(c.backward_error) < 0.15


def test_llama65b_flop_equivalent_block_within_35_percent(comparisons: dict[str, BlockComparison]) -> None:
    c = comparisons[L65]
    assert abs(c.forward_error) < 0.35 and abs(c.backward_error) < 0.35


def test_llama7b_file_claims_more_than_the_a100_peak(comparisons: dict[str, BlockComparison]) -> None:
    # 449 GFLOP per block forward in 1.03 ms is ~437 TFLOP/s > 312: not an A100 fp16 measurement of
    # this shape, hence excluded from the hold-out (and our prediction is, correctly, slower).
    c = comparisons[L7]
    assert c.measured_tflops > A100.peak_flops("bf16") / 1e12
    assert c.predicted_forward_s > c.measured_forward_s


def test_predictions_never_beat_the_peak(comparisons: dict[str, BlockComparison]) -> None:
    for c in comparisons.values():
        assert c.flops_forward / c.predicted_forward_s < A100.peak_flops("bf16"), c.file


def test_compute_fit_report_excludes_impossible_files(shared_data: Path) -> None:
    rep = compute_report(shared_data)
    assert rep["excluded_files"] == [L7]
    assert 0.8 < rep["gemm_efficiency_ceiling"] < 1.0
    assert G175 in rep["holdout_files"] and len(rep["holdout_files"]) == 4
