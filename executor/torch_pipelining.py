"""The one place that touches torch.distributed.pipelining's private API.

Two private pieces are used, both checked against the torch versions this code was tested on:

* ``_PipelineScheduleRuntime`` and its ``_load_csv(path, format="compute_only")``: run an action
  table written in torch's compute-only CSV format (rows = pipeline ranks, cells ``0F0``,
  ``1I3``, ``1W3``, ``0B2``). The runtime lowers it to send/recv actions (``_add_send_recv``),
  adds FSDP unshard/reshard and the final ``REDUCE_GRAD``, and infers the stage placement from the
  table. This is how the executor runs any schedule the simulator timed (torchtitan exposes the
  same loader as ``pipeline_parallel_schedule_csv``).
* ``schedules._wait_batch_p2p``, the module-level helper every schedule (single-stage and runtime)
  calls to wait on point-to-point work. :func:`timed_p2p_waits` substitutes a timed version for
  the duration of a ``with`` block, which is how the time a rank spends blocked on pipeline
  communication is measured without changing torch.

* ``PipelineStage._forward_metadata_inference`` and ``_backward_metadata_inference``: on its first
  step a stage runs a real forward (with grad) to infer the shapes it sends, and keeps that graph
  until the backward's metadata inference. :func:`around_metadata_inference` runs a context
  around both, so memory accounting can leave this one-time work out (it is not training).

* ``PipelineStage.backward_state``: what a split backward's I keeps for W, per micro-batch
  (``(inputs, param_groups, outputs, output_grads)``). :func:`merge_weight_passes` merges its
  parameter groups into one, so that W takes one autograd pass instead of one per group.

One behaviour of the public ``PipelineStage`` is relied on as well, for per-layer timing: under a
split backward, a first stage's I does nothing and its W runs the whole backward
(:func:`weight_pass_runs_whole_backward`).

Tested with torch 2.13.0 (CPU/gloo). Other versions run if the private names exist, with a
warning; if they do not, the error says which name is missing.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch.distributed.pipelining import PipelineStage, schedules
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

TESTED_TORCH = ("2.13",)
_PRIVATE = ("_PipelineScheduleRuntime", "_wait_batch_p2p")


def check_torch_version() -> None:
    """Fail if the private names are gone; warn when this torch was not tested.

    Raises:
        RuntimeError: torch lacks one of the private names this module needs.
    """
    missing = [n for n in _PRIVATE if not hasattr(schedules, n)]
    if missing:
        raise RuntimeError(
            f"torch {torch.__version__} lacks torch.distributed.pipelining.schedules.{', '.join(missing)}; "
            f"the executor was tested with torch {', '.join(TESTED_TORCH)}"
        )
    if not any(torch.__version__.startswith(v) for v in TESTED_TORCH):
        warnings.warn(
            f"executor: torch {torch.__version__} is untested (tested: {', '.join(TESTED_TORCH)}); "
            "action-table loading uses private torch APIs",
            stacklevel=2,
        )


def named_schedule(class_name: str, stages: list[PipelineStage], n_microbatches: int,
                   loss_fn: Callable[..., torch.Tensor]) -> Any:
    """One of torch's schedule classes by name (``1F1B``, ``Interleaved1F1B``, ``ZBVZeroBubble`` …)."""
    cls = get_schedule_class(class_name)
    if issubclass(cls, PipelineScheduleSingle):
        if len(stages) != 1:
            raise ValueError(f"{class_name} runs one stage per rank, got {len(stages)}")
        return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
    return cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)


def table_schedule(csv_path: str | Path, stages: list[PipelineStage], n_microbatches: int,
                   loss_fn: Callable[..., torch.Tensor]) -> Any:
    """A runtime schedule that executes the compute-only action table in ``csv_path``."""
    check_torch_version()
    runtime = schedules._PipelineScheduleRuntime(stages, n_microbatches=n_microbatches, loss_fn=loss_fn,
                                                  scale_grads=True)
    runtime._load_csv(str(csv_path), format="compute_only")
    return runtime


def schedule_orders(schedule: Any) -> dict[int, list[str]]:
    """The compute actions per pipeline rank that ``schedule`` holds, as strings like ``2F0``."""
    order = getattr(schedule, "pipeline_order", None) or {}
    return {r: [str(a) for a in acts if a is not None] for r, acts in order.items()}


METADATA_INFERENCE = ("_forward_metadata_inference", "_backward_metadata_inference")


