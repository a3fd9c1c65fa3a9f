"""The measured Gantt draws the optimizer step, as the simulated one does.

Before, the measured trace kept every action and wait but no optimizer step (only each rank's mean
``optimizer_s``), so :func:`mindpipe.simulator.calibrate.runs.measured_events` — the measured panel
of the demo's measured-vs-simulated Gantt charts — had F, B and waits while the simulated panel
also had the optimizer. One real run on CPU (gloo, two pipeline ranks) is checked here.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from mindpipe.simulator.calibrate.runs import load_run, measured_events
from mindpipe.traces.builtin import load_cluster
from mindpipe.traces.config import Model, Plan

from .conftest import TINY, run_plan

PP2 = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b", "precision": "fp32"}
STEPS = 4


@pytest.fixture(scope="module")
def pp2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pp2-optimizer")
    res = run_plan(tmp, PP2, 2, steps=STEPS)
    assert res.returncode == 0, res.stderr[-4000:]
    return tmp, load_run(tmp / "measured.json")


def test_the_measurement_keeps_every_ranks_optimizer_step(pp2):
    _tmp, run = pp2
    meas = run.measurement
    assert Counter((o.rank, o.step) for o in meas.optimizer) == {(r, s): 1 for r in (0, 1) for s in range(1, STEPS + 1)}
    for o in meas.optimizer:  # after the rank's last action of that step (the schedule, then the update)
        last = max(a.start_s + a.duration_s for a in meas.actions if a.rank == o.rank and a.step == o.step)
        assert o.start_s >= last and o.duration_s >= 0


def test_the_chrome_trace_and_the_measurement_hold_the_same_optimizer_spans(pp2):
    tmp, run = pp2
    doc = json.loads((tmp / run.measurement.timeline_file).read_text())
    spans = sorted((e["pid"], round(e["ts"])) for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "optimizer")
    assert all(e["tid"] == 0 for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "optimizer")  # compute
    assert spans == sorted((o.rank, round(o.start_s * 1e6)) for o in run.measurement.optimizer)


def test_measured_and_simulated_gantt_show_the_same_actions(pp2):
    from mindpipe.simulator.api import SimulationOptions, simulate

    _tmp, run = pp2
    measured = measured_events(run)
    simulated = simulate(Model(**TINY), load_cluster("cpu:1x2"), Plan(**PP2), SimulationOptions(timeline=True)).timeline
    assert simulated is not None

    def compute(events):
        return Counter((e.rank, e.category) for e in events if e.thread == "compute")

    assert compute(measured) == compute(simulated)  # F and B per micro-batch, one optimizer step per rank
    optimizer = [e for e in measured if e.category == "optimizer"]
    assert [(e.rank, e.thread, e.name) for e in sorted(optimizer, key=lambda e: e.rank)] == [
        (0, "compute", "optimizer"), (1, "compute", "optimizer")]
    for e in optimizer:  # on the step's axis, after the rank's own actions
        assert e.start_s >= max(a.end_s for a in measured if a.rank == e.rank and a.category in ("F", "B"))


def test_the_demo_gantt_says_the_optimizer_is_drawn(pp2, tmp_path, monkeypatch):
    """The demo's measured panel (mindpipe.loop_report) no longer says the optimizer is left out."""
    from mindpipe.simulator.api import SimulationOptions, simulate

    import mindpipe.loop_report as loop_report

    panels: list[tuple[list, str]] = []
    monkeypatch.setattr(loop_report, "write_gantts", lambda drawn, path: panels.extend(drawn))
    monkeypatch.setattr(loop_report, "simulate",  # uncalibrated: the demo's fit is not what is checked here
                        lambda model, cluster, plan, _opts: simulate(model, cluster, plan, SimulationOptions(timeline=True)))
    loop_report._gantt(pp2[1], None, tmp_path / "gantt.png")
    (measured, title), (simulated, _) = panels
    assert "waits and the optimizer" in title and "(host time not recorded per action)" in title
    assert {e.category for e in measured} >= {"F", "B", "optimizer"}
    assert {e.category for e in measured if e.thread == "compute"} == {e.category for e in simulated if e.thread == "compute"}
