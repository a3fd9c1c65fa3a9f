"""Fit a :class:`~mindpipe.traces.calibration.Calibration` from measured runs (``mindpipe calibrate``).

Three fits, in order, each on what the executor recorded (:mod:`mindpipe.traces.measured`):

1. **Communication** (per backend and link type): the collectives of the profiled step, grouped
   by operation, message size and group size. A host-side collective time includes waiting for
   the slowest peer, so each group's time is a low quantile of its events (the events where
   everyone was already there). All-reduces are fitted with the ring α-β model
   ``t = steps(op, k) · α + wire_bytes(op, n, k) / β`` (nccl-tests PERFORMANCE.md), which then
   prices every transfer on that link. Point-to-point events are left out: a gloo send completes
   when the peer has received (its time is mostly the peer's), and a receive whose data had
   already arrived times only the final copy. All-gathers are left out because the profiler's
   input shapes do not say whether a size is the shard or the gathered tensor. Groups inside one
   node fit that node's link; on several nodes, all-reduces over data- or tensor-parallel groups
   that span nodes then fit the NICs, as the simulator's topology splits them (:func:`fit_comm`).
   On a CPU host the rest of each tensor-parallel event, beyond its group's fastest, is the wait
   for the peers (``LinkCalibration.tp_wait_s``, :func:`tp_waits`).
2. **Compute** (per device and precision): the work of every compute action of the clean steps —
   what it would take alone — is its process CPU time where the executor recorded it (CPU ranks;
   divided by the threads per rank), else its duration less the modelled time of the TP
   collectives inside it, times its shared-core rate
   (:func:`~mindpipe.simulator.calibrate.features.shared_core_rates`).
   The medians per (rank, stage, action kind) are fitted by non-negative least squares on
   relative error to the features of :func:`~mindpipe.simulator.calibrate.features.action_features`;
   the optimizer step likewise to (1, parameters per rank).
3. **Host CPU** (CPU devices with the ranks' CPU time recorded): each rank's CPU time per
   iteration outside its compute actions and its optimizer step (as fitted in 2) is fitted by
   non-negative least squares on relative error to
   :data:`~mindpipe.simulator.calibrate.features.HOST_FEATURES` — a fixed part, a part per operator its
   actions run, and the host copies of its transfers per algorithm step and per wire byte. On a host
   whose ranks share the cores, gloo's copies run on the same cores as compute: on the 2-vCPU
   machine of ``benchmarks/calibration_fidelity.py`` a tensor-parallel rank spends 10–24 % of its
   CPU outside its actions (its in-action collectives aside), a pipeline-only rank 5–8 %.
4. **Step overhead** (per device): the median, over runs, of measured minus simulated iteration
   time once 1–3 are in — what the simulator still does not see.

Not a hardware constant, but carried along: the runs' measured gradient noise scale
(:func:`mindpipe.simulator.calibrate.noise.fit_noise`), the critical batch of goodput tuning.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.build import optimizer_shard, rank_params
from mindpipe.simulator.calibrate.features import (
    FEATURES,
    HOST_FEATURES,
    action_collectives,
    action_features,
    rank_host_features,
    shared_core_rates,
    stage_structure,
)
from mindpipe.simulator.calibrate.models import ReferenceOpTime, as_run
from mindpipe.simulator.calibrate.noise import fit_noise
from mindpipe.simulator.calibrate.runs import MeasuredRun
from mindpipe.simulator.collectives import ring_steps, wire_bytes
from mindpipe.simulator.topology import Phase, Topology
from mindpipe.traces.calibration import (
    OP_KINDS,
    Calibration,
    ComputeCalibration,
    DeviceCalibration,
    LinkCalibration,
)
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import stage_to_rank
from mindpipe.traces.units import plural
from scipy.optimize import lsq_linear, nnls

# A group's transfer time: this quantile of its events (0: the fastest, where nobody waited).
COMM_QUANTILE = 0.0
# Weight of the pull of each operator kind's scale towards the common scale, per fitted row
# (ridge; see _fit_compute_constants).
RIDGE_PER_ROW = 0.01
# Constants no fitted run can identify (their features are 0 in every row): they stay 0, and a
# simulation of a plan that has them prices nothing for them; the report says so.
UNFITTED = ((("tp_ops", "tp_bytes"), "no run fitted on has tensor-parallel layers: their extra time per operator "
             "and per byte sent is not fitted (0: a tensor-parallel plan is priced without it)"),
            (("dp_units",), "no run fitted on wraps modules for data parallelism: the time per wrapped module "
             "is not fitted (0: a data-parallel plan is priced without it)"),
            (("split_input_ops", "weight_passes", "weight_pass_ops"), "no run fitted on splits its backward (I and "
             "W): torch's host work of the split (I's grouping walk, W's pass per parameter group) is not fitted "
             "(0: a zero-bubble plan is priced as one backward)"))
# Scales NNLS drives to zero (the kind's time is explained by the overhead term) are kept at
# this floor so the contract's "positive" rule holds; such a kind then costs almost nothing.
MIN_SCALE = 1e-3


@dataclass
class FitNotes:
    """What each fit used and how well it explains its own data (for the report)."""

    comm_groups: list[dict[str, float | int | str]]
    step_residuals_s: dict[str, float]
    warnings: list[str]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _nnls_relative(rows: list[list[float]], targets: list[float]) -> tuple[np.ndarray, float]:
    """Non-negative x minimising Σ ((A x − y) / y)²; returns x and the fit's MAPE."""
    a = np.asarray(rows, dtype=float)
    y = np.asarray(targets, dtype=float)
    w = 1.0 / y
    # Columns differ by orders of magnitude (seconds vs counts); scale them for conditioning.
    norms = np.linalg.norm(a * w[:, None], axis=0)
    norms[norms == 0] = 1.0
    x, _ = nnls(a * w[:, None] / norms, y * w)
    x = x / norms
    mape = float(np.mean(np.abs(a @ x - y) / y))
    return x, mape


