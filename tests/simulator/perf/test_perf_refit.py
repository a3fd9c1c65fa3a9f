"""End-to-end refit helper (phase 2): recovers known constants, writes provenance."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.perf import GpuComputeModel
from mindpipe.simulator.perf.constants import GpuConstants, parse_constants, shipped_constants
from mindpipe.simulator.perf.refit import fit_compute_constants, refit_document
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan

A100 = get_device("a100-sxm4-80gb")
ROWS = [(Model(kind="gpt", num_layers=2, hidden_size=h, num_heads=16, seq_len=1024, vocab_size=50304), b)
        for h in (512, 1024, 2048) for b in (1, 2, 8)]


def iteration_like(c: GpuConstants, row: tuple[Model, int]) -> float:
    model, b = row
    plan = Plan(micro_batch_size=b, global_batch_size=b, precision="fp16")
    layers = GpuComputeModel(A100, c).layer_costs(model, plan)
    return sum(x.forward_s + x.backward_input_s + x.backward_weight_s for x in layers)


def test_fit_recovers_the_constants_that_generated_the_data() -> None:
    truth = dataclasses.replace(GpuConstants.from_file(shipped_constants("a100.json")), gemm_ceiling=0.72,
                                host_overhead_per_kernel_s=4e-6)
    measured = {id(r): iteration_like(truth, r) for r in ROWS}
    fields = ("gemm_ceiling", "host_overhead_per_kernel_s")
    fitted, mape = fit_compute_constants(ROWS, iteration_like, lambda r: measured[id(r)], fields)
    assert fitted.gemm_ceiling == pytest.approx(0.72, rel=0.02)
    assert mape < 1.0
    doc = refit_document(fitted, fields, ["fit.csv"], ["holdout.csv"], 3.2, "least squares on log ratio")
    rec = parse_constants(doc, "a100.json").records["gemm_efficiency_ceiling"]
    assert rec.method == "fit" and rec.fit_files == ["fit.csv"] and rec.holdout_mape_percent == 3.2
    assert rec.value == pytest.approx(fitted.gemm_ceiling, rel=1e-5)
