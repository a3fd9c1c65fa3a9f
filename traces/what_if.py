"""What-if knobs: plan keys only the simulator models, each with the one value the executor runs.

DESIGN.md "searched means runnable": the tuner's default space pins every knob at the executor's
value (:mod:`mindpipe.tuner.keys`), the executor runs a plan that sets one at that value and says
so (:func:`mindpipe.executor.precheck.what_if_notes`), and every output marks a plan that uses one.
The plan keys themselves are :class:`mindpipe.traces.config.Plan`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mindpipe.traces.config import Plan

# Why the executor runs no other value: executor.precheck.what_if_notes. ``tune --what-if`` searches
# the first four. ``blocking_p2p=true`` (Megatron-LM's blocking pipeline sends) only ever costs
# time, ``fused_elementwise=true`` (Transformer Engine's fused Llama norm/rotary/SwiGLU kernels)
# only ever saves it, and ``dp_impl=megatron`` (Megatron-LM's data parallelism instead of the
# executor's FSDP2) plans for another framework, so ``--what-if all`` leaves these three out: the
# validations of Megatron's and NeMo's published runs set them, and ``tune --what-if KEY --fix
# KEY=VALUE`` pins them (tuner.keys).
SEARCHED_WHAT_IF_KEYS: dict[str, Any] = {"comm_priority": "fair", "overlap_grad_reduce": False,
                                         "tp_comm_overlap": False, "overlap_param_gather": False}
WHAT_IF_KEYS: dict[str, Any] = {**SEARCHED_WHAT_IF_KEYS, "blocking_p2p": False, "fused_elementwise": False,
                                "dp_impl": "fsdp2"}


def what_if_used(plan: Plan | Mapping[str, Any]) -> list[str]:
    """The what-if knobs a plan (or a point of plan keys) sets to a value the executor does not carry out."""
    # A point may leave a knob out (one the tuner never searches): that is the executor's value.
    get = (lambda k: plan.get(k, WHAT_IF_KEYS[k])) if isinstance(plan, Mapping) else lambda k: getattr(plan, k)
    return [k for k, run in WHAT_IF_KEYS.items() if get(k) != run]


def plan_value(value: Any) -> str:
    """A plan value as the command line and the plan files write it (``fair``, ``false``, ``[4, 4]``)."""
    return value if isinstance(value, str) else json.dumps(value)


__all__ = ["SEARCHED_WHAT_IF_KEYS", "WHAT_IF_KEYS", "plan_value", "what_if_used"]