def _fit_compute_constants(rows: list[list[float]], targets: list[float]) -> tuple[np.ndarray, float]:
    """Scales per kind, per-op and per-TP-op overheads (``FEATURES`` order) and the fit's MAPE.

    For one model the kinds' reference times all grow with the tokens of a micro-batch, so the
    data barely tell them apart. First a tied fit (one scale for every kind, both overheads),
    then the per-kind fit with a ridge pull of each scale towards the tied one: a kind's scale
    leaves the common value only where the data clearly ask for it.
    """
    a = np.asarray(rows, dtype=float)
    y = np.asarray(targets, dtype=float)
    nk = len(OP_KINDS)
    tied_rows = np.column_stack([a[:, :nk].sum(axis=1), a[:, nk:]])
    tied, _ = _nnls_relative(tied_rows.tolist(), targets)
    common = max(float(tied[0]), MIN_SCALE)
    used = [k for k in range(nk) if np.any(a[:, k] > 0)]
    lam = RIDGE_PER_ROW * len(y)
    w = 1.0 / y
    penalty = np.zeros((len(used), a.shape[1]))
    for i, k in enumerate(used):
        penalty[i, k] = np.sqrt(lam) / common
    design = np.vstack([a * w[:, None], penalty])
    target = np.concatenate([y * w, np.full(len(used), np.sqrt(lam))])
    x = lsq_linear(design, target, bounds=(0.0, np.inf)).x
    for k in range(nk):
        if k not in used:
            x[k] = common
    for k in range(nk, a.shape[1]):
        if not np.any(a[:, k] > 0):
            x[k] = 0.0  # no run had this feature (e.g. no fresh allocation): the data say nothing of it
    mape = float(np.mean(np.abs(a @ x - y) / y))
    return x, mape


def _intra_link(run: MeasuredRun) -> str:
    """The link type collectives inside one node use."""
    return "local" if run.device.kind == "cpu" else "nvlink"


def _spanning(run: MeasuredRun, axis: str, n: int, k: int, rank: int) -> list[Phase] | None:
    """The phases of an all-reduce of ``n`` bytes over ``rank``'s ``axis`` group when that group
    spans nodes (:meth:`Topology.collective`: reduce-scatter inside each node, a ring over the
    NICs, all-gather inside each node); None for a group inside one node, or one the plan's
    mesh does not describe (``k`` other than the axis's size)."""
    plan = run.plan
    if run.measurement.nodes == 1 or axis not in ("dp", "tp") or k != (plan.tp if axis == "tp" else plan.grad_replicas):
        return None
    topo = Topology(plan, run.cluster, run.device, rank_order=plan.rank_order)  # placed as the simulator places it
    phases = topo.collective("allreduce", float(n), axis, topo.coords(rank)[0])
    return phases if any(ph.link_type == "nic" for ph in phases) else None


