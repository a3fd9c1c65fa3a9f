"""What a split backward (zero-bubble I and W) costs on this CPU beyond one backward, on gpt-tiny-8k's last stage.

The simulator prices a split backward as the profile splits it (``mindpipe profile``:
B = ``grad(inputs)``, W = full backward − B), so I + W costs one backward. The executor runs torch's
``stage_backward_input`` and ``stage_backward_weight`` instead: the first walks the stage's autograd
graph in Python to group its parameters (``construct_reverse_graph``, ``get_param_groups``) and
registers a hook per group before its ``grad(inputs)``; the second takes one ``autograd.grad``
pass per parameter group (or one merged pass, :func:`mindpipe.executor.torch_pipelining.merged_param_group`).
This times, single-threaded, in one process, on the last stage of a pp2 split of ``gpt-tiny-8k``
(two blocks, the final norm, the 8k-entry head and the loss; the demo's model), per micro-batch:

* ``forward_ms``: the stage's forward and loss;
* ``backward_ms``: one ``loss.backward()``;
* ``grad_inputs_ms``: a plain ``autograd.grad`` of the stage input (``retain_graph``): the profile's B;
* ``grad_inputs_hooks_dropping_ms``, ``grad_inputs_hooks_keeping_ms``: the same with torch's
  prehooks on the parameter groups' nodes, the captured output gradients dropped or kept (as
  torch's I keeps them for W);
* ``stage_backward_input_ms``, ``stage_backward_weight_ms``: torch's I and its W per group;
* ``merged_weight_ms``: W as one merged pass; ``groups``: torch's parameter groups.

And, for middle stages of k = 1, 2, 4 and 8 GPT blocks (h = 64, micro-batch 2), what torch's I and W
take beyond a plain ``grad(inputs)`` and the profile's W (``scaling``), beside what the simulator's
host terms count there (:func:`mindpipe.simulator.build.split_backward_walks`: the operators I
walks, W's passes and the operators those walk), and the least-squares host time per unit of each.

Usage: ``python benchmarks/split_backward_cpu.py [--micro-batches 2,4] [--reps 30]
[--out benchmarks/results/split_backward_cpu.json]``. Timings on a shared 2-core host are noisy:
compare within one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from mindpipe.executor.stages import build_stage_modules
from mindpipe.executor.torch_pipelining import merged_param_group
from mindpipe.simulator.build import split_backward_walks, stage_op_counts
from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import block_policies, stage_layout
from mindpipe.traces.torch_gpt import build_gpt, lm_loss
from torch.distributed.pipelining._backward import (
    _get_grad_fn_or_grad_acc as _grad_acc,
)
from torch.distributed.pipelining._backward import (
    construct_reverse_graph,
    get_param_groups,
    stage_backward_input,
    stage_backward_weight,
)

MODEL = "gpt-tiny-8k"


def _median_ms(fn: Callable[[], float], reps: int) -> float:
    for _ in range(3):
        fn()
    return 1e3 * statistics.median(fn() for _ in range(reps))


def measure(micro_batch: int, reps: int) -> dict[str, float]:
    """The module docstring's figures for one micro-batch size."""
    model = load_model(MODEL)
    plan = Plan(pp=2, schedule="zb_h1", micro_batch_size=micro_batch, global_batch_size=8 * micro_batch,
                precision="fp32")
    stage = build_stage_modules(build_gpt(model, seed=0), plan, 1)[1]
    params = list(stage.parameters())
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(micro_batch, model.seq_len, model.hidden_size, generator=g)
    y = torch.randint(0, model.vocab_size, (micro_batch, model.seq_len), generator=g)

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        x = x0.clone().requires_grad_(True)
        return x, lm_loss(stage(x), y)

    def timed(fn: Callable[[], object]) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def fwd() -> float:
        return timed(forward)

    def full() -> float:
        _, loss = forward()
        return timed(loss.backward)

    def plain_i() -> float:
        x, loss = forward()
        return timed(lambda: torch.autograd.grad(loss, [x], retain_graph=True))

    def hooked_i(keep: bool) -> float:
        # torch's I without its bookkeeping: the same prehooks on the groups' nodes, the captured
        # output gradients kept (as torch keeps them for W) or dropped
        x, loss = forward()
        outs, ins = [loss.grad_fn], [x.grad_fn or _grad_acc(x)]
        groups = get_param_groups(ins, [_grad_acc(p) for p in params], construct_reverse_graph(outs))
        kept: list[object] = []
        handles = [node.register_prehook(kept.append if keep else (lambda g: None))
                   for group in groups for node in group["intermediates"]]
        t = timed(lambda: torch.autograd.grad(loss, [x], retain_graph=True))
        for h in handles:
            h.remove()
        return t

    groups_seen: list[int] = []

    def split(merged: bool, part: str) -> float:
        x, loss = forward()
        t = time.perf_counter()
        _, groups = stage_backward_input([loss], None, [x], iter(params))
        i_s = time.perf_counter() - t
        groups_seen.append(len(groups))
        t = time.perf_counter()
        stage_backward_weight(iter(params), [merged_param_group(groups)] if merged else groups)
        w_s = time.perf_counter() - t
        return i_s if part == "I" else w_s

    for p in params:
        p.grad = None
    out = {"micro_batch": micro_batch, "forward_ms": _median_ms(fwd, reps), "backward_ms": _median_ms(full, reps),
           "grad_inputs_ms": _median_ms(plain_i, reps),
           "grad_inputs_hooks_dropping_ms": _median_ms(lambda: hooked_i(False), reps),
           "grad_inputs_hooks_keeping_ms": _median_ms(lambda: hooked_i(True), reps),
           "stage_backward_input_ms": _median_ms(lambda: split(False, "I"), reps),
           "stage_backward_weight_ms": _median_ms(lambda: split(False, "W"), reps),
           "merged_weight_ms": _median_ms(lambda: split(True, "W"), reps),
           "groups": float(groups_seen[0])}
    out["profile_weight_ms"] = out["backward_ms"] - out["grad_inputs_ms"]  # the profile's W: full − B
    out["split_over_backward"] = (out["stage_backward_input_ms"] + out["stage_backward_weight_ms"]) / out["backward_ms"]
    return out


