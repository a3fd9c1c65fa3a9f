"""Measure this machine's sustained CPU matmul throughput and memory bandwidth with torch.

The numbers calibrate the ``cpu`` entry of ``traces/hardware/catalog.json``: the simulator
should use what a CPU run can actually sustain, not a theoretical peak, when it predicts CPU
(gloo) runs of the executor.

Method:
    * Matmul: square ``n x n @ n x n`` products for n in {1024, 1536, 2048}, in fp32 and bf16,
      with ``torch.set_num_threads(os.cpu_count())``. Each size is warmed up, then timed
      ``--repeats`` times; a matmul counts ``2 * n**3`` FLOPs. The per-dtype figure is the best
      per-size median (the size at which the BLAS kernel sustains the most).
    * fp16 is measured too, but only at n in {512, 1024} and with at most 5 repeats: CPUs
      without AVX512-FP16/AMX-FP16 have no fast fp16 GEMM in torch, and it runs ~100x slower
      than bf16 (so the simulator must not assume fp16 is cheap on CPU).
    * Memory bandwidth: ``dst.copy_(src)`` on fp32 tensors of ``--copy-mib`` MiB each (far larger
      than the last-level cache), counting bytes read + bytes written (STREAM "copy" convention;
      write-allocate traffic is not counted). Median of repeats.

Usage:
    python benchmarks/measure_cpu.py [--repeats 15] [--out benchmarks/results/cpu_peak.json]

Prints one JSON object on stdout and writes the same object to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "cpu_peak.json"


def _cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo, or platform's answer elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_flags() -> list[str]:
    """Return the SIMD-relevant CPU flags (AVX2 / AVX-512 / FMA / AMX) found in /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    keep = ("avx", "fma", "amx")
                    return sorted(f for f in flags if f.startswith(keep))
    except OSError:
        pass
    return []


def _median_seconds(fn, repeats: int, warmup: int) -> float:
    """Run ``fn`` ``warmup`` times untimed, then return the median of ``repeats`` timings."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_matmul(
    dtype: torch.dtype, sizes: list[int], repeats: int, warmup: int = 3
) -> dict[str, float]:
    """Return the median FLOP/s of square matmuls of each size, keyed by ``str(n)``."""
    out: dict[str, float] = {}
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, generator=gen).to(dtype)
        b = torch.randn(n, n, generator=gen).to(dtype)
        c = torch.empty(n, n, dtype=dtype)
        seconds = _median_seconds(functools.partial(torch.mm, a, b, out=c), repeats, warmup)
        out[str(n)] = 2.0 * n**3 / seconds
    return out


def measure_copy_bandwidth(mib: int, repeats: int) -> float:
    """Return the median copy bandwidth in bytes/s (bytes read + bytes written per second)."""
    numel = mib * 2**20 // 4
    src = torch.ones(numel, dtype=torch.float32)
    dst = torch.zeros(numel, dtype=torch.float32)
    seconds = _median_seconds(lambda: dst.copy_(src), repeats, warmup=2)
    return 2.0 * src.numel() * src.element_size() / seconds


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print its JSON result and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per case")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 1536, 2048])
    parser.add_argument("--fp16-sizes", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--copy-mib", type=int, default=512, help="size of each copy buffer")
    parser.add_argument("--out", type=Path, default=_DEFAULT_OUT)
    args = parser.parse_args(argv)

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    by_size = {
        name: measure_matmul(dt, args.sizes, args.repeats)
        for name, dt in _DTYPES.items()
        if name != "fp16"
    }
    # Slow path on most CPUs (see module docstring): fewer, smaller cases.
    by_size["fp16"] = measure_matmul(torch.float16, args.fp16_sizes, min(args.repeats, 5), warmup=1)
    result = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
        "cpu_model": _cpu_model(),
        "logical_cpus": threads,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": _cpu_flags(),
        "matmul_sizes": args.sizes,
        "fp16_matmul_sizes": args.fp16_sizes,
        "repeats": args.repeats,
        "matmul_flops_per_s_by_size": by_size,
        "matmul_flops_per_s": {name: max(v.values()) for name, v in by_size.items()},
        "copy_buffer_mib": args.copy_mib,
        "memory_bandwidth_GBps": measure_copy_bandwidth(args.copy_mib, args.repeats) / 1e9,
    }
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