def fit_comm(runs: list[MeasuredRun]) -> tuple[dict[str, dict[str, LinkCalibration]], list[dict[str, float | int | str]]]:
    """α-β per backend and link type from the profiled collectives (module docstring, step 1).

    Collectives inside one node fit the node's link (NVLink, or a CPU host's loopback). Those
    whose group spans nodes then fit the NICs: what the fitted intra-node link does not explain
    of such an all-reduce (its reduce-scatter and all-gather inside each node) is the ring over
    the node's NICs, ``steps(op, nodes) · α + wire_bytes · flows / β`` with ``flows`` the groups
    of the stage that cross the same NIC at once (as the simulator's topology shares it), so β
    is the node's achieved NIC bandwidth.
    """
    groups: dict[tuple[str, str, str, int, int], list[float]] = defaultdict(list)
    spanning: dict[tuple[str, int, tuple[Phase, ...]], list[float]] = defaultdict(list)
    for run in runs:
        link = _intra_link(run)
        meas, plan = run.measurement, run.plan
        sizes = {"dp": plan.grad_replicas, "tp": plan.tp, "pp": 2}
        for c in meas.comms:
            if c.kind != "collective" or not c.size_bytes or c.op != "allreduce" or not c.duration_s > 0:
                continue  # a 0 s collective was not timed; it cannot weigh a relative fit
            k = c.group_size or sizes.get(c.axis)
            if not k or k < 2:
                continue
            if meas.nodes > 1 and c.axis not in ("dp", "tp"):
                continue  # which links a group of another axis crosses is not known
            phases = _spanning(run, c.axis, c.size_bytes, k, c.rank)
            if phases is None:
                groups[(meas.backend, link, c.op, c.size_bytes, k)].append(c.duration_s)
            else:
                spanning[(meas.backend, c.size_bytes, tuple(phases))].append(c.duration_s)
    out: dict[str, dict[str, LinkCalibration]] = {}
    table: list[dict[str, float | int | str]] = []
    by_link: dict[tuple[str, str], list[tuple[str, int, int, float, int]]] = defaultdict(list)
    for (backend, link, op, n, k), durations in groups.items():
        by_link[(backend, link)].append((op, n, k, _quantile(durations, COMM_QUANTILE), len(durations)))
    _fit_links(by_link, out, table)
    _fit_nics(spanning, out, table)
    _fit_waits(runs, out)
    return out, table


def tp_waits(run: MeasuredRun) -> list[float]:
    """Each profiled tensor-parallel collective's wait for its peers in ``run``, as on a host with
    a core per rank (``LinkCalibration.tp_wait_s``): its time less the fastest event of the same
    operation and size (where every peer was already there), over :func:`oversubscription`. Empty
    where the cores are not shared (GPUs) or no tensor-parallel collective was timed."""
    if _slots(run) is None or run.plan.tp < 2:
        return []
    groups: dict[tuple[str, int | None], list[float]] = defaultdict(list)
    for c in run.measurement.comms:
        if c.kind == "collective" and c.axis == "tp" and c.duration_s > 0:
            groups[(c.op, c.size_bytes)].append(c.duration_s)
    over = oversubscription(run)
    return [(d - min(durations)) / over for durations in groups.values() for d in durations]


def _fit_waits(runs: list[MeasuredRun], out: dict[str, dict[str, LinkCalibration]]) -> None:
    """Each fitted link's ``tp_wait_s``: the median over runs of each run's median
    (:func:`tp_waits`; a round in which the host stalled waits several times longer)."""
    by_link: dict[tuple[str, str], list[float]] = defaultdict(list)
    for run in runs:
        waits = tp_waits(run)
        if waits:
            by_link[(run.measurement.backend, _intra_link(run))].append(statistics.median(waits))
    for (backend, link), medians in by_link.items():
        cal = out.get(backend, {}).get(link)
        if cal is not None:
            cal.tp_wait_s = statistics.median(medians)


