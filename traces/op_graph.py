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
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from mindpipe.traces.timing import Clock, measure_unit, tensor_bytes
from mindpipe.traces.trace import LayerRecord
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

# Nodes that only describe, view or index a tensor: no kernel worth timing on their own.
_FREE_METHODS = {"size", "view", "transpose", "chunk", "split", "permute", "reshape", "contiguous", "to", "unsqueeze"}
_FREE_FUNCTIONS = {operator.getitem, getattr, torch.narrow, torch.transpose, torch.reshape}


# Reads of a tensor's metadata, not its values: a cut only has to carry the numbers they return.
_METADATA_METHODS = {"size", "dim"}
_METADATA_ATTRS = {"shape", "dtype", "device", "ndim", "layout", "is_cuda"}


def _reads_only_metadata(node: torch.fx.Node) -> bool:
    """``x.size()``, ``x.dim()``, ``x.shape``, ``x.dtype`` …: a use that does not need ``x``'s values."""
    if node.op == "call_method":
        return node.target in _METADATA_METHODS
    return (node.op == "call_function" and node.target is getattr and len(node.args) > 1
            and node.args[1] in _METADATA_ATTRS)


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


@dataclass(frozen=True)
class _BlockGraph:
    """A block traced by ``torch.fx`` and grouped into units, as every later pass reads it.

    Attributes:
        gm: The traced block, in the block's train/eval mode.
        placeholder: The graph's one input node.
        output: The graph's output node.
        groups: The units' nodes, in graph order (:func:`group_nodes`).
        unit_of: Index of the unit holding each node, by node name.
        names: Record name of each unit (``<block_name>.<last node>``).
        excluded: Parameters, buffers and model state: storages never charged as activations.
    """

    gm: torch.fx.GraphModule
    placeholder: torch.fx.Node
    output: torch.fx.Node
    groups: list[list[torch.fx.Node]]
    unit_of: dict[str, int]
    names: list[str]
    excluded: list[torch.Tensor]


@dataclass(frozen=True)
class _ForwardPass:
    """What one attributed forward pass of the whole block leaves behind.

    Attributes:
        activation_bytes: Bytes autograd saves, per unit, each storage charged to its first saver.
        values: Every node's result, detached, by node name: the units' recorded inputs.
    """

    activation_bytes: list[int]
    values: dict[str, Any]


def _trace_block(block: torch.nn.Module, block_name: str, state: Sequence[torch.Tensor]) -> _BlockGraph:
    """Trace ``block`` with ``torch.fx`` and split its graph into units."""
    gm = torch.fx.symbolic_trace(block)
    gm.train(block.training)
    (placeholder,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    groups = group_nodes(gm)
    return _BlockGraph(
        gm=gm,
        placeholder=placeholder,
        output=output,
        groups=groups,
        unit_of={n.name: i for i, g in enumerate(groups) for n in g},
        names=[f"{block_name}.{g[-1].name}" for g in groups],
        excluded=[*gm.parameters(), *gm.buffers(), *state],
    )


def _attributed_pass(bg: _BlockGraph, x: torch.Tensor) -> _ForwardPass:
    """Run the block once on ``x``, unit by unit; returns each unit's saved bytes and every node's value."""
    # One pass with every unit's saves attributed to the unit that saves first.
    skip = {t.untyped_storage().data_ptr() for t in bg.excluded}
    charged: dict[int, int] = {}
    act = [0] * len(bg.groups)
    env: dict[str, Any] = {bg.placeholder.name: x.detach().requires_grad_(True)}
    for gi, g in enumerate(bg.groups):

        def pack(t: torch.Tensor, gi: int = gi) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in skip and ptr not in charged:
                charged[ptr] = gi
                act[gi] += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run_nodes(bg.gm, g, env)
    values = {k: tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, v) for k, v in env.items()}
    return _ForwardPass(activation_bytes=act, values=values)


def _live_after(bg: _BlockGraph, gi: int, fwd: _ForwardPass) -> list[torch.Tensor]:
    """The tensors a cut right after unit ``gi`` must carry across."""
    # Live across a cut after this unit: values made at or before it and read after it (a later
    # size() or .shape reads only metadata: the block takes b and s from the LayerNorm output).
    # A node may return a tuple (Llama's apply_rope: q and k): its tensors cross with it.
    return [
        t
        for n in [bg.placeholder, *(m for gj in bg.groups[: gi + 1] for m in gj)]
        if any(u is bg.output or (bg.unit_of.get(u.name, len(bg.groups)) > gi and not _reads_only_metadata(u))
               for u in n.users)
        for t in tree_flatten(fwd.values.get(n.name))[0]
        if isinstance(t, torch.Tensor)
    ]


def _unit_record(
    bg: _BlockGraph, gi: int, fwd: _ForwardPass, prev_name: str | None, clock: Clock, warmup: int, repeats: int, seed: int
) -> LayerRecord:
    """Time unit ``gi`` alone on its recorded inputs and describe it as one record."""
    g = bg.groups[gi]
    members = {n.name for n in g}
    ext = sorted({a.name for n in g for a in n.all_input_nodes if a.name not in members}, key=lambda s: (s != bg.placeholder.name, s))
    outs = [n.name for n in g if any(u.name not in members for u in n.users)]

    # Inputs and outputs go to measure_unit flat: a tuple-valued node (apply_rope's (q, k)) is
    # its tensors, so their gradients flow and the unit's backward is timed and counted.
    flat_inputs, spec = tree_flatten([fwd.values[e] for e in ext])

    def unit(*inputs: Any) -> tuple[Any, ...]:
        local = dict(zip(ext, tree_unflatten(list(inputs), spec), strict=True))
        run_nodes(bg.gm, g, local)
        return tuple(t for t in tree_flatten([local[o] for o in outs])[0] if isinstance(t, torch.Tensor))

    mods = [bg.gm.get_submodule(str(n.target)) for n in g if n.op == "call_module"]
    # A parameter a function reads through get_attr (Llama's rms_norm(x, ln1.weight)) is the unit's too.
    read = [w for n in g if n.op == "get_attr" if isinstance(w := _fetch(bg.gm, str(n.target)), torch.nn.Parameter)]
    unit_params = list({id(p): p for p in [*(p for m in mods for p in m.parameters()), *read]}.values())
    cost = measure_unit(
        unit, flat_inputs, unit_params, clock,
        warmup=warmup, repeats=repeats, exclude_storages=bg.excluded, seed=seed + gi,
    )
    live = _live_after(bg, gi, fwd)
    producers = [bg.names[bg.unit_of[e]] if e in bg.unit_of else prev_name for e in ext]
    return LayerRecord(
        name=bg.names[gi],
        kind=_kind(bg.gm, g[-1]),
        forward_s=cost.forward_s,
        backward_input_s=cost.backward_input_s,
        backward_weight_s=cost.backward_weight_s,
        activation_bytes=fwd.activation_bytes[gi],
        output_bytes=tensor_bytes(live) if gi < len(bg.groups) - 1 else cost.output_bytes,
        param_count=sum(p.numel() for p in unit_params),
        forward_flops=cost.forward_flops,
        backward_flops=cost.backward_flops,
        inputs=sorted({p for p in producers if p}),
        stats=cost.stats,
    )


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
    bg = _trace_block(block, block_name, state)
    fwd = _attributed_pass(bg, x)
    return [_unit_record(bg, gi, fwd, prev_name, clock, warmup, repeats, seed) for gi in range(len(bg.groups))]
