"""The gradient noise scale (McCandlish et al. 2018, arXiv 1812.06162, Appendix A), torch-free.

The *simple* noise scale ``B_noise = tr(Σ) / |G|²`` (their eq. 2.7; Σ the per-example gradient
covariance, G the true gradient) predicts the critical batch: training to a target at batch B takes ``S = S_min·(1 + B_crit/B)``
steps and ``E = E_min·(1 + B/B_crit)`` examples, with ``B_crit ≈ B_noise``. It is measured from the squared
norms of two unbiased gradient estimates at batch sizes ``B_small < B_big``: since
``E|G_B|² = |G|² + tr(Σ)/B``,

    |G|²  ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)
    tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)

are unbiased per step but very noisy, so (as the paper recommends) each is smoothed separately
with an exponential moving average before the ratio is taken. The average here is Adam's
bias-corrected EMA, ``m_t = β·m_{t−1} + (1−β)·x_t``, ``m̂_t = m_t / (1 − β^t)``, with
``β = EMA_BETA = 0.99`` (a window of about 100 steps; in a shorter run it is close to the plain
mean of all steps). AdaptDL (``adaptdl/torch/gradient_noise_scale.py``) smooths the same two
quantities the same way. Steps with a non-finite norm are skipped, as AdaptDL does.

The executor (:mod:`mindpipe.executor.noise_probe`) takes the norms; this module holds the
arithmetic and the records ``measured.json`` keeps (:class:`GradientNoise`), and calibration
combines runs with :func:`combine_noise_scales`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from mindpipe.traces.config import non_negative, one_of, positive
from mindpipe.traces.errors import ContractError

EMA_BETA = 0.99
# data_parallel: G_small is a replica's local gradient (batch = global / dp) before the
# data-parallel reduction, G_big the reduced one; microbatch: G_small is one micro-batch's
# gradient, G_big the accumulated step gradient (one replica).
NOISE_METHODS = ("data_parallel", "microbatch")


def two_batch_estimates(small_sq_norm: float, big_sq_norm: float, small_batch: float,
                        big_batch: float) -> tuple[float, float]:
    """Unbiased one-step estimates ``(|G|², tr(Σ))`` from two batch sizes (module docstring).

    Raises:
        ValueError: ``small_batch`` is not smaller than ``big_batch`` or not positive.
    """
    if not 0 < small_batch < big_batch:
        raise ValueError(f"need 0 < B_small < B_big, got {small_batch} and {big_batch}")
    grad_sq = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)
    trace_cov = (small_sq_norm - big_sq_norm) / (1.0 / small_batch - 1.0 / big_batch)
    return grad_sq, trace_cov


@dataclass
class NoiseStepRecord:
    """One step's norms and the smoothed noise scale after it.

    Attributes:
        step: Global step (1-based).
        small_sq_norm: |G_small|² (mean over the small estimates the step had: the replicas).
        big_sq_norm: |G_big|².
        small_batch, big_batch: Samples behind each estimate.
        grad_sq_ema, trace_cov_ema: The bias-corrected EMAs of |G|² and tr(Σ) after this step.
        noise_scale: ``trace_cov_ema / grad_sq_ema`` in samples; None while ``grad_sq_ema <= 0``.
    """

    step: int
    small_sq_norm: float
    big_sq_norm: float
    small_batch: int
    big_batch: int
    grad_sq_ema: float
    trace_cov_ema: float
    noise_scale: float | None = None

    def __post_init__(self) -> None:
        positive("step", self.step)
        for key in ("small_sq_norm", "big_sq_norm"):
            non_negative(key, getattr(self, key))
        positive("small_batch", self.small_batch)
        if self.big_batch <= self.small_batch:
            raise ContractError("", "big_batch", f"big_batch={self.big_batch} must exceed small_batch={self.small_batch}")
        if self.noise_scale is not None:
            non_negative("noise_scale", self.noise_scale)


@dataclass
class GradientNoise:
    """The gradient noise scale a run measured (``measurement.gradient_noise`` in measured.json).

    Attributes:
        method: ``data_parallel`` or ``microbatch`` (see ``NOISE_METHODS``).
        ema_beta: β of the smoothing (module docstring).
        steps: Per step, in order.
        noise_scale: The final smoothed estimate in samples (None when |G|² never came out
            positive): the critical batch goodput uses.
    """

    method: str
    ema_beta: float
    steps: list[NoiseStepRecord] = field(default_factory=list)
    noise_scale: float | None = None

    def __post_init__(self) -> None:
        one_of("method", self.method, NOISE_METHODS)
        if not 0 <= self.ema_beta < 1:
            raise ContractError("", "ema_beta", f"ema_beta={self.ema_beta} must be in [0, 1)")
        if self.noise_scale is not None:
            non_negative("noise_scale", self.noise_scale)

    @property
    def samples(self) -> int:
        """Training samples the estimate saw (big batch summed over the steps)."""
        return sum(s.big_batch for s in self.steps)


class NoiseScaleEstimator:
    """Smooths per-step two-batch estimates into the noise scale (module docstring).

    Args:
        method: How the two batch sizes were obtained (``NOISE_METHODS``).
        beta: EMA decay per step.
    """

    def __init__(self, method: str, beta: float = EMA_BETA) -> None:
        self.result = GradientNoise(method, beta)
        self._grad_sq = 0.0
        self._trace_cov = 0.0
        self._weight = 0.0  # 1 − β^t: the bias correction

    def update(self, step: int, small_sq_norm: float, big_sq_norm: float, small_batch: int,
               big_batch: int) -> NoiseStepRecord | None:
        """Add one step; returns its record, or None for a skipped (non-finite) step."""
        if not (math.isfinite(small_sq_norm) and math.isfinite(big_sq_norm)):
            return None
        grad_sq, trace_cov = two_batch_estimates(small_sq_norm, big_sq_norm, small_batch, big_batch)
        beta = self.result.ema_beta
        self._grad_sq = beta * self._grad_sq + (1 - beta) * grad_sq
        self._trace_cov = beta * self._trace_cov + (1 - beta) * trace_cov
        self._weight = beta * self._weight + (1 - beta)
        g, s = self._grad_sq / self._weight, self._trace_cov / self._weight
        scale = max(0.0, s) / g if g > 0 else None
        rec = NoiseStepRecord(step, small_sq_norm, big_sq_norm, small_batch, big_batch, g, s, scale)
        self.result.steps.append(rec)
        self.result.noise_scale = scale
        return rec


def combine_noise_scales(estimates: Sequence[tuple[float, int]]) -> float:
    """Sample-weighted mean of ``(noise_scale, samples)`` pairs (runs of one model).

    Raises:
        ValueError: nothing to combine (no pairs, or no samples).
    """
    total = sum(n for _, n in estimates)
    if not estimates or total <= 0:
        raise ValueError("no noise-scale estimates with samples to combine")
    return sum(b * n for b, n in estimates) / total


__all__ = [
    "EMA_BETA",
    "NOISE_METHODS",
    "GradientNoise",
    "NoiseScaleEstimator",
    "NoiseStepRecord",
    "combine_noise_scales",
    "two_batch_estimates",
]
