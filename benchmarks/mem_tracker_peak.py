"""Peak memory of one training step by category, from torch's ``MemTracker``, against the memory model.

An independent look at what a step holds at its peak: torch's
``torch.distributed._tools.mem_tracker.MemTracker`` sorts every live tensor into parameters,
buffers, gradients, activations and temporaries. Printed beside the simulator's terms for the same
single-device plan (weights, gradients, activations, other), optimizer state left out on both sides.
On this CPU it locates the peak where the model does; on a GPU (``--device cuda``) it shows which
category holds what the caching allocator sees beyond the model (``benchmarks/gpu_check.sh``).

    .venv/bin/python benchmarks/mem_tracker_peak.py [--device cpu|cuda]
        [--vocab V] [--micro-batch B] [--json]

fp32 only: the simulator's bf16 is mixed precision (fp32 master weights), which a bf16 module is not.
"""

from __future__ import annotations

import argparse
import json

import torch
from mindpipe.executor.precheck import catalog_device
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.torch_gpt import lm_loss
from mindpipe.traces.torch_models import build_model
from torch.distributed._tools.mem_tracker import MemTracker

MIB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = Model(kind="gpt", num_layers=4, hidden_size=1024, num_heads=16, seq_len=512, vocab_size=args.vocab,
                  name="gpt-1k")
    dev = torch.device(args.device)
    net = build_model(model, seed=0, dtype="fp32", device=dev)
    x = torch.randint(0, args.vocab, (args.micro_batch, model.seq_len), device=dev)
    y = torch.randint(0, args.vocab, (args.micro_batch, model.seq_len), device=dev)

    def step() -> None:
        lm_loss(net(x), y).backward()

    step()  # first-call work out of the way; then, as training does, gradients freed at the step
    net.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(net)
    with tracker:
        step()
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    measured = {str(k).split(".")[-1].lower(): v / MIB for k, v in peak.items()}
    spec = catalog_device(dev.type, torch.cuda.get_device_name(dev) if dev.type == "cuda" else None)
    if spec is None:
        raise SystemExit(f"mem_tracker_peak: {torch.cuda.get_device_name(dev)} is not in the hardware catalog")
    gpu = spec.name
    plan = Plan(micro_batch_size=args.micro_batch, global_batch_size=args.micro_batch, precision="fp32")
    rank = Simulator(model, Cluster(gpu=gpu, num_nodes=1, gpus_per_node=1)).memory(plan, reserved_bytes=0.0)[0]
    simulated = {"weights": rank.weights_bytes / MIB, "gradients": rank.gradients_bytes / MIB,
                 "activations": rank.activations_bytes / MIB, "other": rank.other_bytes / MIB}
    simulated["total"] = sum(simulated.values())
    out = {"device": gpu, "vocab": args.vocab, "micro_batch": args.micro_batch,
           "mem_tracker_peak_mib": measured, "simulated_mib_without_optimizer": simulated}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{gpu} fp32 V={args.vocab} b={args.micro_batch}")
    print("  MemTracker at the peak: " + ", ".join(f"{k} {v:.1f}" for k, v in measured.items()) + " MiB")
    print("  simulated (no optimizer): " + ", ".join(f"{k} {v:.1f}" for k, v in simulated.items()) + " MiB")


if __name__ == "__main__":
    main()
