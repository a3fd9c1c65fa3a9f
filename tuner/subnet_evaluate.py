"""One evaluation of a supernet point: partition, simulate N subnets, subnets per hour.

:func:`mindpipe.tuner.evaluate.evaluate` hands a point here when the problem's model is a
supernet, so the sweep, the store and the outputs treat both kinds alike. The plan is made
concrete the way the executor will run it:

1. the partition by the point's rule (:func:`~mindpipe.tuner.subnet_partition.supernet_partition`)
   over the simulator's candidate costs at the plan's micro-batch and precision, written into the
   plan (``best_plan.json`` then carries it to ``mindpipe run``);
2. :meth:`~mindpipe.simulator.subnet_sim.SupernetSimulator.run` of subnets 0..N−1 of the supernet's
   seeded stream, with context switching as the problem asks; a ``sync`` plan trains batches of
   ``subnet_window`` subnets, as the executor reads that key;
3. the record: ``ok`` with subnets per hour, or ``out_of_memory`` when a stage does not fit
   (the simulation's own memory, :attr:`~mindpipe.tuner.records.MemoryCode.SIMULATED_PEAK`).
"""

from __future__ import annotations

import time

from mindpipe.simulator.subnet_sim import SupernetSimulator
from mindpipe.traces.supernet import Supernet, subnet_schedule, subnet_window
from mindpipe.tuner.keys import Point, plan_of, point_key
from mindpipe.tuner.materialize import Problem
from mindpipe.tuner.records import EvaluationRecord, MemoryCode, Metrics, Status
from mindpipe.tuner.subnet_partition import supernet_partition

# One simulator per problem per process, as for GPT problems (:mod:`mindpipe.tuner.materialize`).
_SIMULATORS: dict[str, SupernetSimulator] = {}
_CACHE_SIZE = 8


def supernet_simulator(problem: Problem) -> SupernetSimulator:
    """The problem's :class:`SupernetSimulator`, built once per process (cached on its fingerprint)."""
    net = problem.model
    if not isinstance(net, Supernet):
        raise TypeError(f"{net.label} is not a supernet")
    sim = _SIMULATORS.get(problem.fingerprint) if problem.fingerprint else None
    if sim is None:
        sim = SupernetSimulator(net, problem.cluster, trace=problem.trace, calibration=problem.calibration)
        if problem.fingerprint:
            if len(_SIMULATORS) >= _CACHE_SIZE:
                _SIMULATORS.pop(next(iter(_SIMULATORS)))
            _SIMULATORS[problem.fingerprint] = sim
    return sim


def evaluate_supernet(problem: Problem, point: Point) -> EvaluationRecord:
    """Evaluate one supernet point (module docstring); never raises for a bad plan, it records it."""
    start = time.perf_counter()
    rec = EvaluationRecord(key=point_key(point), point=dict(point))
    try:
        sim = supernet_simulator(problem)
        plan = plan_of(point, problem.pinned)
        name = point["partitioner"]
        if name != "given":
            layers = sim.supernet.num_layers
            partition = [layers] if plan.pp == 1 else supernet_partition(name, sim.costs(plan), plan.pp)
            plan = plan_of(point, problem.pinned, partition)
        rec.plan = plan
        sync = subnet_window(plan) if subnet_schedule(plan) == "sync" else None
        result = sim.run(plan, problem.num_subnets, context_switching=problem.context_switching, sync_batch=sync)
        rec.simulated = True
        rec.metrics = Metrics.of_supernet(result, sim.supernet.seq_len)
        if not result.fits_in_memory:
            worst = max(result.stages, key=lambda st: st.memory.total_gib)
            rec.status, rec.code = Status.OUT_OF_MEMORY, MemoryCode.SIMULATED_PEAK
            rec.message = (f"stage {worst.stage} needs {worst.memory.total_gib:.2f} GiB of "
                           f"{worst.memory.capacity_bytes / 2**30:.2f} GiB")
    except Exception as e:  # a broken rule, or a bug: recorded and counted, the sweep goes on
        rec.failed(e)
    rec.eval_s = time.perf_counter() - start
    return rec


__all__ = ["evaluate_supernet", "supernet_simulator"]
