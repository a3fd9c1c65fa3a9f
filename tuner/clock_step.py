"""``tune --clocks``: the step after the plan search that adds SM clocks to the best plan
(``stage_clocks_mhz``; ``action_clocks_mhz`` for ``perseus_action``).

Clocks do not change which plan is fastest at default clocks by more than the slowdown allowed,
so they are planned after the search, on the best plan only: the plan search stays the same
space (and cost), and the clock plan is judged against that plan at default clocks. The step
rewrites ``best_plan.json`` with the clocks, writes ``clocks.json`` (baseline, chosen clocks,
engine-simulated time and energy, Perseus's frontier) and ``clock_frontier.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.atomic import figure, save_figure, write_text
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.schema import write_json
from mindpipe.traces.trace import Trace
from mindpipe.traces.units import ENERGY_UNITS, scaled_unit
from mindpipe.tuner.frequency import ClockPlan, plan_clocks


def plot_frontier(cp: ClockPlan, path: Path, title: str = "", max_slowdown: float = 0.01) -> None:
    """Time–energy frontier (DAG) with the baseline, the allowed slowdown and the chosen plan (engine) marked."""
    # the unit that puts the values between 1 and 1000 (kJ for a small model's iteration, MJ for a large one)
    unit, per = scaled_unit([cp.baseline_energy_j, cp.energy_j, *(p.energy_j for p in cp.frontier)], ENERGY_UNITS)
    fig, ax = figure(figsize=(6, 4))
    if cp.frontier:
        ax.plot([p.iteration_s for p in cp.frontier], [p.energy_j / per for p in cp.frontier], ".-",
                label="Perseus frontier (DAG)")
    ax.plot([cp.baseline_s], [cp.baseline_energy_j / per], "ks", label="default clocks")
    ax.plot([cp.iteration_s], [cp.energy_j / per], "r*", markersize=12,
            label=f"{cp.method}: {cp.energy_saving:.1%} less energy, {cp.slowdown:+.2%} time")
    ax.axvline(cp.baseline_s * (1 + max_slowdown), color="grey", linestyle=":",
               label=f"allowed: +{100 * max_slowdown:g} % time")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel(f"GPU energy per iteration ({unit})")
    which = "per-action" if cp.plan.action_clocks_mhz is not None else "per-stage"
    ax.set_title(title or f"{which} SM clocks: time vs energy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def add_stage_clocks(out: str | Path, plan: Plan, model: Model, cluster: Cluster, method: str,
                     max_slowdown: float = 0.01, *, trace: Trace | None = None, calibration: Calibration | None = None,
                     stride: int = 1, plots: bool = True) -> ClockPlan:
    """Plan clocks for ``plan`` and write it with them to ``out/best_plan.json`` (module docstring).

    Returns:
        The clock plan (``.plan``: ``plan`` with its ``stage_clocks_mhz`` or ``action_clocks_mhz``).

    Raises:
        ContractError: the device has no frequency data.
    """
    out = Path(out)
    sim = Simulator(model, cluster, trace=trace, calibration=calibration)
    cp = plan_clocks(sim, plan, method, max_slowdown, stride)
    write_json(cp.plan, out / "best_plan.json")
    write_text(out / "clocks.json", json.dumps(cp.to_dict(), indent=1) + "\n")
    if plots:
        plot_frontier(cp, out / "clock_frontier.png", max_slowdown=max_slowdown)
    return cp


__all__ = ["add_stage_clocks", "plot_frontier"]