def _scaling_row(k: int, reps: int) -> dict[str, float]:
    """One ``scaling`` row: a middle stage of ``k`` blocks."""
    model = Model(kind="gpt", num_layers=k + 1, hidden_size=64, num_heads=4, seq_len=32, vocab_size=64,
                  name=f"gpt-h64-{k}")
    plan = Plan(pp=2, schedule="zb_h1", micro_batch_size=2, global_batch_size=4, precision="fp32",
                partition=[1, k])
    stage = build_stage_modules(build_gpt(model, seed=0), plan, 1)[1]
    blocks = torch.nn.Sequential(*stage.blocks.values())
    params = list(blocks.parameters())
    x0 = torch.randn(2, model.seq_len, model.hidden_size, generator=torch.Generator().manual_seed(0))

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        x = x0.clone().requires_grad_(True)
        return x, blocks(x)

    def timed(fn: Callable[[], object]) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def full() -> float:
        _, out = forward()
        return timed(lambda: out.backward(torch.ones_like(out)))

    def plain_i() -> float:
        x, out = forward()
        return timed(lambda: torch.autograd.grad(out, [x], torch.ones_like(out), retain_graph=True))

    def split(part: str) -> float:
        x, out = forward()
        t = time.perf_counter()
        _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], iter(params))
        i_s = time.perf_counter() - t
        t = time.perf_counter()
        stage_backward_weight(iter(params), groups)
        return i_s if part == "I" else time.perf_counter() - t

    b, gi = _median_ms(full, reps), _median_ms(plain_i, reps)
    i_ms, w_ms = _median_ms(lambda: split("I"), reps), _median_ms(lambda: split("W"), reps)
    # The simulator's walks on a stage of these k blocks alone (no head: the final norm and the
    # head are not in the timed module).
    counts = [c for c in stage_op_counts(model, plan)[1] if c.kind == "block"]
    span = dataclasses.replace(stage_layout(plan, model)[1], has_head=False)
    ops, passes, walked = split_backward_walks(model, plan, span, counts, block_policies(plan, model.num_layers))
    return {"blocks": k, "backward_ms": b, "grad_inputs_ms": gi, "stage_backward_input_ms": i_ms,
            "stage_backward_weight_ms": w_ms, "input_extra_ms": i_ms - gi, "weight_extra_ms": w_ms - (b - gi),
            "ops_walked_by_i": ops, "weight_passes": passes, "ops_walked_by_w": walked}


def scaling(reps: int) -> dict[str, object]:
    """The module docstring's ``scaling`` rows and the host times per walked operator and per pass."""
    rows = [_scaling_row(k, reps) for k in (1, 2, 4, 8)]
    a = np.array([[r["ops_walked_by_i"]] for r in rows])
    per_op_i = float(np.linalg.lstsq(a, np.array([r["input_extra_ms"] for r in rows]), rcond=None)[0][0])
    a = np.array([[r["weight_passes"], r["ops_walked_by_w"]] for r in rows])
    per_pass, per_op_w = (float(v) for v in np.linalg.lstsq(a, np.array([r["weight_extra_ms"] for r in rows]), rcond=None)[0])
    return {"rows": rows, "input_ms_per_op_walked": per_op_i, "weight_ms_per_pass": per_pass,
            "weight_ms_per_op_walked": per_op_w}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", default="2,4")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/split_backward_cpu.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [measure(int(mb), args.reps) for mb in args.micro_batches.split(",")]
    result = {"model": MODEL, "stage": "last of pp2 (2 blocks, final norm, LM head, loss)", "threads": 1, "rows": rows,
              "scaling": scaling(args.reps)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
