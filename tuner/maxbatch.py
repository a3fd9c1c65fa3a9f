"""The maximum trainable batch (``mindpipe tune --objective max_batch``): the largest global batch
that fits, with the partition and the memory policy chosen together, and the throughput there.

With m micro-batches per iteration, a 1F1B stage holds min(p − s, m) of them, so once m ≥ p the
memory depends on the micro-batch size alone and any global batch could be reached by accumulating
more micro-batches. The maximum trainable batch is therefore taken, as in the vPipe and DawnPiper
evaluations, at a fixed number of micro-batches m (default p, the fewest that fill the pipeline):
global batch = dp × micro-batch size × m, and the search is over the micro-batch size. For each
candidate size the partitioner runs (:func:`mindpipe.tuner.materialize.materialize`: a memory-aware
partitioner chooses the per-block keep/recompute/swap with the split) and the simulator's memory
model says whether the plan fits; sizes are doubled until one does not fit, then bisected (fitting
is taken as monotone in the micro-batch size: a smaller batch needs less of every term). The
memory-blind baselines (``even``, ``pipedream``, ``balanced``) keep every activation unless
``recompute`` is pinned. The plan found is simulated for its throughput.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.traces.atomic import output_dir, write_text
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.config import LAYER_MEMORY_POLICIES, Cluster, MadeFor, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.schema import to_dict, write_json
from mindpipe.traces.trace import Trace
from mindpipe.traces.units import plural
from mindpipe.tuner.keys import (
    CLI_ARG_NAMES,
    PYTHON_ARG_NAMES,
    WHAT_IF_KEYS,
    ArgNames,
    Point,
    check_partitioners,
    read_fixes,
)
from mindpipe.tuner.materialize import Materialized, Problem, materialize


@dataclass(frozen=True)
class MaxBatch:
    """The largest fitting batch of one (mesh, partitioner).

    Attributes:
        partitioner: The partitioner.
        dp, tp, pp: The mesh.
        num_microbatches: Micro-batches per iteration (fixed).
        micro_batch_size: The largest fitting micro-batch size (0: not even 1 fits).
        global_batch_size: dp × micro_batch_size × num_microbatches (0 when nothing fits).
        plan: The plan at that size (partition and policy written in), None when nothing fits.
        throughput_samples_per_s: Simulated throughput of ``plan``.
        peak_memory_gib: Largest rank's memory of ``plan``.
    """

    partitioner: str
    dp: int
    tp: int
    pp: int
    num_microbatches: int
    micro_batch_size: int
    global_batch_size: int
    plan: Plan | None
    throughput_samples_per_s: float | None
    peak_memory_gib: float | None


def point_at(base: Mapping[str, Any], micro_batch_size: int, num_microbatches: int) -> Point:
    """``base`` with the micro-batch size and the global batch it gives."""
    point = dict(base, micro_batch_size=micro_batch_size,
                 global_batch_size=base["dp"] * micro_batch_size * num_microbatches)
    return point


def _try(problem: Problem, base: Mapping[str, Any], mbs: int, m: int) -> Materialized | None:
    """The materialised plan at ``mbs`` when it fits, else None (a size the plan rules refuse: None).

    :func:`search` has already refused a mesh whose plan, or partitioner, breaks a rule at one
    sample per micro-batch (:func:`_mesh_rule`), so a refusal here is one of the size's own.
    """
    try:
        mat = materialize(problem, point_at(base, mbs, m))
    except ContractError:
        return None
    return mat if mat.fits else None


def largest_fit(problem: Problem, base: Mapping[str, Any], num_microbatches: int,
                max_micro_batch: int | None = None) -> tuple[int, Materialized | None]:
    """(largest fitting micro-batch size, its plan) by doubling then bisection; (0, None) if 1 does not fit."""
    top = max_micro_batch or int(limit("micro_batch_size"))
    best = _try(problem, base, 1, num_microbatches)
    if best is None:
        return 0, None
    lo, hi = 1, None
    while hi is None:
        nxt = min(2 * lo, top)
        if nxt == lo:
            return lo, best
        mat = _try(problem, base, nxt, num_microbatches)
        if mat is None:
            hi = nxt
        else:
            lo, best = nxt, mat
    while hi - lo > 1:
        mid = (lo + hi) // 2
        mat = _try(problem, base, mid, num_microbatches)
        if mat is None:
            hi = mid
        else:
            lo, best = mid, mat
    return lo, best


def max_batch(problem: Problem, base: Mapping[str, Any], num_microbatches: int,
              max_micro_batch: int | None = None) -> MaxBatch:
    """The largest fitting global batch of ``base`` (a point without the batch keys) and its throughput."""
    mbs, mat = largest_fit(problem, base, num_microbatches, max_micro_batch)
    thr = peak = None
    if mat is not None:
        result = problem.simulator().run(mat.plan)
        thr, peak = result.throughput_samples_per_s, mat.peak_memory_gib
    return MaxBatch(base["partitioner"], base["dp"], base["tp"], base["pp"], num_microbatches, mbs,
                    base["dp"] * mbs * num_microbatches if mat is not None else 0,
                    mat.plan if mat is not None else None, thr, peak)


def throughput_at(problem: Problem, base: Mapping[str, Any], micro_batch_size: int,
                  num_microbatches: int) -> float | None:
    """Simulated throughput of ``base`` at a given micro-batch size; None when it does not fit."""
    mat = _try(problem, base, micro_batch_size, num_microbatches)
    return None if mat is None else problem.simulator().run(mat.plan).throughput_samples_per_s


def _values(fixes: Mapping[str, Any], key: str, default: list[Any]) -> list[Any]:
    value = fixes.get(key)
    if value is None:
        return default
    return list(value) if isinstance(value, list) else [value]


def meshes(problem: Problem, fixes: Mapping[str, Any]) -> Iterator[tuple[int, int, int]]:
    """(dp, tp, pp) of the cluster allowed by ``fixes`` (tp within a node)."""
    world = problem.cluster.world_size
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    for tp, pp in itertools.product(_values(fixes, "tp", divisors), _values(fixes, "pp", divisors)):
        if tp > problem.cluster.gpus_per_node or world % (tp * pp):
            continue
        dp = world // (tp * pp)
        if dp in _values(fixes, "dp", [dp]):
            yield dp, tp, pp


MESH_KEYS = ("dp", "tp", "pp")
"""The keys whose ``--fix`` lists :func:`meshes` searches; every other key is pinned to one value."""


def _search_name(arg_names: ArgNames) -> str:
    """What the caller ran: ``--objective max_batch`` on the command line, ``tune_max_batch`` in Python."""
    return "tune_max_batch" if arg_names.python else "--objective max_batch"


def check_fixes(fixes: Mapping[str, Any], *, arg_names: ArgNames = CLI_ARG_NAMES) -> None:
    """Refuse ``--fix`` values the search would otherwise drop (:func:`base_point` pins scalars only).

    Raises:
        ContractError: a list for a key other than dp, tp, pp; the batch keys, which are searched;
            the partition or per-block policy, which ``--partitioner`` chooses with the batch. Named as
            ``arg_names`` names the arguments.
    """
    fix, mode = arg_names.name("--fix"), _search_name(arg_names)
    for key, value in fixes.items():
        if key in ("micro_batch_size", "global_batch_size"):
            raise ContractError(fix, key, f"{key}: {mode} searches the micro-batch size (global batch = dp x "
                                f"micro-batch size x {arg_names.name('--microbatches')}); do not pin it")
        if key in ("partition", "layer_memory_policy"):
            raise ContractError(fix, key, f"{key}: {mode} chooses the partition and memory policy for each batch "
                                f"size with {arg_names.name('--partitioner')} (vpipe, dawnpiper choose per-block "
                                "policies)")
        if isinstance(value, list) and key not in MESH_KEYS:
            shown_values = ",".join(json.dumps(v) if isinstance(v, bool) else str(v) for v in value)
            raise ContractError(fix, key, f"{key}={shown_values}: {mode} pins {key} to one value "
                                f"(only {', '.join(MESH_KEYS)} take a list, searched as meshes); run it once per value")


def base_point(dp: int, tp: int, pp: int, partitioner: str, fixes: Mapping[str, Any]) -> Point:
    """A point of the mesh without the batch keys: pinned scalars, else 1F1B and the Plan's defaults."""
    point: Point = {"dp": dp, "tp": tp, "pp": pp, "partitioner": partitioner, "schedule": "1f1b", "recompute": "none"}
    for key, value in fixes.items():
        if key not in ("dp", "tp", "pp", "micro_batch_size", "global_batch_size", "partitioner", "partition",
                       "layer_memory_policy") and not isinstance(value, list):
            point[key] = value
    return point


