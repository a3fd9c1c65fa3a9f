"""Bytes a swapped block sends to the host: the pool's, per saved view, and the memory model's (CPU, seconds).

The executor's host pool (:mod:`mindpipe.executor.offload`) copies a saved tensor with its whole
storage and lets the storage's other saved views share the copy; until stop 63 it copied each
saved view on its own, and attention saves the softmax's output through two views of one storage.
For one GPT block's forward under ``swapping`` this prints, per shape: the pool's bytes, the sum of
the saved views' own bytes (what copying each view would move), and the memory model's bytes for a
kept block (``activation_bytes_per_layer``, what the simulator prices a swapped block's copy at).

    .venv/bin/python benchmarks/swap_bytes.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from mindpipe.executor.offload import HostPool, local_tensor, swapping
from mindpipe.simulator.memory import activation_bytes_per_layer
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.torch_models import build_model

# (hidden, heads, sequence, fused attention)
SHAPES = [(1024, 16, 512, False), (1024, 16, 512, True), (64, 4, 32, False)]


def measure(hidden: int, heads: int, seq: int, flash: bool) -> dict[str, float | int | bool]:
    model = Model(kind="gpt", num_layers=1, hidden_size=hidden, num_heads=heads, seq_len=seq, vocab_size=128)
    block = build_model(model, seed=0, flash_attention=flash).blocks["0"]
    pool = HostPool(torch.device("cpu"))
    views: dict[tuple, int] = {}
    pack = pool.pack

    def counting(t: torch.Tensor):  # the saved views, each counted once
        local = local_tensor(t)
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape), local.stride())
        out = pack(t)
        if out is not t:
            views[key] = local.numel() * local.element_size()
        return out

    pool.pack = counting  # type: ignore[method-assign]
    x = torch.randn(1, seq, hidden, requires_grad=True)
    with swapping(pool):
        y = block(x)
    plan = Plan(micro_batch_size=1, global_batch_size=1, precision="fp32", flash_attention=flash)
    modelled = activation_bytes_per_layer(model, plan, policy="none", mask_bytes=4)
    del y
    return {"hidden": hidden, "heads": heads, "seq": seq, "flash_attention": flash, "pool_bytes": pool.peak_bytes,
            "per_view_bytes": sum(views.values()), "model_bytes": modelled,
            "pool_over_model": pool.peak_bytes / modelled, "per_view_over_model": sum(views.values()) / modelled}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = [measure(*shape) for shape in SHAPES]
    text = json.dumps(rows, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
