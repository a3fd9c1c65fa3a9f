"""vPipe's prefetch of swapped activations on one GPU: is the copy back hidden under the action before?

What the simulator prices (``simulator.actions.prefetched_backward``, ``Engine._prefetch``): on a
pipeline stage whose backward follows another action (1F1B's stages but the last), the backward's
swapped activations are copied back while that action runs, so only the part of the copy longer
than it is exposed. The executor runs this with :func:`mindpipe.executor.offload.install_prefetch`;
a pipeline of several stages needs several GPUs, so this runs the first stage's own sequence on
one: F0, F1, B0 (1F1B's first stage with two micro-batches), each block's saved activations
swapped to pinned host memory, with

* ``keep``: nothing swapped (the baseline);
* ``lazy``: B0 copies each storage back when it asks for it, on the compute stream (the executor
  before stop 63, and still a backward right after its own forward);
* ``prefetch``: the last swapped block's copy started on the prefetch's stream when F1 starts
  (``HostPool.prefetch``), and each swapped block's first use in B0 starting the copy of the next
  one below it.

It reports per variant the time of F1 and of B0 (CUDA events, median of ``--repeats``), the
allocator's peak, the bytes swapped per micro-batch, and one block's copy alone (host→device), so
that the exposed copy measured (B0 − keep's B0) can be set against the simulator's rule
(``planning.exposed_swap_s`` with ``work.swap_chain_stall_s``, keep's B0 shared evenly over the blocks).

    python benchmarks/swap_prefetch.py [--hidden 4096 --layers 4 --seq 2048 --mbs 2] [--out FILE.json]

Needs a CUDA GPU (it exits 2 with one line otherwise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("swap_prefetch: needs a CUDA GPU; none here", file=sys.stderr)
        return 2
    from mindpipe.executor.offload import HostPool
    from mindpipe.executor.parallelize import apply_recompute
    from mindpipe.executor.stages import build_stage_modules
    from mindpipe.simulator.planning import exposed_swap_s
    from mindpipe.simulator.work import swap_chain_stall_s
    from mindpipe.traces.config import Model, Plan
    from mindpipe.traces.layout import block_policies
    from mindpipe.traces.torch_models import build_model

    dev = torch.device("cuda")
    model = Model(kind="gpt", num_layers=args.layers, hidden_size=args.hidden, num_heads=args.heads,
                  seq_len=args.seq, vocab_size=8192)
    out: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "model": vars(args) | {"out": None},
                 "variants": {}}
    for variant in ("keep", "lazy", "prefetch"):
        policy = "keep" if variant == "keep" else "swap"
        plan = Plan(micro_batch_size=args.mbs, global_batch_size=args.mbs, precision="bf16", flash_attention=True,
                    layer_memory_policy=[policy] * args.layers)
        stage = build_stage_modules(build_model(model, seed=0, dtype="bf16", device=dev, flash_attention=True), plan, 0)[0]
        blocks = torch.nn.Sequential(*stage.blocks.values())
        pool = HostPool(dev)
        apply_recompute(stage, block_policies(plan, model.num_layers), pool, None)
        times: dict[str, list[float]] = {"f1_s": [], "b0_s": []}
        swapped = 0
        for rep in range(args.repeats + 1):
            xs = [torch.randn(args.mbs, args.seq, args.hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
                  for _ in range(2)]
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            pool.group = (0, 0)
            y0 = blocks(xs[0])
            pool.group = None
            ev[0].record()
            if variant == "prefetch":
                swapped = pool.prefetch((0, 0))
            pool.group = (0, 1)
            y1 = blocks(xs[1])
            pool.group = None
            ev[1].record()
            ev[2].record()
            y0.float().square().mean().backward()
            ev[3].record()
            pool.release((0, 0))
            torch.cuda.synchronize()
            if rep:  # the first is a warm-up
                times["f1_s"].append(ev[0].elapsed_time(ev[1]) / 1e3)
                times["b0_s"].append(ev[2].elapsed_time(ev[3]) / 1e3)
            peak = torch.cuda.max_memory_allocated()
            del y0, y1, xs
            pool.blocks.clear()
            pool.started.clear()
        out["variants"][variant] = {k: statistics.median(v) for k, v in times.items()} | {
            "peak_allocated_bytes": peak, "host_pool_peak_bytes": pool.peak_bytes, "prefetched_bytes": swapped}
    # One block's copy back alone: the prefetched bytes (the last swapped block's) host→device, pinned.
    nbytes = out["variants"]["prefetch"]["prefetched_bytes"]
    host = torch.empty(max(1, nbytes), dtype=torch.uint8, pin_memory=True)
    copies = []
    for _ in range(args.repeats + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        host.to(dev, non_blocking=True)
        b.record()
        torch.cuda.synchronize()
        copies.append(a.elapsed_time(b) / 1e3)
    copy_s = statistics.median(copies[1:])
    v = out["variants"]
    keep_b0 = v["keep"]["b0_s"]
    out["block_copy_back_s"] = copy_s
    out["copy_back_gb_per_s"] = nbytes / copy_s / 1e9 if copy_s > 0 else None
    out["exposed_s"] = {k: v[k]["b0_s"] - keep_b0 for k in ("lazy", "prefetch")}
    # The planners' and engine's rule for the prefetched B0: the last swapped block's copy under F1,
    # the others during B0 one ahead (keep's B0 shared evenly over the blocks).
    chain = swap_chain_stall_s([keep_b0 / args.layers] * args.layers, [copy_s] * args.layers)
    out["simulator_exposed_s"] = exposed_swap_s(copy_s * args.layers, v["prefetch"]["f1_s"], 0.0,
                                                back_s=copy_s, chain_s=chain)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
