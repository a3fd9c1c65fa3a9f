"""SM clocks in the executor: ``stage_clocks_mhz`` (one locked clock per rank) and ``action_clocks_mhz``
(Perseus's clock per forward/backward, switched by a thread once the device reaches each action).
On CPU a one-line notice and the run proceeds; NVML on GPUs (the switching logic is checked here with
a fake clock control and fake device marks)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from mindpipe.executor.clocks import (
    ACTION_CPU_NOTICE,
    CPU_NOTICE,
    ActionClocks,
    lock_stage_clock,
    nvml_index,
    start_action_clocks,
)
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


def test_cpu_run_with_action_clocks_says_so_and_keeps_the_plan(tmp_path) -> None:
    """Per-action clocks are a plan key the executor carries out: on CPU one notice, and measured.json
    records the plan as given (no what-if line)."""
    clocks = [[[1410] * 4, [1095] * 4], [[1410] * 4, [1410] * 4]]
    plan = {"dp": 1, "tp": 1, "pp": 2, "micro_batch_size": 1, "global_batch_size": 4, "schedule": "1f1b",
            "action_clocks_mhz": clocks}
    p = run_plan(tmp_path, plan, 2, steps=3)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count(ACTION_CPU_NOTICE) == 1
    assert "what-if" not in p.stderr
    measured = json.loads((tmp_path / "measured.json").read_text())["measurement"]
    assert measured["plan"]["action_clocks_mhz"] == clocks
    assert "action_clocks_mhz skipped on CPU" in measured["energy_notes"]


class _Mark:
    """A fake device mark: ``synchronize`` blocks until the test says the device got there."""

    def __init__(self) -> None:
        self.reached = threading.Event()

    def synchronize(self) -> None:
        assert self.reached.wait(10)


class _Setter:
    def __init__(self, fail_at: int | None = None) -> None:
        self.locked: list[int] = []
        self.resets = 0
        self.fail_at = fail_at

    def lock(self, mhz: int) -> None:
        if self.fail_at is not None and len(self.locked) == self.fail_at:
            raise RuntimeError("NVML_ERROR_NO_PERMISSION")
        self.locked.append(mhz)

    def reset(self) -> None:
        self.resets += 1


class _Stage:
    """The three action methods of torch's pipeline stage, recording their calls."""

    def __init__(self, index: int) -> None:
        self.stage_index = index
        self.calls: list[tuple[str, int]] = []

    def forward_one_chunk(self, mb: int, *args, **kwargs):
        self.calls.append(("F", mb))
        return mb

    def backward_one_chunk(self, mb: int, loss=None, full_backward: bool = True, last_backward: bool = False):
        self.calls.append(("B" if full_backward else "I", mb))

    def backward_weight_one_chunk(self, mb: int, last_backward: bool = False):
        self.calls.append(("W", mb))


