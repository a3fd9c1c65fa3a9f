"""``stage_clocks_mhz`` in the executor: a one-line notice on CPU and the run proceeds; NVML on GPUs.
``action_clocks_mhz`` (per-action clocks) is a what-if knob the executor labels and does not carry out."""

from __future__ import annotations

import json

import pytest
import torch
from mindpipe.executor.clocks import CPU_NOTICE, lock_stage_clock
from mindpipe.traces.config import Plan

from .conftest import run_plan


def test_cpu_run_with_stage_clocks_says_so_and_proceeds(tmp_path) -> None:
    plan = {"dp": 1, "tp": 1, "pp": 2, "micro_batch_size": 1, "global_batch_size": 4, "schedule": "1f1b",
            "stage_clocks_mhz": [1095, 1410]}
    p = run_plan(tmp_path, plan, 2, steps=3)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count(CPU_NOTICE) == 1  # printed once, by the launcher
    measured = json.loads((tmp_path / "measured.json").read_text())["measurement"]
    assert "stage_clocks_mhz skipped on CPU" in measured["energy_notes"]
    assert measured["plan"]["stage_clocks_mhz"] == [1095, 1410]


def test_rank_clock_follows_the_stage_to_rank_rule() -> None:
    plan = Plan(pp=2, global_batch_size=4, schedule="interleaved_1f1b", virtual_stages=2,
                stage_clocks_mhz=[1095, 1410, 1095, 1410])
    clock = lock_stage_clock(plan, torch.device("cpu"), 1, verbose=False)
    assert (clock.mhz, clock.status) == (1410, "skipped_cpu")
    assert lock_stage_clock(Plan(), torch.device("cpu"), 0).status == "none"


@pytest.mark.gpu
def test_gpu_lock_is_applied_or_reported() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    plan = Plan(pp=1, global_batch_size=1, stage_clocks_mhz=[1095])
    clock = lock_stage_clock(plan, torch.device("cuda", 0), 0, verbose=False)
    try:
        assert clock.status in ("locked", "failed")
        if clock.status == "locked":
            import pynvml

            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) <= 1095
    finally:
        clock.release()


def test_cpu_run_with_action_clocks_runs_default_clocks_and_labels_the_what_if_knob(tmp_path) -> None:
    """Per-action clocks are a what-if knob: the executor says so in one line and records what ran."""
    plan = {"dp": 1, "tp": 1, "pp": 2, "micro_batch_size": 1, "global_batch_size": 4, "schedule": "1f1b",
            "action_clocks_mhz": [[[1410] * 4, [1095] * 4], [[1410] * 4, [1410] * 4]]}
    p = run_plan(tmp_path, plan, 2, steps=3)
    assert p.returncode == 0, p.stderr
    notes = [line for line in p.stderr.splitlines() if "action_clocks_mhz" in line]
    assert len(notes) == 1 and "[16 per-action clocks]" in notes[0] and "default clocks" in notes[0]
    measured = json.loads((tmp_path / "measured.json").read_text())["measurement"]
    assert measured["plan"]["action_clocks_mhz"] is None
