"""Cost of large fresh CPU allocations: the LM-head GEMM of gpt-tiny-8k per sample, by micro-batch.

glibc serves a request at or above its mmap threshold (at most 32 MiB on 64-bit hosts) with a new
mapping that the kernel page-faults and zeroes on first touch. This times ``X @ Wᵀ`` (logits of
``mb × 128 × 8192`` fp32) with a fresh result and into a preallocated one (``out=``), and
``log_softmax`` of the logits, single-threaded, and prints the extra time per fresh byte
(:data:`mindpipe.traces.host_alloc.CPU_FRESH_ALLOC_BYTES` is where the jump should appear).

Usage: ``python benchmarks/fresh_alloc.py [--out benchmarks/results/fresh_alloc.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from mindpipe.traces.builtin import load_model
from mindpipe.traces.host_alloc import CPU_FRESH_ALLOC_BYTES


def _median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(micro_batches: list[int], reps: int) -> list[dict[str, float]]:
    """Per micro-batch: logits MiB, ms per sample fresh / into ``out=`` / log_softmax."""
    model = load_model("gpt-tiny-8k")
    w = torch.randn(model.vocab_size, model.hidden_size)
    rows = []
    for mb in micro_batches:
        x = torch.randn(mb * model.seq_len, model.hidden_size)
        out = torch.empty(mb * model.seq_len, model.vocab_size)
        logits = torch.randn(mb * model.seq_len, model.vocab_size)
        fresh = _median_s(lambda x=x: x @ w.t(), reps)
        reuse = _median_s(lambda x=x, out=out: torch.mm(x, w.t(), out=out), reps)
        lsm = _median_s(lambda logits=logits: torch.log_softmax(logits, -1), reps)
        nbytes = out.numel() * 4
        rows.append({"micro_batch": mb, "logits_MiB": nbytes / 2**20, "fresh_ms_per_sample": 1e3 * fresh / mb,
                     "out_ms_per_sample": 1e3 * reuse / mb, "log_softmax_ms_per_sample": 1e3 * lsm / mb,
                     "fresh_extra_ns_per_byte": 1e9 * max(0.0, fresh - reuse) / nbytes,
                     "at_or_above_threshold": nbytes >= CPU_FRESH_ALLOC_BYTES})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", default="2,4,8,16")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fresh_alloc.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = measure([int(x) for x in args.micro_batches.split(",")], args.reps)
    for r in rows:
        print(f"mb {r['micro_batch']:3d}  logits {r['logits_MiB']:5.0f} MiB  fresh {r['fresh_ms_per_sample']:.2f}  "
              f"out= {r['out_ms_per_sample']:.2f}  log_softmax {r['log_softmax_ms_per_sample']:.2f} ms/sample  "
              f"extra {r['fresh_extra_ns_per_byte']:.2f} ns/byte{'  (mmapped)' if r['at_or_above_threshold'] else ''}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": 1, "torch": torch.__version__, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
