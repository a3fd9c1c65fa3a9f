"""``mindpipe tune``: search plans with the simulator as cost function (:func:`mindpipe.tuner.api.tune`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindpipe.cli import loaders, tune_target
from mindpipe.cli.args import count, real, seed
from mindpipe.cli.output import print_json, stderr
from mindpipe.traces.frequency import action_clocks_summary
from mindpipe.traces.limits import limit
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.units import plural
from mindpipe.traces.what_if import SEARCHED_WHAT_IF_KEYS, WHAT_IF_KEYS
from mindpipe.tuner.objectives import OBJECTIVES
from mindpipe.tuner.optimizers import OPTIMIZERS, SURROGATES

if TYPE_CHECKING:
    from mindpipe.traces.calibration import Calibration
    from mindpipe.traces.config import Model
    from mindpipe.traces.trace import Trace
    from mindpipe.tuner.frequency import ClockPlan
    from mindpipe.tuner.objectives import CriticalBatch, Objective
    from mindpipe.tuner.summary import TuneSummary
    from mindpipe.tuner.timeshift import ShiftReport

MAX_WORKERS = 256  # local evaluation processes, and proposals per round
# Options of the search the other objectives run, which --objective max_batch (an exhaustive search of
# the global batch over dp x tp x pp meshes) does not use: given away from its default, one is refused.
MAX_BATCH_UNUSED = ("global_batch", "constraint", "critical_batch", "optimizer", "surrogate", "initial_points",
                    "budget", "batch_size", "dask", "resume", "carbon_csv", "window", "job_hours", "iterations",
                    "interruptible", "target_samples", "target_batch", "max_time_increase", "front_plans", "clocks",
                    "max_slowdown")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand to ``subparsers`` and return its parser."""
    p = subparsers.add_parser("tune", help="search for the best 4D plan with the simulator as cost function")
    _add_input_arguments(p)
    _add_objective_arguments(p)
    _add_space_arguments(p)
    _add_search_arguments(p)
    _add_evaluation_arguments(p)
    _add_output_arguments(p)
    _add_timeshift_arguments(p)
    tune_target.add_arguments(p)
    _add_clock_arguments(p)
    p.set_defaults(func=cmd_tune, max_batch_unused={dest: p.get_default(dest) for dest in MAX_BATCH_UNUSED})
    return p


