"""The ``mindpipe`` command line: thin wiring from subcommands to library calls.

Every input problem is reported as one line ``mindpipe: error: <file>: <key>: <rule>`` on stderr
with exit code 2, never a traceback. ``--json`` prints exactly one JSON object on stdout;
progress always goes to stderr. torch is imported only by the subcommands that need it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mindpipe import __version__
from mindpipe.traces.builtin import load_model, model_names
from mindpipe.traces.errors import ContractError
from mindpipe.traces.summary import format_summary, summarize
from mindpipe.traces.trace import Trace

EXIT_USAGE = 2


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _command_line(argv: Sequence[str]) -> str:
    return "mindpipe " + " ".join(shlex.quote(a) for a in argv)


def _emit(args: argparse.Namespace, trace: Trace, out: str | None) -> None:
    if out:
        trace.save(out)
        _stderr(f"wrote {out}")
    if getattr(args, "json", False):
        payload: dict[str, Any] = summarize(trace)
        payload["out"] = out
        print(json.dumps(payload))
    else:
        print(format_summary(trace))


def cmd_profile(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``mindpipe profile MODEL``: per-layer trace of the GPT model on this machine."""
    from mindpipe.traces.profiler import ProfileOptions, profile_model  # imports torch

    model = load_model(args.model)
    opts = ProfileOptions(
        micro_batch_size=args.micro_batch_size,
        seq_len=args.seq_len,
        device=args.device,
        dtype=args.dtype,
        granularity=args.granularity,
        warmup=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
    )
    trace = profile_model(model, opts, command=_command_line(argv), progress=None if args.quiet else _stderr)
    _emit(args, trace, args.out)
    return 0


