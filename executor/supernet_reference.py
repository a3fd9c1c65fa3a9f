"""Sequential single-process supernet training: what every supernet schedule that claims equivalence must equal.

It trains subnets ``0 .. N−1`` one at a time, with the executor's initialisation
(:func:`~mindpipe.traces.torch_supernet.build_supernet_stages`, seeded per candidate), data
(:func:`~mindpipe.traces.torch_supernet.synthetic_tokens`), optimizer and loss combination
(:mod:`mindpipe.executor.supernet_stage`). For ``dp > 1`` it runs the replicas' row slices one
after another and sums their gradients in rank order, as the all-reduce does, then divides by dp.
One intra-op thread, like the ranks (``OMP_NUM_THREADS=1``), so the kernels add in the same order.

The sum matches gloo's all-reduce bit for bit for dp ≤ 2 (a + b is commutative in IEEE
arithmetic); for dp > 2 a ring all-reduce may add in another order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from mindpipe.executor.supernet_stage import combine_losses, make_optimizer, reduce_gradients
from mindpipe.traces.config import Plan
from mindpipe.traces.supernet import Choices, Supernet, sample_subnet, supernet_stage_layers
from mindpipe.traces.torch_supernet import build_supernet_stages, synthetic_tokens


@dataclass(frozen=True)
class SubnetLoss:
    """One trained subnet: its id, choices and loss (float32 value)."""

    id: int
    choices: Choices
    loss: float


def train_sequential(net: Supernet, plan: Plan, steps: int, seed: int = 0, lr: float = 1e-3,
                     weight_decay: float = 0.0) -> list[SubnetLoss]:
    """Train subnets ``0 .. steps−1`` sequentially; returns every subnet's loss in subnet order."""
    torch.set_num_threads(1)
    stages = build_supernet_stages(net, supernet_stage_layers(plan, net), seed)
    params = [p for st in stages for p in st.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, lr, weight_decay)
    mb, dp = plan.micro_batch_size, plan.dp
    out = []
    for i in range(steps):
        choices = sample_subnet(net, i)
        tokens = synthetic_tokens(net, seed, i, mb * dp)
        losses = []
        for r in range(dp):
            rows = tokens[r * mb:(r + 1) * mb]
            x = rows[:, :-1]
            for st in stages:
                x = st(x, choices)
            loss = stages[-1].loss(x, rows[:, 1:])
            losses.append(float(loss.detach()))
            loss.backward()  # replica r's gradient is added to the sum of replicas 0..r−1
        chosen = [p for st in stages for m in st.chosen(choices) for p in m.parameters()]
        reduce_gradients(chosen, dp, None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out.append(SubnetLoss(i, choices, combine_losses(losses)))
    return out


__all__ = ["SubnetLoss", "train_sequential"]
