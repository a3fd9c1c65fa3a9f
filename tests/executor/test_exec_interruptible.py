"""An interruptible time-shifted schedule, followed with ``mindpipe run``, trains the same as one run.

``tune --interruptible`` writes, per run segment, the global step to train until
(:func:`mindpipe.tuner.timeshift.shift_report`); an operator runs each segment with ``--steps
UNTIL_STEP --checkpoint-dir CK`` and ``--resume`` after the first. Here a schedule of three
one-hour segments (two pauses) is followed on one CPU rank and its losses are compared with an
uninterrupted run. (A single pause, resumed from a named step on two pipeline ranks, is
``test_exec_parity.py::test_resume_continues_exactly``.)
"""

from __future__ import annotations

import datetime as dt

import pytest
from mindpipe.simulator.carbon import CarbonSeries
from mindpipe.simulator.timeshift import Window
from mindpipe.traces.trace import Trace
from mindpipe.tuner.timeshift import JobLength, PlanRun, TimeShift, shift_report

from .conftest import run_plan

PLAN = {"micro_batch_size": 2, "global_batch_size": 4, "precision": "fp32"}
STEPS = 6
T0 = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)


def _segments() -> list[dict]:
    # Clean at 01:00, 03:00 and 05:00 UTC, dirty in between: a 3-hour job that may start until
    # 03:00 (deadline 06:00) runs in three separate hours; at 30 minutes per iteration (on paper)
    # each segment trains two steps.
    values = [400.0, 50.0, 400.0, 60.0, 400.0, 70.0, 400.0]
    series = CarbonSeries.of([(T0 + dt.timedelta(hours=k), v) for k, v in enumerate(values)])
    shift = TimeShift(series, Window(T0, T0 + dt.timedelta(hours=3)), JobLength(iterations=STEPS), interruptible=True)
    run = PlanRun(iteration_time_s=1800.0, energy_j=1.0, global_batch=4)
    return shift_report(shift, run, run).to_dict()["timeshift"]["segments"]


@pytest.mark.slow
def test_a_run_paused_and_resumed_at_the_chosen_hours_gives_the_same_losses(tmp_path):
    segments = _segments()
    assert [s["until_step"] for s in segments] == [2, 4, STEPS]
    assert [s["start"][11:16] for s in segments] == ["01:00", "03:00", "05:00"]
    full_dir = tmp_path / "full"
    full_dir.mkdir()
    res = run_plan(full_dir, PLAN, 1, steps=STEPS)
    assert res.returncode == 0, res.stderr[-4000:]
    full = Trace.load(full_dir / "measured.json").measurement.losses
    ckpt, losses = tmp_path / "ckpt", []
    for k, seg in enumerate(segments):
        part = tmp_path / f"segment{k}"
        part.mkdir()
        extra = ["--checkpoint-dir", str(ckpt)] + (["--resume"] if k else [])
        res = run_plan(part, PLAN, 1, *extra, steps=seg["until_step"])
        assert res.returncode == 0, res.stderr[-4000:]
        steps = Trace.load(part / "measured.json").measurement.steps
        assert [s.step for s in steps] == list(range(len(losses) + 1, seg["until_step"] + 1))
        losses += Trace.load(part / "measured.json").measurement.losses
    assert len(full) == STEPS
    assert losses == full  # bit for bit
