"""``Plan.flash_attention`` in the executor: every rank and the single-process reference run the
fused attention core (:func:`mindpipe.traces.torch_models.use_flash_attention`).

Parity: a tiny Llama with grouped-query attention under pp2 (1F1B, a stage boundary inside a
block, per-block nongemm / selective / full recompute around it) and under tp2 (sequence
parallel, K/V heads split) reproduces the reference's losses within 1e-5. Memory: at a sequence
length where the a·s² scores dominate, the executor's live-tensor accounting (``ranks[].memory``
in measured.json, :mod:`mindpipe.executor.memory_account`) holds exactly the explicit core's
activations less the softmax outputs plus the kernel's per-row log-sum-exp, in process and in a
launched run. CPU ranks run ``_scaled_dot_product_flash_attention_for_cpu`` (no attention dropout
here); with dropout torch falls back to its math backend, which the pre-check notes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from mindpipe.executor.precheck import FLASH_DROPOUT_CPU_NOTICE, check_run
from mindpipe.executor.reference import reference_losses
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan

from .conftest import TINY, launched_trace, stage_saved_activations
from .test_exec_llama import LLAMA
from .test_exec_parity import assert_parity, reference

# Block 1 is cut after its attention (kept whole-block policies only on a cut block); the others
# recompute their fused core (selective), every non-GEMM op including it (nongemm), or all (full).
PP2 = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b", "precision": "fp32",
       "stage_cuts": ["after_attention"], "layer_memory_policy": ["nongemm", "keep", "selective", "recompute"],
       "flash_attention": True}
TP2 = {"tp": 2, "micro_batch_size": 2, "global_batch_size": 8, "sequence_parallel": True, "recompute": "selective",
       "precision": "fp32", "flash_attention": True}
# s = 256: per block the scores' 4·a·s²·b = 2 MiB against ~0.6 MiB for everything else.
LONG: dict[str, Any] = {**TINY, "num_layers": 2, "seq_len": 256, "name": "tiny2-s256"}
KEEP = {"micro_batch_size": 2, "global_batch_size": 4, "precision": "fp32"}


def _scores_less_lse(model: Model, micro_batch_size: int) -> int:
    """Bytes a fused core saves less than the explicit one, per block (fp32, no dropout)."""
    a, s, b = model.num_heads, model.seq_len, micro_batch_size
    return 4 * a * s * s * b - 4 * a * s * b


def test_the_reference_runs_the_plans_attention(monkeypatch):
    """The reference calls the fused kernel exactly when the plan asks for it; without dropout the
    two cores are the same function, so its losses agree."""
    calls = []
    fused_kernel = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(kwargs)
        return fused_kernel(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = Model(**LLAMA)
    explicit = reference_losses(model, Plan(**{**PP2, "flash_attention": False}), 2)
    assert not calls
    fused = reference_losses(model, Plan(**PP2), 2)
    assert len(calls) == 2 * 4 * model.num_layers  # steps × micro-batches × blocks (the reference recomputes nothing)
    assert all(c["is_causal"] and c["enable_gqa"] for c in calls)
    assert max(abs(a - b) / b for a, b in zip(fused, explicit, strict=True)) <= 1e-5


@pytest.mark.parametrize("policy", ["keep", "selective", "nongemm", "recompute"])
def test_a_stage_holds_less_with_flash_attention(policy):
    """The executor's accounting of one stage (the measured.json ``memory`` terms), in process."""
    model = Model(**LONG)
    peaks = []
    for flash in (False, True):
        plan = Plan(micro_batch_size=2, global_batch_size=2, precision="fp32", layer_memory_policy=[policy] * 2,
                    flash_attention=flash)
        held, memory = stage_saved_activations(model, plan)
        peaks.append((held, memory.peak.total))
    (held_e, peak_e), (held_f, peak_f) = peaks
    assert peak_f < peak_e, peaks
    if policy == "keep":  # every block keeps its core's tensors: exactly the scores less the statistics
        assert held_e - held_f == model.num_layers * _scores_less_lse(model, 2)


def test_flash_with_dropout_on_cpu_is_noted():
    model = Model(**{**TINY, "dropout": 0.1})
    notes = check_run(model, Plan(**{**KEEP, "flash_attention": True}), 1, "cpu", get_device("cpu")).notes
    assert FLASH_DROPOUT_CPU_NOTICE in notes
    assert FLASH_DROPOUT_CPU_NOTICE not in check_run(model, Plan(**KEEP), 1, "cpu", get_device("cpu")).notes
    assert FLASH_DROPOUT_CPU_NOTICE not in check_run(Model(**TINY), Plan(**{**KEEP, "flash_attention": True}), 1,
                                                     "cpu", get_device("cpu")).notes


def test_launched_flash_run_holds_less(tmp_path):
    """One rank, s = 256: the measured peak's activations drop by the scores less the log-sum-exp."""
    traces = []
    for name, plan in (("explicit", KEEP), ("flash", {**KEEP, "flash_attention": True})):
        (tmp_path / name).mkdir()
        traces.append(launched_trace(tmp_path / name, plan, LONG, steps=2))
    explicit, flash = (t.measurement.ranks[0].memory for t in traces)
    assert explicit is not None and flash is not None
    assert traces[1].measurement.plan.flash_attention and not traces[0].measurement.plan.flash_attention
    assert flash.peak_bytes < explicit.peak_bytes
    model = Model(**LONG)
    assert explicit.activations_bytes - flash.activations_bytes == model.num_layers * _scores_less_lse(model, 2), (
        explicit, flash)


@pytest.mark.slow
def test_llama_pp2_flash_parity(tmp_path):
    trace = launched_trace(tmp_path, PP2, LLAMA)
    assert trace.measurement.plan.flash_attention
    assert_parity(trace.measurement.losses, reference(PP2, LLAMA))


@pytest.mark.slow
def test_llama_tp2_gqa_flash_parity(tmp_path):
    trace = launched_trace(tmp_path, TP2, LLAMA)
    assert_parity(trace.measurement.losses, reference(TP2, LLAMA))