def _add_input_arguments(p: argparse.ArgumentParser) -> None:
    """The model, the cluster and what prices them: ``--model --cluster --trace --calibration``."""
    p.add_argument("--model", required=True, help="model JSON file, inline JSON or built-in name")
    p.add_argument("--cluster", required=True, help="cluster JSON file, inline JSON, DEVICE or DEVICE:NODESxPER_NODE")
    p.add_argument("--trace", default=None, help="per-layer trace for the compute model (file or shipped name)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="constants fitted from measured runs (mindpipe calibrate)")


def _add_objective_arguments(p: argparse.ArgumentParser) -> None:
    """What to optimise and under which limits: ``--objective --microbatches --critical-batch --constraint``."""
    p.add_argument("--objective", default="throughput", choices=(*OBJECTIVES, "max_batch"),
                   help="throughput (samples/s), energy or carbon per sample, goodput, or max_batch: the largest "
                        "global batch that fits, with the partition and memory policy chosen together "
                        "(default throughput)")
    p.add_argument("--microbatches", type=count(1, int(limit("global_batch_size"))), default=None, metavar="M",
                   help="max_batch: micro-batches per iteration (default: pp, the fewest that fill the pipeline)")
    p.add_argument("--critical-batch", type=real(0.0, float(limit("global_batch_size")), lo_open=True), default=None,
                   metavar="B",
                   help="critical batch size (gradient noise scale, McCandlish et al. 2018) for goodput; overrides "
                        "the noise scale a --calibration file carries (measured by mindpipe run)")
    p.add_argument("--constraint", action="append", default=[], metavar="METRIC<=X",
                   help="e.g. carbon_per_sample<=0.05 or throughput>=100 (repeatable)")


def _add_space_arguments(p: argparse.ArgumentParser) -> None:
    """The plan space: ``--global-batch --fix --what-if --search --partitioner``."""
    p.add_argument("--global-batch", default=None, metavar="N|A,B|A:B",
                   help="global batch: fixed (N), a list (A,B,...), or A:B, doubling from A up to B (3:100 is 3,6,...,96; "
                        "default: the smallest power of two >= 4x devices)")
    p.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE",
                   help="pin a plan key, e.g. --fix tp=8 --fix recompute=full (KEY=A,B restricts to a set)")
    p.add_argument("--what-if", nargs="?", const="all", default=None, metavar="KEY[,KEY]",
                   help=f"also search what-if knobs, which only the simulator models (the executor runs "
                        f"{', '.join(f'{k}={json.dumps(v)}' for k, v in SEARCHED_WHAT_IF_KEYS.items())}): all of them, or "
                        "the ones named; plans that use one are marked in every output. Not in all: blocking_p2p "
                        "(Megatron's blocking pipeline exchanges: name it with --fix blocking_p2p=true to plan "
                        "for a Megatron-LM deployment), fused_elementwise (a Llama block's norms, rotary "
                        "embedding and SwiGLU as Transformer Engine's fused kernels: --fix fused_elementwise=true) "
                        "and dp_impl (Megatron-LM's DDP and distributed optimizer instead of FSDP2: "
                        "--fix dp_impl=megatron)")
    p.add_argument("--search", default=None, metavar="KEY[,KEY]",
                   help="also search plan keys the default space leaves at one value: cp (context parallelism: "
                        "each mesh's data-parallel devices split into dp x cp, with FlashAttention; cp=1 is then "
                        "tried with FlashAttention too)")
    p.add_argument("--partitioner", default="balanced",
                   help="balanced, pipedream, even, vpipe or dawnpiper (the last two choose per-block keep/recompute/swap "
                        "with the partition), or a comma list searched as a dimension (default balanced)")


def _add_search_arguments(p: argparse.ArgumentParser) -> None:
    """The search algorithm: ``--optimizer --surrogate --initial-points --budget --seed``."""
    p.add_argument("--optimizer", default="bo", choices=OPTIMIZERS, help="bo, random or grid (default bo)")
    p.add_argument("--surrogate", default="gp", choices=SURROGATES, help="bo surrogate: gp, rf or et (default gp)")
    p.add_argument("--initial-points", type=count(1, int(limit("tune_budget"))), default=10,
                   help="bo: random points before the surrogate (default 10)")
    p.add_argument("--budget", type=count(1, int(limit("tune_budget"))), default=60,
                   help="most simulations to run (default 60)")
    p.add_argument("--seed", type=seed(), default=0)


def _add_evaluation_arguments(p: argparse.ArgumentParser) -> None:
    """Where and how plans are simulated: ``--workers --batch-size --dask --dask-timeout --subnets``."""
    p.add_argument("--workers", type=count(1, MAX_WORKERS), default=2,
                   help="parallel local evaluation processes (default 2)")
    p.add_argument("--batch-size", type=count(1, MAX_WORKERS), default=None,
                   help="proposals per round (default: --workers)")
    p.add_argument("--dask", default=None, metavar="ADDRESS", help="evaluate on a Dask cluster (scheduler address)")
    p.add_argument("--dask-timeout", type=real(0.0, 3600.0, lo_open=True), default=30.0, metavar="SECONDS",
                   help="how long to wait for the Dask scheduler before giving up (default 30)")
    p.add_argument("--subnets", type=count(1, int(limit("train_steps"))), default=None, metavar="N",
                   help="supernets: subnets each plan is simulated for (default 256; the objective is subnets "
                        "trained per hour)")


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """Outputs and state: ``--out --resume --no-plots --json --quiet``."""
    p.add_argument("--out", required=True, metavar="DIR", help="output and state directory")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep stored in --out (same search arguments; bo also the same batch size)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--json", action="store_true", help="print one JSON summary object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")


