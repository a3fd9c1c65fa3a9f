"""Simulating supernet training (NASPipe): subnets per hour, bubble, conflict stalls and memory of a plan.

:class:`SupernetSimulator` is built once from (supernet, cluster, trace, calibration) like
:class:`~mindpipe.simulator.simulator.Simulator` and answers :meth:`~SupernetSimulator.run` per plan:

1. draw subnets ``0..N−1`` of the supernet's seeded stream
   (:func:`~mindpipe.traces.supernet.sample_subnet`) and ask
   :func:`~mindpipe.traces.supernet.subnet_stage_operators` what each uses per stage;
2. price every stage of every subnet from its choices (:mod:`mindpipe.simulator.subnet_costs`),
   the pipeline sends and the data-parallel all-reduce of the chosen candidates' gradients
   (the :class:`~mindpipe.simulator.topology.Topology` and the communication model, uncontended),
   the optimizer update per subnet (``each_backward``) or per batch (``batch_end``), and, with
   context switching, the host→device copy of each subnet's candidates (weights and optimizer
   state over PCIe on a GPU; a memory copy on a CPU);
3. build the plan's schedule (:func:`~mindpipe.simulator.subnet_schedules.build_subnet_schedule`,
   CSP ordered on nominal durations exactly as the executor orders it) and replay it with the priced
   actions (:mod:`mindpipe.simulator.subnet_replay`);
4. report per stage busy time, bubble, conflict stalls, memory (:mod:`mindpipe.simulator.subnet_memory`).

One subnet trains one micro-batch per data-parallel replica; throughput counts subnets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mindpipe.simulator.build import GRAD_BYTES
from mindpipe.simulator.calibrate.models import apply_calibration
from mindpipe.simulator.costs import DTYPE_BYTES, CommModel, ComputeModel
from mindpipe.simulator.memory import OPTIMIZER_BYTES
from mindpipe.simulator.network import Transfers
from mindpipe.simulator.perf import default_models
from mindpipe.simulator.subnet_costs import SupernetCosts, hardware_costs, trace_costs
from mindpipe.simulator.subnet_memory import StageMemory, stage_memory
from mindpipe.simulator.subnet_replay import ActionCosts, conflict_stalls, replay
from mindpipe.simulator.subnet_schedules import SubnetSchedule, build_subnet_schedule, consecutive_conflict_rate
from mindpipe.simulator.topology import Topology
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import integer, within_limit
from mindpipe.traces.supernet import (
    Choices,
    Supernet,
    check_supernet_plan,
    default_subnets,
    sample_subnets,
    stage_conflict_probability,
    subnet_batch,
    subnet_schedule,
    subnet_stage_operators,
    subnet_window,
    supernet_stage_layers,
)
from mindpipe.traces.trace import Trace


@dataclass(frozen=True)
class StageReport:
    """One pipeline stage of a simulated supernet run.

    Attributes:
        stage: Pipeline stage.
        layers: Choice layers on it.
        busy_s: Time it computed (forward, backward, all-reduce and update).
        busy_fraction: ``busy_s`` over the run's span.
        conflict_stall_s: Idle time while an arrived forward was held back only by CSP's rule.
        other_idle_s: The rest of the idle time (waiting for data or the schedule's order).
        conflict_rate: Share of consecutive subnet pairs sharing an operator here (drawn subnets).
        conflict_rate_closed_form: 1 − Π_l (1 − 1/K_l) over the stage's layers (uniform sampling; 1 − (1 − 1/K)^{L_s}
            when every layer chooses from the whole pool); 1 on a stage holding trained shared parts
            (``train_shared``), which every subnet uses.
        memory: Peak memory.
    """

    stage: int
    layers: int
    busy_s: float
    busy_fraction: float
    conflict_stall_s: float
    other_idle_s: float
    conflict_rate: float
    conflict_rate_closed_form: float
    memory: StageMemory


@dataclass(frozen=True)
class SupernetResult:
    """A simulated supernet run of N subnets under one plan.

    Attributes:
        supernet: The supernet's label.
        schedule, window, sync_batch: The subnet schedule, its CSP window and its subnets per
            synchronous update (``sync``; 1 for the others).
        num_subnets: Subnets trained, N.
        total_time_s: Span of the run.
        time_per_subnet_s: ``total_time_s / N``.
        subnets_per_hour: ``3600 · N / total_time_s``.
        bubble_fraction: Idle share of all stages' time over the span.
        stages: Per-stage reports.
        context_switching: Whether memory and copies assume context switching.
        fits_in_memory: Every stage fits its device (or budget).
        cost_source: Where compute costs came from (``gpu-model``, ``roofline``, ``calibrated``, ``trace``, ``calibrated trace``).
        samples_per_subnet: micro_batch_size × dp.
    """

    supernet: str
    schedule: str
    window: int
    sync_batch: int
    num_subnets: int
    total_time_s: float
    time_per_subnet_s: float
    subnets_per_hour: float
    bubble_fraction: float
    stages: tuple[StageReport, ...]
    context_switching: bool
    fits_in_memory: bool
    cost_source: str
    samples_per_subnet: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (memory also in GiB per stage)."""
        out = asdict(self)
        out["memory_by_stage_gib"] = [r.memory.total_gib for r in self.stages]
        out["peak_memory_gib"] = max(out["memory_by_stage_gib"])
        return out