def _fit_links(by_link: dict[tuple[str, str], list[tuple[str, int, int, float, int]]],
               out: dict[str, dict[str, LinkCalibration]], table: list[dict[str, float | int | str]]) -> None:
    """α-β of each (backend, link) from its groups' times (at least two message sizes)."""
    for (backend, link), samples in sorted(by_link.items()):
        if len({(op, n) for op, n, *_ in samples}) < 2:
            continue  # one message size cannot separate latency from bandwidth
        rows = [[float(ring_steps(op, k)), wire_bytes(op, n, k)] for op, n, k, _, _ in samples]
        x, mape = _nnls_relative(rows, [t for *_, t, _ in samples])
        if x[1] <= 0:
            continue
        out.setdefault(backend, {})[link] = LinkCalibration(
            step_latency_s=float(x[0]), bandwidth_Bps=float(1.0 / x[1]), samples=sum(c for *_, c in samples),
            fit_mape=mape)
        for (op, n, k, t, count), row in zip(samples, rows, strict=True):
            table.append({"backend": backend, "link": link, "op": op, "size_bytes": n, "group_size": k, "events": count,
                          "measured_s": t, "fitted_s": float(row[0] * x[0] + row[1] * x[1])})


def _fit_nics(spanning: dict[tuple[str, int, tuple[Phase, ...]], list[float]],
              out: dict[str, dict[str, LinkCalibration]], table: list[dict[str, float | int | str]]) -> None:
    """α-β of the NICs from all-reduces over groups that span nodes (:func:`fit_comm`)."""
    by_backend: dict[str, list[tuple[list[float], float, float, int, int, int]]] = defaultdict(list)
    for (backend, size, phases), durations in spanning.items():
        t = _quantile(durations, COMM_QUANTILE)
        inside = 0.0
        row: list[float] = []
        nodes = 0
        known = True
        for ph in phases:
            if ph.link_type == "nic":
                flow = ph.flows[0]
                row = [float(ring_steps(ph.op, ph.group_size) * ph.count), flow.nbytes * max(flow.multiplicity)]
                nodes = ph.group_size
                continue
            cal = out.get(backend, {}).get(ph.link_type)
            if cal is None:
                known = False  # the intra-node part is not known: this group cannot be split
                break
            # As the calibrated model prices it: the collective the backend runs (gloo has no
            # reduce-scatter), its steps and its bytes (CalibratedCommModel).
            ran = as_run(ph.op, backend)
            more = wire_bytes(ran, 1.0, ph.group_size) / wire_bytes(ph.op, 1.0, ph.group_size)
            inside += (ring_steps(ran, ph.group_size) * ph.count * cal.step_latency_s
                       + sum(f.nbytes for f in ph.flows) * more / cal.bandwidth_Bps)
        if row and known and t - inside > 0:
            by_backend[backend].append((row, t - inside, t, size, nodes, len(durations)))
    for backend, samples in sorted(by_backend.items()):
        if len({n for *_, n, _, _ in samples}) < 2:
            continue  # one message size cannot separate latency from bandwidth
        x, mape = _nnls_relative([r for r, *_ in samples], [y for _, y, *_ in samples])
        if x[1] <= 0:
            continue
        out.setdefault(backend, {})["nic"] = LinkCalibration(
            step_latency_s=float(x[0]), bandwidth_Bps=float(1.0 / x[1]), samples=sum(c for *_, c in samples),
            fit_mape=mape)
        for row, y, t, n, nodes, count in samples:
            table.append({"backend": backend, "link": "nic", "op": "allreduce", "size_bytes": n, "group_size": nodes,
                          "events": count, "measured_s": t, "fitted_s": float(t - y + row[0] * x[0] + row[1] * x[1])})


def _slots(run: MeasuredRun) -> float | None:
    """Ranks the host's cores run at full speed at once (None: devices are not shared)."""
    meas = run.measurement
    if run.device.kind != "cpu" or not meas.cpus_per_node:
        return None
    return meas.cpus_per_node / meas.threads_per_rank


def oversubscription(run: MeasuredRun) -> float:
    """A host's ranks over the ranks its cores run at full speed at once, at least 1 (1 where
    devices are not shared): how much slower each rank's work runs when all compute together."""
    slots = _slots(run)
    return 1.0 if slots is None else max(1.0, run.cluster.gpus_per_node / slots)


def _tp_comm_s(colls, plan, link: LinkCalibration | None, backend: str) -> float:
    if link is None or plan.tp < 2:
        return 0.0
    return sum(ring_steps(as_run(c.op, backend), plan.tp) * link.step_latency_s
               + wire_bytes(as_run(c.op, backend), c.nbytes, plan.tp) / link.bandwidth_Bps for c in colls)


