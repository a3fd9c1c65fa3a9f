"""Carry out the plan's SM clocks with NVML: ``stage_clocks_mhz`` (one clock per pipeline rank,
locked for the run) and ``action_clocks_mhz`` (Perseus's clock per forward/backward of each
micro-batch, switched around every action); both reset after the run.

**Per rank** (``stage_clocks_mhz``). Each pipeline rank runs all its virtual stages at one clock
(the plan rule, :func:`mindpipe.traces.frequency.check_stage_clocks_shape`), locked as Zeus's
pipeline frequency controller does: ``nvmlDeviceSetGpuLockedClocks(handle, f, f)`` with the memory
clock left alone, ``nvmlDeviceResetGpuLockedClocks`` at the end (ml-energy/zeus,
``zeus/optimizer/pipeline_frequency/frequency_controller.py``).

**Per action** (``action_clocks_mhz``, :class:`ActionClocks`). Perseus (SOSP'24) sets the clock of
every forward and backward of every micro-batch; Zeus's controller does it from a separate process
so that the training loop never waits for NVML. Here the host only *enqueues*: when a stage starts
an action whose clock differs from the one before it, the rank records a CUDA event on the current
stream and hands (event, MHz) to a clock thread, which waits for the event — the moment the GPU
reaches that action, not the moment the host (which runs ahead) launched it — and then locks the
new clock. The backward clock covers B, and I and W of a split backward (as the simulator prices
them, :func:`mindpipe.simulator.frequency.apply_action_clocks`); work between actions (sends, the
gradient reduction, the optimizer step) runs at the clock of the action before it. The thread
counts the switches and times each NVML call, for measured.json's energy notes. The time to
switch (NVML's call and the GPU's settling) is not in the simulator.

Locking needs ``pynvml`` (``nvidia-ml-py``) and, on most drivers, administrator rights; where it
cannot be done the run goes on at default clocks and says so in one line and in measured.json's
energy notes. On CPU either key is skipped with a one-line notice. NVML's energy counter is read by
:class:`mindpipe.executor.measure.EnergyMeter` either way.
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mindpipe.traces.config import Plan
from mindpipe.traces.frequency import rank_clocks
from mindpipe.traces.layout import stage_to_rank

if TYPE_CHECKING:  # the launcher's pre-check imports this module and must not pay for torch's import
    import torch

CPU_NOTICE = "stage_clocks_mhz: not applied on CPU (NVML locked clocks need NVIDIA GPUs); running at the host's clocks"
ACTION_CPU_NOTICE = ("action_clocks_mhz: not applied on CPU (NVML locked clocks need NVIDIA GPUs); "
                     "running at the host's clocks")


def nvml_index(device: torch.device) -> int:
    """NVML's index of a CUDA device. NVML numbers every GPU of the machine, CUDA only those
    ``CUDA_VISIBLE_DEVICES`` leaves to the process (torchrun launchers and schedulers set it), so
    the device's ordinal is mapped through it as torch's own NVML readings do
    (``torch.cuda._get_nvml_device_index``); the ordinal itself where torch cannot map it."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        return int(torch.cuda._get_nvml_device_index(index))
    except Exception:  # a private helper of torch's: absent in another version, or no NVML to ask
        return index


class ClockSetter(Protocol):
    """What :class:`ActionClocks` needs of a device's clock control (NVML on a GPU; a fake in tests)."""

    def lock(self, mhz: int) -> None:
        """Lock the SM clock at ``mhz``."""

    def reset(self) -> None:
        """Return to the default clocks."""


class Marker(Protocol):
    """A point in the device's work queue: ``synchronize()`` returns once the device has reached it."""

    def synchronize(self) -> None:
        """Block until the device has done everything queued before the mark."""


class NvmlClocks:
    """:class:`ClockSetter` for one GPU through NVML (``pynvml``), by NVML's index (:func:`nvml_index`)."""

    def __init__(self, index: int) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def lock(self, mhz: int) -> None:
        self._nvml.nvmlDeviceSetGpuLockedClocks(self._handle, mhz, mhz)

    def reset(self) -> None:
        self._nvml.nvmlDeviceResetGpuLockedClocks(self._handle)


