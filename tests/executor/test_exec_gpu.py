"""The CUDA + NCCL path of the executor (skipped on machines without a GPU)."""

from __future__ import annotations

import pytest
from mindpipe.traces.trace import Trace

from .conftest import STEPS, assert_layer_times, run_plan


@pytest.mark.gpu
def test_single_gpu_run_uses_cuda_nccl_and_allocator_memory(tmp_path):
    plan = {"micro_batch_size": 2, "global_batch_size": 8, "precision": "bf16"}
    res = run_plan(tmp_path, plan, 1, "--device", "cuda")
    assert res.returncode == 0, res.stderr[-4000:]
    m = Trace.load(tmp_path / "measured.json").measurement
    assert m is not None and m.device_kind == "cuda" and m.backend == "nccl"
    assert len(m.losses) == STEPS and all(loss > 0 for loss in m.losses)
    assert all(r.memory_source == "cuda_allocator" and r.peak_memory_bytes > 0 for r in m.ranks)
    # NVML energy counters where pynvml is installed; otherwise the run says it estimated.
    assert m.energy_source in ("nvml", "estimated") and m.energy_j_per_iteration > 0
    assert_layer_times(Trace.load(tmp_path / "measured.json"))  # CUDA events at the layer marks
