"""One evaluation: a point → its plan, memory check and (if it fits) simulated metrics.

:func:`evaluate` is a top-level function of picklable arguments so that any
``concurrent.futures`` executor — a local process pool or a Dask cluster's — can run it. It
returns a plain, JSON-ready record; the sweep adds the objective and stores it.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import to_dict
from mindpipe.tuner.materialize import Problem, materialize
from mindpipe.tuner.space import Point, point_key

# Simulator result fields copied into every record (DESIGN.md simulation-result contract).
RESULT_FIELDS = (
    "iteration_time_s", "throughput_samples_per_s", "throughput_tokens_per_s", "tflops_per_gpu", "mfu",
    "bubble_fraction", "peak_memory_gib", "fits_in_memory", "energy_j", "carbon_gco2",
)
# Outcomes of an evaluation.
OK, OUT_OF_MEMORY, INVALID, ERROR = "ok", "out_of_memory", "invalid", "error"


def evaluate(problem: Problem, point: Point) -> dict[str, Any]:
    """Evaluate one point.

    Returns:
        A record: ``key``, ``point``, ``plan`` (with its partition), ``status`` (``ok``;
        ``out_of_memory`` — filtered by the memory model before simulating, or reported so by the
        simulator; ``invalid`` — a plan rule the space did not catch; ``error`` — an unexpected
        exception, with its message), ``simulated`` (whether the event simulation ran),
        ``metrics`` (simulator fields and ``peak_memory_gib``) and ``eval_s``.
    """
    start = time.perf_counter()
    record: dict[str, Any] = {"key": point_key(point), "point": dict(point), "plan": None, "status": OK,
                              "simulated": False, "metrics": {}, "message": ""}
    try:
        sim = problem.simulator()
        mat = materialize(problem, point, sim)
        record["plan"] = to_dict(mat.plan)
        record["metrics"]["peak_memory_gib"] = mat.peak_memory_gib
        if not mat.fits:
            record["status"] = OUT_OF_MEMORY
            worst = max(mat.memory, key=lambda rm: rm.total_bytes)
            record["message"] = (f"rank {worst.rank} needs {worst.total_bytes / 2**30:.1f} GiB of "
                                 f"{worst.capacity_bytes / 2**30:.1f} GiB")
        else:
            result = sim.run(mat.plan)
            record["simulated"] = True
            record["metrics"] = {k: getattr(result, k) for k in RESULT_FIELDS}
            record["metrics"]["exposed_dp_comm_s"] = result.extra.get("exposed_dp_comm_s")
            if not result.fits_in_memory:
                record["status"] = OUT_OF_MEMORY
                record["message"] = f"simulated peak {result.peak_memory_gib:.1f} GiB does not fit"
    except ContractError as e:
        record["status"], record["message"] = INVALID, str(e)
    except Exception as e:  # a bug must not kill a long sweep; it is recorded and counted
        record["status"] = ERROR
        record["message"] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
    record["eval_s"] = time.perf_counter() - start
    return record


__all__ = ["ERROR", "INVALID", "OK", "OUT_OF_MEMORY", "RESULT_FIELDS", "evaluate"]
