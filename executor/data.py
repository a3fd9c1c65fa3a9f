"""Training data: deterministic synthetic tokens, or a text file as byte-level tokens.

Both sources are pure functions of (seed, global step): every rank can build the global batch of
any step on its own and take its data-parallel slice, a resumed run sees exactly the batches an
uninterrupted one would, and the single-process reference trains on the same tokens.

Data-parallel rank d takes rows ``[d·n, (d+1)·n)`` of the global batch, ``n = m·b`` (m
micro-batches of b sequences); the pipeline schedule cuts those into m consecutive micro-batches.
"""

from __future__ import annotations

import numpy as np
import torch
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.reading import TEXT_DATA, read_bytes
from mindpipe.traces.torch_gpt import synthetic_batch

# Distinct streams per step without collisions for any realistic step count.
_STEP_STRIDE = 1_000_003


class TokenSource:
    """Global batches for a model and plan (see module docstring).

    Args:
        model: The model contract (sequence length, vocabulary).
        plan: Gives the global batch size.
        seed: Data seed.
        data: ``synthetic`` or the path of a text file (bytes are the tokens; vocab ≥ 256).
    """

    def __init__(self, model: Model, plan: Plan, seed: int, data: str = "synthetic") -> None:
        self.model = model
        self.global_batch = plan.global_batch_size
        self.local_rows = plan.num_microbatches * plan.micro_batch_size
        self.seed = seed
        self.data = data
        self._bytes: torch.Tensor | None = None
        if data != "synthetic":
            raw = np.frombuffer(read_bytes(data, TEXT_DATA), dtype=np.uint8)
            if raw.size < model.seq_len + 2:
                raise ValueError(f"{data}: {raw.size} bytes, need at least seq_len+2={model.seq_len + 2}")
            self._bytes = torch.from_numpy(raw.astype(np.int64))

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, next-token targets), each ``[global_batch, seq_len]``, for global step ``step``."""
        step_seed = self.seed * _STEP_STRIDE + step
        if self._bytes is None:
            return synthetic_batch(self.model, self.global_batch, seed=step_seed)
        s = self.model.seq_len
        gen = torch.Generator().manual_seed(step_seed)
        starts = torch.randint(0, self._bytes.numel() - s - 1, (self.global_batch,), generator=gen)
        rows = torch.stack([self._bytes[i:i + s + 1] for i in starts.tolist()])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def local_batch_at(self, step: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's rows of the step's global batch."""
        x, y = self.global_batch_at(step)
        lo = dp_rank * self.local_rows
        return x[lo:lo + self.local_rows], y[lo:lo + self.local_rows]


__all__ = ["TokenSource"]
