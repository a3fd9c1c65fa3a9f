"""Operator-level profiling of a transformer block from its ``torch.fx`` graph.

DawnPiper (Peng et al., 2025) partitions and plans memory below the layer level, on a graph
captured by a compiler. Here a block is traced with ``torch.fx.symbolic_trace``; every compute
node (module call, matmul, softmax, GeLU, dropout, add, mul …) becomes one unit, and the free
nodes that only reshape or index (``view``, ``transpose``, ``chunk``, ``getitem``, ``size`` …)
are folded into the first compute unit that consumes them. Each unit is timed in isolation on
its real inputs like a layer (:func:`mindpipe.traces.timing.measure_unit`).

Per-unit numbers that must add up to the block's are attributed, not re-measured: a tensor that
autograd saves is charged to the first unit that saves it (the softmax output, saved by both the
softmax and the following matmul, is counted once), so the units' ``activation_bytes`` sum to the
block's. ``output_bytes`` of a unit is everything live across a cut right after it (for a cut
inside a block that includes the residual stream), which is what a partitioner must send.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from mindpipe.traces.timing import Clock, measure_unit, tensor_bytes
from mindpipe.traces.trace import LayerRecord
from torch.utils._pytree import tree_map

# Nodes that only describe, view or index a tensor: no kernel worth timing on their own.
_FREE_METHODS = {"size", "view", "transpose", "chunk", "split", "permute", "reshape", "contiguous", "to", "unsqueeze"}
_FREE_FUNCTIONS = {operator.getitem, getattr, torch.narrow, torch.transpose, torch.reshape}


def _is_free(node: torch.fx.Node) -> bool:
    if node.op in ("placeholder", "get_attr", "output"):
        return True
    if node.op == "call_method":
        return node.target in _FREE_METHODS
    return node.op == "call_function" and node.target in _FREE_FUNCTIONS


def _kind(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))).__name__.lower()
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target))


def group_nodes(gm: torch.fx.GraphModule) -> list[list[torch.fx.Node]]:
    """Split the graph's nodes into units: one compute node each, plus the free nodes it needs."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    leaders = [n for n in nodes if not _is_free(n)]
    owner: dict[torch.fx.Node, int] = {n: i for i, n in enumerate(leaders)}
    last = len(leaders) - 1
    for n in reversed(nodes):
        if n in owner:
            continue
        users = [owner.get(u, last) for u in n.users if u.op != "output"]
        owner[n] = min(users) if users else last
    for n in nodes:
        # Items of a tuple-valued free node (chunk/split) stay with it, so units exchange tensors.
        src = n.args[0] if n.args else None
        if n.target is operator.getitem and isinstance(src, torch.fx.Node) and _is_free(src) and src in owner:
            owner[n] = min(owner[n], owner[src]) if src.op != "get_attr" else owner[n]
    groups: list[list[torch.fx.Node]] = [[] for _ in leaders]
    for n in nodes:  # keep topological order inside each unit
        groups[owner[n]].append(n)
    return groups


def _fetch(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def run_nodes(gm: torch.fx.GraphModule, nodes: Sequence[torch.fx.Node], env: dict[str, Any]) -> None:
    """Execute ``nodes`` in order, reading arguments from and writing results to ``env``."""
    for n in nodes:
        args = torch.fx.node.map_arg(n.args, lambda a: env[a.name])
        kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a.name])
        if n.op == "call_module":
            env[n.name] = gm.get_submodule(str(n.target))(*args, **kwargs)
        elif n.op == "call_function":
            env[n.name] = n.target(*args, **kwargs)  # type: ignore[operator]
        elif n.op == "call_method":
            self_obj, *rest = args
            env[n.name] = getattr(self_obj, str(n.target))(*rest, **kwargs)
        elif n.op == "get_attr":
            env[n.name] = _fetch(gm, str(n.target))


def profile_block_ops(
    block: torch.nn.Module,
    x: torch.Tensor,
    block_name: str,
    prev_name: str | None,
    clock: Clock,
    warmup: int,
    repeats: int,
    seed: int,
    state: Sequence[torch.Tensor],
) -> list[LayerRecord]:
    """Profile one block operator by operator; returns one record per unit, in graph order."""
    gm = torch.fx.symbolic_trace(block)
    gm.train(block.training)
    (placeholder,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    groups = group_nodes(gm)
    unit_of = {n.name: i for i, g in enumerate(groups) for n in g}
    names = [f"{block_name}.{g[-1].name}" for g in groups]
    params = list(gm.parameters())
    excluded = list(params) + list(gm.buffers()) + list(state)

    # One pass with every unit's saves attributed to the unit that saves first.
    skip = {t.untyped_storage().data_ptr() for t in excluded}
    charged: dict[int, int] = {}
    act = [0] * len(groups)
    env: dict[str, Any] = {placeholder.name: x.detach().requires_grad_(True)}
    for gi, g in enumerate(groups):

        def pack(t: torch.Tensor, gi: int = gi) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in skip and ptr not in charged:
                charged[ptr] = gi
                act[gi] += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run_nodes(gm, g, env)
    values = {k: tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, v) for k, v in env.items()}

    records: list[LayerRecord] = []
    for gi, g in enumerate(groups):
        members = {n.name for n in g}
        ext = sorted({a.name for n in g for a in n.all_input_nodes if a.name not in members}, key=lambda s: (s != placeholder.name, s))
        outs = [n.name for n in g if any(u.name not in members for u in n.users)]

        def unit(*inputs: Any, g: list[torch.fx.Node] = g, ext: list[str] = ext, outs: list[str] = outs) -> tuple[Any, ...]:
            local = dict(zip(ext, inputs, strict=True))
            run_nodes(gm, g, local)
            return tuple(local[o] for o in outs)

        mods = [gm.get_submodule(str(n.target)) for n in g if n.op == "call_module"]
        unit_params = [p for m in mods for p in m.parameters()]
        cost = measure_unit(
            unit, [values[e] for e in ext], unit_params, clock,
            warmup=warmup, repeats=repeats, exclude_storages=excluded, seed=seed + gi,
        )
        # Live across a cut after this unit: values made at or before it and used after it.
        live = [
            values[n.name]
            for n in [placeholder, *(m for gj in groups[: gi + 1] for m in gj)]
            if isinstance(values.get(n.name), torch.Tensor)
            and any(unit_of.get(u.name, len(groups)) > gi or u is output for u in n.users)
        ]
        producers = [names[unit_of[e]] if e in unit_of else prev_name for e in ext]
        records.append(
            LayerRecord(
                name=names[gi],
                kind=_kind(gm, g[-1]),
                forward_s=cost.forward_s,
                backward_input_s=cost.backward_input_s,
                backward_weight_s=cost.backward_weight_s,
                activation_bytes=act[gi],
                output_bytes=tensor_bytes(live) if gi < len(groups) - 1 else cost.output_bytes,
                param_count=sum(p.numel() for p in unit_params),
                forward_flops=cost.forward_flops,
                backward_flops=cost.backward_flops,
                inputs=sorted({p for p in producers if p}),
                stats=cost.stats,
            )
        )
    return records