@dataclass
class StageClock:
    """The outcome of locking one rank's clock.

    Attributes:
        mhz: The clock the plan asks of this rank (None: the plan sets none).
        status: ``none`` (no clocks in the plan), ``skipped_cpu``, ``locked`` or ``failed``.
        detail: Why locking failed, if it did.
    """

    mhz: int | None
    status: str
    detail: str = ""
    _setter: ClockSetter | None = None

    def note(self, pp_rank: int) -> str:
        """A phrase for measured.json's energy notes."""
        if self.status == "locked":
            return f"pipeline rank {pp_rank} SM clock locked at {self.mhz} MHz (NVML)"
        if self.status == "failed":
            return f"pipeline rank {pp_rank} SM clock NOT locked ({self.detail}); default clocks"
        if self.status == "skipped_cpu":
            return "stage_clocks_mhz skipped on CPU"
        return ""

    def release(self) -> None:
        """Reset the locked clock (idempotent)."""
        if self._setter is not None:
            try:
                self._setter.reset()
            finally:
                self._setter = None


def lock_stage_clock(plan: Plan, device: torch.device, pp_rank: int, verbose: bool = True) -> StageClock:
    """Lock the SM clock ``plan`` gives pipeline rank ``pp_rank`` on ``device`` (module docstring).

    ``verbose`` prints a one-line warning on stderr when locking fails (on CPU the launcher's
    pre-check prints :data:`CPU_NOTICE`); the release
    is also registered with :mod:`atexit` so an aborted run does not leave the GPU locked.
    """
    mhz = rank_clocks(plan.stage_clocks_mhz, stage_to_rank(plan))[pp_rank] if plan.stage_clocks_mhz else None
    if mhz is None:
        return StageClock(None, "none")
    if device.type != "cuda":  # the launcher's pre-check printed CPU_NOTICE
        return StageClock(mhz, "skipped_cpu")
    try:
        setter = NvmlClocks(nvml_index(device))
        setter.lock(mhz)
    except Exception as e:  # no pynvml, no permission, unsupported GPU
        clock = StageClock(mhz, "failed", f"{type(e).__name__}: {e}".strip())
        if verbose:
            print(f"stage_clocks_mhz: could not lock {mhz} MHz ({clock.detail}); running at default clocks",
                  file=sys.stderr)
        return clock
    clock = StageClock(mhz, "locked", _setter=setter)
    atexit.register(clock.release)
    return clock


def _cuda_marker() -> Marker:
    import torch

    ev = torch.cuda.Event()
    ev.record()
    return ev


_STOP = None
_JOIN_S = 30.0  # how long release() waits for the clock thread (a hung device must not hang the exit)


