"""Calibrating the supernet simulator from measured supernet runs (``mindpipe calibrate`` on them).

A supernet run (``mindpipe run PLAN --model SUPERNET``) records every stage action of every subnet
(F, B: wall interval and CPU time), and per rank its compute, its stall (blocked in receives) and
its update time (all-reduce + optimizer steps) over the run's wall time. The supernet simulator
(:class:`~mindpipe.simulator.subnet_sim.SupernetSimulator`) needs three things from them (a fourth with a profile), fitted
into the existing :class:`~mindpipe.traces.calibration.Calibration` contract and applied by the
same :func:`~mindpipe.simulator.calibrate.models.apply_calibration` as GPT calibrations:

1. **Compute** (``ComputeCalibration.scale`` per operator kind and ``op_overhead_s``): an action of
   subnet b on stage s runs the operators of b's chosen candidates there (plus the embedding or the
   head), :func:`~mindpipe.simulator.subnet_costs.candidate_ops`. Its time is linear in the
   constants — ``Σ_kind scale_kind · Σ t_ref(op of kind) + op_overhead · #ops`` — so each measured
   action is one row, its features priced by the simulator's own
   :func:`~mindpipe.simulator.subnet_costs.priced_costs` (same operators, same frozen shared parts)
   with a pricer per feature. Rows are fitted by the GPT fit's ridge-tied NNLS on relative error
   (:func:`mindpipe.simulator.calibrate.fit._fit_compute_constants`), then scaled so the fitted
   and measured sums of action time agree (subnets/hour pays the sum; a relative-error fit sits
   below the mean of a right-skewed sample, where a preempted action runs long). Every subnet draws other
   candidates, so one run gives hundreds of distinct rows and the kinds separate well. The target
   is the action's *wall* duration, not its CPU time: the supernet simulator does not model ranks
   sharing cores, and on a loaded host the wall time is what subnets/hour pays (on the 2-vCPU
   machine shared with other jobs the durations were 1.7–1.9× the CPU times).
2. **Update** (``optimizer_overhead_s``, ``optimizer_s_per_param``): per rank, the run's update
   time against (updates, parameters trained over them), NNLS on relative error (runs whose
   update is ``each_backward``; a batched update is left out of this fit).
3. **Outside the actions** (``DeviceCalibration.step_overhead_s``, per subnet and stage): each
   rank's wall time less its compute, stall and update time, per subnet — the sends, the batch,
   the context switcher's copies and the schedule's Python; median over ranks and runs. The
   simulator adds it after each subnet's update on each stage.
4. **Against a profile** (``ComputeCalibration.trace_scale``, when per-candidate traces are given:
   ``mindpipe calibrate RUNS --trace TRACE``): one factor k = Σ measured action time ÷ Σ the same
   actions priced from the trace of the run's supernet (:func:`~mindpipe.simulator.subnet_costs.trace_costs`).
   A simulation given a trace and this calibration prices candidates as trace × k. The profile already
   holds each candidate's real cost relative to the others (the operator model misses how many
   kernels a candidate dispatches, which on small CPU ops is most of its time); what the runs add is
   how much slower an action is inside the pipelined executor than alone in the profiler. Across
   supernets this predicts better than the operator fit (``benchmarks/supernet_fidelity.py``).

Repeated runs of one plan on a shared host differ by the host's load (3× between rounds on the
loaded 2-vCPU machine): :func:`median_repeats` keeps the median round of each plan to fit on.
Communication is not fitted here: a supernet run profiles no collectives, and a point-to-point
receive's time is mostly waiting on its peer (:mod:`mindpipe.simulator.calibrate.fit`, step 1).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from mindpipe.simulator.calibrate.fidelity import FidelityRow, plan_label
from mindpipe.simulator.calibrate.fit import (
    ComputeRows,
    FitNotes,
    _fit_compute_constants,
    kind_scales,
    optimizer_constants,
    unfitted_kinds_warning,
)
from mindpipe.simulator.calibrate.models import ReferenceOpTime
from mindpipe.simulator.calibrate.runs import MeasuredRun, load_run, measured_machine, run_label
from mindpipe.simulator.ops import Op
from mindpipe.simulator.subnet_costs import SupernetCosts, priced_costs, trace_costs
from mindpipe.traces.calibration import OP_KINDS, Calibration, ComputeCalibration, DeviceCalibration
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import Measurement
from mindpipe.traces.schema import to_dict
from mindpipe.traces.supernet import Supernet, subnet_schedule, supernet_stage_layers
from mindpipe.traces.trace import Trace
from mindpipe.traces.units import plural

FEATURES = (*OP_KINDS, "ops")
"""Per-action features: reference time per operator kind, then the operator count."""
PRICED_KINDS = ("gemm", "flash", "memory")
"""The operator kinds a supernet simulation prices: an attention candidate's core is always the fused
kernel (:func:`mindpipe.simulator.subnet_costs.candidate_ops`), so ``bmm`` is never used and its
missing scale is no gap."""


@dataclass
class SupernetRun:
    """One measured supernet run.

    Attributes:
        source: The file it came from.
        measurement: The raw records (``subnets``, ``subnet_stages``, ``subnets_per_hour`` set).
        supernet, cluster, device: What ran, where.
    """

    source: str
    measurement: Measurement
    supernet: Supernet
    cluster: Cluster
    device: DeviceSpec

    @property
    def plan(self) -> Plan:
        """The plan that ran."""
        return self.measurement.plan

    @property
    def name(self) -> str:
        """The file's name without ``.json``/``.json.gz``."""
        return run_label(self.source)

    @property
    def num_subnets(self) -> int:
        """Subnets the run trained."""
        return len(self.measurement.subnets or [])

    @property
    def wall_s(self) -> float:
        """The run's wall time (the slowest rank's), from its subnets/hour."""
        return 3600.0 * self.num_subnets / float(self.measurement.subnets_per_hour or 0.0)

    @property
    def context_switching(self) -> bool:
        """Whether the run kept only the subnets in flight resident."""
        return any(r.context_switch for r in self.measurement.subnet_stages or [])