def cmd_import(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``mindpipe import {aicb,torch-profiler} FILE``: convert another tool's trace."""
    model = load_model(args.model) if args.model else None
    common = {
        "device": args.device,
        "model": model,
        "micro_batch_size": args.micro_batch_size,
        "seq_len": args.seq_len,
        "dtype": args.dtype,
        "command": _command_line(argv),
    }
    if args.format == "aicb":
        from mindpipe.traces.importers.aicb import import_aicb

        trace = import_aicb(args.file, **common)
    else:
        from mindpipe.traces.importers.torch_profiler import import_torch_profiler

        trace = import_torch_profiler(args.file, group=args.group, pattern=args.pattern, steps=args.steps, **common)
    _emit(args, trace, args.out)
    return 0


def cmd_inspect(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``mindpipe inspect TRACE``: summary table; checks the trace against ``--model``."""
    trace = Trace.load(args.trace)
    if args.model:
        trace.check_model(load_model(args.model), source=args.trace)
    _emit(args, trace, None)
    return 0


def _load_trace_arg(arg: str) -> Trace:
    """A trace file, or the name of a shipped trace (e.g. ``gpt-mini.cpu``)."""
    from pathlib import Path

    from mindpipe.traces.data import load_shipped_trace, shipped_trace_names

    if not Path(arg).exists() and arg in shipped_trace_names():
        return load_shipped_trace(arg)
    return Trace.load(arg)


def _format_result(result: Any) -> str:
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


def cmd_simulate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``mindpipe simulate``: predict one iteration of a plan (the ``simulate`` contract)."""
    import datetime as dt

    from mindpipe.simulator.api import SimulationOptions, simulate
    from mindpipe.simulator.energy import load_hourly_intensity
    from mindpipe.simulator.timeline import write_chrome_trace, write_gantt
    from mindpipe.traces.builtin import load_cluster, load_plan
    from mindpipe.traces.errors import ContractError as _CE
    from mindpipe.traces.schema import to_dict

    model = load_model(args.model)
    cluster = load_cluster(args.cluster)
    plan = load_plan(args.plan)
    opts = SimulationOptions(timeline=bool(args.timeline or args.gantt))
    if args.trace:
        trace = _load_trace_arg(args.trace)
        trace.check_model(model, source=args.trace)
        opts.trace = trace
    if args.calibration:
        from mindpipe.traces.calibration import load_calibration

        opts.calibration = load_calibration(args.calibration)
    if args.carbon_csv:
        when = dt.datetime.fromisoformat(args.start) if args.start else None
        if when is None:
            raise _CE("--start", None, "--carbon-csv needs --start YYYY-MM-DDTHH:MM (UTC) of the iteration")
        opts.hourly_intensity = (load_hourly_intensity(args.carbon_csv), when)
    result = simulate(model, cluster, plan, opts)
    if args.timeline and result.timeline is not None:
        write_chrome_trace(result.timeline, args.timeline, label=f"simulated {plan.schedule}")
        _stderr(f"wrote {args.timeline}")
    if args.action_table:
        from mindpipe.simulator.action_table import write_csv
        from mindpipe.simulator.schedules import build_schedule

        write_csv(build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages), args.action_table)
        _stderr(f"wrote {args.action_table}")
    if args.gantt and result.timeline is not None:
        write_gantt(result.timeline, args.gantt, title=f"{model.label}: {plan.schedule}, pp={plan.pp} (simulated)")
        _stderr(f"wrote {args.gantt}")
    if args.json:
        payload = to_dict(result)
        payload.pop("timeline", None)
        print(json.dumps(payload))
    else:
        print(_format_result(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = argparse.ArgumentParser(prog="mindpipe", description="Plan, simulate and run 4D-parallel training.")
    p.add_argument("--version", action="version", version=f"mindpipe {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prof = sub.add_parser("profile", help="profile a model layer by layer on this machine's CPU or GPU")
    prof.add_argument("model", metavar="MODEL", help=f"JSON file, inline JSON or built-in ({', '.join(model_names())})")
    prof.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    prof.add_argument("--micro-batch-size", type=int, default=1, help="sequences per micro-batch (default 1)")
    prof.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's)")
    prof.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="parameter/activation dtype")
    prof.add_argument("--granularity", default="layer", choices=["layer", "op"], help="layers, or operators inside blocks")
    prof.add_argument("--warmup", type=int, default=3, help="untimed runs per layer (default 3)")
    prof.add_argument("--repeats", type=int, default=10, help="timed runs per layer; the median is kept (default 10)")
    prof.add_argument("--seed", type=int, default=0)
    prof.add_argument("--out", required=True, help="trace JSON to write")
    prof.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    prof.add_argument("--quiet", action="store_true", help="no progress on stderr")
    prof.set_defaults(func=cmd_profile)

    imp = sub.add_parser("import", help="convert an AICB workload or a torch.profiler Chrome trace")
    imp.add_argument("format", choices=["aicb", "torch-profiler"])
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--out", required=True, help="trace JSON to write")
    imp.add_argument("--model", default=None, help="the model the trace describes (file or built-in name)")
    imp.add_argument("--device", default=None, help="device label (default: guessed from the file)")
    imp.add_argument("--micro-batch-size", type=int, default=None)
    imp.add_argument("--seq-len", type=int, default=None)
    imp.add_argument("--dtype", default="unknown", choices=["fp32", "bf16", "fp16", "unknown"])
    imp.add_argument("--group", default="auto", choices=["auto", "record_function", "module"], help="torch-profiler: how to find layers")
    imp.add_argument("--pattern", default=None, help="torch-profiler: regex selecting the layer ranges")
    imp.add_argument("--steps", type=int, default=None, help="torch-profiler: profiled steps to divide by")
    imp.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    imp.set_defaults(func=cmd_import)

    ins = sub.add_parser("inspect", help="summarise a trace file and check it against a model")
    ins.add_argument("trace", metavar="TRACE")
    ins.add_argument("--model", default=None, help="fail unless the trace was taken for this model")
    ins.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    ins.set_defaults(func=cmd_inspect)

    sim = sub.add_parser("simulate", help="predict iteration time, memory, energy and carbon of a plan")
    sim.add_argument("--model", required=True, help="model JSON file, inline JSON or built-in name")
    sim.add_argument("--cluster", required=True, help="cluster JSON file, inline JSON, DEVICE or DEVICE:NODESxPER_NODE")
    sim.add_argument("--plan", required=True, help="plan JSON file or inline JSON")
    sim.add_argument("--trace", default=None, help="per-layer trace to use instead of the hardware model")
    sim.add_argument("--calibration", default=None, metavar="FILE",
                     help="constants fitted from measured runs (mindpipe calibrate)")
    sim.add_argument("--timeline", default=None, metavar="FILE", help="write a Chrome trace (Perfetto) of the iteration")
    sim.add_argument("--gantt", default=None, metavar="FILE.png", help="write a Gantt chart of the iteration")
    sim.add_argument("--action-table", default=None, metavar="FILE.csv",
                     help="write the schedule's per-rank action order as torch.distributed.pipelining CSV")
    sim.add_argument("--carbon-csv", default=None, metavar="CSV", help="hourly grid intensity (Electricity Maps CSV)")
    sim.add_argument("--start", default=None, help="with --carbon-csv: UTC start time of the iteration (ISO format)")
    sim.add_argument("--json", action="store_true", help="print one JSON object (the simulation result) on stdout")
    sim.set_defaults(func=cmd_simulate)

    from mindpipe.tuner.cli import add_parser as add_tune_parser  # the handler lives in tuner/ (torch-free)

    add_tune_parser(sub)
    from mindpipe.simulator.perf.cli import add_parser as add_validate_parser  # handler in simulator/perf (torch-free)

    add_validate_parser(sub)
    from mindpipe.simulator.calibrate.cli import add_parser as add_calibrate_parser  # torch-free

    add_calibrate_parser(sub)
    from mindpipe.loop import add_parser as add_demo_parser  # torch only once it runs

    add_demo_parser(sub)

    from mindpipe.executor.config import add_run_arguments  # torch-free

    def cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
        from mindpipe.executor.launch import cmd_run as run_plan  # the handler; imports torch

        return run_plan(args, argv)

    run = sub.add_parser("run", help="train a plan with torch.distributed (wraps torchrun) and measure it")
    add_run_arguments(run, launcher=True)
    run.set_defaults(func=cmd_run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mindpipe`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace, Sequence[str]], int] = args.func
    try:
        return func(args, argv)
    except ContractError as e:
        _stderr(f"mindpipe: error: {e}")
        return EXIT_USAGE
    except OSError as e:
        _stderr(f"mindpipe: error: {getattr(e, 'filename', '') or ''}: {e.strerror or e}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _stderr("mindpipe: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
