"""One rank of the ring-attention check (launched by test_exec_ring_attention.py).

Every rank draws the same whole-sequence q, k, v (fp64), takes its share as the executor does
(:meth:`ContextShard.take`) and runs :func:`context_attention` with ``comm="p2p"`` over a group of
all ranks; the reference is torch's causal ``scaled_dot_product_attention`` on the whole sequence,
forward and backward, with the blocks in torch's FlashAttention kernel and op by op. With dropout, the backward is checked against the forward itself: a central
difference of the loss summed over the ranks along a random direction, both forwards from one
random state. Writes the largest errors as JSON (rank 0).

    python ring_harness.py RANK WORLD PORT OUT
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mindpipe.traces import torch_context_parallel
from mindpipe.traces.torch_context_parallel import ContextShard, context_attention


def _draw(heads: int, kv: int, seq: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, seq, 8, dtype=torch.float64, generator=gen) for n in (heads, kv, kv, heads)]


def exact(shard: ContextShard, heads: int, kv: int) -> float:
    """Largest |ring − causal attention| over the output and the three gradients."""
    q, k, v, g = _draw(heads, kv, 4 * shard.size * 3, seed=heads * 10 + kv)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=kv != heads)
    ref.backward(g)
    mine = [shard.take(t, 2).requires_grad_() for t in (q, k, v)]
    out = context_attention(*mine, shard, 0.0, gqa=kv != heads)
    out.backward(shard.take(g, 2))
    errors = [(out - shard.take(ref, 2)).abs().max()]
    errors += [(m.grad - shard.take(f.grad, 2)).abs().max() for m, f in zip(mine, full, strict=True)]  # type: ignore[operator]
    return max(float(e.detach()) for e in errors)


def dropout_consistency(shard: ContextShard) -> tuple[float, float]:
    """Relative error of the backward against a central difference of the forward, with dropout 0.3;
    and the largest change dropout makes to the output."""
    q, k, v, w = (shard.take(t, 2) for t in _draw(4, 2, 4 * shard.size, seed=7))
    gen = torch.Generator().manual_seed(99 + shard.rank)
    direction = [torch.randn(t.shape, dtype=t.dtype, generator=gen) for t in (q, k, v)]

    def loss(eps: float, grad: bool = False) -> tuple[float, list[torch.Tensor]]:
        torch.manual_seed(1234 + shard.rank)
        xs = [(t + eps * d).requires_grad_(grad) for t, d in zip((q, k, v), direction, strict=True)]
        value = (context_attention(*xs, shard, 0.3, gqa=True) * w).sum()
        grads = list(torch.autograd.grad(value, xs)) if grad else []
        total = value.detach().clone()
        dist.all_reduce(total, group=shard.group)
        return float(total), grads

    eps = 1e-6
    _, grads = loss(0.0, grad=True)
    analytic = torch.tensor(sum(float((g * d).sum()) for g, d in zip(grads, direction, strict=True)), dtype=torch.float64)
    dist.all_reduce(analytic, group=shard.group)
    numeric = (loss(eps)[0] - loss(-eps)[0]) / (2 * eps)
    with torch.no_grad():
        changed = (context_attention(q, k, v, shard, 0.3, gqa=True) - context_attention(q, k, v, shard, 0.0, gqa=True))
    return abs(float(analytic) - numeric) / abs(numeric), float(changed.abs().max())


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = {}
    # The default group and a group of its own (as the executor's device mesh makes for cp < world).
    for name, group in (("world", dist.group.WORLD), ("subgroup", dist.new_group(list(range(world))))):
        shard = ContextShard.of(group, "p2p")
        results[f"{name}_mha"] = exact(shard, 4, 4)
        results[f"{name}_gqa"] = exact(shard, 4, 2)
    # The blocks op by op (what runs with dropout, or on CUDA outside FlashAttention's dtypes).
    fused = torch_context_parallel._fused
    torch_context_parallel._fused = lambda q, dropout_p: False  # type: ignore[assignment]
    results["math_gqa"] = exact(ContextShard.of(dist.group.WORLD, "p2p"), 4, 2)
    torch_context_parallel._fused = fused
    results["dropout_rel"], results["dropout_change"] = dropout_consistency(ContextShard.of(dist.group.WORLD, "p2p"))
    gathered: list[dict[str, float] | None] = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        worst = {key: max(r[key] for r in gathered if r is not None) for key in results}
        with open(out, "w") as f:
            json.dump(worst, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
