"""Single-process training of the same model: the ground truth parity tests compare against.

No parallelism and no torch.distributed: the unsplit GPT or Llama from :func:`mindpipe.traces.torch_models.build_model`,
the global batch in micro-batches of ``micro_batch_size`` sequences in order, each micro-batch's
mean loss divided by the number of micro-batches before ``backward`` (so the gradient is that of
the global mean loss, which is what pipeline schedules with ``scale_grads`` and a data-parallel
average compute), and AdamW. The same per-step RNG seeding as the executor keeps dropout equal, and
the plan's ``flash_attention`` gives it the same attention kernel as every rank, and its
``loss_chunks`` and ``fused_head_loss`` the same loss as the last stage (:func:`mindpipe.traces.torch_gpt.plan_loss`).
"""

from __future__ import annotations

import torch
from mindpipe.executor.data import TokenSource
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import reduces_every_microbatch
from mindpipe.traces.torch_gpt import plan_loss
from mindpipe.traces.torch_models import TransformerLM, build_model


def reference_losses(model: Model, plan: Plan, steps: int, *, seed: int = 0, data: str = "synthetic",
                     lr: float = 1e-3, weight_decay: float = 0.0) -> list[float]:
    """Per-step mean loss of ``steps`` fp32 training steps (step numbers 1..steps)."""
    net = build_model(model, seed=seed, dtype="fp32", flash_attention=plan.flash_attention)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    source = TokenSource(model, plan, seed, data)
    b, lm_loss = plan.micro_batch_size, plan_loss(plan, head=net.lm_head)
    n = plan.global_batch_size // b
    losses = []
    for step in range(1, steps + 1):
        torch.manual_seed(seed * 7919 + step)
        x, y = source.global_batch_at(step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(n):
            loss = lm_loss(_output(net, x[i * b:(i + 1) * b], plan), y[i * b:(i + 1) * b])
            (loss / n).backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total / n)
    return losses


def _output(net: TransformerLM, x: torch.Tensor, plan: Plan) -> torch.Tensor:
    """What the loss takes: the logits, or under ``fused_head_loss`` the final norm's output (the
    loss calls the head, as on the last stage)."""
    if not plan.fused_head_loss:
        out: torch.Tensor = net(x)
        return out
    for _, kind, layer in net.layers():
        if kind != "lm_head":
            x = layer(x)
    return x


def _sq_norm_of_grad(net: TransformerLM, x: torch.Tensor, y: torch.Tensor, plan: Plan) -> float:
    """|∇ mean loss|² over rows ``x, y`` taken in the plan's micro-batches (each micro-batch's mean, averaged)."""
    b, lm_loss = plan.micro_batch_size, plan_loss(plan, head=net.lm_head)
    net.zero_grad(set_to_none=True)
    n = x.shape[0] // b
    for i in range(n):
        (lm_loss(_output(net, x[i * b:(i + 1) * b], plan), y[i * b:(i + 1) * b]) / n).backward()
    return float(sum(p.grad.double().pow(2).sum() for p in net.parameters() if p.grad is not None))


def reference_noise_norms(model: Model, plan: Plan, *, seed: int = 0, data: str = "synthetic") -> tuple[float, float]:
    """Step 1's ``(|G_small|², |G_big|²)`` as :mod:`mindpipe.executor.noise_probe` defines them, single-process.

    ``|G_big|²``: the global batch's gradient. ``|G_small|²``: with ``dp > 1`` the mean over
    data-parallel replicas of their rows' gradient (:class:`~mindpipe.executor.data.TokenSource`'s
    split; of their first micro-batch's rows where FSDP2 reduces in every backward,
    :func:`mindpipe.traces.layout.reduces_every_microbatch`), else the first micro-batch's gradient. Before any optimizer step, so a parallel run's
    first record must match it.
    """
    net = build_model(model, seed=seed, dtype="fp32", flash_attention=plan.flash_attention)
    source = TokenSource(model, plan, seed, data)
    b = plan.micro_batch_size
    torch.manual_seed(seed * 7919 + 1)
    x, y = source.global_batch_at(1)
    big = _sq_norm_of_grad(net, x, y, plan)
    if plan.dp > 1:
        rows = plan.global_batch_size // plan.dp
        # Where FSDP2 reduces every backward the probe reads each replica's first micro-batch.
        take = b if reduces_every_microbatch(plan) else rows
        small = sum(_sq_norm_of_grad(net, x[d * rows:d * rows + take], y[d * rows:d * rows + take], plan)
                    for d in range(plan.dp)) / plan.dp
    else:
        small = _sq_norm_of_grad(net, x[:b], y[:b], plan)
    return small, big


__all__ = ["reference_losses", "reference_noise_norms"]
