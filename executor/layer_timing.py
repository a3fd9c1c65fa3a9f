"""Per-layer timing inside the compute actions: where an F, B, I or W action's time went.

A pipeline stage runs as whole actions (:mod:`mindpipe.executor.measure` times them); this module
cuts each action into consecutive per-layer segments at marks the layers themselves leave, so the
segments of an action add up to the action's time exactly and nothing comes from a cost model:

* **Forward (F).** A forward hook on every pipeline layer of the stage (embedding, each block,
  ``final_norm``, ``lm_head``; :meth:`mindpipe.executor.stages.StageModule.layers`) marks the
  moment the layer returned. Layer *j* runs from the previous layer's mark (the action's start
  for the first layer) to its own (the action's end for the last layer, which so also carries
  what the stage does after its layers).
* **Backward (B, I).** In the same forward hook, an autograd hook is put on the layer's output
  tensor: it fires when that output's gradient is ready. Layer *j*'s backward runs from the
  moment its output gradient is ready until its input gradient is — the previous layer's output
  hook; the stage's first layer ends at the action's end and its last layer starts at the
  action's start (on the last stage that includes the loss's backward, which the profiler also
  counts with the head). I actions (input gradient only, zero-bubble schedules) are cut the same
  way: autograd runs the same per-layer hooks when only input gradients are asked for.
* **Weight gradients (W).** During a W action, a hook on each of the stage's parameters fires
  as that parameter's gradient is produced (torch computes them with ``autograd.grad`` towards
  the parameters, which runs the parameters' tensor hooks). Layer *j*'s W runs from the moment
  the layer before it in completion order had all its gradients (the action's start for the
  first) until its own last parameter gradient is (the action's end for the last).
* A first stage's W under a split backward is not a weight-only pass: torch 2.13 skips that
  stage's I (its input needs no gradient) and runs the whole backward in W
  (:func:`mindpipe.executor.torch_pipelining.weight_pass_runs_whole_backward`). Its W is cut like
  a B and recorded as a whole backward, never split by guess; the report says so.

An action whose marks are incomplete (a hook did not fire) yields no layer segments rather than
made-up ones. Hooks fire only inside an open action of their own stage (and micro-batch), so
forward passes that torch runs outside the actions (shape inference) and the recompute forward
of checkpointed blocks (which calls the block's ``forward``, not the module) leave no marks.
On CUDA a mark is an event recorded on the current stream (the autograd engine runs hooks on the
stream of the node), resolved at the end of the step like the actions' own marks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from mindpipe.executor.payload import ActionKind, LayerInfo, LayerPhase
from torch import nn
from torch.distributed.tensor import DTensor

Mark = Any  # float seconds (CPU) or torch.cuda.Event
MarkSource = Literal["forward", "output_grad", "param_grad"]
Segment = tuple[str, LayerPhase, Mark, Mark]  # layer name, phase, start mark, end mark


@dataclass
class _Open:
    """The action being timed and the layer marks it collected (layer index, mark; firing order)."""

    stage: int
    microbatch: int
    phase: LayerPhase
    source: MarkSource
    marks: list[tuple[int, Mark]] = field(default_factory=list)
    handles: list[Any] = field(default_factory=list)


def tp_param_count(module: nn.Module) -> int:
    """Parameters of ``module`` per tensor-parallel rank, counted on its tensors.

    A DTensor parameter sharded over the mesh's ``tp`` axis holds 1/tp of its global elements
    per TP rank (the plan checks guarantee the sharded dimensions divide); data-parallel
    sharding (FSDP2) is not a TP split and is not divided out.
    """
    total = 0
    for p in module.parameters():
        if isinstance(p, DTensor):
            names = p.device_mesh.mesh_dim_names or ()
            shards = 1
            for name, placement, size in zip(names, p.placements, p.device_mesh.shape, strict=True):
                if name == "tp" and placement.is_shard():
                    shards *= size
            total += p.numel() // shards
        else:
            total += p.numel()
    return total


def _nbytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def forward_segments(n: int, marks: dict[int, Mark], t0: Mark, t1: Mark) -> list[tuple[int, Mark, Mark]] | None:
    """Layer *j* of ``n`` from mark *j−1* (``t0`` for the first) to mark *j* (``t1`` for the last)."""
    if any(j not in marks for j in range(n - 1)):
        return None
    bounds = [t0, *(marks[j] for j in range(n - 1)), t1]
    return [(j, bounds[j], bounds[j + 1]) for j in range(n)]


def backward_segments(n: int, marks: dict[int, Mark], t0: Mark, t1: Mark) -> list[tuple[int, Mark, Mark]] | None:
    """Layer *j* from its output-gradient mark (``t0`` for the last layer) to layer *j−1*'s (``t1`` for the first)."""
    if any(j not in marks for j in range(n - 1)):
        return None
    return [(j, t0 if j == n - 1 else marks[j], t1 if j == 0 else marks[j - 1]) for j in range(n)]


