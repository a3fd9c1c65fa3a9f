"""Memory fidelity: the simulator's peak memory per pipeline rank against a measured run's.

A measured run records, per rank, its peak device memory (``ranks[].memory``:
:class:`~mindpipe.traces.measured.StageMemory`, the executor's live-tensor accounting on a CPU,
the allocator's peak on CUDA). The simulator's memory model answers the same question per
pipeline rank (``Simulator.memory(plan)``); every data- and tensor-parallel replica of a
pipeline rank is compared with it. Relative error is (predicted − measured) / measured, so a
positive error over-predicts (a plan refused that would have fitted) and a negative one
under-predicts (a plan admitted that may not fit). Used by ``benchmarks/memory_fidelity.py`` and
the demo's report.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindpipe.simulator.memory import allocator_overhead_bytes
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Model
from mindpipe.traces.measured import Measurement

MIB = 2**20


def run_cluster(measurement: Measurement) -> Cluster:
    """The measurement's hosts as nodes, each holding an equal share of the ranks, on its catalog
    device; CPU hosts, which have no link the cluster could price, as one node."""
    nodes = max(1, measurement.nodes) if get_device(measurement.device_name).nic_bandwidth_Gbps > 0 else 1
    return Cluster(gpu=measurement.device_name, num_nodes=nodes, gpus_per_node=measurement.world_size // nodes)


@dataclass(frozen=True)
class MemoryRow:
    """One rank of a measured run: predicted and measured peak bytes.

    Attributes:
        rank, pp_rank: Global rank and its pipeline rank.
        stages: Virtual stages it ran.
        predicted_bytes: The simulator's peak for that pipeline rank.
        measured_bytes: The run's peak (``StageMemory.peak_bytes``).
        source: ``tensor_accounting`` or ``cuda_allocator``.
        predicted_host_bytes, measured_host_bytes: Swapped activations in host memory: the
            simulator's peak (``RankMemory.host_bytes``) and the run's pool (``host_pool_peak_bytes``).
    """

    rank: int
    pp_rank: int
    stages: list[int]
    predicted_bytes: float
    measured_bytes: int
    source: str
    predicted_host_bytes: float = 0.0
    measured_host_bytes: int = 0

    @property
    def rel_error(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def memory_rows(measurement: Measurement, model: Model, cluster: Cluster | None = None) -> list[MemoryRow]:
    """Per rank of ``measurement`` (those that recorded memory), predicted vs measured peak bytes.

    ``cluster`` defaults to the measurement's hosts as nodes, each holding an equal share of the
    ranks, on its catalog device; CPU hosts, which have no link the cluster could price, as one
    node (a rank's memory does not depend on how the ranks are spread over hosts). On a
    GPU the measured peak is the caching allocator's, which does not see the CUDA context or
    NCCL's buffers: of the framework overhead the memory model reserves (``GPU_RESERVED_BYTES``)
    the prediction keeps only what the allocator holds (:func:`~mindpipe.simulator.memory.allocator_overhead_bytes`).
    """
    plan = measurement.plan
    cluster = cluster or run_cluster(measurement)
    allocator = any(r.memory is not None and r.memory.source == "cuda_allocator" for r in measurement.ranks)
    sim = Simulator(model, cluster)
    ranks = sim.memory(plan, allocator_overhead_bytes(sim.device) if allocator else None)
    return [MemoryRow(r.rank, r.pp_rank, list(r.stages), ranks[r.pp_rank].total_bytes, r.memory.peak_bytes, r.memory.source,
                      ranks[r.pp_rank].host_bytes, r.memory.host_pool_peak_bytes)
            for r in sorted(measurement.ranks, key=lambda r: r.rank) if r.memory is not None]


@dataclass(frozen=True)
class ActionMemoryRow:
    """One action of a measured run's last step: the accounted peak while it ran against the
    simulator's (``ActionRecord.memory_bytes``, ``Simulator.memory_by_action``)."""

    rank: int
    pp_rank: int
    action: str  # torch's form: "3W1"
    predicted_bytes: float
    measured_bytes: int

    @property
    def rel_error(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def action_memory_rows(measurement: Measurement, model: Model, cluster: Cluster | None = None) -> list[ActionMemoryRow]:
    """Per pipeline rank (its replica with the largest peak), per action of the last step that
    recorded its memory: the accounted peak against ``Simulator.memory_by_action`` — with no
    framework reserve, which the accounting does not see on a GPU either. Empty for a run without
    per-action memory, and where the run's actions are not the simulator's schedule (a supernet,
    a schedule table of its own)."""
    plan = measurement.plan
    cluster = cluster or run_cluster(measurement)
    sim = Simulator(model, cluster)
    predicted, orders = sim.memory_by_action(plan, reserved_bytes=0.0), sim.schedule(plan).orders
    out: list[ActionMemoryRow] = []
    for pp in sorted({r.pp_rank for r in measurement.ranks if r.memory is not None}):
        rank = max((r for r in measurement.ranks if r.pp_rank == pp and r.memory is not None),
                   key=lambda r: r.memory.peak_bytes if r.memory is not None else 0).rank
        mine = [a for a in measurement.actions if a.rank == rank and a.memory_bytes is not None]
        if not mine:
            continue
        last = max(a.step for a in mine)
        seen = {(a.stage, a.kind, a.microbatch): a.memory_bytes for a in mine if a.step == last}
        if set(seen) != {(a.stage, a.kind, a.microbatch) for a in orders[pp]}:
            return []
        out += [ActionMemoryRow(rank, pp, str(a), bytes_, seen[a.stage, a.kind, a.microbatch] or 1)
                for a, bytes_ in zip(orders[pp], predicted[pp], strict=True)]
    return out


def largest_replica(rows: list[MemoryRow]) -> list[MemoryRow]:
    """Per pipeline rank, in order, the row of its replica with the largest measured peak."""
    return [max((r for r in rows if r.pp_rank == pp), key=lambda r: r.measured_bytes)
            for pp in sorted({r.pp_rank for r in rows})]


def memory_table_markdown(rows_by_plan: dict[str, list[MemoryRow]]) -> str:
    """A Markdown table: per plan and pipeline rank, predicted vs measured MiB (largest replica)."""
    lines = ["| plan | pipeline rank | predicted MiB | measured MiB | error |", "|---|---:|---:|---:|---:|"]
    for plan, rows in rows_by_plan.items():
        for worst in largest_replica(rows):
            pp = worst.pp_rank
            lines.append(f"| {plan} | {pp} | {worst.predicted_bytes / MIB:.1f} | {worst.measured_bytes / MIB:.1f} | "
                         f"{100 * worst.rel_error:+.2f} % |")
    return "\n".join(lines)


__all__ = ["ActionMemoryRow", "MemoryRow", "action_memory_rows", "largest_replica", "memory_rows", "memory_table_markdown"]