def _add_clock_arguments(p: argparse.ArgumentParser) -> None:
    """``--clocks --max-slowdown``: per-stage SM clocks chosen after the search (:mod:`mindpipe.tuner.clock_step`)."""
    clocks = p.add_argument_group("frequency planning (a step after the search, on the best plan)")
    # None (not typed) is told apart from a typed "default": carbon_to_target's front plans Perseus
    # clocks unless told otherwise, and --clocks default keeps the GPUs at their default clock.
    clocks.add_argument("--clocks", default=None, choices=("default", "perseus", "envpipe", "perseus_action"),
                        help="add SM clocks to the best plan: per pipeline rank (stage_clocks_mhz) by perseus "
                             "(time-energy frontier) or envpipe (bubble-slack heuristic); per forward/backward of "
                             "each micro-batch (action_clocks_mhz) by perseus_action (not with --objective "
                             "carbon_to_target); or default (none; the default, except that --objective "
                             "carbon_to_target tries perseus unless --clocks default)")
    clocks.add_argument("--max-slowdown", type=real(0.0, 1.0), default=0.01, metavar="F",
                        help="longest iteration the clocks may cost, relative to default clocks (default 0.01)")


def _add_timeshift_arguments(p: argparse.ArgumentParser) -> None:
    """``--carbon-csv --window (--job-hours | --iterations) [--interruptible]`` (:mod:`mindpipe.tuner.timeshift`)."""
    g = p.add_argument_group("time-shifting (--objective carbon with hourly grid intensity)")
    g.add_argument("--carbon-csv", default=None, metavar="CSV", help="hourly grid intensity (Electricity Maps CSV)")
    g.add_argument("--window", default=None, metavar="START/END",
                   help="ISO-8601 interval of the instants the job may start at, both included "
                        "(e.g. 2024-06-01T00:00Z/2024-06-02T00:00Z)")
    g.add_argument("--job-hours", type=real(0.0, 24 * 366, lo_open=True), default=None, metavar="H",
                   help="the job's wall length for every plan")
    g.add_argument("--iterations", type=count(1, int(limit("train_steps"))), default=None, metavar="N",
                   help="the job's length in iterations (hours = N x each plan's simulated iteration time)")
    g.add_argument("--interruptible", action="store_true",
                   help="the job checkpoints and may pause: run the cleanest hours before END + job length")


def _timeshift(args: argparse.Namespace) -> Any:
    """The job to place in time, or None without ``--carbon-csv``.

    Raises:
        ContractError: a time-shifting flag without ``--carbon-csv``, ``--carbon-csv`` without
            ``--window`` or with another objective, both or neither of ``--job-hours`` and
            ``--iterations``, a window the series does not cover.
    """
    from mindpipe.traces.errors import ContractError
    from mindpipe.tuner.keys import CLI_ARG_NAMES
    from mindpipe.tuner.timeshift import JobLength, TimeShift

    given = [flag for flag, v in (("--window", args.window), ("--job-hours", args.job_hours),
                                  ("--iterations", args.iterations), ("--interruptible", args.interruptible or None))
             if v is not None]
    if args.objective == tune_target.OBJECTIVE:  # the target sets the length (tune_target.objective_parts)
        return None
    if args.carbon_csv is None:
        if given:
            raise ContractError(given[0], None, f"{given[0]} places the job in --carbon-csv's series; give --carbon-csv")
        return None
    if args.objective != "carbon":
        raise ContractError("--carbon-csv", None, f"time-shifting needs --objective carbon, not {args.objective}")
    if args.window is None:
        raise ContractError("--window", None, "--carbon-csv needs --window START/END (when the job may start)")
    job = JobLength(args.job_hours, args.iterations, arg_names=CLI_ARG_NAMES)
    series, window = loaders.carbon_window(args.carbon_csv, args.window)
    return TimeShift(series, window, job, args.interruptible)


