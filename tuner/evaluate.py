"""One evaluation: a point → its plan, memory check and (if it fits) simulated metrics.

:func:`evaluate` is a top-level function of picklable arguments so that any
``concurrent.futures`` executor — a local process pool or a Dask cluster's — can run it. It
returns an :class:`~mindpipe.tuner.records.EvaluationRecord`; the sweep stores it and scores it
under the objective.
"""

from __future__ import annotations

import time

from mindpipe.traces.supernet import Supernet
from mindpipe.tuner.keys import Point, point_key
from mindpipe.tuner.materialize import Materialized, Problem, materialize
from mindpipe.tuner.records import EvaluationRecord, MemoryCode, Metrics, Status
from mindpipe.tuner.subnet_evaluate import evaluate_supernet


def evaluate(problem: Problem, point: Point) -> EvaluationRecord:
    """Evaluate one point.

    Returns:
        The record: ``ok`` with the simulator's metrics; ``out_of_memory`` — refused by the
        memory model before simulating (:attr:`MemoryCode.ESTIMATE`) or by the simulation's peak
        (:attr:`MemoryCode.SIMULATED_PEAK`); ``invalid`` — a plan rule the space did not catch
        (its :class:`~mindpipe.tuner.rules.Rule`); ``error`` — an unexpected exception, with its
        message. A supernet problem's points go to :func:`~mindpipe.tuner.subnet_evaluate.evaluate_supernet`.
    """
    if isinstance(problem.model, Supernet):
        return evaluate_supernet(problem, point)
    start = time.perf_counter()
    rec = EvaluationRecord(key=point_key(point), point=dict(point))
    try:
        sim = problem.simulator()
        mat = materialize(problem, point, sim)
        rec.plan = mat.plan
        if not mat.fits:
            _refused(rec, mat)
        else:
            result = mat.result if mat.result is not None else sim.run(mat.plan)
            rec.simulated = True
            rec.metrics = Metrics.of_result(result)
            if not result.fits_in_memory:
                rec.status, rec.code = Status.OUT_OF_MEMORY, MemoryCode.SIMULATED_PEAK
                rec.message = f"simulated peak {result.peak_memory_gib:.1f} GiB does not fit"
    except Exception as e:  # a broken rule, or a bug: recorded and counted, the sweep goes on
        rec.failed(e)
    rec.eval_s = time.perf_counter() - start
    return rec


def _refused(rec: EvaluationRecord, mat: Materialized) -> None:
    """Make ``rec`` the record of a plan the memory model refuses before simulating."""
    worst = max(mat.memory, key=lambda rm: rm.total_bytes / rm.capacity_bytes)
    rec.status, rec.code = Status.OUT_OF_MEMORY, MemoryCode.ESTIMATE
    rec.metrics = Metrics(peak_memory_gib=mat.peak_memory_gib)
    rec.message = f"rank {worst.rank} needs {worst.total_bytes / 2**30:.1f} GiB of {worst.capacity_bytes / 2**30:.1f} GiB"
    if worst.fits_device:  # the devices fit: a rank's swapped copies exceed the host
        host = next(rm for rm in mat.memory if not rm.fits_host)
        rec.message = (f"rank {host.rank} swaps {host.host_bytes / 2**30:.1f} GiB to the host, which has "
                       f"{(host.host_capacity_bytes or 0.0) / 2**30:.1f} GiB per device")


def screen(problem: Problem, point: Point) -> EvaluationRecord | None:
    """The record :func:`evaluate` returns for a point the memory model refuses before simulating,
    found without simulating anything; None when the point may fit (then evaluate it).

    The partition a point gets is :func:`evaluate`'s: when none of ``balanced``'s candidates fits,
    both take the first, so the refusal (plan, peak, message) is the same record; which fitting
    candidate simulates fastest — what costs an evaluation its time — does not change whether
    one fits. This is what lets the sweep drop the plans that cannot fit in the searcher's own
    process at a few milliseconds each, instead of a round of proposals and evaluations (on a
    space of large models on few devices most proposals are such plans). Supernets, and points
    whose evaluation fails otherwise, are left to :func:`evaluate`.
    """
    if isinstance(problem.model, Supernet):
        return None
    start = time.perf_counter()
    try:
        mat = materialize(problem, point, problem.simulator(), simulate=False)
    except Exception:  # evaluate() records it, with its verdict
        return None
    if mat.fits:
        return None
    rec = EvaluationRecord(key=point_key(point), point=dict(point), plan=mat.plan)
    _refused(rec, mat)
    rec.eval_s = time.perf_counter() - start
    return rec


__all__ = ["evaluate", "screen"]
