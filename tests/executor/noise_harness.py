"""One rank of the noise-scale acceptance harness (launched by test_exec_noise_scale.py).

Linear regression ``y = w*·x + ε`` trained through the executor's own pieces: the plan's mesh
(:func:`mindpipe.executor.distributed.build_mesh`), FSDP2 ``replicate`` (``zero_stage`` 0) or
``fully_shard`` (``zero_stage`` 1) as :func:`mindpipe.executor.parallelize.apply_data_parallel`
applies them, a ``PipelineStage`` driven by torch's schedule class of the plan
(:func:`mindpipe.executor.torch_pipelining.named_schedule`), and
:class:`mindpipe.executor.noise_probe.NoiseProbe` wrapped on the stage as the worker wraps it. The
weights stay at ``w = w* + δ`` (no optimizer step), so the noise scale is a constant known in
closed form (see the test). Writes the run's final estimate as JSON.

    python noise_harness.py RANK WORLD PORT OUT DP ZERO MICROBATCHES MICRO_BATCH STEPS
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from mindpipe.executor.__main__ import exit_without_teardown
from mindpipe.executor.distributed import build_mesh, coordinates
from mindpipe.executor.noise_probe import NoiseProbe, noise_method
from mindpipe.executor.precheck import TORCH_SCHEDULES
from mindpipe.executor.torch_pipelining import named_schedule
from mindpipe.traces.config import Plan
from mindpipe.traces.layout import data_parallel_units
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage

DIM, SIGMA, SEED = 8, 1.0, 1234


def half_mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over the micro-batch of ½(x·w − y)²."""
    return 0.5 * (out.squeeze(-1) - target).pow(2).mean()


def main(argv: list[str]) -> None:
    rank, world, port, out = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    dp, zero, m, b, steps = (int(v) for v in argv[4:9])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device("cpu")
    plan = Plan(dp=dp, tp=1, pp=1, micro_batch_size=b, global_batch_size=dp * m * b, schedule="gpipe",
                zero_stage=zero)
    mesh = build_mesh(plan, device)
    dp_rank = coordinates(mesh)["dp"]
    w_star = torch.linspace(-1.0, 1.0, DIM)
    delta = torch.zeros(DIM)
    delta[0] = 1.0  # |δ|² = 1
    model = nn.Linear(DIM, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((w_star + delta).unsqueeze(0))
    if data_parallel_units(plan, 0) == 0:
        pass  # one fp32 replica: the executor applies no wrapper either
    elif zero == 0:
        replicate(model, mesh=mesh["dp"])
    else:
        fully_shard(model, mesh=mesh["dp"])
    stage = PipelineStage(model, 0, 1, device, group=mesh.get_group("pp"))
    probe = NoiseProbe(plan, device, noise_method(plan) or "")
    probe.wrap_stage(stage, model)
    schedule = named_schedule(TORCH_SCHEDULES[plan.schedule], [stage], m, half_mse)
    gen = torch.Generator().manual_seed(SEED)
    rows = m * b
    for step in range(1, steps + 1):
        x = torch.randn(plan.global_batch_size, DIM, generator=gen)  # every rank draws the global batch
        y = x @ w_star + SIGMA * torch.randn(plan.global_batch_size, generator=gen)
        x, y = x[dp_rank * rows:(dp_rank + 1) * rows], y[dp_rank * rows:(dp_rank + 1) * rows]
        model.zero_grad(set_to_none=True)
        schedule.step(x, target=y, losses=[])
        probe.end_step(step)
    if rank == 0:
        res = probe.result
        last = res.steps[-1]
        with open(out, "w") as f:
            json.dump({"method": res.method, "noise_scale": res.noise_scale, "steps": len(res.steps),
                       "grad_sq": last.grad_sq_ema, "trace_cov": last.trace_cov_ema,
                       "small_batch": probe.small_batch, "big_batch": probe.big_batch}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
    # As an executor rank does: gloo's teardown at interpreter exit aborts now and then after the
    # results are written ("terminate called without an active exception").
    exit_without_teardown(0)