def _params_by_rank(run: MeasuredRun) -> dict[int, float]:
    """Parameters whose optimizer step each pipeline rank runs (the engine's own rules)."""
    plan = run.plan
    params = rank_params(stage_structure(run.model, plan), stage_to_rank(plan), plan.pp)
    return {r: optimizer_shard(plan, n) for r, n in enumerate(params)}


def _action_rows(run: MeasuredRun, link: LinkCalibration | None) -> list[tuple[list[float], float]]:
    """(features, work) of each (rank, stage, action kind) of ``run``'s clean steps: the median of
    what its actions would take alone (module docstring, step 2)."""
    meas, plan = run.measurement, run.plan
    feats = action_features(run.model, plan, ReferenceOpTime(run.device))
    colls = action_collectives(run.model, plan)
    clean = set(run.clean_steps)
    actions = [a for a in meas.actions if a.step in clean]
    slots = _slots(run)
    rates = shared_core_rates(actions, slots) if slots is not None else [1.0] * len(actions)
    work: dict[tuple[int, int, str], list[float]] = defaultdict(list)
    for a, rate in zip(actions, rates, strict=True):
        if a.cpu_s is not None:
            # CPU time is the work itself (blocked collective waits use none of it).
            alone = a.cpu_s / meas.threads_per_rank
        else:
            alone = (a.duration_s - _tp_comm_s(colls[(a.stage, a.kind)], plan, link, meas.backend)) * rate
        work[(a.rank, a.stage, a.kind)].append(alone)
    out: list[tuple[list[float], float]] = []
    for (_, stage, kind), values in work.items():
        y = statistics.median(values)
        if y > 0 and any(feats[(stage, kind)]):
            out.append((feats[(stage, kind)], y))
    return out


def _optimizer_rows(run: MeasuredRun) -> list[tuple[list[float], float]]:
    """([1, parameters], seconds) of each rank's measured optimizer step in ``run``."""
    # The optimizer steps of all ranks of a node run together, after the last backward.
    share = 1.0 / oversubscription(run)
    params = _params_by_rank(run)
    return [([1.0, float(params.get(r.pp_rank, 0))], r.optimizer_s * share)
            for r in run.measurement.ranks if r.optimizer_s > 0]


@dataclass
class ComputeRows:
    """The rows a compute fit gathered for one (device, precision).

    Attributes:
        actions: (features, seconds) of each fitted action group.
        optimizer: (features, seconds) of each optimizer step or update.
        threads: How many runs used each number of threads per rank.
    """

    actions: list[tuple[list[float], float]]
    optimizer: list[tuple[list[float], float]]
    threads: Counter[int]


def kind_scales(x: np.ndarray, design: list[list[float]]) -> dict[str, float]:
    """The fitted scale of each operator kind some row of ``design`` has, floored at ``MIN_SCALE``."""
    return {kind: max(float(x[k]), MIN_SCALE) for k, kind in enumerate(OP_KINDS) if any(row[k] > 0 for row in design)}


def unfitted_kinds_warning(label: str, scale: dict[str, float], kinds: tuple[str, ...] = OP_KINDS) -> str | None:
    """The warning naming the operator kinds among ``kinds`` that ``scale`` lacks (no run fitted on
    ran one), or None when every one was fitted.

    Such a kind keeps the uncalibrated model's time (``ComputeCalibration.scale``: kinds not listed
    keep 1.0), so a plan that runs it — flash attention (``flash``) when the runs fitted on did not
    use it, or unfused attention (``bmm``) when they all did — is priced partly uncalibrated, and
    nothing in the file but the missing key says so.
    """
    missing = [k for k in kinds if k not in scale]
    if not missing:
        return None
    names = " and ".join(missing)
    if len(missing) == 1:
        return (f"{label}: no run fitted on exercises the {names} operator kind: its scale is not fitted "
                "(it stays 1.0, the uncalibrated model's time, in any plan that runs it)")
    return (f"{label}: no run fitted on exercises the {names} operator kinds: their scales are not fitted "
            "(they stay 1.0, the uncalibrated model's time, in any plan that runs them)")


def optimizer_constants(rows: ComputeRows) -> np.ndarray | None:
    """(fixed seconds, seconds per parameter) of the optimizer step or update, fitted on
    ``rows.optimizer``; None with fewer than two figures (nothing to separate the two)."""
    if len(rows.optimizer) < 2:
        return None
    x, _ = _nnls_relative([f for f, _ in rows.optimizer], [y for _, y in rows.optimizer])
    return x


