"""Turn a search point into a runnable plan: the partition, then the memory check.

Runs inside the evaluation workers. The partition is computed here and written into the plan, so
the simulator (and later the executor, from ``best_plan.json``) use the same split. Everything
the partitioners and the memory check need — per-layer costs, block caps, link bandwidths, per-rank
memory — comes from the problem's :class:`~mindpipe.simulator.simulator.Simulator`, built once per
worker process and sweep; the memory check runs before the (much more expensive) event simulation,
so plans that cannot fit are filtered without simulating. When ``balanced`` offers several
partitions (several chunks per rank: :func:`~mindpipe.tuner.partition.balanced_candidates`), each
that fits is simulated and the fastest kept, with its simulation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mindpipe.simulator.build import with_tied_copy
from mindpipe.simulator.memory import RankMemory
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_policies
from mindpipe.traces.result import SimulationResult
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.trace import Trace
from mindpipe.tuner.keys import Point, plan_of
from mindpipe.tuner.memsplit import MEMORY_PARTITIONERS, memory_partition
from mindpipe.tuner.partition import StageFits, make_partition

# One Simulator per problem per process: a sweep's workers build theirs on their first point.
_SIMULATORS: dict[str, Simulator] = {}
_SIMULATOR_CACHE_SIZE = 8


@dataclass
class Problem:
    """What every evaluation needs besides the point (pickled to each worker).

    Attributes:
        model, cluster: What is planned.
        trace: Per-layer trace for the compute model (None: the hardware model).
        pinned: Plan list keys pinned by ``--fix`` (``partition``, ``layer_memory_policy``).
        memory_caps: Let the ``balanced`` partitioner cap blocks per stage by memory (block counts
            with one policy for every block, a per-stage memory check with per-block policies).
        fingerprint: Identity of (model, cluster, trace, calibration) for the workers' Simulator cache.
        calibration: Constants fitted from measured runs (``mindpipe calibrate``), or None.
        num_subnets: Supernets: subnets each plan is simulated for (:mod:`mindpipe.tuner.subnet_evaluate`).
        context_switching: Supernets: simulate with context switching (only the resident subnets'
            candidates on the device), as the executor runs by default.
    """

    model: Model | Supernet
    cluster: Cluster
    trace: Trace | None = None
    pinned: dict[str, list[Any]] | None = None
    memory_caps: bool = True
    fingerprint: str = ""
    calibration: Calibration | None = None
    num_subnets: int = 256
    context_switching: bool = True

    @property
    def gpt(self) -> Model:
        """The GPT model (a supernet problem is evaluated by :mod:`mindpipe.tuner.subnet_evaluate`)."""
        if not isinstance(self.model, Model):
            raise TypeError(f"{self.model.label} is a supernet: evaluate it with mindpipe.tuner.subnet_evaluate")
        return self.model

    def simulator(self) -> Simulator:
        """The problem's :class:`Simulator`, built once per process (cached on ``fingerprint``)."""
        if not self.fingerprint:
            return Simulator(self.gpt, self.cluster, trace=self.trace, calibration=self.calibration)
        sim = _SIMULATORS.get(self.fingerprint)
        if sim is None:
            if len(_SIMULATORS) >= _SIMULATOR_CACHE_SIZE:
                _SIMULATORS.pop(next(iter(_SIMULATORS)))
            sim = _SIMULATORS[self.fingerprint] = Simulator(self.gpt, self.cluster, trace=self.trace,
                                                            calibration=self.calibration)
        return sim


@dataclass
class Materialized:
    """A point made concrete: the plan with its partition and the memory verdict.

    ``result`` is the plan's simulation when choosing the partition already ran it (``balanced``
    with several candidates), so the evaluation need not run it again.
    """

    plan: Plan
    memory: list[RankMemory]
    result: SimulationResult | None = None

    @property
    def fits(self) -> bool:
        """True when every pipeline rank fits in device memory."""
        return all(rm.fits for rm in self.memory)

    @property
    def peak_memory_gib(self) -> float:
        """Largest per-rank total, GiB."""
        return max(rm.total_bytes for rm in self.memory) / 2**30


