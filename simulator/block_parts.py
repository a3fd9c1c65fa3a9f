"""The two parts of a transformer block that a stage boundary inside it separates.

A plan may cut a block after its attention sub-layer's residual add (``Plan.stage_cuts``; the
stage layout is :mod:`mindpipe.traces.layout`'s rule). The simulator then prices the block's
``attention`` part (ln1, QKV, attention core, projection, residual add) on one stage and its
``mlp`` part (ln2, fc1, GeLU, fc2, residual add) on the next. This module says which operators,
parameters, tensor-parallel collectives and trace units belong to each part:

* the hardware models' operators (:func:`mindpipe.simulator.ops.block_ops`) split after
  ``residual1``;
* Megatron's TP collectives come one per sub-layer per direction (Shoeybi et al. 2019, Fig. 4),
  so each part issues half;
* an operator-granularity trace (:mod:`mindpipe.traces.op_graph`) is summed unit by unit, the
  units up to and including :data:`mindpipe.traces.layout.CUT_UNITS`'s being the attention part;
  the bytes the cut sends are that unit's ``output_bytes`` (everything live after it: the
  residual stream), and the selective-recompute core is the units between the QKV and the
  projection linears.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from mindpipe.simulator.ops import Op
from mindpipe.traces.config import Model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import CUT_UNITS
from mindpipe.traces.trace import LayerRecord, Trace

Part = Literal["attention", "mlp"]
# The last operator of the attention part in :func:`mindpipe.simulator.ops.block_ops`.
ATTENTION_LAST_OP = "residual1"
# Units of a profiled block (``traces/op_graph.py`` names them after their last torch.fx node).
_UNIT = re.compile(r"^block\.(\d+)\.(.+)$")
T = TypeVar("T")


def split_ops(ops: Sequence[Op]) -> tuple[list[Op], list[Op]]:
    """(attention, mlp) operators of one block's :func:`~mindpipe.simulator.ops.block_ops`."""
    last = max(i for i, op in enumerate(ops) if op.name == ATTENTION_LAST_OP)
    return list(ops[: last + 1]), list(ops[last + 1:])


def split_halves(items: Sequence[T]) -> tuple[list[T], list[T]]:
    """A block's per-sub-layer list (its TP collectives) as (attention, mlp) halves."""
    half = len(items) // 2
    return list(items[:half]), list(items[half:])


def part_params(model: Model, tp: int) -> dict[Part, int]:
    """Parameters per TP rank of each part (their sum is a block's, :func:`~mindpipe.simulator.costs.layer_params`).

    Column- and row-parallel weights (and column-parallel biases) split over t; norms and
    row-parallel biases are replicated. GPT attention: ln1 (2h), QKV with its bias, projection
    and its replicated bias (h); MLP: ln2, fc1 with its bias, fc2 and its replicated bias. Llama
    (no biases): RMSNorm (h) replicated, Q, K, V and the output projection split; RMSNorm and
    SwiGLU's three matrices split. At t = 1 these are :meth:`Model.attention_param_count` and
    :meth:`Model.mlp_param_count`.
    """
    row_bias = 0 if model.is_llama else model.hidden_size
    replicated = model.norm_param_count() + row_bias
    return {
        "attention": (model.attention_param_count() - replicated) // tp + replicated,
        "mlp": (model.mlp_param_count() - replicated) // tp + replicated,
    }


@dataclass(frozen=True)
class UnitSums:
    """Summed times of some units of one profiled block (one micro-batch at the trace's shape)."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float

    @classmethod
    def of(cls, records: Sequence[LayerRecord]) -> UnitSums:
        """Sum of ``records``' forward, input-gradient and weight-gradient times."""
        return cls(sum(r.forward_s for r in records), sum(r.backward_input_s for r in records),
                   sum(r.backward_weight_s for r in records))


@dataclass(frozen=True)
class OpBlock:
    """One block of an operator-granularity trace, summed as a whole and per part.

    Attributes:
        whole: All its units.
        attention, mlp: Its units up to and including the cut unit, and the rest.
        core_forward_s: Forward time of the attention core (units between QKV and projection).
        cut_bytes: ``output_bytes`` of the cut unit: what a boundary after the attention part sends.
    """

    whole: UnitSums
    attention: UnitSums
    mlp: UnitSums
    core_forward_s: float
    cut_bytes: int


def op_blocks(trace: Trace, source: str) -> list[OpBlock]:
    """The blocks of an operator-granularity trace in block order (units grouped by ``block.i.``).

    Raises:
        ContractError: no block units, or a block without the cut unit (:data:`CUT_UNITS`).
    """
    units: dict[int, list[tuple[str, LayerRecord]]] = {}
    for r in trace.layers:
        m = _UNIT.match(r.name)
        if m:
            units.setdefault(int(m.group(1)), []).append((m.group(2), r))
    if not units:
        raise ContractError(source, "layers", "the operator trace has no block units (block.<i>.<unit>)")
    cut = CUT_UNITS["after_attention"]
    out = []
    for i in sorted(units):
        names = [n for n, _ in units[i]]
        recs = [r for _, r in units[i]]
        if cut not in names:
            raise ContractError(source, "layers", f"block.{i} has no unit {cut!r} (the residual add a cut follows)")
        k = names.index(cut)
        # The last input projection: GPT's fused ``qkv``, Llama's ``wv`` (traces/torch_llama.py).
        qkv = next((j for j, n in reversed(list(enumerate(names))) if n.endswith(("qkv", "wv"))), None)
        proj = next((j for j, n in enumerate(names) if n.endswith("proj")), None)
        core = recs[qkv + 1:proj] if qkv is not None and proj is not None else []
        out.append(OpBlock(UnitSums.of(recs), UnitSums.of(recs[: k + 1]), UnitSums.of(recs[k + 1:]),
                           sum(r.forward_s for r in core), recs[k].output_bytes or 0))
    return out


__all__ = ["ATTENTION_LAST_OP", "OpBlock", "Part", "UnitSums", "op_blocks", "part_params", "split_halves", "split_ops"]