def _format_timeshift(r: ShiftReport) -> list[str]:
    sched = r.schedule
    kind = "interruptible" if sched.interruptible else "non-interruptible"
    runs = "; ".join(f"{seg.start[:16]} to {seg.end[:16]}" for seg in r.steps)
    return [
        f"start            {r.start} ({kind}, {r.job_hours:.4g} h job, waits {sched.wait_s / 3600:.4g} h "
        f"after the window start)",
        f"runs             {runs} (UTC; {plural(len(sched.run_hours()), 'hour')}; steps to pause at in timeshift.json)",
        f"carbon           {r.carbon_gco2:.6g} gCO2 at {sched.intensity_g_per_kwh:.4g} g/kWh vs "
        f"{r.carbon_gco2_if_now:.6g} gCO2 for {r.reference.label} started now; saving "
        f"{100 * r.carbon_saving_fraction:.1f} % per sample (the chosen plan started now: "
        f"{r.carbon_gco2_same_plan_if_now:.6g} gCO2)",
    ]


def _outputs(summary: TuneSummary) -> str:
    """The files the sweep wrote, as :func:`mindpipe.tuner.output.write_outputs` recorded them, and the summary."""
    return f"outputs          {summary.out}/" + ", ".join([*summary.written, "summary.json"])


def _infeasible(summary: TuneSummary) -> list[str]:
    """Two lines: the simulations that were infeasible, per reason; then what was refused before
    simulating — combinations the plan rules filtered (never plans) and plans the memory estimate
    refused — which the searcher never spent a simulation on."""
    simulated, refused = summary.infeasible_simulated, dict(summary.refused_before_simulation)
    among = f"of the {plural(summary.evaluations, 'simulation')}"
    first = (f"{sum(simulated.values())} {among}: " + ", ".join(f"{k} {v}" for k, v in sorted(simulated.items()))
             if simulated else f"none {among}")
    words = {"rules": lambda n: f"{plural(n, 'combination')} broke a plan rule",
             "out_of_memory": lambda n: f"{plural(n, 'plan')} did not fit the memory estimate"}
    said = [words[k](refused.pop(k)) for k in words if k in refused] + [f"{k} {v}" for k, v in sorted(refused.items())]
    total = sum(summary.refused_before_simulation.values())
    return [f"infeasible       {first}",
            f"refused          {total} before simulating: {', '.join(said)}" if said else
            "refused          none before simulating"]


def _format(summary: TuneSummary) -> str:
    from mindpipe.traces.schema import to_dict

    plan = to_dict(summary.best_plan) if summary.best_plan is not None else {}
    keys: tuple[str, ...] = ("dp", "tp", "pp", "micro_batch_size", "global_batch_size", "schedule", "virtual_stages",
                             "recompute", "sequence_parallel", "zero_stage", "comm_priority", "overlap_grad_reduce",
                             "tp_comm_overlap", "overlap_param_gather", "flash_attention", "loss_chunks",
                             "fused_head_loss", "blocking_p2p", "fused_elementwise", "dp_impl", "partition")
    net = summary.supernet
    if net is not None:
        keys = ("dp", "pp", "micro_batch_size", "global_batch_size", "subnet_schedule", "subnet_window", "partition")
    if plan.get("cp", 1) != 1:  # context parallelism (--search cp), named only where a plan uses it
        keys = (*keys[:3], "cp", "cp_comm_type", *keys[3:])
    shown = ", ".join(f"{k}={plan.get(k)}" for k in keys if k in plan)
    searched, uses, pinned = summary.what_if.searched, summary.what_if.best_plan_uses, summary.what_if.pinned
    if not searched and not pinned:
        what_if = "none searched: every plan is one the executor runs"
    else:
        used = (", ".join(f"{k}={json.dumps(plan.get(k))}" for k in uses) + " (simulated only; the executor "
                "runs " + ", ".join(f"{k}={json.dumps(WHAT_IF_KEYS[k])}" for k in uses) + ")") if uses else "none"
        said = ([f"searched {', '.join(searched)}"] if searched else []) + (
            [f"pinned {', '.join(f'{k}={json.dumps(v)}' for k, v in pinned.items())}"] if pinned else [])
        what_if = f"{'; '.join(said)}; the best plan uses {used}"
    shifted = _format_timeshift(summary.timeshift) if summary.timeshift is not None else []
    if net is not None:
        same = net.best_plan_equivalent_to_sequential
        what_if = (f"{net.name}: {net.goodput}; the best plan "
                   + ("trains exactly as sequential training" if same else
                      "is NOT equivalent to sequential training (sync/async)"))
    front = ([f"pareto front     {plural(summary.pareto_points, 'plan')} (throughput vs carbon per sample)"] if net is None
             else [])
    made_for = summary.best_plan.made_for if summary.best_plan is not None else None
    if net is None and summary.flash_attention_searched == [False] and not (made_for and made_for.trace):
        # say what the search left out (a trace prices only the attention it was profiled with)
        front.append("attention        explicit kernels only (Megatron's default): add --fix flash_attention=false,true "
                     "to search FlashAttention too")
    critical = summary.critical_batch
    return "\n".join([
        f"objective        {summary.objective}",
        *([f"critical batch   {critical.value:.6g} samples: {critical.note}"]
          if critical is not None and critical.value is not None else []),
        f"best value       {summary.best_value:.6g}"
        + (" (the search's best plan at default clocks, before the front's clocks and start times below)"
           if summary.target is not None else ""),
        f"best plan        {shown}",
        f"{'what-if knobs' if net is None else 'supernet':16s} {what_if}",
        *[f"also searched    {k} = {', '.join(map(str, v))} (--search)" for k, v in (summary.search or {}).items()],
        f"simulations      {summary.evaluations} ({plural(summary.evaluated_points, 'point')} considered, {summary.reused} "
        "from a previous run)",
        f"space            {plural(summary.space_size, 'valid point')}",
        *_infeasible(summary),
        *front,
        *shifted,
        *(tune_target.format_lines(summary.target) if summary.target is not None else []),
        _outputs(summary),
        *_clock_lines(summary.clocks),
    ])