def fit_compute(runs: list[MeasuredRun], comm: dict[str, dict[str, LinkCalibration]],
                warnings: list[str]) -> dict[str, dict[str, ComputeCalibration]]:
    """Per device and precision: operator scales, per-operator overhead and optimizer constants."""
    gathered: dict[tuple[str, str], ComputeRows] = defaultdict(lambda: ComputeRows([], [], Counter()))
    for run in runs:
        rows = gathered[(run.device.name, run.plan.precision)]
        rows.threads[run.measurement.threads_per_rank] += 1
        rows.actions += _action_rows(run, comm.get(run.measurement.backend, {}).get(_intra_link(run)))
        rows.optimizer += _optimizer_rows(run)
    out: dict[str, dict[str, ComputeCalibration]] = {}
    for (device, precision), rows in gathered.items():
        if not rows.actions:
            continue
        fitted = _compute_constants(f"{device} {precision}", rows, warnings)
        if fitted is not None:
            out.setdefault(device, {})[precision] = fitted
    return out


def _compute_constants(label: str, rows: ComputeRows, warnings: list[str]) -> ComputeCalibration | None:
    """The constants of one (device, precision) from its gathered rows (None: too few to fit)."""
    design = [f for f, _ in rows.actions]
    # Constants whose feature no run has are not fitted (they stay 0 or the common scale).
    present = sum(1 for k in range(len(FEATURES)) if any(row[k] > 0 for row in design))
    if len(design) < present:
        warnings.append(f"{label}: {plural(len(design), 'action group')}, too few to fit {plural(present, 'constant')}")
        return None
    x, mape = _fit_compute_constants(design, [y for _, y in rows.actions])
    scale = kind_scales(x, design)
    unfitted = unfitted_kinds_warning(label, scale)
    if unfitted is not None:
        warnings.append(unfitted)
    for features, what in UNFITTED:
        if not any(row[FEATURES.index(f)] > 0 for row in design for f in features):
            warnings.append(f"{label}: {what}")
    for kind, v in scale.items():
        if v == MIN_SCALE:
            warnings.append(f"{label}: the {kind} scale fitted to zero (its time is in the per-op overhead)")
    opt_x = optimizer_constants(rows)
    if opt_x is None:
        opt_x = np.zeros(2)
    held = sorted({int(f[1]) for f, _ in rows.optimizer})
    if len(held) == 1:
        warnings.append(f"{label}: every optimizer step fitted on updated {held[0]:,} parameters: its time per "
                        "parameter is not identifiable (all of it is in the fixed part)")
    t = rows.threads.most_common(1)[0][0]
    if len(rows.threads) > 1:
        warnings.append(f"{label}: runs used different threads per rank {sorted(rows.threads)}; "
                        f"the fit is labelled {t} thread(s)")
    return ComputeCalibration(
        scale=scale, op_overhead_s=float(x[FEATURES.index("ops")]), tp_op_overhead_s=float(x[FEATURES.index("tp_ops")]),
        tp_comm_cpu_s_per_byte=float(x[FEATURES.index("tp_bytes")]), dp_unit_overhead_s=float(x[FEATURES.index("dp_units")]),
        fresh_s_per_byte=float(x[FEATURES.index("fresh_bytes")]),
        swap_s_per_byte=float(x[FEATURES.index("swap_bytes")]),
        split_input_op_s=float(x[FEATURES.index("split_input_ops")]),
        weight_pass_s=float(x[FEATURES.index("weight_passes")]),
        weight_pass_op_s=float(x[FEATURES.index("weight_pass_ops")]),
        optimizer_overhead_s=float(opt_x[0]),
        optimizer_s_per_param=float(opt_x[1]), threads_per_rank=t, samples=len(design), fit_mape=mape)


