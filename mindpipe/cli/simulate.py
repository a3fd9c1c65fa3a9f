"""``mindpipe simulate --model M --cluster C --plan P``: predict one iteration of a plan (torch-free)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindpipe.cli import loaders
from mindpipe.cli.args import count
from mindpipe.cli.output import check_outputs, print_json, stderr
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.frequency import action_clocks_summary
from mindpipe.traces.limits import limit
from mindpipe.traces.result import SimulationResult
from mindpipe.traces.supernet import DEFAULT_SUBNETS, Supernet, default_subnets
from mindpipe.traces.units import plural
from mindpipe.traces.what_if import WHAT_IF_KEYS, plan_value, what_if_used

if TYPE_CHECKING:
    from mindpipe.simulator.subnet_sim import SupernetResult

SUPERNET_ONLY = ("subnets", "no_context_switch", "memory_budget_gib")
GPT_ONLY = ("timeline", "gantt", "action_table", "carbon_csv")

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
    sn = p.add_argument_group("supernets (--model names a supernet)")
    sn.add_argument("--subnets", type=count(1, int(limit("train_steps"))), default=None, metavar="N",
                    help=f"subnets to simulate (default {DEFAULT_SUBNETS}, rounded up to whole batches of a sync plan)")
    sn.add_argument("--no-context-switch", action="store_true",
                    help="keep every stage's whole slice of the supernet on the device (no context switching)")
    sn.add_argument("--memory-budget-gib", type=float, default=None, metavar="GIB",
                    help="per-device memory budget instead of the device's capacity")
    p.set_defaults(func=cmd_simulate)
    return p


def _host_lines(host_gib: list[float], capacity_gib: float | None) -> list[str]:
    """The swapped activations' host memory per rank, marked where it exceeds the host's share."""
    if not host_gib:
        return []
    over = capacity_gib is not None and any(h > capacity_gib for h in host_gib)
    return ["host (swap) by rank   " + ", ".join(f"{h:.2f}" for h in host_gib) + " GiB"
            + (f"   ** exceeds the host's {capacity_gib:.0f} GiB per device **" if over else "")]


def format_result(result: SimulationResult, plan: Plan | None = None) -> str:
    """Human-readable summary of a simulation result; with ``plan``, a line naming its what-if knobs
    (values the simulator prices and the executor does not carry out)."""
    e = result.extra
    lines = [
        f"iteration time        {result.iteration_time_s:.6g} s  ({e.schedule}, {e.num_microbatches} micro-batches)",
        f"throughput            {result.throughput_samples_per_s:.6g} samples/s, {result.throughput_tokens_per_s:.6g} tokens/s",
        f"per device            {result.tflops_per_gpu:.4g} TFLOP/s, MFU {100 * result.mfu:.1f}%"
        # fp8's MFU is against the FP8 dense peak (twice bf16's on H100): say so, or it reads as a slowdown.
        + (" of the fp8 peak" if plan is not None and plan.precision == "fp8" else ""),
        (f"pipeline bubble       {100 * result.bubble_fraction:.1f}% of the pipeline span" if len(e.rank_end_s) != 1
         else f"idle between actions  {100 * result.bubble_fraction:.1f}% of the span (one stage: no pipeline bubble)"),
        f"exposed DP comm       {e.exposed_dp_comm_s:.4g} s",
        "memory by rank (GiB)  " + ", ".join(f"{m:.2f}" for m in result.memory_by_stage_gib)
        + ("" if (result.fits_in_memory if e.fits_in_device_memory is None else e.fits_in_device_memory)
           else "   ** does not fit in device memory **"),
        *_host_lines(e.host_memory_by_stage_gib, e.host_capacity_gib),
        f"energy                {result.energy_j:.6g} J per iteration (facility)",
        f"carbon                {result.carbon_gco2:.6g} gCO2eq per iteration ({e.carbon_intensity_g_per_kwh:.0f} g/kWh)",
    ]
    cal = e.calibration
    if cal is not None:
        lines.append("calibrated            " + "; ".join(
            [f"step overhead {cal.step_overhead_s:.4g} s"]
            + ([f"{cal.cores_per_rank_slots:g} ranks at full speed per host"] if cal.cores_per_rank_slots else [])
            + (["transfers are host copies on the shared cores"] if cal.transfers_on_cores else [])
            + cal.notes))
    if plan is not None:
        lines += _clock_lines(plan, result)
    if e.warning is not None:
        lines.append(f"warning: {e.warning}")
    knobs = what_if_used(plan) if plan is not None else []
    if knobs:
        lines.append("what-if knobs         " + ", ".join(f"{k}={plan_value(getattr(plan, k))}" for k in knobs)
                     + " (simulated only: mindpipe run carries out " + ", ".join(
                         f"{k}={plan_value(WHAT_IF_KEYS[k])}" for k in knobs) + ")")
    return "\n".join(lines)


def _clock_lines(plan: Plan, result: SimulationResult) -> list[str]:
    """The plan's SM clocks as priced (or why they were not), and the devices' energy under them."""
    e = result.extra
    if plan.stage_clocks_mhz is not None:
        what = f"stage_clocks_mhz={plan_value(plan.stage_clocks_mhz)} (one per pipeline stage, locked for the run)"
    elif plan.action_clocks_mhz is not None:
        what = (f"action_clocks_mhz: {action_clocks_summary(plan.action_clocks_mhz)} "
                "(one per forward/backward of each micro-batch, switched between actions)")
    else:
        return []
    if e.stage_clocks_note is not None:
        return [f"SM clocks             {what}; {e.stage_clocks_note}"]
    return [f"SM clocks             {what}", f"device energy         {e.device_energy_j:.6g} J per iteration (GPUs, before PUE)"]


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
    net = loaders.network(args.model)
    if isinstance(net, Supernet):
        return _simulate_supernet(args, net)
    for key in SUPERNET_ONLY:
        if getattr(args, key) is not None and getattr(args, key) is not False:  # 0 is given too
            raise ContractError(f"--{key.replace('_', '-')}", None, "applies to supernets only; --model is a GPT model")
    model = net
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
    if opts.trace is not None:
        _add_trace_notes(result, opts.trace.pricing_notes(model, plan, cluster.gpu))
    _write_files(args, model, plan, result)
    if args.json:
        payload = to_dict(result)
        payload.pop("timeline", None)
        print_json(payload)
    else:
        print(format_result(result, plan))
        from mindpipe.traces.catalog import get_device
        from mindpipe.tuner.space import default_attention

        if not plan.flash_attention and True in default_attention(model, cluster):
            print("attention             explicit kernels (the plan's default); Llama recipes run a fused kernel "
                  "on GPUs: add \"flash_attention\": true to the plan")
        if model.is_llama and not plan.fused_elementwise and get_device(cluster.gpu).kind == "gpu":
            print("norms, rotary, SwiGLU eager PyTorch kernels, as the executor runs them; Megatron-core and Transformer "
                  "Engine fuse each: add \"fused_elementwise\": true to the plan to price that")
    return 0


def _add_trace_notes(result: SimulationResult, notes: list[str]) -> None:
    """Append to ``extra.warning`` what the trace did not measure of this plan (:meth:`Trace.pricing_notes`),
    each once (so a simulator that already notes them is not repeated)."""
    have = result.extra.warning or ""
    new = [n for n in notes if n not in have]
    if new:
        result.extra.warning = "; ".join([have, *new] if have else new)


def format_supernet_result(r: SupernetResult) -> str:
    """Human-readable summary of a simulated supernet run."""
    how = {"csp": f"window {r.window}", "sync": f"batch {r.sync_batch}"}.get(r.schedule, "")
    lines = [
        f"supernet              {r.supernet}: {plural(r.num_subnets, 'subnet')}, {r.schedule}" + (f" ({how})" if how else ""),
        f"throughput            {r.subnets_per_hour:.6g} subnets/hour ({r.time_per_subnet_s:.6g} s per subnet, "
        f"{plural(r.samples_per_subnet, 'sample')} each)",
        f"total time            {r.total_time_s:.6g} s",
        f"pipeline bubble       {100 * r.bubble_fraction:.1f}% of all stages' time",
        f"compute costs         {r.cost_source}; context switching {'on' if r.context_switching else 'off'}",
        "stage  layers  busy   conflict stall  other idle  conflicts (closed form)  in flight  memory GiB",
    ]
    for s in r.stages:
        m = s.memory
        lines.append(f"{s.stage:5d}  {s.layers:6d}  {100 * s.busy_fraction:4.1f}%  {s.conflict_stall_s:12.4g} s  "
                     f"{s.other_idle_s:8.4g} s  {100 * s.conflict_rate:5.1f}% ({100 * s.conflict_rate_closed_form:5.1f}%)"
                     f"        {m.in_flight_peak:5d}  {m.total_gib:8.3f}" + ("" if m.fits else "  ** does not fit **"))
    return "\n".join(lines)


def _simulate_supernet(args: argparse.Namespace, net: Supernet) -> int:
    """The supernet branch of ``simulate``: replay the plan's subnet schedule (:mod:`mindpipe.simulator.subnet_sim`)."""
    from mindpipe.simulator.subnet_sim import SupernetSimulator
    from mindpipe.traces.builtin import config_source

    for key in GPT_ONLY:
        if getattr(args, key) is not None:
            raise ContractError(f"--{key.replace('_', '-')}", None, "is not available for supernets yet")
    if args.memory_budget_gib is not None and not 0 < args.memory_budget_gib < math.inf:
        raise ContractError("--memory-budget-gib", None, f"{args.memory_budget_gib} must be a finite number > 0")
    cluster = loaders.cluster(args.cluster)
    plan = loaders.plan(args.plan)
    trace = loaders.trace(args.trace) if args.trace else None
    sim = SupernetSimulator(net, cluster, trace=trace, calibration=loaders.calibration(args.calibration))
    budget = args.memory_budget_gib * 2**30 if args.memory_budget_gib is not None else None
    result = sim.run(plan, default_subnets(plan) if args.subnets is None else args.subnets,
                     context_switching=not args.no_context_switch, memory_budget_bytes=budget,
                     source=config_source(args.plan, "plan"))
    if args.json:
        print_json(result.to_dict())
    else:
        print(format_supernet_result(result))
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


__all__ = ["GANTT_SUFFIXES", "add_parser", "check_arguments", "cmd_simulate", "format_result", "format_supernet_result"]
