"""Partial gradients (sequence parallelism's norms) are reduced in one all-reduce, to the right sums.

Two gloo ranks in spawned processes (a few seconds): :func:`reduced_partials` over partial
DTensors of two shapes and a partial average must give each rank the sums (the average) of both
ranks' local parts, ``Replicate`` placements, and issue one all-reduce for the sums (the average
is redistributed on its own by DTensor); :func:`reduce_partial_grads` writes them back to the
parameters' gradients and leaves reduced ones alone.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from .conftest import free_port


def _worker(rank: int, port: int, out: dict) -> None:
    from mindpipe.executor.partial_grads import reduce_partial_grads, reduced_partials
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    calls = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        a = DTensor.from_local(torch.full((3,), rank + 1.0), mesh, [Partial()], run_check=False)
        b = DTensor.from_local(torch.arange(4.0).view(2, 2) * (rank + 1), mesh, [Partial()], run_check=False)
        c = DTensor.from_local(torch.full((2,), 2.0 * rank), mesh, [Partial("avg")], run_check=False)
        ra, rb, rc = reduced_partials([a, b, c])
        sums_calls = list(calls)
        layer = nn.Linear(2, 2, bias=False)
        layer.weight = nn.Parameter(DTensor.from_local(torch.zeros(2, 2), mesh, [Replicate()], run_check=False))
        layer.weight.grad = DTensor.from_local(torch.ones(2, 2) * (rank + 1), mesh, [Partial()], run_check=False)
        first, again = reduce_partial_grads([layer]), reduce_partial_grads([layer])
        out[rank] = {
            "a": ra.to_local().tolist(), "b": rb.to_local().tolist(), "c": rc.to_local().tolist(),
            "placements": [str(t.placements) for t in (ra, rb, rc)], "shapes": [tuple(t.shape) for t in (ra, rb, rc)],
            "sum_calls": sums_calls, "grad": layer.weight.grad.to_local().tolist(),
            "grad_placements": str(layer.weight.grad.placements), "reduced": (first, again),
        }
    finally:
        dist.all_reduce = real
        dist.destroy_process_group()


def test_partial_gradients_are_summed_in_one_all_reduce():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), out), nprocs=2, join=True)
        res = dict(out)
    for rank in (0, 1):
        r = res[rank]
        assert r["a"] == [3.0, 3.0, 3.0]
        assert r["b"] == [[0.0, 3.0], [6.0, 9.0]]
        assert r["c"] == [1.0, 1.0]  # the average of 0 and 2
        assert r["placements"] == ["(Replicate(),)"] * 3 and r["shapes"] == [(3,), (2, 2), (2,)]
        assert r["sum_calls"] == [7]  # a and b flattened into one message
        assert r["grad"] == [[3.0, 3.0], [3.0, 3.0]] and r["grad_placements"] == "(Replicate(),)"
        assert r["reduced"] == (1, 0)  # nothing left the second time