@dataclass
class ActionClocks:
    """Carry out ``action_clocks_mhz`` on one rank: a clock per forward/backward of each micro-batch.

    The stages' action methods call :meth:`before` (installed by :meth:`wrap_stage`); a change of clock
    is queued with a mark of the device's work, and a thread locks the clock once the device gets
    there (module docstring). ``status``: ``switching``, ``skipped_cpu`` or ``failed`` (with ``detail``).

    Attributes:
        clocks: The plan's ``action_clocks_mhz`` (``[stage][0 forward | 1 backward][micro-batch]``).
        switches: Clock changes made so far; ``call_s`` the seconds of each NVML call.
    """

    clocks: list[list[list[int]]]
    status: str
    detail: str = ""
    setter: ClockSetter | None = None
    marker: Callable[[], Marker] = _cuda_marker
    switches: int = 0
    call_s: list[float] = field(default_factory=list)
    _queued: int | None = None
    _queue: queue.SimpleQueue[tuple[Marker, int] | None] = field(default_factory=queue.SimpleQueue)
    _thread: threading.Thread | None = None

    def clock_of(self, stage: int, kind: str, mb: int) -> int:
        """The clock of ``kind`` (F, B, I or W) of micro-batch ``mb`` on virtual stage ``stage``."""
        return self.clocks[stage][0 if kind == "F" else 1][mb]

    def start(self, first_mhz: int | None = None) -> None:
        """Start the clock thread; ``first_mhz`` is the clock already locked (no switch queued for it)."""
        self._queued = first_mhz
        self._thread = threading.Thread(target=self._run, name="mindpipe-action-clocks", daemon=True)
        self._thread.start()

    def before(self, stage: int, kind: str, mb: int) -> None:
        """Called as a stage starts an action: queue its clock if it differs from the last one queued."""
        if self.status != "switching":
            return
        mhz = self.clock_of(stage, kind, mb)
        if mhz != self._queued:
            self._queued = mhz
            self._queue.put((self.marker(), mhz))

    def _run(self) -> None:
        setter = self.setter  # set before the thread starts (start_action_clocks)
        while (item := self._queue.get()) is not _STOP and setter is not None:
            mark, mhz = item
            mark.synchronize()
            t0 = time.perf_counter()
            try:
                setter.lock(mhz)
            except Exception as e:  # e.g. the driver refused a clock mid-run: stop switching, say so at the end
                self.status, self.detail = "failed", f"after {self.switches} switches, {type(e).__name__}: {e}".strip()
                return
            self.call_s.append(time.perf_counter() - t0)
            self.switches += 1

    def wrap_stage(self, stage: Any) -> None:
        """Make ``stage``'s forward, backward and weight-gradient actions call :meth:`before` first."""
        s = stage.stage_index
        fwd, bwd, bww = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

        def forward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            self.before(s, "F", mb)
            return fwd(mb, *args, **kwargs)

        def backward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            self.before(s, "B", mb)
            return bwd(mb, *args, **kwargs)

        def backward_weight_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            self.before(s, "W", mb)
            return bww(mb, *args, **kwargs)

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def release(self) -> None:
        """Stop the thread once it has made the switches queued, and reset the clocks (idempotent)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(_JOIN_S)
            self._thread = None
        if self.setter is not None:
            try:
                self.setter.reset()
            finally:
                self.setter = None

    def note(self, pp_rank: int) -> str:
        """A phrase for measured.json's energy notes."""
        if self.status == "skipped_cpu":
            return "action_clocks_mhz skipped on CPU"
        calls = sorted(self.call_s)
        timing = (f", NVML call median {1e3 * calls[len(calls) // 2]:.2f} ms, max {1e3 * calls[-1]:.2f} ms"
                  if calls else "")
        if self.status == "failed":
            return f"pipeline rank {pp_rank} per-action SM clocks NOT applied ({self.detail}){timing}; default clocks"
        return f"pipeline rank {pp_rank} SM clock switched {self.switches} times between actions (NVML{timing})"


def start_action_clocks(plan: Plan, device: torch.device, stages: list[Any], verbose: bool = True,
                        setter: Callable[[int], ClockSetter] = NvmlClocks,
                        marker: Callable[[], Marker] = _cuda_marker) -> ActionClocks | None:
    """Carry out ``plan.action_clocks_mhz`` on this rank's ``stages`` (None if the plan sets none).

    On CUDA it locks the clock of the rank's first action (its first stage's first forward) at once,
    so a driver that refuses is known before training; then every stage is wrapped and the thread
    started. Where locking fails the run goes on at default clocks (``verbose``: one line on stderr).
    On CPU nothing is wrapped (the launcher's pre-check printed :data:`ACTION_CPU_NOTICE`).
    ``setter`` and ``marker`` make the device's clock control and work marks (NVML, CUDA events).
    """
    if plan.action_clocks_mhz is None:
        return None
    clocks = ActionClocks(plan.action_clocks_mhz, "skipped_cpu", marker=marker)
    if device.type != "cuda":
        return clocks
    first = clocks.clock_of(min(st.stage_index for st in stages), "F", 0)
    try:
        clocks.setter = setter(nvml_index(device))
        clocks.setter.lock(first)
    except Exception as e:  # no pynvml, no permission, unsupported GPU
        clocks.status, clocks.detail = "failed", f"{type(e).__name__}: {e}".strip()
        if verbose:
            print(f"action_clocks_mhz: could not lock {first} MHz ({clocks.detail}); running at default clocks",
                  file=sys.stderr)
        return clocks
    clocks.status = "switching"
    for st in stages:
        clocks.wrap_stage(st)
    clocks.start(first)
    atexit.register(clocks.release)
    return clocks


__all__ = ["ACTION_CPU_NOTICE", "CPU_NOTICE", "ActionClocks", "ClockSetter", "Marker", "NvmlClocks", "StageClock",
           "lock_stage_clock", "nvml_index", "start_action_clocks"]
