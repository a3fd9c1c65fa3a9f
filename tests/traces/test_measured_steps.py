"""One rule for a measured run's iteration time: the median of its clean steps (not warm-up, not
profiled), read by ``mindpipe run``'s headline, tokens/s and MFU, and by calibration."""

from __future__ import annotations

import pytest
from mindpipe.traces.config import Plan
from mindpipe.traces.measured import CommEvent, Measurement, StepRecord, typical_iteration_s


def _measurement(times: list[float], warmup: int, profiled: list[int]) -> Measurement:
    steps = [StepRecord(i + 1, 5.0, t, 1.0) for i, t in enumerate(times)]
    comms = [CommEvent(0, s, "collective", "dp", "allreduce", 0.0, 0.01, 1024, 2) for s in profiled]
    comms.append(CommEvent(0, 2, "dp_sync", "dp", "allreduce", 0.0, 0.01, 1024, 2))  # not a profiler record
    return Measurement(plan=Plan(dp=2, global_batch_size=8), world_size=2, nodes=1, backend="gloo", device_kind="cpu",
                       device_name="cpu", threads_per_rank=1, torch_version="2.13.0", schedule_source="torch",
                       seed=0, data="synthetic", warmup_steps=warmup, steps=steps, tokens_per_s=1.0,
                       model_flops_per_iteration=1.0, peak_flops_per_s=1.0, devices_for_mfu=1, mfu=0.0,
                       energy_j_per_iteration=0.0, energy_source="estimated", comms=comms)


def test_median_of_the_steps_neither_warm_up_nor_profiled() -> None:
    m = _measurement([9.0, 1.0, 1.2, 3.0, 1.1], warmup=1, profiled=[4])
    assert m.profiled_steps == {4}
    assert [s.step for s in m.clean_steps] == [2, 3, 5]
    assert m.iteration_s == pytest.approx(1.1)  # the mean of the measured steps would be 1.575
    assert typical_iteration_s(m.steps, m.warmup_steps, m.comms) == m.iteration_s


def test_a_stall_moves_the_mean_not_the_headline() -> None:
    assert _measurement([1.0, 1.0, 1.0, 7.0], warmup=0, profiled=[]).iteration_s == pytest.approx(1.0)


def test_every_step_profiled_falls_back_to_the_measured_ones() -> None:
    m = _measurement([9.0, 2.0, 4.0], warmup=1, profiled=[2, 3])
    assert [s.step for s in m.clean_steps] == [2, 3] and m.iteration_s == pytest.approx(3.0)


def test_no_step_after_warm_up_uses_every_step() -> None:
    m = _measurement([2.0, 4.0], warmup=2, profiled=[])
    assert [s.step for s in m.clean_steps] == [1, 2] and m.iteration_s == pytest.approx(3.0)