def search(problem: Problem, fixes: Mapping[str, Any], partitioner: str,
           num_microbatches: int | None = None) -> list[MaxBatch]:
    """:func:`max_batch` of every allowed mesh, best first (largest batch, then throughput).

    A mesh whose plan or partitioner breaks a rule (:func:`_mesh_rule`) is left out.

    Args:
        problem: Model, cluster, trace, calibration.
        fixes: Parsed ``--fix`` values (scalars pin plan keys; dp, tp, pp may be lists).
        partitioner: The partitioner.
        num_microbatches: Micro-batches per iteration (default: pp of each mesh).
    """
    out = []
    for dp, tp, pp in meshes(problem, fixes):
        base = base_point(dp, tp, pp, partitioner, fixes)
        if _mesh_rule(problem, base, num_microbatches or pp) is not None:
            continue
        out.append(max_batch(problem, base, num_microbatches or pp))
    out.sort(key=lambda r: (-r.global_batch_size, -(r.throughput_samples_per_s or 0.0)))
    return out


def _mesh_rule(problem: Problem, base: Mapping[str, Any], num_microbatches: int) -> str | None:
    """The rule ``base`` breaks at one sample per micro-batch, or None when it is a plan its partitioner
    can plan: the plan rules, then the partitioner's own (``vpipe`` and ``dawnpiper`` need one stage
    per pipeline rank, so refuse interleaved and V schedules), which would otherwise read as
    "nothing fits"."""
    point = point_at(base, 1, num_microbatches)
    try:
        problem.simulator().check(Plan(**{k: v for k, v in point.items() if k != "partitioner"}))
        materialize(problem, point)
    except ContractError as e:
        return e.rule
    return None