def _clock_lines(c: ClockPlan | None) -> list[str]:
    if c is None:
        return []
    clocks = c.plan.action_clocks_mhz
    which = (f"action_clocks_mhz=[{action_clocks_summary(clocks)}]" if clocks is not None
             else f"stage_clocks_mhz={c.plan.stage_clocks_mhz}")
    return [f"clocks           {c.method}: {which}, "
            f"{c.energy_saving:.1%} less GPU energy at {c.slowdown:+.2%} iteration time "
            f"(clocks.json, clock_frontier.png)"]


def cmd_tune(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the search; exit 2 (through ContractError) when no plan is feasible."""
    trace = loaders.trace(args.trace) if args.trace else None
    calibration = loaders.calibration(args.calibration)
    partitioners = [p.strip() for p in args.partitioner.split(",") if p.strip()]
    _check_objective_options(args)
    if args.objective == "max_batch":
        return _max_batch(args, partitioners, trace, calibration)
    model = loaders.network(args.model)
    objective, critical = _objective(args, model, calibration)
    summary = _search(args, model, objective, partitioners, trace, calibration, critical)
    if not isinstance(model, Supernet) and summary.best_plan is not None:  # a supernet run trains in fp32
        _note_cpu_bf16(summary.best_plan.precision, args.cluster)
    if args.json:
        print_json(summary.to_dict())
    else:
        print(_format(summary))
    sys.stdout.flush()
    return 0


def _check_objective_options(args: argparse.Namespace) -> None:
    """Refuse options the chosen objective does not use (``max_batch`` and the searching ones differ)."""
    from mindpipe.traces.errors import ContractError

    if args.objective != "max_batch":
        if args.microbatches is not None:
            raise ContractError("--microbatches", None, f"only --objective max_batch takes it; {args.objective} "
                                "searches the micro-batch size (and so the micro-batches) with the other plan keys")
        if (args.clocks in (None, "default") and args.objective != tune_target.OBJECTIVE
                and args.max_slowdown != args.max_batch_unused["max_slowdown"]):
            raise ContractError("--max-slowdown", None, "bounds the slowdown of the clocks --clocks perseus|envpipe|perseus_action "
                                "plans; without --clocks no clocks are planned")
        return
    if args.subnets is not None:
        raise ContractError("--objective", None, "max_batch searches GPT plans; a supernet's objective is "
                            "throughput (subnets trained per hour)")
    for dest, default in args.max_batch_unused.items():
        if getattr(args, dest) != default:
            flag = "--" + dest.replace("_", "-")
            raise ContractError(flag, None, "not used by --objective max_batch (it searches the global batch "
                                "over every dp x tp x pp mesh exhaustively)")
    if args.what_if is not None:
        raise ContractError("--what-if", None, "--objective max_batch searches the plans the executor runs; "
                            "what-if knobs are searched by the other objectives")
    if args.search is not None:
        raise ContractError("--search", None, "--objective max_batch searches dp x tp x pp meshes (cp=1); "
                            "--search is for the other objectives")


def _objective(args: argparse.Namespace, model: Model | Supernet,
               calibration: Calibration | None) -> tuple[Objective, CriticalBatch]:
    """The objective with its constraints, and the critical batch goodput uses (with where it came from)."""
    from mindpipe.tuner.keys import CLI_ARG_NAMES
    from mindpipe.tuner.objectives import (
        CriticalBatch,
        Objective,
        critical_batch_for,
        needs_critical_batch,
        parse_constraint,
    )

    constraints = [parse_constraint(c) for c in args.constraint]
    if isinstance(model, Supernet):  # goodput for supernets counts subnets; Objective refuses a critical batch
        critical = CriticalBatch(args.critical_batch, "typed" if args.critical_batch is not None else "none")
    else:
        critical = critical_batch_for(args.critical_batch, calibration, model,
                                      needed=needs_critical_batch(args.objective, constraints))
    parts = tune_target.objective_parts(args, critical.value)
    objective = Objective(args.objective, critical.value, constraints, shift=_timeshift(args),
                          supernet=isinstance(model, Supernet), target=parts.target, placement=parts.placement,
                          arg_names=CLI_ARG_NAMES)
    return objective, critical


def _search(args: argparse.Namespace, model: Model | Supernet, objective: Objective, partitioners: list[str],
            trace: Trace | None, calibration: Calibration | None, critical: CriticalBatch) -> TuneSummary:
    """Run the sweep (with a progress bar unless ``--quiet``) and the clock step of ``--clocks``; the summary."""
    from mindpipe.tuner.api import tune
    from mindpipe.tuner.keys import CLI_ARG_NAMES
    from mindpipe.tuner.progress import ProgressBar
    from mindpipe.tuner.store import CONFIG_NAME, RECORDS_NAME
    from mindpipe.tuner.sweep import SweepConfig

    to_target = args.objective == tune_target.OBJECTIVE
    cfg = SweepConfig(optimizer=args.optimizer, budget=args.budget, seed=args.seed, surrogate=args.surrogate,
                      n_initial=args.initial_points, workers=args.workers, dask=args.dask, batch_size=args.batch_size,
                      dask_timeout_s=args.dask_timeout, arg_names=CLI_ARG_NAMES)
    if args.resume and not any(os.path.lexists(os.path.join(args.out, n)) for n in (CONFIG_NAME, RECORDS_NAME)):
        # Not an error: a sweep killed before its first evaluation stored nothing yet. Said, so that a
        # mistyped --out does not pass for a resumed sweep.
        stderr(f"mindpipe: note: --resume: {args.out} holds no sweep yet ({CONFIG_NAME}); starting a new one")
    bar = None if args.quiet else ProgressBar(f"tune {args.optimizer}", objective.unit)
    try:
        outcome = tune(model, args.cluster, out=args.out, objective=objective, global_batch=args.global_batch,
                       fixes=args.fix, partitioners=partitioners, what_if=args.what_if, search=args.search,
                       trace=trace, calibration=calibration,
                       trace_source=Path(args.trace).name if args.trace else "trace",
                       calibration_source=os.path.basename(args.calibration) if args.calibration else "calibration",
                       config=cfg, resume=args.resume, progress=bar, plots=not args.no_plots, subnets=args.subnets,
                       front=tune_target.front_config(args) if to_target else None, clocks=args.clocks,
                       max_slowdown=args.max_slowdown, critical=critical, arg_names=CLI_ARG_NAMES)
    finally:
        if bar is not None:
            bar.close()
    return outcome.summary


def _note_cpu_bf16(precision: str, cluster_arg: str) -> None:
    """A note when the best plan (of ``precision``) is bf16 for the CPU on a host whose CPU would emulate
    its GEMMs (:data:`mindpipe.executor.precheck.CPU_BF16_NOTICE`, which ``mindpipe run`` prints too)."""
    from mindpipe.executor.precheck import CPU_BF16_NOTICE, cpu_has_bf16_gemm
    from mindpipe.traces.catalog import get_device

    if precision != "bf16":
        return
    if get_device(loaders.cluster(cluster_arg).gpu).kind == "cpu" and cpu_has_bf16_gemm() is False:
        stderr(f"mindpipe: note: the best plan is bf16 for the cpu device: {CPU_BF16_NOTICE}")


def _max_batch(args: argparse.Namespace, partitioners: list[str], trace: Any, calibration: Any) -> int:
    """``--objective max_batch`` (:func:`mindpipe.tuner.maxbatch.tune_max_batch`)."""
    from collections import Counter

    from mindpipe.traces.schema import to_dict
    from mindpipe.traces.what_if import plan_value
    from mindpipe.tuner.keys import CLI_ARG_NAMES, OPTIONAL_POINT_KEYS
    from mindpipe.tuner.maxbatch import tune_max_batch

    summary = tune_max_batch(args.model, args.cluster, out=args.out, partitioners=partitioners, fixes=args.fix,
                             num_microbatches=args.microbatches, trace=trace, calibration=calibration,
                             trace_source=Path(args.trace).name if args.trace else "trace",
                             calibration_source=os.path.basename(args.calibration) if args.calibration else "calibration",
                             arg_names=CLI_ARG_NAMES)
    if args.json:
        print_json(summary.to_dict())
    else:
        best = summary.best
        plan = to_dict(best.plan)
        # Keys that change what fits, named when pinned away from their defaults (--fix loss_chunks=16).
        pinned = "".join(f", {k}={plan_value(plan[k])}" for k, default in OPTIONAL_POINT_KEYS.items()
                         if plan.get(k, default) != default)
        # What decides the memory, always named: a memory-blind partitioner keeps every activation
        # unless --fix recompute says otherwise, and ZeRO stays at the plan's default unless pinned.
        policy = plan.get("layer_memory_policy")
        counts = ", ".join(f"{n} {p}" for p, n in sorted(Counter(policy).items())) if policy else None
        memory = (f"per-block policy from {best.partitioner}: {counts}" if counts else
                  f"recompute={plan['recompute']} for every block ({best.partitioner} chooses no per-block policy; "
                  "--partitioner vpipe,dawnpiper do)") + f"; zero_stage={plan['zero_stage']}"
        if lazy := [str(i) for i, how in enumerate(plan.get("swap_copy_back") or []) if how == "lazy"]:
            memory += f"; swapped blocks copied back as asked on stage{'s' * (len(lazy) > 1)} {', '.join(lazy)} (swap_copy_back)"
        print("\n".join([
            "objective        max_batch (largest global batch that fits)",
            f"best value       {best.global_batch_size} (micro_batch_size {best.micro_batch_size} x "
            f"{plural(best.num_microbatches, 'micro-batch', 'micro-batches')} x dp {best.dp})",
            f"best plan        partitioner={best.partitioner}, dp={best.dp}, tp={best.tp}, pp={best.pp}, "
            f"partition={plan.get('partition')}{pinned}",
            f"memory policy    {memory}",
            f"throughput       {best.throughput_samples_per_s:.6g} samples/s at that batch; peak memory "
            f"{best.peak_memory_gib:.2f} GiB",
            f"outputs          {summary.out}/best_plan.json, max_batch.json, summary.json",
        ]))
    sys.stdout.flush()
    return 0


__all__ = ["add_parser", "cmd_tune"]
