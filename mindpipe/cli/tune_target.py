"""``mindpipe tune --objective carbon_to_target``: its flags, its inputs and its lines of output.

The objective and the front live in :mod:`mindpipe.tuner.target` and
:mod:`mindpipe.tuner.target_front`; this module only turns flags into those objects (errors are
:class:`~mindpipe.traces.errors.ContractError` naming the flag: exit 2, one line).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindpipe.cli import loaders
from mindpipe.cli.args import count, real
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.units import plural

if TYPE_CHECKING:
    from mindpipe.tuner.target import Placement, TrainingTarget
    from mindpipe.tuner.target_front import TargetChoice

OBJECTIVE = "carbon_to_target"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--target-samples N [--target-batch B] [--max-time-increase F] [--front-plans K]``."""
    g = p.add_argument_group("carbon to target (--objective carbon_to_target; noise scale: --critical-batch)")
    g.add_argument("--target-samples", type=real(0.0, 1e15, lo_open=True), default=None, metavar="N",
                   help="samples a run needed to reach the target at --target-batch (default: N is E_min, the "
                        "small-batch limit); iterations to target = S_min*(1 + B_noise/B), McCandlish et al. 2018")
    g.add_argument("--target-batch", type=real(0.0, float(limit("global_batch_size"))), default=None, metavar="B",
                   help="the global batch --target-samples was measured at (samples)")
    g.add_argument("--max-time-increase", type=real(0.0, 10.0), default=0.03, metavar="F",
                   help="compute hours to target the choice may add over the throughput-optimal plan "
                        "(waiting excluded; default 0.03)")
    g.add_argument("--front-plans", type=count(1, 32), default=3, metavar="K",
                   help="best plans of the search to try clocks and start times on (default 3)")


@dataclass(frozen=True)
class TargetParts:
    """The ``target`` and ``placement`` of :class:`~mindpipe.tuner.objectives.Objective` (None for
    other objectives, and ``placement`` None without ``--carbon-csv``)."""

    target: TrainingTarget | None = None
    placement: Placement | None = None


def objective_parts(args: argparse.Namespace, noise_scale: float | None) -> TargetParts:
    """The target and placement of ``--objective carbon_to_target`` from its flags.

    ``noise_scale`` is the critical batch :func:`mindpipe.tuner.objectives.critical_batch_for`
    found: ``--critical-batch``, else the gradient noise scale a ``--calibration`` file carries.

    Raises:
        ContractError: a target or front flag with another objective, no ``--target-samples`` or noise
            scale, ``--job-hours``/``--iterations`` (the target sets the length), ``--carbon-csv``
            without ``--window`` or the reverse, ``--max-slowdown`` with ``--clocks default`` (no
            clocks to bound).
    """
    from mindpipe.tuner.keys import CLI_ARG_NAMES
    from mindpipe.tuner.target import Placement, TrainingTarget

    if args.objective != OBJECTIVE:
        if args.target_samples is not None or args.target_batch is not None:
            flag = "--target-samples" if args.target_samples is not None else "--target-batch"
            raise ContractError(flag, None, f"{flag} needs --objective {OBJECTIVE}, not {args.objective}")
        for dest in ("max_time_increase", "front_plans"):  # away from their defaults: typed, and unused
            if getattr(args, dest) != args.max_batch_unused[dest]:
                flag = "--" + dest.replace("_", "-")
                raise ContractError(flag, None, f"{flag} shapes the front of --objective {OBJECTIVE}; "
                                                f"{args.objective} does not use it")
        return TargetParts()
    if args.clocks == "default" and args.max_slowdown != args.max_batch_unused["max_slowdown"]:
        raise ContractError("--max-slowdown", None, "bounds the slowdown of the clocks the front plans; with "
                                                    "--clocks default no clocks are planned")
    if args.target_samples is None:
        raise ContractError("--target-samples", None, f"--objective {OBJECTIVE} needs --target-samples N")
    if noise_scale is None:
        raise ContractError("--critical-batch", None, f"--objective {OBJECTIVE} needs the gradient noise scale: "
                                                      "--critical-batch B or a --calibration whose runs measured it")
    for flag, value in (("--job-hours", args.job_hours), ("--iterations", args.iterations)):
        if value is not None:
            raise ContractError(flag, None, f"{flag} is not used with --objective {OBJECTIVE}: the target "
                                            "(--target-samples) sets the job's length")
    target = TrainingTarget(args.target_samples, noise_scale, args.target_batch or 0.0, arg_names=CLI_ARG_NAMES)
    placement = None
    if args.carbon_csv is not None or args.window is not None:
        if args.carbon_csv is None or args.window is None:
            missing = "--carbon-csv" if args.carbon_csv is None else "--window"
            raise ContractError(missing, None, "placing the job in time needs both --carbon-csv and --window")
        series, window = loaders.carbon_window(args.carbon_csv, args.window)
        placement = Placement(series, window, args.interruptible)
    elif args.interruptible:
        raise ContractError("--interruptible", None, "--interruptible places the job in --carbon-csv's series; "
                                                     "give --carbon-csv and --window")
    return TargetParts(target, placement)


def front_config(args: argparse.Namespace) -> Any:
    """The front's width: default clocks and the planner ``--clocks`` names (perseus when none is given;
    ``--clocks default``: default clocks only, no clock planning), :func:`mindpipe.tuner.target_front.front_clocks`."""
    from mindpipe.tuner.target_front import FrontConfig, front_clocks

    return FrontConfig(front_clocks(args.clocks), args.front_plans, args.max_slowdown, args.max_time_increase)


def format_lines(choice: TargetChoice) -> list[str]:
    """The carbon-to-target lines of the text output."""
    from mindpipe.tuner.target_front import saving

    c, ref = choice.chosen, choice.reference
    cost, gain = c.cost, saving(c, ref)
    where = (f"starts {c.start}, {plural(len(c.run_hours), 'run hour')}, waits {cost.wait_hours:.4g} h"
             if c.start else "annual intensity (no --carbon-csv)")
    clocks = c.candidate.plan.stage_clocks_mhz
    return [
        f"to target        {cost.iterations:.6g} iterations, {cost.compute_hours:.4g} h computing "
        f"({gain['compute_time_increase_fraction']:+.2%} vs the throughput-optimal plan), {where}",
        f"clocks           {c.candidate.clocks}" + (f": stage_clocks_mhz={clocks}" if clocks else "")
        + (f" ({choice.clock_note})" if choice.clock_note else ""),
        f"carbon           {cost.carbon_gco2 / 1e3:.6g} kgCO2, {cost.energy_kwh:.6g} kWh vs "
        f"{ref.cost.carbon_gco2 / 1e3:.6g} kgCO2, {ref.cost.energy_kwh:.6g} kWh for the throughput-optimal "
        f"plan started now at default clocks; saving {gain['carbon_saving_fraction']:.1%}",
        f"front            {choice.front_points} of {choice.priced_points} (plan, clocks, start) points "
        "(target_front.csv, target_front.png, target.json)",
    ]


__all__ = ["OBJECTIVE", "TargetParts", "add_arguments", "format_lines", "front_config", "objective_parts"]
