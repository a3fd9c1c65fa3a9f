"""``mindpipe simulate --model M --cluster C --plan P``: predict one iteration of a plan (torch-free)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mindpipe.cli import loaders
from mindpipe.cli.output import check_outputs, print_json, stderr
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.result import SimulationResult

GANTT_SUFFIXES = (".png", ".pdf", ".svg")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``simulate`` subcommand to ``sub`` and return its parser."""
    p = sub.add_parser("simulate", help="predict iteration time, memory, energy and carbon of a plan")
    p.add_argument("--model", required=True, help="model JSON file, inline JSON or built-in name")
    p.add_argument("--cluster", required=True, help="cluster JSON file, inline JSON, DEVICE or DEVICE:NODESxPER_NODE")
    p.add_argument("--plan", required=True, help="plan JSON file or inline JSON")
    p.add_argument("--trace", default=None, help="per-layer trace (file or shipped name) instead of the hardware model")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="constants fitted from measured runs (mindpipe calibrate)")
    p.add_argument("--timeline", default=None, metavar="FILE", help="write a Chrome trace (Perfetto) of the iteration")
    p.add_argument("--gantt", default=None, metavar="FILE.png",
                   help=f"write a Gantt chart of the iteration ({', '.join(GANTT_SUFFIXES)})")
    p.add_argument("--action-table", default=None, metavar="FILE.csv",
                   help="write the schedule's per-rank action order as torch.distributed.pipelining CSV")
    p.add_argument("--carbon-csv", default=None, metavar="CSV", help="hourly grid intensity (Electricity Maps CSV)")
    p.add_argument("--start", default=None, help="with --carbon-csv: UTC start time of the iteration (ISO format)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the simulation result) on stdout")
    p.set_defaults(func=cmd_simulate)
    return p


def format_result(result: SimulationResult) -> str:
    """Human-readable summary of a simulation result."""
    e = result.extra
    lines = [
        f"iteration time        {result.iteration_time_s:.6g} s  ({e.get('schedule')}, {e.get('num_microbatches')} micro-batches)",
        f"throughput            {result.throughput_samples_per_s:.6g} samples/s, {result.throughput_tokens_per_s:.6g} tokens/s",
        f"per device            {result.tflops_per_gpu:.4g} TFLOP/s, MFU {100 * result.mfu:.1f}%",
        f"pipeline bubble       {100 * result.bubble_fraction:.1f}% of the pipeline span",
        f"exposed DP comm       {e.get('exposed_dp_comm_s', 0.0):.4g} s",
        "memory by stage (GiB) " + ", ".join(f"{m:.2f}" for m in result.memory_by_stage_gib)
        + ("" if result.fits_in_memory else "   ** does not fit in device memory **"),
        f"energy                {result.energy_j:.6g} J per iteration (facility)",
        f"carbon                {result.carbon_gco2:.6g} gCO2eq per iteration ({e.get('carbon_intensity_g_per_kwh'):.0f} g/kWh)",
    ]
    if "calibration" in e:
        cal = e["calibration"]
        lines.append("calibrated            " + "; ".join(
            [f"step overhead {cal['step_overhead_s']:.4g} s"]
            + ([f"{cal['cores_per_rank_slots']:g} ranks at full speed per host"] if cal["cores_per_rank_slots"] else [])
            + (["transfers are host copies on the shared cores"] if cal.get("transfers_on_cores") else [])
            + cal["notes"]))
    if "warning" in e:
        lines.append(f"warning: {e['warning']}")
    return "\n".join(lines)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse argument combinations that cannot work, before any input is read.

    Raises:
        ContractError: a ``--gantt`` file type matplotlib is not asked to write here, or ``--start``
            without ``--carbon-csv`` (it would be ignored).
    """
    if args.gantt is not None and Path(args.gantt).suffix.lower() not in GANTT_SUFFIXES:
        raise ContractError("--gantt", None, f"{args.gantt!r}: a Gantt chart is written as "
                                             f"{', '.join(GANTT_SUFFIXES)} (by the file's suffix)")
    if args.start is not None and args.carbon_csv is None:
        raise ContractError("--start", None, "--start is the iteration's start in --carbon-csv's series; "
                                             "give --carbon-csv too")
    check_outputs([args.timeline, args.gantt, args.action_table])


def cmd_simulate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Simulate the plan; write the files asked for; print the result (one JSON object with ``--json``)."""
    from mindpipe.simulator.api import SimulationOptions
    from mindpipe.traces.builtin import config_source
    from mindpipe.traces.schema import to_dict

    check_arguments(args)
    model = loaders.model(args.model)
    cluster = loaders.cluster(args.cluster)
    plan = loaders.plan(args.plan)
    opts = SimulationOptions(timeline=bool(args.timeline or args.gantt))
    if args.trace:
        opts.trace = loaders.trace(args.trace, model)
    opts.calibration = loaders.calibration(args.calibration)
    opts.hourly_intensity = loaders.carbon(args.carbon_csv, args.start)
    sim = opts.simulator(model, cluster)
    sim.check(plan, source=config_source(args.plan, "plan"))  # a rule tying the plan to the model names the plan
    result = sim.run(plan, timeline=opts.timeline, hourly=opts.hourly_intensity)
    _write_files(args, model, plan, result)
    if args.json:
        payload = to_dict(result)
        payload.pop("timeline", None)
        print_json(payload)
    else:
        print(format_result(result))
    return 0


def _write_files(args: argparse.Namespace, model: Model, plan: Plan, result: SimulationResult) -> None:
    """``--timeline``, ``--action-table`` and ``--gantt``, each named on stderr once written."""
    from mindpipe.simulator.timeline import write_chrome_trace, write_gantt

    if args.timeline and result.timeline is not None:
        write_chrome_trace(result.timeline, args.timeline, label=f"simulated {plan.schedule}")
        stderr(f"wrote {args.timeline}")
    if args.action_table:
        from mindpipe.simulator.action_table import write_csv
        from mindpipe.simulator.schedules import build_schedule

        write_csv(build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages), args.action_table)
        stderr(f"wrote {args.action_table}")
    if args.gantt and result.timeline is not None:
        write_gantt(result.timeline, args.gantt, title=f"{model.label}: {plan.schedule}, pp={plan.pp} (simulated)")
        stderr(f"wrote {args.gantt}")


__all__ = ["GANTT_SUFFIXES", "add_parser", "check_arguments", "cmd_simulate", "format_result"]