def completion_segments(marks: list[tuple[int, Mark]], t0: Mark, t1: Mark) -> list[tuple[int, Mark, Mark]]:
    """Consecutive segments in the order the layers finished (a layer's last mark); the last ends at ``t1``."""
    last: dict[int, int] = {}
    for pos, (j, _) in enumerate(marks):
        last[j] = pos
    order = sorted(last, key=last.__getitem__)
    out: list[tuple[int, Mark, Mark]] = []
    start = t0
    for k, j in enumerate(order):
        end = t1 if k == len(order) - 1 else marks[last[j]][1]
        out.append((j, start, end))
        start = end
    return out


class LayerTimer:
    """Marks of the pipeline layers of one rank's stages (see module docstring).

    Args:
        now: The recorder's clock (host seconds, or a recorded CUDA event).
    """

    def __init__(self, now: Callable[[], Mark]) -> None:
        self.now = now
        self.layers: dict[int, list[tuple[str, str, nn.Module]]] = {}
        self.output_bytes: dict[str, int] = {}
        self._params: dict[str, int] = {}
        self._open: _Open | None = None

    def install(self, stage: int, layers: list[tuple[str, str, nn.Module]]) -> None:
        """Hook the ``(name, kind, module)`` layers of virtual stage ``stage``, in forward order."""
        self.layers[stage] = list(layers)
        for j, (name, _kind, module) in enumerate(layers):
            self._params[name] = tp_param_count(module)
            module.register_forward_hook(self._after_forward(stage, j, name))

    def infos(self) -> list[LayerInfo]:
        """Every hooked layer with its parameters per TP rank and its measured output size."""
        return [LayerInfo(s, j, name, kind, self._params[name], self.output_bytes.get(name))
                for s, layers in sorted(self.layers.items()) for j, (name, kind, _) in enumerate(layers)]

    # -- actions -----------------------------------------------------------------------------
    def begin(self, stage: int, microbatch: int, kind: ActionKind, whole_backward: bool = False) -> None:
        """Open an action; ``whole_backward``: a W that runs the stage's whole backward."""
        if stage not in self.layers:
            self._open = None
            return
        if kind == "F":
            self._open = _Open(stage, microbatch, "forward", "forward")
        elif kind == "B" or (kind == "W" and whole_backward):
            self._open = _Open(stage, microbatch, "backward", "output_grad")
        elif kind == "I":
            self._open = _Open(stage, microbatch, "backward_input", "output_grad")
        else:
            self._open = _Open(stage, microbatch, "backward_weight", "param_grad")
            for j, (_name, _kind, module) in enumerate(self.layers[stage]):
                for p in module.parameters():
                    if p.requires_grad:
                        self._open.handles.append(p.register_hook(self._on_grad(stage, microbatch, j, "param_grad")))

    def end(self, t0: Mark, t1: Mark) -> list[Segment]:
        """Close the open action that ran from ``t0`` to ``t1``; its per-layer segments (may be empty)."""
        a, self._open = self._open, None
        if a is None:
            return []
        for h in a.handles:
            h.remove()
        layers = self.layers[a.stage]
        if a.source == "param_grad":
            segs: list[tuple[int, Mark, Mark]] | None = completion_segments(a.marks, t0, t1) if a.marks else None
        else:
            first: dict[int, Mark] = {}
            for j, mark in a.marks:
                first.setdefault(j, mark)
            cut = forward_segments if a.source == "forward" else backward_segments
            segs = cut(len(layers), first, t0, t1)
        return [(layers[j][0], a.phase, s, e) for j, s, e in segs or ()]

    # -- hooks -------------------------------------------------------------------------------
    def _mark(self, stage: int, microbatch: int | None, j: int, source: MarkSource) -> None:
        a = self._open
        if a is not None and a.stage == stage and a.source == source and microbatch in (None, a.microbatch):
            a.marks.append((j, self.now()))

    def _on_grad(self, stage: int, microbatch: int, j: int, source: MarkSource) -> Callable[[Any], None]:
        def hook(_grad: Any) -> None:
            self._mark(stage, microbatch, j, source)

        return hook

    def _after_forward(self, stage: int, j: int, name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            a = self._open
            if a is None or a.stage != stage or a.source != "forward":
                return
            self._mark(stage, None, j, "forward")
            if isinstance(output, torch.Tensor):
                if name not in self.output_bytes:
                    self.output_bytes[name] = _nbytes(output)
                if output.requires_grad:
                    output.register_hook(self._on_grad(stage, a.microbatch, j, "output_grad"))

        return hook


__all__ = ["LayerTimer", "backward_segments", "completion_segments", "forward_segments", "tp_param_count"]