def fit_host(runs: list[MeasuredRun], cal: Calibration, warnings: list[str]) -> None:
    """Set each CPU device's host CPU constants and its loopback link's copy costs (step 3)."""
    rows: dict[tuple[str, str, str], list[list[float]]] = defaultdict(list)
    ys: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for run in runs:
        meas, plan = run.measurement, run.plan
        dev = cal.devices.get(run.device.name)
        comp = dev.compute.get(plan.precision) if dev is not None else None
        clean = set(run.clean_steps)
        actions = [a for a in meas.actions if a.step in clean]
        if (comp is None or run.device.kind != "cpu" or meas.nodes != 1 or not actions
                or any(a.cpu_s is None for a in actions) or any(r.cpu_time_s is None for r in meas.ranks)):
            continue
        n = len(clean)
        act_cpu: dict[int, float] = defaultdict(float)
        counts: dict[int, dict[tuple[int, str], float]] = defaultdict(lambda: defaultdict(float))
        pp_of = {r.rank: r.pp_rank for r in meas.ranks}
        first: dict[int, int] = {}  # the lowest rank of each pipeline rank counts its actions
        for r in sorted(meas.ranks, key=lambda r: r.rank):
            first.setdefault(r.pp_rank, r.rank)
        for a in actions:
            act_cpu[a.rank] += (a.cpu_s or 0.0) / n
            if a.rank in pp_of and first[pp_of[a.rank]] == a.rank:
                counts[pp_of[a.rank]][(a.stage, a.kind)] += 1.0 / n
        feats = rank_host_features(run.model, plan, run.cluster, run.device, counts)
        params = _params_by_rank(run)
        key = (run.device.name, meas.backend, _intra_link(run))
        for r in meas.ranks:
            optimizer = comp.optimizer_overhead_s + comp.optimizer_s_per_param * params.get(r.pp_rank, 0)
            y = (r.cpu_time_s or 0.0) - act_cpu[r.rank] - optimizer
            if y > 0:
                rows[key].append(feats[r.pp_rank])
                ys[key].append(y)
    for (device, backend, link_type), design in rows.items():
        link = cal.comm.get(backend, {}).get(link_type)
        cols = len(HOST_FEATURES) if link is not None else 2
        if link is None:
            warnings.append(f"{device}: no {backend} {link_type} link fitted; host CPU of transfers not fitted")
        if len(design) < 2 * cols:
            warnings.append(f"{device}: {plural(len(design), 'rank-iteration')}, too few to fit the host CPU")
            continue
        x, mape = _nnls_relative([row[:cols] for row in design], ys[(device, backend, link_type)])
        dev = cal.devices[device]
        dev.step_cpu_s, dev.op_cpu_s = float(x[0]), float(x[1])
        dev.host_samples, dev.host_fit_mape = len(design), mape
        if link is not None:
            link.cpu_s_per_step, link.cpu_s_per_byte = float(x[2]), float(x[3])


def check_one_model(runs: list[MeasuredRun]) -> None:
    """Refuse runs of different models in one fit.

    The fitted constants (operator scales, per-operator and per-iteration overheads) describe one
    model's operators on one machine; runs of two models mixed in one fit blend their residuals
    and the result is right for neither, with nothing in the file to say so.

    Raises:
        ContractError: naming a run of each model.
    """
    first = runs[0] if runs else None
    for run in runs[1:]:
        if first is not None and not run.model.same_shape(first.model):
            raise ContractError(run.source, "model", (
                f"model: {run.source} ran {run.model.describe()}, but {first.source} ran "
                f"{first.model.describe()}; calibrate runs of one model at a time"))


def held_out_model_warnings(fitted: list[MeasuredRun], held_out: list[MeasuredRun]) -> list[str]:
    """A warning for each held-out run of another model than the runs fitted on (one model:
    :func:`check_one_model`), by :meth:`~mindpipe.traces.config.Model.same_shape` (names aside).

    Such a run is not refused: the constants are per operator kind, and predicting another model
    with them is a legitimate question (``benchmarks/llama_elementwise_cpu.py`` holds Llama runs
    out of a GPT fit, "held out twice over: plans and model"). But its error then measures how the
    calibration carries over to that model, not how well it fits the one it came from, and the
    held-out MAPE mixes the two; the warning says which runs are of the other kind.
    """
    if not fitted:
        return []
    model = fitted[0].model
    return [f"{run.source}: held out, but it ran {run.model.describe()}, not {model.describe()} as the runs "
            "fitted on did: its error is how the calibration carries over to another model, not the fit's "
            "held-out error" for run in held_out if not run.model.same_shape(model)]


