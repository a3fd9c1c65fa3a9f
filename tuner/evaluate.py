"""One evaluation: a point → its plan, memory check and (if it fits) simulated metrics.

:func:`evaluate` is a top-level function of picklable arguments so that any
``concurrent.futures`` executor — a local process pool or a Dask cluster's — can run it. It
returns an :class:`~mindpipe.tuner.records.EvaluationRecord`; the sweep stores it and scores it
under the objective.
"""

from __future__ import annotations

import time
import traceback

from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Supernet
from mindpipe.tuner.keys import Point, point_key
from mindpipe.tuner.materialize import Problem, materialize
from mindpipe.tuner.records import EvaluationRecord, MemoryCode, Metrics, Status
from mindpipe.tuner.rules import rule_of
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
            worst = max(mat.memory, key=lambda rm: rm.total_bytes)
            rec.status, rec.code = Status.OUT_OF_MEMORY, MemoryCode.ESTIMATE
            rec.metrics = Metrics(peak_memory_gib=mat.peak_memory_gib)
            rec.message = (f"rank {worst.rank} needs {worst.total_bytes / 2**30:.1f} GiB of "
                           f"{worst.capacity_bytes / 2**30:.1f} GiB")
        else:
            result = mat.result if mat.result is not None else sim.run(mat.plan)
            rec.simulated = True
            rec.metrics = Metrics.of_result(result)
            if not result.fits_in_memory:
                rec.status, rec.code = Status.OUT_OF_MEMORY, MemoryCode.SIMULATED_PEAK
                rec.message = f"simulated peak {result.peak_memory_gib:.1f} GiB does not fit"
    except ContractError as e:
        rec.status, rec.code, rec.message = Status.INVALID, rule_of(e), str(e)
    except Exception as e:  # a bug must not kill a long sweep; it is recorded and counted
        rec.status, rec.code = Status.ERROR, None
        rec.message = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
    rec.eval_s = time.perf_counter() - start
    return rec


__all__ = ["evaluate"]