def _wait_for(cond, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "the clock thread did not get there"
        time.sleep(0.001)


def _cuda_plan(clocks: list) -> Plan:
    return Plan(pp=1, global_batch_size=len(clocks[0][0]), action_clocks_mhz=clocks)


def test_action_clock_switches_when_the_device_reaches_the_action_not_when_the_host_queues_it() -> None:
    """F/B/I/W map to the plan's forward and backward clocks; an unchanged clock queues nothing; a change
    is made only once the device has reached the action's mark, in order; release resets."""
    marks: list[_Mark] = []

    def marker() -> _Mark:
        marks.append(_Mark())
        return marks[-1]

    setter = _Setter()
    stage = _Stage(0)
    clocks = start_action_clocks(_cuda_plan([[[1410, 1200, 1200], [1095, 1095, 1410]]]), torch.device("cuda", 0),
                                 [stage], verbose=False, setter=lambda index: setter, marker=marker)
    assert clocks is not None and clocks.status == "switching"
    assert setter.locked == [1410]  # the first action's clock, locked before training
    assert stage.forward_one_chunk(0) == 0  # 1410: already locked, nothing queued
    stage.forward_one_chunk(1)  # 1200
    stage.forward_one_chunk(2)  # 1200 again: nothing queued
    stage.backward_one_chunk(0, full_backward=False)  # I: the backward clock 1095
    stage.backward_weight_one_chunk(0)  # W of micro-batch 0: 1095, nothing queued
    stage.backward_one_chunk(2)  # B: 1410
    assert stage.calls == [("F", 0), ("F", 1), ("F", 2), ("I", 0), ("W", 0), ("B", 2)]
    assert len(marks) == 3
    time.sleep(0.05)
    assert setter.locked == [1410]  # the host ran ahead; the device has reached no mark yet
    marks[0].reached.set()
    _wait_for(lambda: setter.locked == [1410, 1200])
    for m in marks[1:]:
        m.reached.set()
    _wait_for(lambda: setter.locked == [1410, 1200, 1095, 1410])
    clocks.release()
    clocks.release()
    assert setter.resets == 1 and clocks.switches == 3 and len(clocks.call_s) == 3
    assert clocks.note(0).startswith("pipeline rank 0 SM clock switched 3 times between actions (NVML, NVML call median")


def test_action_clocks_that_cannot_be_locked_run_at_default_clocks_and_say_so(capsys) -> None:
    stage = _Stage(0)
    plan = _cuda_plan([[[1410, 1200], [1095, 1095]]])

    def refuse(index: int) -> _Setter:
        raise RuntimeError("NVML_ERROR_NO_PERMISSION")

    clocks = start_action_clocks(plan, torch.device("cuda", 0), [stage], setter=refuse)
    assert clocks is not None and clocks.status == "failed"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not lock 1410 MHz" in err[0] and "default clocks" in err[0]
    assert stage.forward_one_chunk.__func__ is _Stage.forward_one_chunk  # not wrapped: nothing to switch
    assert "NOT applied (RuntimeError: NVML_ERROR_NO_PERMISSION)" in clocks.note(1)
    # A refusal in the middle of the run stops the switching and is told in the run's notes.
    setter = _Setter(fail_at=2)
    clocks = start_action_clocks(plan, torch.device("cuda", 0), [_Stage(0)], verbose=False,
                                 setter=lambda index: setter, marker=lambda: _done())
    clocks.before(0, "F", 1)
    clocks.before(0, "B", 0)
    _wait_for(lambda: clocks.status == "failed")
    clocks.before(0, "F", 0)  # after a failure nothing more is queued
    clocks.release()
    assert setter.locked == [1410, 1200] and setter.resets == 1
    assert "NOT applied (after 1 switches, RuntimeError: NVML_ERROR_NO_PERMISSION)" in clocks.note(0)


def _done() -> _Mark:
    m = _Mark()
    m.reached.set()
    return m


def test_action_clocks_on_cpu_wrap_nothing() -> None:
    stage = _Stage(0)
    clocks = start_action_clocks(_cuda_plan([[[1410], [1095]]]), torch.device("cpu"), [stage])
    assert isinstance(clocks, ActionClocks) and clocks.status == "skipped_cpu"
    assert stage.forward_one_chunk.__func__ is _Stage.forward_one_chunk
    assert clocks.note(0) == "action_clocks_mhz skipped on CPU"
    assert start_action_clocks(Plan(), torch.device("cpu"), [stage]) is None


@pytest.mark.gpu
def test_gpu_action_clocks_switch_between_actions_or_report() -> None:
    """On a GPU with NVML: the thread switches the clock between real kernels (or the run says why not)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(4096, 4096, device="cuda")

    class Busy(_Stage):
        def forward_one_chunk(self, mb: int, *args, **kwargs):
            return (x @ x).sum()

    stage = Busy(0)
    clocks = start_action_clocks(_cuda_plan([[[1410, 1095, 1410, 1095], [1095] * 4]]), torch.device("cuda", 0),
                                 [stage], verbose=False)
    try:
        for mb in range(4):
            stage.forward_one_chunk(mb)
        torch.cuda.synchronize()
    finally:
        clocks.release()
    assert clocks.status in ("switching", "failed")
    if clocks.status == "switching":
        assert clocks.switches == 3


def test_nvml_index_follows_cuda_visible_devices(monkeypatch) -> None:
    """NVML numbers every GPU of the machine: a process given GPUs 4 and 5 (CUDA_VISIBLE_DEVICES=4,5)
    must lock and read GPU 5 for its cuda:1, as torch's own mapping says; the ordinal where torch
    cannot map it."""
    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", lambda index: {0: 4, 1: 5}[index], raising=False)
    assert nvml_index(torch.device("cuda", 1)) == 5

    def unknown(index: int) -> int:
        raise RuntimeError("no NVML")

    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", unknown, raising=False)
    assert nvml_index(torch.device("cuda", 1)) == 1
