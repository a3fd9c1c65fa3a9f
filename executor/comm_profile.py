"""Record the collectives of one step with torch.profiler (``--profile-step N``).

Tensor-parallel all-reduces, FSDP all-gathers/reduce-scatters and pipeline sends/receives run
inside the compute actions, where the action timers cannot separate them. For one chosen step
the profiler records the backend's own events — ``gloo:all_reduce``, ``gloo:send`` … on the
process group's worker thread, ``nccl:all_reduce`` … on GPUs — whose duration is the
communication itself, and their input shapes and dtypes, which give the message size. These are
what calibration needs for a latency/bandwidth fit per backend.

The event names do not carry the process group, so the mesh axis is inferred: sends/receives are
``pp``; other collectives belong to the only non-pipeline axis with more than one rank, or, when
both ``dp`` and ``tp`` have several, are marked ``unknown``, as they are under context
parallelism (the K/V all-gathers of the ``cp`` group and the gradient reduction over dp·cp use the
same ops). Start times are aligned to the run's origin through the host clock read when profiling
starts (the profiler's own time base is relative to that moment), good to a fraction of a
millisecond.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Iterator
from typing import Any

from mindpipe.executor.measure import Recorder
from mindpipe.executor.payload import Axis
from torch.distributed.device_mesh import DeviceMesh
from torch.profiler import ProfilerActivity, profile

_EVENT = re.compile(r"^(gloo|nccl):(\w+)$")
_DTYPE_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4,
                "unsigned char": 1, "bool": 1, "signed char": 1, "short int": 2}
_OPS = {"all_reduce": "allreduce", "allreduce": "allreduce", "all_gather": "allgather", "allgather": "allgather",
        "_allgather_base": "allgather", "all_gather_into_tensor": "allgather", "reduce_scatter": "reducescatter",
        "reduce_scatter_tensor": "reducescatter", "_reduce_scatter_base": "reducescatter", "send": "send",
        "recv": "recv", "broadcast": "broadcast", "all_to_all": "alltoall", "alltoall_base": "alltoall",
        "barrier": "barrier", "gather": "gather", "scatter": "scatter", "reduce": "reduce"}


def _nbytes(event: Any) -> int | None:
    shapes = getattr(event, "input_shapes", None) or []
    dtypes = getattr(event, "input_dtypes", None) or []
    if not shapes or not shapes[0] or not isinstance(shapes[0], list):
        return None
    dims = shapes[0]
    if dims and isinstance(dims[0], list):  # a tensor list
        dims = dims[0]
    size = _DTYPE_BYTES.get(dtypes[0] if dtypes else "float", 4)
    return int(math.prod(dims)) * size


def axis_of(op: str, mesh_sizes: dict[str, int]) -> Axis:
    """The mesh axis a collective ran on, as far as the op and the mesh tell (see module doc)."""
    if op in ("send", "recv"):
        return "pp"
    if mesh_sizes.get("cp", 1) > 1:
        return "unknown"
    several: list[Axis] = [a for a in ("dp", "tp") if mesh_sizes.get(a, 1) > 1]
    return several[0] if len(several) == 1 else "unknown"


@contextlib.contextmanager
def profiled(enabled: bool, recorder: Recorder, mesh: DeviceMesh) -> Iterator[None]:
    """Profile the block when ``enabled`` and add its collectives to ``recorder``."""
    if not enabled:
        yield
        return
    activities = [ProfilerActivity.CPU]
    if recorder.cuda:
        activities.append(ProfilerActivity.CUDA)
    sizes = {name: mesh.size(i) for i, name in enumerate(mesh.mesh_dim_names or ())}
    with profile(activities=activities, record_shapes=True) as prof:
        t_start = time.perf_counter() - recorder.origin
        yield
    for e in prof.events():
        m = _EVENT.match(e.name)
        if m is None:
            continue
        op = _OPS.get(m.group(2), m.group(2))
        t0 = t_start + e.time_range.start / 1e6
        recorder.add_collective(axis_of(op, sizes), op, t0, t0 + e.time_range.elapsed_us() / 1e6, _nbytes(e), None)


__all__ = ["axis_of", "profiled"]
