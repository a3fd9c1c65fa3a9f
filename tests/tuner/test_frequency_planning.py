"""Clock planners: the frontier is a frontier, the greedy walk against exhaustive search, EnvPipe's
envelope, the engine's check of the chosen plan, and ``tune --clocks`` / plan errors on the CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Cluster, Plan
from mindpipe.traces.what_if import what_if_used
from mindpipe.tuner import clock_step
from mindpipe.tuner.clock_dag import ClockDag, DagPoint
from mindpipe.tuner.frequency import ClockPlan, clock_grid, envpipe_clocks, pareto, perseus_frontier, plan_clocks


@pytest.fixture(scope="module")
def case() -> tuple[Simulator, Plan]:
    sim = Simulator(load_model("gpt-1.3b"), Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=3))
    plan = Plan(dp=1, tp=1, pp=3, micro_batch_size=1, global_batch_size=12, schedule="1f1b", partition=[6, 8, 10])
    return sim, plan


def test_frontier_is_monotone_and_starts_at_max_clocks(case) -> None:
    sim, plan = case
    grid = clock_grid(sim, stride=4)
    dag = ClockDag.of(sim, plan, grid)
    front = perseus_frontier(dag, grid)
    assert front[0].rank_clocks_mhz == (1410, 1410, 1410)
    assert front[0].iteration_s == pytest.approx(sim.run(plan).iteration_time_s, rel=1e-9)
    for a, b in itertools.pairwise(front):
        assert a.iteration_s < b.iteration_s and a.energy_j > b.energy_j


@pytest.mark.parametrize(("partition", "gbs"), [([6, 8, 10], 12), ([8, 8, 8], 24), ([10, 8, 6], 12)])
def test_greedy_frontier_against_exhaustive_search(partition: list[int], gbs: int) -> None:
    """The greedy frontier is not proven exact: measured against all 7³ clock vectors, every exact
    frontier point is matched by a greedy point no slower with at most 2 % more energy (1 % within
    the 1 % slowdown the planners use)."""
    sim = Simulator(load_model("gpt-1.3b"), Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=3))
    plan = Plan(dp=1, tp=1, pp=3, micro_batch_size=1, global_batch_size=gbs, schedule="1f1b", partition=partition)
    grid = clock_grid(sim, stride=4)[:7]  # 1410 .. 1050 MHz
    dag = ClockDag.of(sim, plan, grid)
    exact = pareto([dag.evaluate(c) for c in itertools.product(grid, repeat=3)])
    greedy = perseus_frontier(dag, grid)
    for p in exact:
        best = min((g.energy_j for g in greedy if g.iteration_s <= p.iteration_s * (1 + 1e-9)), default=float("inf"))
        near = p.iteration_s <= exact[0].iteration_s * 1.01
        assert best <= p.energy_j * (1.01 if near else 1.02)


def test_envpipe_meets_its_envelope_and_saves_energy(case) -> None:
    sim, plan = case
    grid = clock_grid(sim, stride=2)
    dag = ClockDag.of(sim, plan, grid)
    base = dag.evaluate([1410] * 3)
    clocks = envpipe_clocks(dag, grid, base.iteration_s * 1.01)
    got = dag.evaluate(clocks)
    assert got.iteration_s <= base.iteration_s * 1.01
    assert got.energy_j < base.energy_j
    assert clocks[2] == 1410  # the longest stage is critical and keeps its clock


@pytest.mark.parametrize("method", ["perseus", "envpipe"])
def test_plan_clocks_is_checked_by_the_engine(case, method: str) -> None:
    sim, plan = case
    cp = plan_clocks(sim, plan, method, max_slowdown=0.01, stride=2)
    assert cp.plan.stage_clocks_mhz is not None and len(cp.plan.stage_clocks_mhz) == 3
    r = sim.run(cp.plan)
    assert r.iteration_time_s == pytest.approx(cp.iteration_s)
    assert cp.slowdown <= 0.01 and cp.energy_saving > 0.02


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("clocks", "message"), [
    ([1410, 1100], "stage_clocks_mhz[1]=1100 is not a supported a100-sxm4-80gb SM clock"),
    ([1410], "stage_clocks_mhz has 1 entry, expected pp×virtual_stages=2"),
    ([1410, "fast"], "stage_clocks_mhz[1]: must be an integer, got 'fast'"),
])
def test_bad_stage_clocks_exit_2_with_one_line(clocks, message: str) -> None:
    plan = {"dp": 1, "tp": 1, "pp": 2, "global_batch_size": 4, "stage_clocks_mhz": clocks}
    p = _cli("simulate", "--model", "gpt-1.3b", "--cluster", "a100-sxm4-80gb:1x2", "--plan", json.dumps(plan))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def _tune_with_clocks(out, method: str) -> tuple[dict, dict]:
    """``mindpipe tune --clocks METHOD`` of a small gpt-1.3b pp4 1F1B search: (summary, best_plan.json)."""
    p = _cli("tune", "--model", "gpt-1.3b", "--cluster", "a100-sxm4-80gb:1x4", "--budget", "3", "--optimizer", "random",
             "--workers", "1", "--fix", "pp=4", "--fix", "schedule=1f1b", "--out", str(out), "--quiet", "--json",
             "--no-plots", "--clocks", method)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), json.loads((out / "best_plan.json").read_text())


def test_tune_clocks_adds_stage_clocks_to_the_best_plan(tmp_path) -> None:
    summary, best = _tune_with_clocks(tmp_path, "envpipe")
    assert best["stage_clocks_mhz"] == summary["clocks"]["stage_clocks_mhz"] == summary["best_plan"]["stage_clocks_mhz"]
    assert summary["clocks"]["slowdown"] <= 0.01
    assert json.loads((tmp_path / "clocks.json").read_text())["method"] == "envpipe"
    # summary.json is written once, after the clock step: it is what --json printed.
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_tune_clocks_perseus_action_adds_a_clock_per_action_to_the_best_plan(tmp_path) -> None:
    """Per-action clocks are a plan the executor runs, so ``tune --clocks`` offers them: best_plan.json
    carries ``action_clocks_mhz`` (one clock per forward/backward of each micro-batch of every stage)."""
    summary, best = _tune_with_clocks(tmp_path, "perseus_action")
    clocks = best["action_clocks_mhz"]
    m = best["global_batch_size"] // (best["micro_batch_size"] * best["dp"])
    assert best["stage_clocks_mhz"] is None and len(clocks) == 4
    assert all(len(pair) == 2 and all(len(row) == m for row in pair) for pair in clocks)
    assert summary["best_plan"]["action_clocks_mhz"] == clocks and summary["clocks"]["method"] == "perseus_action"
    assert summary["clocks"]["energy_saving"] > 0 and summary["clocks"]["slowdown"] <= 0.01
    assert what_if_used(best) == []  # a plan the executor runs, not a what-if


def test_tune_clocks_on_a_device_without_frequency_data_is_refused_before_the_sweep(tmp_path) -> None:
    p = _cli("tune", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--budget", "2", "--clocks", "perseus",
             "--out", str(tmp_path / "t"), "--quiet", "--no-plots")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--clocks: stage_clocks_mhz: no frequency data for 'cpu'" in lines[0]
    assert not (tmp_path / "t" / "evaluations.csv").exists()  # nothing simulated before the refusal


@pytest.mark.parametrize(("energy_j", "unit"), [(1.5e3, "kJ"), (44e3, "kJ"), (2.2e6, "MJ"), (300.0, "J")])
def test_the_clock_frontier_plot_labels_energy_in_the_unit_of_its_magnitude(monkeypatch, tmp_path, energy_j, unit):
    plan = Plan(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4, stage_clocks_mhz=[1410, 1290])
    frontier = [DagPoint((1410, 1410), 1.0, energy_j), DagPoint((1410, 1290), 1.01, 0.97 * energy_j)]
    cp = ClockPlan("perseus", plan, 1.0, energy_j, 1.01, 0.97 * energy_j, frontier)
    drawn = {}
    monkeypatch.setattr(clock_step, "save_figure", lambda fig, path: drawn.update(ax=fig.axes[0]))
    clock_step.plot_frontier(cp, tmp_path / "clock_frontier.png")
    ax = drawn["ax"]
    assert ax.get_ylabel() == f"GPU energy per iteration ({unit})"
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    assert 1 <= max(ys) < 1000


@pytest.mark.parametrize("max_slowdown", [0.01, 0.05])
def test_the_clock_frontier_marks_the_slowdown_the_plan_was_allowed(monkeypatch, tmp_path, max_slowdown):
    """The dotted line was drawn at +1 % whatever --max-slowdown said."""
    plan = Plan(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4, stage_clocks_mhz=[1410, 1290])
    cp = ClockPlan("perseus", plan, 1.0, 1e3, 1.04, 900.0, [DagPoint((1410, 1410), 1.0, 1e3)])
    drawn = {}
    monkeypatch.setattr(clock_step, "save_figure", lambda fig, path: drawn.update(ax=fig.axes[0]))
    clock_step.plot_frontier(cp, tmp_path / "clock_frontier.png", max_slowdown=max_slowdown)
    (line,) = [ln for ln in drawn["ax"].get_lines() if ln.get_linestyle() == ":"]
    assert line.get_xdata()[0] == pytest.approx(1 + max_slowdown)
    assert line.get_label() == f"allowed: +{100 * max_slowdown:g} % time"