def around_metadata_inference(stage: PipelineStage, context: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
    """Run ``context()`` around the stage's metadata inference (module docstring), where torch has it."""
    for name in METADATA_INFERENCE:
        method = getattr(stage, name, None)
        if method is None:
            continue

        def wrapped(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
            with context():
                return _method(*args, **kwargs)

        setattr(stage, name, wrapped)


def weight_pass_runs_whole_backward(stage: PipelineStage) -> bool:
    """True when ``stage``'s W action runs its whole backward instead of weight gradients only.

    torch 2.13 (``PipelineStage.backward_one_chunk`` with ``full_backward=False``) skips the
    input-gradient pass of the first stage — its input, token ids, needs no gradient — and its
    ``backward_weight_one_chunk`` then runs ``autograd.backward`` over the whole stage. A stage
    built with a custom ``dw_builder`` runs the full backward in I instead (not used here).
    """
    return stage.stage_index == 0 and getattr(stage, "dw_builder", None) is None


def merge_weight_passes(stage: PipelineStage) -> None:
    """Make ``stage``'s W (split backward) take one autograd pass over all its parameters.

    torch's ``stage_backward_weight`` takes one ``autograd.grad`` pass per parameter group (a
    LayerNorm's or a Linear's weights: six per GPT block), and each pass is a new graph task, so
    a checkpointed (recomputed) block re-runs its forward once per group — six re-runs per block
    and micro-batch, each kept until W ends. One pass over the merged groups re-runs each
    recomputed block once, but walks the input-gradient path between the groups again (torch
    clamps each intermediate's gradient to the one I saved, so the results are the same bit for
    bit, ``tests/executor/test_one_weight_pass.py``, but the work is done). The executor merges
    where that pays (:func:`mindpipe.traces.layout.one_weight_pass`, which the simulator prices).
    """
    original = stage.backward_one_chunk

    def backward_one_chunk(bwd_chunk_id: int, loss: Any = None, full_backward: bool = True,
                           last_backward: bool = False) -> Any:
        out = original(bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward)
        state = stage.backward_state.get(bwd_chunk_id) if not full_backward else None
        if state is not None and mergeable(state[1]):
            stage.backward_state[bwd_chunk_id] = (state[0], [merged_param_group(state[1])], *state[2:])
        return out

    stage.backward_one_chunk = backward_one_chunk  # type: ignore[method-assign]


class ParamGroup(TypedDict, total=False):
    """One parameter group as torch's ``stage_backward_input`` returns it for W (``params``: the
    group's parameters, ``intermediates``: the autograd nodes W starts from, ``grads``: per
    intermediate, the gradient tuple I saved; absent when I saw none)."""

    params: Any
    intermediates: list[Any]
    grads: list[Any]


def mergeable(groups: list[ParamGroup] | None) -> bool:
    """True for two or more groups whose I saved a gradient tuple for every intermediate (torch's
    W would fail on any other, so those are left to it)."""
    return groups is not None and len(groups) > 1 and all(
        len(g.get("grads") or ()) == len(g["intermediates"]) and all(x is not None for x in g["grads"]) for g in groups)


def merged_param_group(groups: list[ParamGroup]) -> ParamGroup:
    """One parameter group holding every group's parameters, intermediates and saved gradients, in
    the groups' order."""
    return ParamGroup(params=[p for g in groups for p in g["params"]],
                      intermediates=[n for g in groups for n in g["intermediates"]],
                      grads=[t for g in groups for t in g["grads"]])


@contextlib.contextmanager
def timed_p2p_waits(on_wait: Callable[[Callable[[], None]], None]) -> Iterator[None]:
    """Route every pipeline p2p wait through ``on_wait(do_wait)`` while the block runs.

    ``on_wait`` receives a zero-argument function that performs the original wait; it times
    the call (host clock, or CUDA events on a GPU) and must call it exactly once.
    """
    check_torch_version()
    original = schedules._wait_batch_p2p

    def timed(work: list[Any]) -> None:
        if work:
            on_wait(lambda: original(work))

    schedules._wait_batch_p2p = timed
    try:
        yield
    finally:
        schedules._wait_batch_p2p = original


__all__ = ["TESTED_TORCH", "check_torch_version", "named_schedule", "schedule_orders", "table_schedule",
           "timed_p2p_waits", "weight_pass_runs_whole_backward"]