class SupernetSimulator:
    """Simulations of supernet plans on one cluster under one set of models (module docstring).

    Args:
        supernet, cluster: What is simulated.
        trace: A per-candidate trace instead of the hardware compute model.
        calibration: Constants fitted from measured runs (``mindpipe calibrate``; for supernet runs
            :mod:`mindpipe.simulator.calibrate.supernet`): its compute constants for the device and
            precision price the candidates' operators in place of the trace — or, when it was fitted
            against a trace (``trace_scale``) and a trace is given, scale the trace — its optimizer constants
            the update, and its ``step_overhead_s`` is added per subnet and stage after the update.
        compute, comm: Models overriding the defaults.
    """

    def __init__(self, supernet: Supernet, cluster: Cluster, *, trace: Trace | None = None,
                 calibration: Calibration | None = None, compute: ComputeModel | None = None,
                 comm: CommModel | None = None) -> None:
        self.supernet = supernet
        self.device = get_device(cluster.gpu)
        hw_compute, hw_comm = default_models(self.device, cluster)
        self.step_overhead_s = 0.0
        self.calibration = calibration
        if calibration is not None:
            applied = apply_calibration(calibration, self.device, cluster, hw_compute, hw_comm)
            cluster, hw_compute, hw_comm = applied.cluster, applied.compute or hw_compute, applied.comm or hw_comm
            self.step_overhead_s = applied.step_overhead_s
        self.cluster = cluster
        self.trace = trace
        self.compute: ComputeModel = compute or hw_compute
        self.comm: CommModel = comm or hw_comm

    def check(self, plan: Plan, source: str = "plan") -> None:
        """Raise a ContractError unless ``plan`` is a supernet plan for this supernet and cluster."""
        check_supernet_plan(plan, self.supernet, self.cluster, source)

    def costs(self, plan: Plan) -> SupernetCosts:
        """Candidate and shared-part costs under ``plan``: with a trace and a calibration fitted against
        a trace (``trace_scale``) for this device and precision, the trace × that scale; else a
        calibration's compute constants if given (fitted to what the executor ran), else the trace's
        if given, else the hardware model's."""
        fitted = getattr(self.calibration.devices.get(self.device.name), "compute", {}) if self.calibration else {}
        constants = fitted.get(plan.precision)
        if self.trace is not None and constants is not None and constants.trace_scale > 0:
            return trace_costs(self.supernet, plan, self.trace, time_scale=constants.trace_scale)
        if self.trace is not None and constants is None:
            return trace_costs(self.supernet, plan, self.trace)
        return hardware_costs(self.supernet, plan, self.compute)

    def run(self, plan: Plan, num_subnets: int | None = None, *, context_switching: bool = True,
            memory_budget_bytes: float | None = None, sync_batch: int | None = None,
            source: str = "plan") -> SupernetResult:
        """Simulate training subnets ``0..num_subnets−1`` under ``plan``.

        Args:
            plan: A supernet plan (:func:`~mindpipe.traces.supernet.check_supernet_plan`).
            num_subnets: Subnets trained, N (default :func:`~mindpipe.traces.supernet.default_subnets`:
                :data:`~mindpipe.traces.supernet.DEFAULT_SUBNETS`, in whole batches of a ``sync`` plan).
            context_switching: Only the resident subnets' candidates on the device, copied in ahead
                (else every stage keeps its whole slice of the supernet).
            memory_budget_bytes: A per-device memory budget instead of the device's capacity.
            sync_batch: Subnets per batch of the ``sync`` schedule (default the plan's, as the executor
                runs it: :func:`~mindpipe.traces.supernet.subnet_batch`; must divide N).
            source: The plan's name in errors.

        Raises:
            ContractError: the plan does not fit the supernet or the cluster, or a bad count.
        """
        self.check(plan, source)
        num_subnets = default_subnets(plan) if num_subnets is None else num_subnets
        integer("subnets", num_subnets, 1, "train_steps")
        net, p = self.supernet, plan.pp
        # Work and memory grow with the choices drawn (pp <= num_layers bounds the actions too): refuse
        # before drawing them, as a GPT plan past microbatch_stages is refused.
        within_limit("subnets", num_subnets * net.num_layers, "subnet_choices",
                     f"subnets×num_layers={num_subnets}×{net.num_layers}")
        name, window = subnet_schedule(plan), subnet_window(plan)
        batch = (sync_batch or subnet_batch(plan)) if name == "sync" else 1
        integer("sync_batch", batch, 1, "train_steps")
        if name == "sync" and num_subnets % batch:
            raise ContractError("--subnets", None, f"sync trains batches of {batch} subnets; "
                                f"--subnets={num_subnets} is not a multiple")
        costs = self.costs(plan)
        layers = supernet_stage_layers(plan, net)
        subnets = sample_subnets(net, num_subnets)
        ops = [subnet_stage_operators(net, plan, c) for c in subnets]
        action_costs = self._action_costs(plan, costs, layers, subnets, name, batch, context_switching)

        # The order is the executor's (executor/supernet_worker.py): CSP list-scheduled on nominal
        # durations (forward 1, backward 2), so a plan runs as it was simulated; the replay below
        # times that order with the priced actions.
        sched = build_subnet_schedule(name, ops, p, window, batch)
        if sched.update == "batch_end":  # the update waits for the batch's last backward on the stage
            action_costs = self._action_costs(plan, costs, layers, subnets, name, batch, context_switching, sched)
        rep = replay(sched, action_costs)
        stalls = conflict_stalls(sched, rep, ops)
        mem = stage_memory(costs, plan, self.device, sched, subnets, layers, context_switching, memory_budget_bytes)
        span = rep.makespan_s
        firsts = [sum(layers[:s]) for s in range(p)]
        reports = tuple(StageReport(
            s, layers[s], rep.busy_s[s], rep.busy_s[s] / span, stalls[s], span - rep.busy_s[s] - stalls[s],
            consecutive_conflict_rate(ops, s), stage_conflict_probability(net, firsts[s], layers[s], s in (0, p - 1)),
            mem[s])
            for s in range(p))
        return SupernetResult(net.label, name, sched.window, sched.batch, num_subnets, span, span / num_subnets,
                              3600.0 * num_subnets / span, 1.0 - sum(rep.busy_s) / (p * span), reports,
                              context_switching, all(m.fits for m in mem), costs.source,
                              plan.micro_batch_size * plan.dp)

    # -- pricing the actions --------------------------------------------------------------------
    def _action_costs(self, plan: Plan, costs: SupernetCosts, layers: list[int], subnets: list[Choices], name: str,
                      batch: int, context_switching: bool, sched: SubnetSchedule | None = None) -> ActionCosts:
        """Durations of every action of every subnet (module docstring, step 2)."""
        p, n = plan.pp, len(subnets)
        topo = Topology(plan, self.cluster, self.device, rank_order=plan.rank_order)
        alone = Transfers(None, None, topo, self.comm)  # type: ignore[arg-type]  # pricing alone needs no event loop
        grad_b = GRAD_BYTES[plan.precision]  # the gradient buffer's dtype, as the GPT simulation reduces it
        fwd, bwd, after, swap = ([[0.0] * n for _ in range(p)] for _ in range(4))
        sends: list[float] = []
        first = 0
        for s in range(p):
            stage = [costs.stage(c, first, layers[s], s == 0, s == p - 1) for c in subnets]
            out_bytes = stage[0].output_bytes
            sends.append(alone.time_alone(topo.p2p(s, s + 1, out_bytes)) if s + 1 < p and out_bytes else 0.0)

            def update_s(trained: int, s: int = s) -> float:
                ar = alone.time_alone(topo.collective("allreduce", trained * grad_b, "dp", s)) if plan.dp > 1 else 0.0
                return ar + (self.compute.optimizer_step_s(trained, plan) if trained else 0.0)

            for b in range(n):  # a calibration's time per subnet and stage outside the actions and the update
                after[s][b] = self.step_overhead_s

            for b, c in enumerate(stage):
                fwd[s][b], bwd[s][b] = c.forward_s, c.backward_s
                if sched is None or sched.update == "each_backward":
                    after[s][b] += update_s(c.trained_params)
                if context_switching:
                    swap[s][b] = self._copy_s(topo, alone, s, c.trained_params * (DTYPE_BYTES[plan.precision]
                                                                                  + OPTIMIZER_BYTES[plan.precision]))
            if sched is not None and sched.update == "batch_end":
                for start in range(0, n, batch):
                    keys = {(layer, subnets[b][layer]) for b in range(start, min(n, start + batch))
                            for layer in range(first, first + layers[s])}
                    trained = sum(costs.candidates[k].param_count for _, k in keys)
                    trained += sum(x.trained_params for x in (costs.embedding if s == 0 else None,
                                                              costs.head if s == p - 1 else None) if x is not None)
                    after[s][min(n, start + batch) - 1] += update_s(trained)
            first += layers[s]
        return ActionCosts(fwd, bwd, after, swap, sends, [0.0, *sends[:-1]])

    def _copy_s(self, topo: Topology, alone: Transfers, s: int, nbytes: float) -> float:
        """Host→device copy of ``nbytes`` for stage s: PCIe on a GPU, a memory copy (read + write) on a CPU."""
        if nbytes <= 0:
            return 0.0
        if self.device.kind == "cpu":
            return 2.0 * nbytes / (self.device.memory_bandwidth_GBps * 1e9)
        return alone.time_alone(topo.swap(s, nbytes))


__all__ = ["StageReport", "SupernetResult", "SupernetSimulator"]