def _no_mesh(problem: Problem, fixes: Mapping[str, Any], partitioner: str = "balanced",
             num_microbatches: int | None = None) -> str:
    """Why :func:`search` had no mesh to try with ``partitioner``: no dp x tp x pp of the devices
    matches ``fixes``, or the first rule broken (at ``num_microbatches``, default pp, as searched)."""
    cluster = problem.cluster
    allowed = list(meshes(problem, fixes))
    if not allowed:
        return (f"no dp x tp x pp mesh of the {cluster.world_size} devices matches it (dp·tp·pp = "
                f"{cluster.world_size}, tp <= {cluster.gpus_per_node} per node)")
    dp, tp, pp = allowed[0]
    m = num_microbatches or pp
    rule = _mesh_rule(problem, base_point(dp, tp, pp, partitioner, fixes), m)
    example = f", e.g. dp={dp}, tp={tp}, pp={pp} with {plural(m, 'micro-batch', 'micro-batches')}: {rule}" \
        if rule is not None else ""
    return f"every dp x tp x pp mesh it allows breaks a plan rule{example}"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b; inf when only b is 0 (nothing fits the baseline); None when either is missing."""
    if a is None or b is None:
        return None
    return math.inf if b == 0 and a > 0 else (a / b if b else None)




def row(r: MaxBatch) -> dict[str, Any]:
    """One result as a JSON row (the plan's partition, boundaries inside blocks and policy counts included)."""
    plan = r.plan
    policy = plan.layer_memory_policy if plan is not None else None
    return {"partitioner": r.partitioner, "dp": r.dp, "tp": r.tp, "pp": r.pp, "num_microbatches": r.num_microbatches,
            "micro_batch_size": r.micro_batch_size, "global_batch_size": r.global_batch_size,
            "throughput_samples_per_s": r.throughput_samples_per_s, "peak_memory_gib": r.peak_memory_gib,
            "partition": plan.partition if plan is not None else None,
            "stage_cuts": plan.stage_cuts if plan is not None else None,
            "swap_copy_back": plan.swap_copy_back if plan is not None else None,
            "policy_counts": {p: policy.count(p) for p in LAYER_MEMORY_POLICIES} if policy else None}


@dataclass(frozen=True)
class MaxBatchSummary:
    """What ``tune --objective max_batch`` reports: the largest batch found (its plan with ``made_for``),
    every (mesh, partitioner) result and the output directory."""

    best: MaxBatch
    results: list[MaxBatch]
    out: str

    @property
    def best_value(self) -> int:
        """The largest fitting global batch (``best_value`` in the JSON, as :class:`~mindpipe.tuner.summary.TuneSummary` names it)."""
        return self.best.global_batch_size

    @property
    def best_plan(self) -> Plan | None:
        """The plan at that batch, with ``made_for`` (``best_plan`` in the JSON)."""
        return self.best.plan

    def to_dict(self) -> dict[str, Any]:
        """``summary.json`` and ``--json``: ``best_value`` (the global batch), ``best_plan``, the
        throughput there, and every result as in ``max_batch.json``."""
        b = self.best
        return {"objective": "max_batch", "best_value": self.best_value,
                "best_plan": to_dict(self.best_plan) if self.best_plan is not None else None,
                "partitioner": b.partitioner,
                "micro_batch_size": b.micro_batch_size, "num_microbatches": b.num_microbatches,
                "throughput_samples_per_s": b.throughput_samples_per_s, "peak_memory_gib": b.peak_memory_gib,
                "results": [row(r) for r in self.results], "out": self.out}


def tune_max_batch(model: Model | str, cluster: Cluster | str, *, out: str | Path, partitioners: Sequence[str],
                   fixes: dict[str, Any] | Sequence[str] | None = None, num_microbatches: int | None = None,
                   trace: Trace | None = None, calibration: Calibration | None = None,
                   trace_source: str = "trace", calibration_source: str = "calibration",
                   arg_names: ArgNames = PYTHON_ARG_NAMES) -> MaxBatchSummary:
    """The largest trainable global batch over the allowed meshes and ``partitioners``; writes outputs.

    Writes ``best_plan.json`` (with ``made_for``), ``max_batch.json`` (every mesh and partitioner) and
    ``summary.json`` (what ``--json`` prints) to ``out``, and returns the summary.

    A ``trace`` pins ``precision`` and ``flash_attention`` to how it was profiled, as
    :func:`mindpipe.tuner.api.tune` does (its times are that dtype's and that attention kernel's);
    ``--fix`` with another value is refused.

    Args:
        trace_source, calibration_source: Their file or name, for ``best_plan.json``'s ``made_for``.
        arg_names: How errors name the arguments: this function's keywords (``fixes``), or
            :data:`~mindpipe.tuner.keys.CLI_ARG_NAMES` for ``mindpipe tune``'s flags.

    Raises:
        ContractError: an unknown partitioner, one that plans none of the allowed meshes (``vpipe``
            and ``dawnpiper`` with an interleaved or V schedule), a ``--fix`` the trace cannot
            price, or no plan fits even one sample per micro-batch.
    """
    from mindpipe.tuner.api import attention_as_profiled, fingerprint, precision_as_profiled, reference

    model, cluster = load_model(model), load_cluster(cluster)
    fix, mode = arg_names.name("--fix"), _search_name(arg_names)
    fixed = read_fixes(fixes, arg_names=arg_names)
    for key, run in WHAT_IF_KEYS.items():  # the meshes here are dp·tp·pp, the plans the executor runs
        if key in fixed and any(v != run for v in (fixed[key] if isinstance(fixed[key], list) else [fixed[key]])):
            raise ContractError(fix, key, f"{key} is a what-if knob (the executor runs only {key}="
                                f"{json.dumps(run)}); {mode} searches the plans the executor runs")
    if any(v != 1 for v in (fixed["cp"] if isinstance(fixed.get("cp"), list) else [fixed.get("cp", 1)])):
        raise ContractError(fix, "cp", f"{mode} searches dp x tp x pp meshes (cp=1); "
                            "context parallelism is searched by the other objectives")
    check_fixes(fixed, arg_names=arg_names)
    if trace is not None:  # a trace prices only plans run as it was profiled (the plans tune proposes)
        fixed = precision_as_profiled(attention_as_profiled(fixed, trace, arg_names=arg_names), trace,
                                      arg_names=arg_names)
    partitioners = check_partitioners(partitioners, arg_names=arg_names)
    problem = Problem(model, cluster, trace, fingerprint=fingerprint(model, cluster, trace, calibration),
                      calibration=calibration)
    results = []
    for name in partitioners:
        found = search(problem, fixed, name, num_microbatches)
        if not found:  # named, not dropped: a partitioner asked for that plans none of the meshes
            where = f"{arg_names.name('--partitioner')} {name}" if len(partitioners) > 1 else fix
            raise ContractError(where, None, _no_mesh(problem, fixed, name, num_microbatches))
        results.extend(found)
    results.sort(key=lambda r: (-r.global_batch_size, -(r.throughput_samples_per_s or 0.0)))
    out_dir = output_dir(Path(out))
    table = [row(r) for r in results]
    write_text(out_dir / "max_batch.json", json.dumps(table, indent=1) + "\n")
    best = results[0]
    if best.plan is None:
        raise ContractError("tune", None, f"no plan of {model.label} fits one sample per micro-batch on "
                            f"{cluster.world_size} × {cluster.gpu} (see {out_dir / 'max_batch.json'})")
    made_for = MadeFor(model, cluster, tool="mindpipe tune --objective max_batch",
                       trace=reference(trace_source, trace) if trace is not None else None,
                       calibration=reference(calibration_source, calibration) if calibration is not None else None)
    plan = dataclasses.replace(best.plan, made_for=made_for)
    write_json(plan, out_dir / "best_plan.json")
    summary = MaxBatchSummary(dataclasses.replace(best, plan=plan), results, str(out_dir))
    write_text(out_dir / "summary.json", json.dumps(summary.to_dict(), indent=1) + "\n")
    return summary


__all__ = ["MESH_KEYS", "MaxBatch", "MaxBatchSummary", "base_point", "check_fixes", "largest_fit", "max_batch", "meshes", "point_at", "ratio", "row", "search",
           "throughput_at", "tune_max_batch"]
