"""A minimal hand-written torch.distributed.pipelining training script (the overhead baseline).

Two pipeline ranks, the model cut in half (embedding + first half of the blocks | second half +
final norm + LM head), ``Schedule1F1B``, AdamW, synthetic tokens — nothing else: no mesh, no
data-parallel wrapper, no measurement hooks. Run under torchrun by
``benchmarks/executor_overhead.py``; rank 0 writes the per-step wall times (max over ranks) as JSON.

    torchrun --nproc-per-node 2 benchmarks/executor_handwritten_pp.py MODEL MICRO_BATCH GLOBAL_BATCH STEPS OUT.json
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist
from mindpipe.traces.builtin import load_model
from mindpipe.traces.torch_gpt import GPT, build_gpt, lm_loss, synthetic_batch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


class Half(nn.Module):
    """One pipeline rank's half of the GPT."""

    def __init__(self, gpt: GPT, first: bool) -> None:
        super().__init__()
        n = len(gpt.blocks)
        keep = range(0, n // 2) if first else range(n // 2, n)
        self.embedding = gpt.embedding if first else None
        self.blocks = nn.ModuleList(gpt.blocks[str(i)] for i in keep)
        self.norm = None if first else gpt.final_norm
        self.head = None if first else gpt.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for b in self.blocks:
            x = b(x)
        if self.norm is not None and self.head is not None:
            x = self.head(self.norm(x))
        return x


def main() -> None:
    model_name, mbs, gbs, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    model = load_model(model_name)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    part = Half(build_gpt(model, seed=0), first=rank == 0)
    stage = PipelineStage(part, rank, 2, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=gbs // mbs, loss_fn=lm_loss)
    opt = torch.optim.AdamW(part.parameters(), lr=1e-3, weight_decay=0.0)
    times = []
    dist.barrier()
    for step in range(1, steps + 1):
        x, y = synthetic_batch(model, gbs, seed=step)
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if rank == 0:
            schedule.step(x, return_outputs=False)
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses, return_outputs=False)
        opt.step()
        times.append(time.perf_counter() - t0)
    everyone: list[list[float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, times)
    if rank == 0:
        per_step = [max(t[i] for t in everyone if t is not None) for i in range(steps)]
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"step_s": per_step}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
