"""Per-action SM clocks (``action_clocks_mhz``, Perseus's plan, which the executor switches around every
action): plan rules, the simulator, the slack-absorbing planner, the energy bound and ``tune --clocks``."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys

import pytest
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Cluster, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.what_if import what_if_used
from mindpipe.tuner.clock_actions import ActionGrid, _hull_segments, absorb_slack, energy_bound, lp_plan
from mindpipe.tuner.clock_dag import ClockDag
from mindpipe.tuner.frequency import clock_grid, plan_clocks


@pytest.fixture(scope="module")
def case() -> tuple[Simulator, Plan]:
    sim = Simulator(load_model("gpt-1.3b"), Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=3))
    plan = Plan(dp=1, tp=1, pp=3, micro_batch_size=1, global_batch_size=6, schedule="1f1b", partition=[6, 8, 10])
    return sim, plan


def _uniform(plan: Plan, mhz: int) -> list[list[list[int]]]:
    m = plan.num_microbatches
    return [[[mhz] * m, [mhz] * m] for _ in range(plan.num_stages)]


def test_uniform_action_clocks_equal_stage_clocks(case) -> None:
    sim, plan = case
    for mhz in (1410, 1200):
        a = sim.run(dataclasses.replace(plan, action_clocks_mhz=_uniform(plan, mhz)))
        s = sim.run(dataclasses.replace(plan, stage_clocks_mhz=[mhz] * 3))
        assert a.iteration_time_s == pytest.approx(s.iteration_time_s, rel=1e-12)
        assert a.extra.device_energy_j == pytest.approx(s.extra.device_energy_j, rel=1e-12)


def test_one_slower_action_costs_its_own_stretch_and_less_energy(case) -> None:
    """Slowing only the last stage's first forward: the engine charges exactly that action, and a
    non-critical one (stage 0's last backward is critical, stage 2's first forward is not alone)."""
    sim, plan = case
    base = sim.run(plan)
    clocks = _uniform(plan, 1410)
    clocks[0][0][1] = 1200  # stage 0, forward of micro-batch 1: warm-up, before the first backward arrives
    r = sim.run(dataclasses.replace(plan, action_clocks_mhz=clocks))
    assert r.extra.device_energy_j < base.extra.device_energy_j
    assert r.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-9)  # it had slack
    assert what_if_used(dataclasses.replace(plan, action_clocks_mhz=clocks)) == []  # the executor runs it
    assert dataclasses.replace(plan, action_clocks_mhz=clocks).as_executed().action_clocks_mhz == clocks


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda c: c[:2], "action_clocks_mhz must be a list of pp×virtual_stages=3"),
    (lambda c: [c[0], [c[1][0]], c[2]], "action_clocks_mhz[1] must be [forward MHz per micro-batch"),
    (lambda c: [c[0], c[1], [c[2][0], c[2][1][:-1]]], "action_clocks_mhz[2][1] must list one MHz per micro-batch (m=6)"),
    (lambda c: [[c[0][0], [*c[0][1][:-1], True]], c[1], c[2]], "action_clocks_mhz[0][1][5]=True must be a positive"),
])
def test_action_clock_shape_rules(case, mutate, message: str) -> None:
    _, plan = case
    with pytest.raises(ContractError, match=re.escape(message)):
        dataclasses.replace(plan, action_clocks_mhz=mutate(_uniform(plan, 1410)))


def test_action_clocks_need_supported_clocks_and_exclude_stage_clocks(case) -> None:
    sim, plan = case
    bad = _uniform(plan, 1410)
    bad[1][0][2] = 1100
    with pytest.raises(ContractError, match=r"action_clocks_mhz\[1\]\[0\]\[2\]=1100 is not a supported"):
        check_plan(dataclasses.replace(plan, action_clocks_mhz=bad), sim.model, sim.cluster)
    with pytest.raises(ContractError, match="not both"):
        dataclasses.replace(plan, stage_clocks_mhz=[1410] * 3, action_clocks_mhz=_uniform(plan, 1410))


def test_hull_segments_drop_points_above_the_chord() -> None:
    # (0,10) (1,7) (2,6) (3,2): (2,6) lies above the chord (1,7)→(3,2); (1,7) below (0,10)→(3,2).
    assert _hull_segments([0, 1, 2, 3], [10, 7, 6, 2]) == [(-3.0, 1), (-2.5, 2)]
    assert _hull_segments([0, 1, 2, 3], [10, 9, 8, 2]) == [(-8 / 3, 3)]
    assert _hull_segments([0, 1, 2], [10, 6, 4]) == [(-4.0, 1), (-2.0, 1)]


def test_absorbed_plan_meets_the_deadline_and_stays_under_the_bound(case) -> None:
    """The slack-filling pass never passes its deadline (on the DAG and the engine); no per-stage
    plan, exhaustively, and not the per-action one beat the rank-window bound."""
    sim, plan = case
    grid = clock_grid(sim, stride=4)
    dag = ClockDag.of(sim, plan, grid)
    ag = ActionGrid.of(dag, grid)
    base = dag.evaluate([1410] * 3)
    limit = base.iteration_s * 1.01
    idx = absorb_slack(ag, [0] * len(ag.nodes), limit - dag.tail_s)
    _, span = ag.starts(idx)
    assert span + dag.tail_s <= limit * (1 + 1e-12)
    assert any(i > 0 for i in idx)
    got = ag.energy(idx, span)
    window, free = energy_bound(ag, limit)
    assert free <= window <= got < base.energy_j
    r = sim.run(dataclasses.replace(plan, action_clocks_mhz=ag.action_clocks(idx)))
    assert r.iteration_time_s == pytest.approx(span + dag.tail_s, rel=1e-6)
    assert r.extra.device_energy_j == pytest.approx(got, rel=1e-6)
    best_stage = min(p.energy_j for p in (dag.evaluate(c) for c in itertools.product(grid[:8], repeat=3))
                     if p.iteration_s <= limit)
    assert window <= best_stage
    # The LP optimum is a tighter bound than the rank window, and its rounding a feasible plan.
    lp_idx, lp_energy = lp_plan(ag, limit - dag.tail_s)
    _, lp_span = ag.starts(lp_idx)
    assert lp_span <= (limit - dag.tail_s) * (1 + 1e-9)
    assert window <= lp_energy <= min(got, best_stage) * (1 + 1e-9)
    assert lp_energy <= ag.energy(lp_idx, lp_span) * (1 + 1e-9)


def test_perseus_action_beats_per_stage_within_the_slowdown(case) -> None:
    sim, plan = case
    stage = plan_clocks(sim, plan, "perseus", 0.01, stride=2)
    action = plan_clocks(sim, plan, "perseus_action", 0.01, stride=2)
    assert action.plan.action_clocks_mhz is not None and action.plan.stage_clocks_mhz is None
    assert action.slowdown <= 0.01
    assert action.energy_saving >= stage.energy_saving
    assert action.energy_saving <= action.bounds["lp_exact"] + 1e-6 <= action.bounds["rank_window"] + 2e-6
    info = action.to_dict()
    assert info["method"] == "perseus_action" and len(info["action_clocks_min_mean_max_mhz"]) == 3


def test_action_clocks_on_the_cli_have_one_line_errors() -> None:
    bad = {"dp": 1, "tp": 1, "pp": 2, "global_batch_size": 4, "action_clocks_mhz": [[[1410] * 4, [1410] * 4]] * 2}
    bad["action_clocks_mhz"] = json.loads(json.dumps(bad["action_clocks_mhz"]))
    bad["action_clocks_mhz"][0][1][3] = 1100
    p = subprocess.run([sys.executable, "-m", "mindpipe.cli", "simulate", "--model", "gpt-1.3b", "--cluster",
                        "a100-sxm4-80gb:1x2", "--plan", json.dumps(bad)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "action_clocks_mhz[0][1][3]=1100 is not a supported a100-sxm4-80gb SM clock" in lines[0]
    # A valid plan: the clocks and the devices' energy under them, and no what-if line (the executor runs it).
    bad["action_clocks_mhz"][0][1][3] = 1095
    p = subprocess.run([sys.executable, "-m", "mindpipe.cli", "simulate", "--model", "gpt-1.3b", "--cluster",
                        "a100-sxm4-80gb:1x2", "--plan", json.dumps(bad)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "SM clocks             action_clocks_mhz: 16 clocks, 1095-1410 MHz" in p.stdout
    assert "device energy" in p.stdout and "what-if" not in p.stdout
