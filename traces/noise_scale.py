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

    def state(self) -> NoiseEmaState:
        """The moving averages so far (what a checkpoint keeps so a resumed run continues them)."""
        return NoiseEmaState(self.result.method, self.result.ema_beta, self._grad_sq, self._trace_cov, self._weight)

    def restore(self, state: NoiseEmaState) -> None:
        """Continue from a checkpoint's averages (the steps before it stay in that run's measured.json).

        Raises:
            ContractError: the state was taken with another method or β (the averages would not mean the same).
        """
        if (state.method, state.ema_beta) != (self.result.method, self.result.ema_beta):
            raise ContractError("", "gradient_noise", f"the checkpoint's noise-scale averages were taken with method "
                                f"{state.method!r}, beta {state.ema_beta}; this run uses {self.result.method!r}, "
                                f"beta {self.result.ema_beta}")
        self._grad_sq, self._trace_cov, self._weight = state.grad_sq, state.trace_cov, state.weight
        if state.weight > 0:
            g, s = state.grad_sq / state.weight, state.trace_cov / state.weight
            self.result.noise_scale = max(0.0, s) / g if g > 0 else None


@dataclass(frozen=True)
class NoiseEmaState:
    """The un-normalised EMAs of |G|² and tr(Σ) and their bias-correction weight 1 − β^t.

    Attributes:
        method: ``NOISE_METHODS`` entry the norms were taken with.
        ema_beta: β of the averages.
        grad_sq, trace_cov: ``m_t`` of |G|² and of tr(Σ) (before the bias correction).
        weight: ``1 − β^t`` (0 before the first step).
    """

    method: str
    ema_beta: float
    grad_sq: float
    trace_cov: float
    weight: float

    def __post_init__(self) -> None:
        one_of("method", self.method, NOISE_METHODS)
        if not 0 <= self.ema_beta < 1:
            raise ContractError("", "ema_beta", f"ema_beta={self.ema_beta} must be in [0, 1)")
        for key in ("grad_sq", "trace_cov", "weight"):
            if not math.isfinite(getattr(self, key)):
                raise ContractError("", key, f"{key} must be finite")
        if not 0 <= self.weight <= 1:
            raise ContractError("", "weight", f"weight={self.weight} must be in [0, 1]")

    def to_json(self) -> dict[str, float | str]:
        """The JSON document a checkpoint keeps."""
        return {"method": self.method, "ema_beta": self.ema_beta, "grad_sq": self.grad_sq,
                "trace_cov": self.trace_cov, "weight": self.weight}

    @classmethod
    def from_json(cls, doc: object) -> NoiseEmaState:
        """Read :meth:`to_json`'s document.

        Raises:
            ContractError: not an object with exactly those keys, or values out of range.
        """
        keys = {"method", "ema_beta", "grad_sq", "trace_cov", "weight"}
        if not isinstance(doc, dict) or set(doc) != keys:
            raise ContractError("", "gradient_noise", f"expected an object with keys {sorted(keys)}")
        if not isinstance(doc["method"], str) or any(
                isinstance(doc[k], bool) or not isinstance(doc[k], int | float) for k in keys - {"method"}):
            raise ContractError("", "gradient_noise", "method must be a string and the rest numbers")
        return cls(doc["method"], float(doc["ema_beta"]), float(doc["grad_sq"]), float(doc["trace_cov"]),
                   float(doc["weight"]))


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
    "NoiseEmaState",
    "NoiseScaleEstimator",
    "NoiseStepRecord",
    "combine_noise_scales",
    "two_batch_estimates",
]
