"""``tune(model, cluster, ...)``: the tuner's one library entry point (``mindpipe tune`` wraps it).

Builds the search space, runs the sweep with the simulator as cost function, writes the outputs
(:mod:`mindpipe.tuner.output`) and returns the summary. Usable from a notebook::

    from mindpipe.tuner.api import tune
    outcome = tune("gpt-13b", "a100-sxm4-80gb:8x8", objective="throughput", global_batch=512,
                   fixes=["tp=8"], out="sweeps/13b", config=SweepConfig(optimizer="bo", budget=60))
    outcome.summary.best_plan, outcome.summary.best_value  # a TuneSummary; .to_dict() is summary.json

A supernet (``tune("supernet-mini", "cpu:1x4", out=..., subnets=256)``) is searched over dp × pp,
micro-batch, ``subnet_schedule``, ``subnet_window`` and the supernet partitioner
(:mod:`mindpipe.tuner.subnet_space`) against the supernet simulator, valued in subnets trained per
hour (:mod:`mindpipe.tuner.objectives`); its ``best_plan.json`` names the supernet in ``made_for``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.simulator.simulator import Simulator
from mindpipe.simulator.subnet_costs import check_candidate_trace
from mindpipe.traces.builtin import load_cluster, load_network
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.config import PRECISIONS, Cluster, MadeFor, Model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.frequency import frequency_spec
from mindpipe.traces.limits import shown
from mindpipe.traces.schema import to_dict, write_json
from mindpipe.traces.supernet import Supernet, check_subnet_count
from mindpipe.traces.trace import Trace
from mindpipe.traces.units import plural
from mindpipe.tuner.evaluate import evaluate
from mindpipe.tuner.evaluate import screen as screen_memory
from mindpipe.tuner.frequency import CLOCK_METHODS
from mindpipe.tuner.keys import (
    CLI_ARG_NAMES,
    PYTHON_ARG_NAMES,
    ArgNames,
    check_fixes_what_if,
    parse_global_batch,
    parse_search,
    parse_what_if,
    read_fixes,
)
from mindpipe.tuner.materialize import Problem
from mindpipe.tuner.objectives import CriticalBatch, Objective
from mindpipe.tuner.output import write_outputs
from mindpipe.tuner.records import Verdict
from mindpipe.tuner.space import SearchSpace
from mindpipe.tuner.store import SweepStore
from mindpipe.tuner.summary import TuneSummary
from mindpipe.tuner.sweep import Evaluator, Progress, Screener, SweepConfig, SweepResult, run_sweep
from mindpipe.tuner.target import Placement, TrainingTarget
from mindpipe.tuner.target_front import FRONT_CLOCK_METHODS, FrontConfig, front_clocks, run_front
from mindpipe.tuner.timeshift import PlanRun, TimeShift, reprice, write_report

DEFAULT_SUBNETS = 256
"""Subnets a supernet plan is simulated for: a power of two, so every power-of-two sync batch divides it."""


class NoFeasiblePlan(ContractError):
    """The search found no plan that satisfies every rule, the memory and the constraints."""


@dataclass
class TuneOutcome:
    """What :func:`tune` returns: the summary (``summary.json``), the sweep result and the space."""

    summary: TuneSummary
    result: SweepResult
    space: SearchSpace


def default_global_batch(cluster: Cluster) -> int:
    """The smallest power of two ≥ 4 × devices (at least 4 samples per device in any layout)."""
    g = 1
    while g < 4 * cluster.world_size:
        g *= 2
    return g


def fingerprint(model: Model | Supernet, cluster: Cluster, trace: Trace | None, calibration: Calibration | None = None) -> str:
    """Short hash identifying (model, cluster, trace, calibration)."""
    parts = [to_dict(model), to_dict(cluster), to_dict(trace) if trace is not None else None]
    if calibration is not None:  # absent from older sweeps' identity, so they still resume
        parts.append(to_dict(calibration))
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def reference(source: str, obj: Trace | Calibration) -> str:
    """``SOURCE sha256:PREFIX``: where a trace or calibration came from and a hash of its content.

    The hash is over the canonical JSON of the object (sorted keys), so a file, a shipped name and
    an object built in a notebook with the same content get the same reference.
    """
    blob = json.dumps(to_dict(obj), sort_keys=True, default=str)
    return f"{source} sha256:{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def attention_as_profiled(fixes: dict[str, Any], trace: Trace, *,
                          arg_names: ArgNames = CLI_ARG_NAMES) -> dict[str, Any]:
    """``fixes`` with ``flash_attention`` pinned to how ``trace`` ran attention (a trace prices only
    such plans, :class:`mindpipe.simulator.costs.TraceComputeModel`).

    Raises:
        ContractError: ``--fix flash_attention`` asks for another value than the trace's (naming the
            arguments as ``arg_names`` does).
    """
    want = trace.flash_attention
    pinned = fixes.get("flash_attention")
    if pinned is None:
        return {**fixes, "flash_attention": want}
    if any(v != want for v in (pinned if isinstance(pinned, list) else [pinned])):
        profile_with = "" if want else f" with {arg_names.name('--flash-attention')}"
        raise ContractError(arg_names.name("--fix"), "flash_attention", (
            f"the trace was profiled {'with' if want else 'without'} flash attention, so it prices only "
            f"flash_attention={str(want).lower()}: profile again{profile_with} "
            f"or tune without {arg_names.name('--trace')}"))
    return fixes


def precision_as_profiled(fixes: dict[str, Any], trace: Trace, *,
                          arg_names: ArgNames = CLI_ARG_NAMES) -> dict[str, Any]:
    """``fixes`` with ``precision`` pinned to the dtype ``trace`` was profiled in (its times are that
    dtype's: :meth:`mindpipe.traces.trace.Trace.pricing_notes`); a trace of unknown dtype pins nothing.

    Raises:
        ContractError: ``--fix precision`` asks for another precision than the trace's.
    """
    want = trace.dtype
    if want not in PRECISIONS:
        return fixes
    pinned = fixes.get("precision")
    if pinned is None:
        return {**fixes, "precision": want}
    if any(v != want for v in (pinned if isinstance(pinned, list) else [pinned])):
        raise ContractError(arg_names.name("--fix"), "precision", (
            f"the trace was profiled in {want}, so it prices only precision={want}: profile again with "
            f"{arg_names.name('--dtype')}, or tune without {arg_names.name('--trace')}"))
    return fixes


def build_space(model: Model | Supernet, cluster: Cluster, global_batch: int | Sequence[int] | str | None,
                fixes: dict[str, Any] | Sequence[str] | None, partitioners: Sequence[str],
                what_if: str | Sequence[str] | None = None, trace: Trace | None = None,
                search: str | Sequence[str] | None = None, *, arg_names: ArgNames = CLI_ARG_NAMES) -> SearchSpace:
    """The search space from loose arguments (see :func:`tune`); a GPT model's ``trace`` pins
    ``flash_attention`` to how it was profiled (:func:`attention_as_profiled`). Errors name the
    arguments as ``arg_names`` does (``mindpipe tune``'s flags by default; :func:`tune` passes its own).
    """
    if global_batch is None:
        batches = [default_global_batch(cluster)]
    elif isinstance(global_batch, str):
        batches = parse_global_batch(global_batch, arg_names=arg_names)
    else:  # a size or sizes from Python: the same rules as the text (0 < size <= the limit, how many)
        values = list(global_batch) if isinstance(global_batch, list | tuple | set | range) else [global_batch]
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ContractError(arg_names.name("--global-batch"), None, f"{shown(global_batch)}: a global batch "
                                "size is a whole number (or give a list of them, or 'A:B')")
        batches = parse_global_batch(",".join(map(str, values)), arg_names=arg_names)
    fixed = read_fixes(fixes, arg_names=arg_names)
    knobs, opened = parse_what_if(what_if, arg_names=arg_names), parse_search(search, arg_names=arg_names)
    if trace is not None and not isinstance(model, Supernet):
        fixed = precision_as_profiled(attention_as_profiled(fixed, trace, arg_names=arg_names), trace,
                                      arg_names=arg_names)
        if "cp" in opened:  # the trace compute model's own refusal, before any point is proposed
            raise ContractError(arg_names.name("--search"), "cp", "cp: a trace's layers ran whole sequences, so it "
                                f"cannot price context parallelism; tune cp without {arg_names.name('--trace')} "
                                "(the hardware model)")
    if not isinstance(model, Supernet):  # the space asks too, naming the flags; a supernet refuses what-if first
        check_fixes_what_if(fixed, knobs, arg_names=arg_names)
    named = (partitioners,) if isinstance(partitioners, str) else tuple(partitioners)  # "even" is one, not four
    with arg_names.renaming():  # the space names the arguments as the caller does; renaming covers the rest
        return SearchSpace(model, cluster, batches, fixed, named, knobs,
                           batch_given=global_batch is not None, search=opened, arg_names=arg_names)


def target_identity(obj: Objective) -> dict[str, Any]:
    """What makes two carbon-to-target sweeps the same job (for ``--resume``)."""
    t = obj.target
    ident: dict[str, Any] = {"samples": t.samples, "noise_scale": t.noise_scale,
                             "reference_batch": t.reference_batch} if t is not None else {}
    p = obj.placement
    if p is not None:
        blob = repr((p.series.times, p.series.values)).encode()
        ident["placement"] = {"series": hashlib.sha256(blob).hexdigest()[:16], "window": [str(p.window.start),
                              str(p.window.end)], "interruptible": p.interruptible}
    return ident


def write_front(sim: Simulator, result: SweepResult, target: TrainingTarget, placement: Placement | None,
                cfg: FrontConfig, out_dir: Path, summary: TuneSummary, plots: bool) -> None:
    """The carbon-to-target front (:func:`mindpipe.tuner.target_front.run_front`): its keys join
    ``summary``, and the chosen plan, with its clocks, replaces the best plan (``made_for`` kept)."""
    choice = run_front(sim, result.records, target, placement, cfg, out_dir, plots)
    plan = choice.chosen.candidate.plan
    old = summary.best_plan
    chosen = dataclasses.replace(plan, made_for=old.made_for if old is not None else plan.made_for)
    write_json(chosen, out_dir / "best_plan.json")
    summary.best_plan = chosen
    summary.target = choice


def add_clocks(problem: Problem, model: Model, out_dir: Path, summary: TuneSummary, method: str, max_slowdown: float,
               plots: bool, shift: TimeShift | None = None) -> None:
    """Plan the best plan's stage clocks (:func:`mindpipe.tuner.clock_step.add_stage_clocks`): the plan
    with its clocks replaces the best plan in ``best_plan.json`` and ``summary``; a time-shifted job
    (``shift``) is placed again for the clocked plan's speed and power (``timeshift.json``)."""
    from mindpipe.tuner.clock_step import add_stage_clocks

    if summary.best_plan is None:
        return
    cp = add_stage_clocks(out_dir, summary.best_plan, model, problem.cluster, method, max_slowdown,
                          trace=problem.trace, calibration=problem.calibration, plots=plots)
    summary.clocks = cp
    summary.best_plan = cp.plan
    if shift is not None and summary.timeshift is not None:
        run = problem.simulator().run(cp.plan)
        summary.timeshift = reprice(shift, PlanRun(run.iteration_time_s, run.energy_j, cp.plan.global_batch_size),
                                    summary.timeshift.reference)
        write_report(summary.timeshift, out_dir)


def tune(model: Model | Supernet | str, cluster: Cluster | str, *, out: str | Path,
         objective: Objective | str = "throughput", global_batch: int | Sequence[int] | str | None = None,
         fixes: dict[str, Any] | Sequence[str] | None = None, partitioners: Sequence[str] = ("balanced",),
         what_if: str | Sequence[str] | None = None, trace: Trace | None = None,
         calibration: Calibration | None = None, trace_source: str = "trace",
         calibration_source: str = "calibration", config: SweepConfig | None = None, resume: bool = False,
         progress: Progress | None = None, plots: bool = True, evaluator: Evaluator = evaluate,
         screen: Screener | None = screen_memory,
         subnets: int | None = None, front: FrontConfig | None = None,
         search: str | Sequence[str] | None = None, clocks: str | None = None, max_slowdown: float = 0.01,
         critical: CriticalBatch | None = None, arg_names: ArgNames = PYTHON_ARG_NAMES) -> TuneOutcome:
    """Search for the best plan of ``model`` on ``cluster`` and write the outputs to ``out``.

    Args:
        model, cluster: Objects or CLI-style arguments (built-in names, files, inline JSON).
        out: Output and state directory.
        objective: An :class:`Objective` or an objective name.
        global_batch: One size, a list, or ``"N"``/``"A,B"``/``"A:B"`` text; default
            :func:`default_global_batch`.
        fixes: Pinned plan keys: ``["tp=8", "recompute=full"]`` or a parsed dict. A what-if knob
            may be pinned to a value the executor does not run only when ``what_if`` names it.
        partitioners: Partitioners to try (``balanced``, ``pipedream``, ``even``).
        what_if: What-if knobs to search as well (:data:`mindpipe.tuner.keys.WHAT_IF_KEYS`):
            ``"all"``, ``"comm_priority"``, a list; None searches only what the executor runs.
        search: Plan keys the default space leaves at one value, to search as well
            (:data:`mindpipe.tuner.keys.SEARCH_ON_REQUEST_KEYS`: ``"cp"``).
        trace: Per-layer trace for the compute model (default: the hardware model).
        calibration: Constants fitted from measured runs (``mindpipe calibrate``).
        trace_source, calibration_source: Their file or name, for ``best_plan.json``'s ``made_for``.
        config: Optimizer, budget, seed and parallelism.
        resume: Continue the sweep stored in ``out`` without re-evaluating what it holds.
        progress: Per-evaluation callback (e.g. :class:`mindpipe.tuner.progress.ProgressBar`).
        plots: Write the PNG plots.
        evaluator: Evaluation function (tests and benchmarks substitute recorded results).
        screen: What refuses a point before it is proposed (default: the memory model's refusal,
            :func:`mindpipe.tuner.evaluate.screen`); None proposes every point the searcher picks.
        subnets: Supernets only: subnets each plan is simulated for (default
            :data:`DEFAULT_SUBNETS`; a ``sync`` plan needs a multiple of its window).
        front: For ``carbon_to_target``: the plans × clocks × start times front's width
            (:mod:`mindpipe.tuner.target_front`; default :class:`FrontConfig`).
        clocks, max_slowdown: Plan the best plan's SM clocks by this method (``perseus``,
            ``envpipe``: one per pipeline rank; ``perseus_action``: one per forward/backward of each
            micro-batch; ``default`` or None leaves the clocks) within this iteration-time slowdown
            (a fraction in [0, 1]). ``carbon_to_target`` prices its front at default clocks and at
            the named planner's (:func:`~mindpipe.tuner.target_front.front_clocks`: perseus when
            None, none besides default clocks for ``"default"``), unless ``front`` says otherwise.
        critical: Where the objective's critical batch came from (reported in the summary).
        arg_names: How error messages name the arguments: these keywords (``fixes: ...``, the
            default), or ``mindpipe tune``'s flags (:data:`~mindpipe.tuner.keys.CLI_ARG_NAMES`, which
            the CLI passes).

    Raises:
        ContractError: invalid arguments, an empty space, or a different sweep in ``out``.
        NoFeasiblePlan: nothing evaluated was feasible (outputs are written first).
    """
    model = load_network(model)
    cluster = load_cluster(cluster)
    supernet = isinstance(model, Supernet)
    if clocks is not None and clocks not in CLOCK_METHODS:  # refused before the sweep, not after it
        raise ContractError(arg_names.name("--clocks"), None, f"{clocks!r} must be one of {', '.join(CLOCK_METHODS)}")
    if isinstance(max_slowdown, bool) or not (isinstance(max_slowdown, (int, float)) and math.isfinite(max_slowdown)
                                               and 0.0 <= max_slowdown <= 1.0):
        raise ContractError(arg_names.name("--max-slowdown"), None,
                            f"{max_slowdown!r} is not a finite number in [0, 1]")
    planned = None if clocks in (None, "default") else clocks  # the method planning the best plan's clocks
    if supernet and planned is not None:
        raise ContractError(arg_names.name("--clocks"), None, "per-stage clocks are planned for GPT and Llama "
                            "models (the supernet simulator prices no energy)")
    # the objective's rules name the arguments as the caller does
    obj = objective if isinstance(objective, Objective) else Objective(objective, supernet=supernet, arg_names=arg_names)
    if obj.supernet != supernet:
        obj = dataclasses.replace(obj, supernet=supernet, arg_names=arg_names)  # re-checked for the model's kind
    if obj.target is not None and clocks is not None and clocks not in FRONT_CLOCK_METHODS:
        raise ContractError(arg_names.name("--clocks"), None,
                            f"{clocks!r}: the carbon-to-target front plans per-stage clocks "
                            f"({', '.join(FRONT_CLOCK_METHODS)}); per-action clocks are planned for the other objectives")
    if planned is not None and obj.target is None:  # refused before the sweep, not after it
        frequency_spec(cluster.gpu, source=arg_names.name("--clocks"))
    if subnets is not None and not supernet:
        raise ContractError(arg_names.name("--subnets"), None,
                            f"{arg_names.name('--subnets')} counts subnets of a supernet; {model.label} is a GPT model")
    if isinstance(model, Supernet):  # refused once here, not as every plan's failure
        check_subnet_count(model, DEFAULT_SUBNETS if subnets is None else subnets, arg_names.name("--subnets"),
                           default=subnets is None)
    cfg = config or SweepConfig()
    space = build_space(model, cluster, global_batch, fixes, partitioners, what_if, trace, search, arg_names=arg_names)
    if trace is not None:
        if isinstance(model, Supernet):
            check_candidate_trace(trace, model)
        else:
            trace.check_model(model, source="trace")
    fp = fingerprint(model, cluster, trace, calibration)
    problem = Problem(model, cluster, trace, space.pinned or None, fingerprint=fp, calibration=calibration,
                      num_subnets=DEFAULT_SUBNETS if subnets is None else subnets)
    if not space.points:
        from mindpipe.tuner.sweep import no_plan_message

        raise NoFeasiblePlan("tune", None, no_plan_message(space, arg_names))
    out_dir = Path(out)
    store = SweepStore(out_dir, _sweep_identity(problem, space, obj, cfg), resume, arg_names=arg_names)
    try:
        with arg_names.renaming():  # the executor's refusals (Dask) name their flag as the source
            result = run_sweep(problem, space, obj, cfg, store, progress=progress, evaluator=evaluator, screen=screen,
                               arg_names=arg_names)
    finally:
        store.close()
    made_for = MadeFor(None if isinstance(model, Supernet) else model, cluster, tool="mindpipe tune",
                       supernet=model if isinstance(model, Supernet) else None,
                       trace=reference(trace_source, trace) if trace is not None else None,
                       calibration=reference(calibration_source, calibration) if calibration is not None else None)
    front_cfg = front or FrontConfig(front_clocks(clocks if obj.target is not None else None))
    info = _write(problem, result, obj, space, out_dir, made_for, plots, front_cfg)
    info.critical_batch = critical
    if planned is not None and isinstance(model, Model) and obj.target is None:  # the front plans its own
        add_clocks(problem, model, out_dir, info, planned, max_slowdown, plots, obj.shift)
    info.write()
    if result.best is None:
        raise NoFeasiblePlan("tune", None, _nothing_feasible(result, space, obj, out_dir))
    return TuneOutcome(info, result, space)


def _nothing_feasible(result: SweepResult, space: SearchSpace, obj: Objective, out_dir: Path) -> str:
    """Why a sweep found no feasible plan: the simulations' verdicts, the points refused before
    simulating, and the combinations the plan rules filtered (never evaluated), each counted apart."""

    def counts(tally: Counter[Verdict]) -> str:
        return ", ".join(f"{v.value}: {n}" for v, n in sorted(tally.items()))

    simulated, refused = result.simulated_infeasible, result.refused
    groups = ([f"{plural(sum(simulated.values()), 'simulation')} ({counts(simulated)})"] if simulated else []) + (
        [f"{sum(refused.values())} refused before simulating ({counts(refused)})"] if refused else [])
    late = (" (no_value: the job, at that plan's speed, runs past the carbon series)"
            if obj.shift is not None and simulated.get(Verdict.NO_VALUE) else "")
    rules = (f"; {plural(space.rejected_total, 'combination')} of the search space broke a plan rule (not evaluated)"
             if space.rejected_total else "")
    return (f"no feasible plan among the {len(result.records)} evaluated: {', '.join(groups)}{late}{rules}; "
            f"see {out_dir / 'evaluations.csv'}")


def _sweep_identity(problem: Problem, space: SearchSpace, obj: Objective, cfg: SweepConfig) -> dict[str, Any]:
    """What a stored sweep must match to be resumed (:class:`mindpipe.tuner.store.SweepStore`).

    A key only some sweeps have is left out of the others' identity, so that sweeps stored before
    it existed still resume.
    """
    identity = {
        "problem": problem.fingerprint, "model": problem.model.label, "global_batch": space.global_batches,
        "fixes": space.fixes, "partitioners": list(space.partitioners), "what_if": list(space.what_if),
        "objective": {"name": obj.name, "critical_batch": obj.critical_batch, "constraints": [str(c) for c in obj.constraints]},
        **cfg.identity(),
    }
    if obj.shift is not None:
        identity["timeshift"] = obj.shift.identity()
    if isinstance(problem.model, Supernet):
        identity["subnets"] = problem.num_subnets
    if space.search:
        identity["search"] = list(space.search)
    if obj.target is not None:
        identity["target"] = target_identity(obj)
    return identity


def _write(problem: Problem, result: SweepResult, obj: Objective, space: SearchSpace, out_dir: Path, made_for: MadeFor,
           plots: bool, front: FrontConfig) -> TuneSummary:
    """Write the sweep's outputs (and a time-shifted job's start, a target's front); their summary."""
    shifted = None
    if obj.shift is not None and result.best is not None:
        from mindpipe.tuner.timeshift import report_for

        shifted = report_for(obj.shift, result.records, result.best)
    info = write_outputs(result, obj, space, out_dir, made_for, plots=plots, timeshift=shifted)
    if obj.target is not None and result.best is not None and isinstance(problem.model, Model):
        sim = Simulator(problem.model, problem.cluster, trace=problem.trace, calibration=problem.calibration)
        write_front(sim, result, obj.target, obj.placement, front, out_dir, info, plots)
    return info


__all__ = ["DEFAULT_SUBNETS", "NoFeasiblePlan", "TuneOutcome", "add_clocks", "attention_as_profiled", "build_space", "default_global_batch", "fingerprint", "reference", "tune"]