def load_measured(paths: Sequence[str | Path]) -> tuple[list[MeasuredRun], list[SupernetRun]]:
    """Measured runs split into GPT runs and supernet runs; a mixture is refused.

    Raises:
        ContractError: a file that is not a measured run, or GPT and supernet runs together.
    """
    if not paths:
        raise ContractError("", "measured", "no measured runs given")
    gpt: list[MeasuredRun] = []
    nets: list[SupernetRun] = []
    for path in paths:
        trace = Trace.load(path)
        meas = trace.measurement
        if meas is not None and meas.subnets is not None:
            nets.append(_supernet_run(str(path), trace, meas))
        else:
            gpt.append(load_run(path))
    if gpt and nets:
        raise ContractError(nets[0].source, "measurement.subnets", (
            f"{nets[0].source} is a supernet run but {gpt[0].source} is a GPT run; calibrate them separately"))
    return gpt, nets


def median_repeats(runs: list[SupernetRun]) -> list[SupernetRun]:
    """Of repeated runs of one (supernet, plan), the run with the median subnets/hour (the lower
    median for an even count), in first-seen order.

    On a shared machine the host's load swings between runs minutes apart by more than the plans
    differ (3× between rounds of one plan on the loaded 2-vCPU machine), and a fit on every round
    averages those loads; the median run is one real run at a typical load (the supernet analogue of
    :func:`~mindpipe.simulator.calibrate.runs.merge_repeats`).
    """
    groups: dict[str, list[SupernetRun]] = {}
    for run in runs:
        key = json.dumps([to_dict(run.plan), to_dict(run.supernet), run.measurement.world_size], sort_keys=True)
        groups.setdefault(key, []).append(run)
    out = []
    for group in groups.values():
        ordered = sorted(group, key=lambda r: r.measurement.subnets_per_hour or 0.0)
        out.append(ordered[(len(ordered) - 1) // 2])
    return out


def _supernet_run(source: str, trace: Trace, meas: Measurement) -> SupernetRun:
    if trace.supernet is None:
        raise ContractError(source, "supernet", "a supernet run must say which supernet ran")
    if not meas.subnets or not meas.subnet_stages or not meas.subnets_per_hour:
        raise ContractError(source, "measurement.subnets_per_hour", "a supernet run needs subnets, subnet_stages "
                            "and subnets_per_hour (write one with `mindpipe run --model SUPERNET --out`)")
    device, cluster = measured_machine(source, meas)
    return SupernetRun(source, meas, trace.supernet, cluster, device)


def feature_costs(net: Supernet, plan: Plan, device: DeviceSpec) -> list[SupernetCosts]:
    """Per feature (:data:`FEATURES`), the supernet's parts "priced" by that feature alone, so that
    ``costs[k].stage(...).forward_s`` is feature k of a forward action (backward likewise)."""
    ref = ReferenceOpTime(device)

    def pricer(k: int):  # type: ignore[no-untyped-def]
        def price(ops: Sequence[Op]) -> tuple[float, float, float]:
            out = {"forward": 0.0, "backward_input": 0.0, "backward_weight": 0.0}
            for op in ops:
                if k == len(OP_KINDS):
                    out[op.phase] += 1.0
                elif op.kind == OP_KINDS[k]:
                    out[op.phase] += ref(op, plan.precision)
            return out["forward"], out["backward_input"], out["backward_weight"]
        return price

    return [priced_costs(net, plan, pricer(k), FEATURES[k]) for k in range(len(FEATURES))]


def action_rows(run: SupernetRun) -> tuple[list[list[float]], list[float]]:
    """One row of :data:`FEATURES` per measured F/B action of the run, and its wall duration."""
    meas, plan, net = run.measurement, run.plan, run.supernet
    feats = feature_costs(net, plan, run.device)
    layers = supernet_stage_layers(plan, net)
    firsts = [sum(layers[:s]) for s in range(plan.pp)]
    choices = {sub.id: tuple(sub.choices) for sub in meas.subnets or []}
    rows: list[list[float]] = []
    ys: list[float] = []
    for a in meas.actions:
        if a.kind not in ("F", "B") or a.microbatch not in choices or a.duration_s <= 0:
            continue
        s = a.stage
        parts = [f.stage(choices[a.microbatch], firsts[s], layers[s], s == 0, s == plan.pp - 1) for f in feats]
        rows.append([p.forward_s if a.kind == "F" else p.backward_s for p in parts])
        ys.append(a.duration_s)
    return rows, ys


def update_row(run: SupernetRun, stage: int) -> tuple[float, float] | None:
    """(updates, parameters trained over them) of one stage, or None for a batched update."""
    plan, net, meas = run.plan, run.supernet, run.measurement
    if subnet_schedule(plan) in ("sync",):
        return None
    costs = feature_costs(net, plan, run.device)[-1]
    layers = supernet_stage_layers(plan, net)
    first = sum(layers[:stage])
    trained = sum(costs.stage(tuple(sub.choices), first, layers[stage], stage == 0, stage == plan.pp - 1).trained_params
                  for sub in meas.subnets or [])
    return float(len(meas.subnets or [])), float(trained)


def outside_s(run: SupernetRun) -> list[float]:
    """Per rank: wall time outside compute, stall and update, per subnet (module docstring, 3)."""
    n = run.num_subnets
    return [max(0.0, run.wall_s - r.compute_s - r.stall_s - r.update_s) / n for r in run.measurement.subnet_stages or []]


def trace_sums(run: SupernetRun, trace: Trace) -> tuple[float, float]:
    """(Σ measured F/B action time, Σ the same actions priced from ``trace``) of one run."""
    meas, plan, net = run.measurement, run.plan, run.supernet
    costs = trace_costs(net, plan, trace, "--trace")
    layers = supernet_stage_layers(plan, net)
    firsts = [sum(layers[:s]) for s in range(plan.pp)]
    choices = {sub.id: tuple(sub.choices) for sub in meas.subnets or []}
    measured = priced = 0.0
    for a in meas.actions:
        if a.kind not in ("F", "B") or a.microbatch not in choices or a.duration_s <= 0:
            continue
        s = a.stage
        part = costs.stage(choices[a.microbatch], firsts[s], layers[s], s == 0, s == plan.pp - 1)
        measured += a.duration_s
        priced += part.forward_s if a.kind == "F" else part.backward_s
    return measured, priced


def _profiled(net: Supernet) -> Supernet:
    """What a per-candidate profile depends on: the supernet less its per-layer lists.

    ``mindpipe profile`` times each pool candidate once, whatever the layers it may be chosen in,
    so a profile of one ``layer_candidates`` serves a supernet with other lists (as
    :func:`~mindpipe.simulator.subnet_costs.check_candidate_trace` accepts it for a simulation).
    """
    return replace(net, layer_candidates=None)


def _trace_for(run: SupernetRun, traces: Sequence[Trace]) -> Trace | None:
    """The trace profiled for the run's supernet (its pool: :func:`_profiled`) on the run's device, if any."""
    for t in traces:
        if (t.supernet is not None and _profiled(t.supernet) == _profiled(run.supernet)
                and t.device == run.device.name):
            return t
    return None


def check_profiles(traces: Sequence[Trace], runs: Sequence[SupernetRun]) -> None:
    """Raise unless every trace is a per-candidate profile (what ``--trace`` takes) and, if any are
    given, some run is of a supernet and device one of them profiled."""
    for t in traces:
        if t.granularity != "candidate" or t.supernet is None:
            raise ContractError("--trace", "granularity", f"granularity={t.granularity!r}: --trace needs a "
                                "per-candidate trace (mindpipe profile SUPERNET)")
    if traces and not any(_trace_for(r, traces) is not None for r in runs):
        have = "; ".join(f"{t.supernet.label if t.supernet else '?'} on {t.device}" for t in traces)
        runs_of = "; ".join(sorted({f"{r.supernet.label} on {r.device.name}" for r in runs}))
        raise ContractError("--trace", "supernet", f"no run is of a supernet and device a trace profiled "
                            f"(traces: {have}; runs: {runs_of})")


def calibrate_supernet(runs: list[SupernetRun], traces: Sequence[Trace] = ()) -> tuple[Calibration, FitNotes]:
    """Fit compute, update and outside-action constants per device and precision (module docstring);
    with ``traces`` (per-candidate profiles, ``mindpipe profile SUPERNET``) also each device and
    precision's ``trace_scale`` from the runs of a supernet one of them profiled on that device.

    Raises:
        ContractError: no runs, too few actions to fit, a trace that is not a per-candidate trace,
            or traces none of whose supernet and device a run has.
    """
    if not runs:
        raise ContractError("", "measured", "no measured supernet runs given")
    check_profiles(traces, runs)
    trace_sum = _trace_sums_by_key(runs, traces)
    notes = FitNotes(comm_groups=[], step_residuals_s={}, warnings=[])
    gathered: dict[tuple[str, str], ComputeRows] = defaultdict(lambda: ComputeRows([], [], Counter()))
    outside: dict[str, list[float]] = defaultdict(list)
    kinds: dict[str, str] = {}
    for run in runs:
        rows = gathered[(run.device.name, run.plan.precision)]
        kinds[run.device.name] = run.device.kind
        rows.threads[run.measurement.threads_per_rank] += 1
        rows.actions += list(zip(*action_rows(run), strict=True))
        for rec in run.measurement.subnet_stages or []:
            upd = update_row(run, rec.stage)
            if upd is not None and rec.update_s > 0:
                rows.optimizer.append((list(upd), rec.update_s))
        outside[run.device.name] += outside_s(run)
    devices: dict[str, DeviceCalibration] = {}
    for (device, precision), rows in gathered.items():
        comp = _supernet_constants(f"{device} {precision}", rows, trace_sum.get((device, precision), (0.0, 0.0)),
                                   runs[0].source, notes)
        dev = devices.setdefault(device, DeviceCalibration(kind=kinds[device], compute={}))
        dev.compute[precision] = comp
        dev.step_overhead_s = statistics.median(outside[device])
    cal = Calibration(devices=devices, measurements=[f"{r.source} ({r.supernet.label}, "
                                                     f"{subnet_schedule(r.plan)}, pp{r.plan.pp} dp{r.plan.dp})" for r in runs],
                      tool="mindpipe calibrate (supernet runs)")  # no creation time: see fit.calibrate
    return cal, notes


def _trace_sums_by_key(runs: list[SupernetRun], traces: Sequence[Trace]) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (device, precision): (Σ measured, Σ trace-priced) F/B time of the runs a trace profiled."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for run in runs:
        t = _trace_for(run, traces)
        if t is not None:
            m, p = trace_sums(run, t)
            key = (run.device.name, run.plan.precision)
            before = out.get(key, (0.0, 0.0))
            out[key] = (before[0] + m, before[1] + p)
    return out


def _supernet_constants(label: str, rows: ComputeRows, trace_sum: tuple[float, float], source: str,
                        notes: FitNotes) -> ComputeCalibration:
    """The compute and update constants of one (device, precision) from its gathered rows.

    Raises:
        ContractError: fewer than two actions per constant (named after ``source``).
    """
    design = [f for f, _ in rows.actions]
    if len(design) < 2 * len(FEATURES):
        raise ContractError(source, "measurement.actions",
                            f"{label}: {plural(len(design), 'action')}, too few to fit {len(FEATURES)} constants")
    ys = [y for _, y in rows.actions]
    x, _ = _fit_compute_constants(design, ys)
    # Relative-error fits sit below the mean of a right-skewed sample (an action the OS preempted
    # runs long), but subnets/hour pays the sum: scale the constants so the sums agree.
    feats_m, dur = np.asarray(design), np.asarray(ys)
    x = x * float(dur.sum() / max(float((feats_m @ x).sum()), 1e-300))
    mape = float(np.mean(np.abs(feats_m @ x - dur) / dur))
    scale = kind_scales(x, design)
    unfitted = unfitted_kinds_warning(label, scale, PRICED_KINDS)
    if unfitted is not None:
        notes.warnings.append(unfitted)
    opt = optimizer_constants(rows)
    if opt is None:
        opt = np.zeros(2)
        notes.warnings.append(f"{label}: fewer than 2 per-subnet update figures; update not fitted")
    measured, priced = trace_sum
    return ComputeCalibration(scale=scale, op_overhead_s=float(x[len(OP_KINDS)]), optimizer_overhead_s=float(opt[0]),
                              optimizer_s_per_param=float(opt[1]),
                              trace_scale=measured / priced if priced > 0 else 0.0,
                              threads_per_rank=rows.threads.most_common(1)[0][0], samples=len(design), fit_mape=mape)


def supernet_fidelity(runs: list[SupernetRun], calibration: Calibration | None,
                      traces: Sequence[Trace] = ()) -> list[FidelityRow]:
    """Each run's time per subnet (3600 / subnets per hour): measured, simulated uncalibrated (the
    run's supernet's trace among ``traces`` if there is one, else the hardware model) and with
    ``calibration`` (and that trace), in the rows the GPT fidelity report prints."""
    from mindpipe.simulator.subnet_sim import SupernetSimulator  # subnet_sim imports this package's models

    rows = []
    for run in runs:
        def per_subnet(cal: Calibration | None, run: SupernetRun = run) -> float:
            sim = SupernetSimulator(run.supernet, run.cluster, calibration=cal, trace=_trace_for(run, traces))
            return sim.run(run.plan, run.num_subnets, context_switching=run.context_switching).time_per_subnet_s

        label = f"{plan_label(run.plan)} {subnet_schedule(run.plan)} {run.supernet.label}"
        rows.append(FidelityRow(run.name, label, run.plan.world_size, run.wall_s / run.num_subnets, per_subnet(None),
                                None if calibration is None else per_subnet(calibration)))
    return rows


__all__ = ["FEATURES", "PRICED_KINDS", "SupernetRun", "action_rows", "calibrate_supernet", "check_profiles", "feature_costs", "load_measured", "median_repeats", "outside_s",
           "supernet_fidelity", "trace_sums", "update_row"]
