"""Iterations, hours, kWh and gCO2 to reach a training target: the one owner of that rule.

McCandlish et al. (2018, "An Empirical Model of Large-Batch Training", arXiv 1812.06162, eq. 2.11)
find that the optimisation steps S and training examples E needed to reach a given loss trade off
as ``(S/S_min − 1)(E/E_min − 1) = 1`` along the batch size B, with ``B_crit = E_min/S_min`` ≈ the
gradient noise scale ``B_noise``. Hence, at global batch B:

* steps (iterations) to target ``S(B) = S_min·(1 + B_noise/B)``;
* examples to target ``E(B) = E_min·(1 + B/B_noise)`` (= B·S(B)).

Pollux's statistical efficiency (``tuner.objectives.statistical_efficiency``) is ``E_min/E(B)``.

What a user can know is the number of samples a run needed (or was budgeted) to reach the target
**at the batch it trained at**: ``--target-samples N --target-batch B_ref`` (GPT-3 175B: 300 B
tokens at 1,536 sequences of 2,048). Then ``E_min = N / (1 + B_ref/B_noise)``; without
``B_ref`` the samples are ``E_min`` themselves (the small-batch limit). The noise scale is the
``--critical-batch`` (or, once the executor measures it, the calibration's value, read through
one accessor).

:class:`Placement` is where the job may run in time: an hourly intensity series, a start window
and whether it may pause; each candidate job of ``compute_s`` seconds gets its cleanest schedule
from :func:`mindpipe.simulator.timeshift.schedule` (the owner of that rule).
"""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass, field

from mindpipe.simulator.carbon import CarbonSeries
from mindpipe.simulator.energy import J_PER_KWH
from mindpipe.simulator.timeshift import ShiftedSchedule, Window, schedule
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.tuner.keys import PYTHON_ARG_NAMES, ArgNames


@dataclass(frozen=True)
class TrainingTarget:
    """How much training reaches the target, and the gradient noise scale it trades off with.

    Attributes:
        samples: Samples needed to reach the target when trained at ``reference_batch``.
        noise_scale: The gradient noise scale B_noise ≈ B_crit (samples).
        reference_batch: The global batch ``samples`` was measured at; 0 means ``samples`` is
            E_min (the small-batch limit).
        source: What errors name ``samples`` (empty: as ``arg_names`` says).
        arg_names: How errors name the values (not kept): this class's fields
            (``TrainingTarget.noise_scale``) by default, ``mindpipe tune``'s flags with
            :data:`~mindpipe.tuner.keys.CLI_ARG_NAMES`.

    Raises:
        ContractError: a non-positive or non-finite value, naming the flag or field.
    """

    samples: float
    noise_scale: float
    reference_batch: float = 0.0
    source: str = ""
    arg_names: InitVar[ArgNames] = PYTHON_ARG_NAMES

    def __post_init__(self, arg_names: ArgNames) -> None:
        def named(flag: str, name: str) -> str:
            return f"TrainingTarget.{name}" if arg_names.python else flag

        top = float(limit("global_batch_size"))
        if not (math.isfinite(self.samples) and self.samples > 0):
            raise ContractError(self.source or named("--target-samples", "samples"), None,
                                f"{self.samples} samples to target must be a finite number > 0")
        if not (math.isfinite(self.noise_scale) and 0 < self.noise_scale <= top):
            raise ContractError(named("--critical-batch", "noise_scale"), None, f"the noise scale {self.noise_scale} "
                                f"must be in (0, {top:g}] samples (carbon_to_target needs it)")
        if not (math.isfinite(self.reference_batch) and 0 <= self.reference_batch <= top):
            raise ContractError(named("--target-batch", "reference_batch"), None,
                                f"{self.reference_batch} must be in [0, {top:g}] samples")

    @property
    def min_samples(self) -> float:
        """E_min: samples to target in the small-batch limit."""
        return self.samples / (1.0 + self.reference_batch / self.noise_scale)

    @property
    def min_steps(self) -> float:
        """S_min = E_min / B_noise: steps to target in the large-batch limit."""
        return self.min_samples / self.noise_scale

    def iterations(self, global_batch: float) -> float:
        """Steps to target at global batch B: S_min·(1 + B_noise/B) (McCandlish eq. 2.11)."""
        if not global_batch > 0:
            raise ContractError("plan", "global_batch_size", f"{global_batch} must be > 0")
        return self.min_steps * (1.0 + self.noise_scale / global_batch)

    def samples_at(self, global_batch: float) -> float:
        """Samples to target at global batch B: E_min·(1 + B/B_noise) (= B × :meth:`iterations`)."""
        return self.min_samples * (1.0 + global_batch / self.noise_scale)


@dataclass
class Placement:
    """Where a job may run in time (see the module docstring)."""

    series: CarbonSeries
    window: Window
    interruptible: bool = False
    _cache: dict[float, ShiftedSchedule] = field(default_factory=dict, init=False, repr=False, compare=False)

    def schedule(self, compute_s: float) -> ShiftedSchedule:
        """The cleanest schedule of a job of ``compute_s`` seconds in the window (cached).

        Raises:
            ContractError: the job (window end + length) runs past the series.
        """
        if compute_s not in self._cache:
            self._cache[compute_s] = schedule(self.series, self.window, compute_s, self.interruptible)
        return self._cache[compute_s]


@dataclass(frozen=True)
class ToTarget:
    """One job trained to the target: what it costs.

    Attributes:
        iterations: Steps to target.
        compute_hours: Hours the job computes (iterations × iteration time).
        wait_hours: Hours from the window's start to the finish that it does not compute (the
            start delay and, when interruptible, the pauses); 0 without a placement.
        energy_kwh: Facility energy (PUE included).
        intensity_g_per_kwh: Mean grid intensity over the hours it runs.
        carbon_gco2: Emissions to target.
        samples: Samples processed to reach the target.
    """

    iterations: float
    compute_hours: float
    wait_hours: float
    energy_kwh: float
    intensity_g_per_kwh: float
    carbon_gco2: float
    samples: float


def to_target(target: TrainingTarget, global_batch: int, iteration_time_s: float, energy_j: float,
              intensity_g_per_kwh: float | None = None, sched: ShiftedSchedule | None = None) -> ToTarget:
    """The cost of training a plan (iteration time, facility energy per iteration) to the target.

    The grid intensity is the schedule's (when placed in time) or ``intensity_g_per_kwh`` (an
    annual mean). gCO2 = iterations × energy per iteration × intensity over the hours it runs.

    Raises:
        ContractError: neither an intensity nor a schedule.
    """
    iters = target.iterations(global_batch)
    compute_s = iters * iteration_time_s
    kwh = iters * energy_j / J_PER_KWH
    if sched is not None:
        ci = sched.intensity_g_per_kwh
        # Datetimes hold whole microseconds: the segment ends are the job length rounded to one, so
        # the difference is too (a job that starts at once waits 0 h, not a rounding residue).
        wait_h = round((sched.finish - sched.window.start).total_seconds() - compute_s, 6) / 3600
    elif intensity_g_per_kwh is not None:
        ci, wait_h = intensity_g_per_kwh, 0.0
    else:
        raise ContractError("tune", "carbon", "carbon to target needs a grid intensity or an hourly series")
    # max(-0.0, 0.0) is -0.0 (JSON's "-0.0"): a rounding residue below zero is no wait at all.
    return ToTarget(iters, compute_s / 3600, wait_h if wait_h > 0 else 0.0, kwh, ci, kwh * ci,
                    target.samples_at(global_batch))


__all__ = ["Placement", "ToTarget", "TrainingTarget", "to_target"]