def _policy_fits(sim: Simulator, plan: Plan) -> StageFits | None:
    """A per-stage memory check for ``balanced`` when blocks carry their own policies (no count caps then)."""
    if plan.layer_memory_policy is None or plan.virtual_stages != 1:
        return None
    budgets = sim.stage_budgets(plan)
    policies = block_policies(plan, sim.model.num_layers)
    return lambda s, lo, hi: budgets[s].fits(policies[lo:hi])


def materialize(problem: Problem, point: Point, sim: Simulator | None = None, *, simulate: bool = True) -> Materialized:
    """Partition the point's plan by its partitioner and check its memory.

    The memory-aware partitioners (``vpipe``, ``dawnpiper``) write their per-block policy into the
    plan's ``layer_memory_policy`` as well, and ``dawnpiper`` its boundaries inside blocks into
    ``stage_cuts``. Among several ``balanced`` candidates the fastest that fits is chosen by
    simulating them; with ``simulate=False`` the first that fits (the memory verdict is the same:
    whether any candidate fits; :func:`mindpipe.tuner.evaluate.screen`).

    Raises:
        ContractError: the point breaks a plan rule (should not happen for points of a space).
    """
    sim = sim or problem.simulator()
    model = problem.gpt
    plan = plan_of(point, problem.pinned)
    name = point["partitioner"]
    if name in MEMORY_PARTITIONERS:
        mp = memory_partition(name, sim, plan)
        # The per-block policy replaces the recompute level (traces/layout.py block_policies): write
        # none, so the plan does not say recompute=full beside blocks it keeps.
        plan = dataclasses.replace(plan_of(point, problem.pinned, mp.partition), layer_memory_policy=list(mp.policy),
                                   stage_cuts=mp.stage_cuts, swap_copy_back=mp.swap_copy_back, recompute="none")
        return Materialized(plan, sim.memory(plan))
    if plan.num_stages == 1:
        partition = [model.num_layers]
    else:
        costs = with_tied_copy(sim.layer_costs(plan), model, plan) if name in ("balanced", "pipedream") else []
        stage_to_rank = sim.schedule(plan).stage_to_rank
        caps = fits = None
        if name == "balanced" and problem.memory_caps:
            caps = sim.block_caps(plan)
            fits = _policy_fits(sim, plan) if caps is None else None
        simulated: dict[tuple[int, ...], tuple[list[RankMemory], SimulationResult | None]] = {}

        def fastest(candidates: list[list[int]]) -> list[int]:
            """The candidate partition that fits and simulates fastest (the evaluation's own verdicts)."""
            def verdict(part: list[int]) -> tuple[bool, float]:
                cand = plan_of(point, problem.pinned, part)
                memory = sim.memory(cand)
                if not simulate:
                    simulated[tuple(part)] = (memory, None)
                    return not all(rm.fits for rm in memory), 0.0
                result = sim.run(cand) if all(rm.fits for rm in memory) else None
                simulated[tuple(part)] = (memory, result)
                return (result is None or not result.fits_in_memory,
                        result.iteration_time_s if result is not None else float("inf"))
            return min(candidates, key=verdict)

        try:
            partition = make_partition(name, costs, plan, num_layers=model.num_layers, stage_to_rank=stage_to_rank,
                                       bandwidths=sim.link_bandwidths(plan), caps=caps, fits=fits, choose=fastest)
        except ContractError:
            if caps is None and fits is None:
                raise
            # No split fits under the caps: balance time alone; the memory check reports the overflow.
            partition = make_partition(name, costs, plan, num_layers=model.num_layers, stage_to_rank=stage_to_rank,
                                       choose=fastest)
        if tuple(partition) in simulated:
            memory, result = simulated[tuple(partition)]
            return Materialized(plan_of(point, problem.pinned, partition), memory, result)
    plan = plan_of(point, problem.pinned, partition)
    return Materialized(plan, sim.memory(plan))


__all__ = ["Materialized", "Problem", "materialize"]