def calibrate(runs: list[MeasuredRun], host_cpu: bool = True) -> tuple[Calibration, FitNotes]:
    """Fit communication, compute and step overhead from ``runs`` (module docstring).

    ``host_cpu=False`` skips step 3 (for ablations: what the host CPU model adds).

    Raises:
        ContractError: runs of two models, or nothing could be fitted (no actions, a single
            message size …).
    """
    check_one_model(runs)
    runs = sorted(runs, key=lambda r: r.source)  # the same runs in any order fit the same constants, bit for bit
    warnings: list[str] = []
    for run in runs:
        meas = run.measurement
        if not meas.profiled_steps:
            warnings.append(f"{run.source}: no profiled step (mindpipe run --profile-step N): no collective sizes")
        if meas.warmup_steps >= len(meas.steps):
            warnings.append(f"{run.source}: every one of its {plural(len(meas.steps), 'step')} is warm-up "
                            f"(warmup_steps={meas.warmup_steps}): fitted on the warm-up steps")
    comm, comm_table = fit_comm(runs)
    for backend in sorted({r.measurement.backend for r in runs if r.measurement.nodes > 1}):
        if "nic" not in comm.get(backend, {}):
            warnings.append(f"{backend}: the multi-node runs fit no NIC link (it needs all-reduces of two sizes over "
                            "groups that span nodes, and the intra-node link fitted from groups inside a node)")
    compute = fit_compute(runs, comm, warnings)
    devices: dict[str, DeviceCalibration] = {}
    for run in runs:
        name = run.device.name
        if name in compute and name not in devices:
            devices[name] = DeviceCalibration(kind=run.device.kind, compute=compute[name],
                                              cpus_per_node=run.measurement.cpus_per_node)
    noise = fit_noise(runs, warnings)
    if not devices and not comm and noise is None:
        raise ContractError(runs[0].source if runs else "", "measurement",
                            "nothing to calibrate: no compute actions, no profiled collectives and no gradient noise scale")
    # No creation time (``created`` stays empty): the file is a function of the runs alone, so a
    # refit of the same runs is the same file, with the same sha256 and the same
    # ``mindpipe tune`` reference and sweep identity (tuner.api.reference, fingerprint).
    cal = Calibration(devices=devices, comm=comm, measurements=[r.source for r in runs], gradient_noise=noise)
    if host_cpu:
        fit_host(runs, cal, warnings)
    for run in runs:
        if run.device.name in devices and not _compute_fitted(run, cal):
            warnings.append(f"{run.source}: no {run.device.name} {run.plan.precision} compute was fitted: "
                            "its prediction has uncalibrated compute, and it is left out of the step overhead")
    residuals = fit_step_overhead(runs, cal)
    return cal, FitNotes(comm_table, residuals, warnings)


def _compute_fitted(run: MeasuredRun, cal: Calibration) -> bool:
    """Whether ``cal`` has compute constants for the device and precision ``run`` ran at."""
    dev = cal.devices.get(run.device.name)
    return dev is not None and run.plan.precision in dev.compute


def fit_step_overhead(runs: list[MeasuredRun], cal: Calibration, rounds: int = 4) -> dict[str, float]:
    """Set each device's step overhead from its runs' residuals; the final residuals per run.

    The engine spends the overhead in slices between a rank's actions (where it occurs), so part
    of it hides in pipeline waits and the iteration does not grow by exactly the overhead: the
    median residual is added again until it is under 1 % of the runs' median iteration time.
    """
    residuals: dict[str, float] = {}
    # A run whose compute is not calibrated would pour the catalog model's error into the overhead.
    mine = [run for run in runs if _compute_fitted(run, cal)]
    for _ in range(rounds + 1):
        by_device: dict[str, list[float]] = defaultdict(list)
        for run in mine:
            predicted = simulate(run.model, run.cluster, run.plan, SimulationOptions(calibration=cal)).iteration_time_s
            residuals[run.source] = run.iteration_s - predicted
            by_device[run.device.name].append(run.iteration_s - predicted)
        moved = False
        for name, values in by_device.items():
            dev = cal.devices[name]
            scale = statistics.median(r.iteration_s for r in mine if r.device.name == name)
            new = max(0.0, dev.step_overhead_s + statistics.median(values))
            if abs(new - dev.step_overhead_s) > 0.01 * scale:
                dev.step_overhead_s, moved = new, True
        if not moved:
            break
    return residuals


__all__ = ["COMM_QUANTILE", "ComputeRows", "FitNotes", "calibrate", "check_one_model", "fit_comm", "fit_compute", "fit_host",
           "fit_step_overhead", "held_out_model_warnings", "kind_scales", "optimizer_constants", "unfitted_kinds_warning"]
