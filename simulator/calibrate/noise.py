"""Carry the gradient noise scale the runs measured into the calibration file.

Each measured run (``mindpipe run``) records its smoothed gradient noise scale
(``measurement.gradient_noise``, :mod:`mindpipe.traces.noise_scale`). Calibration keeps one value
per model: the runs' final estimates weighted by the training samples each estimate saw
(:func:`mindpipe.traces.noise_scale.combine_noise_scales`). ``calibrate`` already refuses runs of
two models, so every run here trained the same network; runs on different data are combined but
listed, since the noise scale is a property of model *and* data (and grows as training
progresses: McCandlish et al. 2018, §3; the OLMo measurements in arXiv 2505.23971).
"""

from __future__ import annotations

from mindpipe.simulator.calibrate.runs import MeasuredRun
from mindpipe.traces.calibration import NoiseCalibration
from mindpipe.traces.noise_scale import combine_noise_scales


def fit_noise(runs: list[MeasuredRun], warnings: list[str]) -> NoiseCalibration | None:
    """The sample-weighted noise scale of ``runs`` (None when none measured one).

    Appends to ``warnings`` a line per run without an estimate, and one when the runs trained
    on different data.
    """
    pairs: list[tuple[float, int]] = []
    used: list[MeasuredRun] = []
    for run in runs:
        noise = run.measurement.gradient_noise
        if noise is None or noise.noise_scale is None or noise.samples == 0:
            why = ("one replica and one micro-batch: no two batch sizes to compare" if noise is None
                   else "|G|² never came out positive")
            warnings.append(f"{run.source}: no gradient noise scale ({why})")
            continue
        pairs.append((noise.noise_scale, noise.samples))
        used.append(run)
    if not used or sum(b for b, _ in pairs) <= 0:
        return None
    data = sorted({r.measurement.data for r in used})
    if len(data) > 1:
        warnings.append(f"gradient noise scale combines runs on different data ({', '.join(data)})")
    return NoiseCalibration(noise_scale=combine_noise_scales(pairs), samples=sum(n for _, n in pairs),
                            model=used[0].model, runs=[r.source for r in used], data=data)


__all__ = ["fit_noise"]
