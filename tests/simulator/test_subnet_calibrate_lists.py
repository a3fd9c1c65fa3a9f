"""``mindpipe calibrate RUNS --trace PROFILE``: a per-candidate profile serves any ``layer_candidates``.

``mindpipe profile`` times each pool candidate once, whatever layers may choose it, and a simulation
accepts a profile of the same pool with other lists; the calibration's ``trace_scale`` must too,
instead of skipping (or, when no run matches, refusing) the profile because the lists differ.
"""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.calibrate.supernet import calibrate_supernet

from tests.simulator.test_subnet_calibrate import NET, PROFILE_SPEEDUP, _profile, _synthetic

NAMES = [c.name for c in NET.candidates]
LISTED = dataclasses.replace(NET, layer_candidates=[NAMES[:4]] * 4 + [NAMES[2:]] * 4)


def test_profile_of_other_lists_fits_trace_scale():
    fit = [_synthetic("sequential"), _synthetic("csp")]
    cal, _ = calibrate_supernet(fit, [_profile(LISTED)])  # profiled with lists, the runs had none
    assert cal.devices["cpu"].compute["bf16"].trace_scale == pytest.approx(PROFILE_SPEEDUP, rel=1e-9)
