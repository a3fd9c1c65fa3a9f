"""Carry out ``stage_clocks_mhz``: lock this rank's SM clock with NVML for the run, reset it after.

Each pipeline rank runs all its virtual stages at one clock (the plan rule,
:func:`mindpipe.traces.frequency.check_stage_clocks_shape`), locked as Zeus's pipeline frequency
controller does: ``nvmlDeviceSetGpuLockedClocks(handle, f, f)`` with the memory clock left alone,
``nvmlDeviceResetGpuLockedClocks`` at the end (ml-energy/zeus,
``zeus/optimizer/pipeline_frequency/frequency_controller.py``). Locking needs ``pynvml``
(``nvidia-ml-py``) and, on most drivers, administrator rights; where it cannot be done the run goes
on at default clocks and says so in one line and in measured.json's energy notes. On CPU the plan
key is skipped with a one-line notice. NVML's energy counter is read by
:class:`mindpipe.executor.measure.EnergyMeter` either way.
"""

from __future__ import annotations

import atexit
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindpipe.traces.config import Plan
from mindpipe.traces.frequency import rank_clocks
from mindpipe.traces.layout import stage_to_rank

if TYPE_CHECKING:  # the launcher's pre-check imports this module and must not pay for torch's import
    import torch

CPU_NOTICE = "stage_clocks_mhz: not applied on CPU (NVML locked clocks need NVIDIA GPUs); running at the host's clocks"


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
    _nvml: Any = None
    _handle: Any = None

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
        if self._handle is not None:
            try:
                self._nvml.nvmlDeviceResetGpuLockedClocks(self._handle)
            finally:
                self._handle = None


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
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        pynvml.nvmlDeviceSetGpuLockedClocks(handle, mhz, mhz)
    except Exception as e:  # no pynvml, no permission, unsupported GPU
        clock = StageClock(mhz, "failed", f"{type(e).__name__}: {e}".strip())
        if verbose:
            print(f"stage_clocks_mhz: could not lock {mhz} MHz ({clock.detail}); running at default clocks",
                  file=sys.stderr)
        return clock
    clock = StageClock(mhz, "locked", _nvml=pynvml, _handle=handle)
    atexit.register(clock.release)
    return clock


__all__ = ["CPU_NOTICE", "StageClock", "lock_stage_clock"]
