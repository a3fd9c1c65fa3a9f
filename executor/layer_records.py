"""The measured trace's per-layer records: medians of the layer segments the ranks timed.

Every compute action was cut into per-layer segments as it ran
(:mod:`mindpipe.executor.layer_timing`). A layer's record is the median of its segments over the
measured steps, the micro-batches and the data/tensor-parallel replicas, phase by phase — no cost
model is involved. Parameters and output bytes are counted on the rank's own tensors.

What cannot be split is not split by guess: under a split backward torch runs the first stage's
whole backward in its W actions, so that stage's layers keep their whole backward in
``backward_input_s`` with ``backward_weight_s`` 0 (the trace contract's convention for a backward
that was not split), and the provenance notes name them. The LM head fused into the loss
(``fused_head_loss``) takes its weight gradient in the loss's backward, in I: its W is 0 by
construction, not untimed. Any other layer with no segment of a phase (a hook that never fired)
gets 0 there and is named in the notes too; ``stats`` gives the sample count and inter-quartile
range of each phase.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from mindpipe.executor.payload import LayerInfo, LayerPhase, RankPayload
from mindpipe.traces.timing import median_iqr
from mindpipe.traces.trace import LayerRecord

LAYER_TIMES = ("per-layer medians over measured steps, micro-batches and replicas of segments timed inside each "
               "action: forward between the layers' forward hooks, backward between their output-gradient hooks, "
               "weight gradient between their parameter-gradient hooks (executor.layer_timing)")


@dataclass
class LayerTable:
    """Per-layer records in model order, and how they were obtained.

    Attributes:
        records: One record per pipeline layer.
        split: True when weight gradients were timed apart from input gradients (W actions).
        notes: Provenance remarks (layers whose backward was not split, phases never timed).
    """

    records: list[LayerRecord]
    split: bool
    notes: list[str]


def _samples(payloads: list[RankPayload]) -> dict[str, dict[LayerPhase, list[float]]]:
    out: dict[str, dict[LayerPhase, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in payloads:
        for s in p.spans.layers:
            if s.step >= p.first_measured:
                out[s.layer][s.phase].append(s.end_s - s.start_s)
    return out


def _layers(payloads: list[RankPayload]) -> list[LayerInfo]:
    """Every pipeline layer once (the lowest rank's view of it), in model order."""
    seen: dict[str, LayerInfo] = {}
    for p in sorted(payloads, key=lambda p: p.rank):
        for info in p.layers:
            seen.setdefault(info.name, info)
    return sorted(seen.values(), key=lambda i: (i.stage, i.index))


def _median(name: str, phase: str, values: list[float] | None, stats: dict[str, float],
            untimed: dict[str, list[str]]) -> float:
    """Median of a phase's segments, with its count and IQR in ``stats``; None: nothing to time."""
    if values is None:
        return 0.0
    stats[f"{phase}_samples"] = float(len(values))
    if not values:
        untimed[phase].append(name)
        return 0.0
    median, stats[f"{phase}_s_iqr"] = median_iqr(values)
    return median


def layer_table(payloads: list[RankPayload], fused_head: bool = False) -> LayerTable:
    """The per-layer records of a run from every rank's payload (see module docstring);
    ``fused_head``: the plan's ``fused_head_loss``."""
    samples = _samples(payloads)
    split = any(got.get("backward_weight") for got in samples.values())
    records: list[LayerRecord] = []
    whole: list[str] = []
    untimed: dict[str, list[str]] = defaultdict(list)
    for info in _layers(payloads):
        got = samples.get(info.name, {})
        bi: list[float] | None = got.get("backward_input", [])
        bw: list[float] | None = got.get("backward_weight", []) if split else None
        if got.get("backward") and not (bi and bw):  # a whole backward: a B, or a first stage's W
            bi, bw = got["backward"], None
            whole += [info.name] if split else []
        elif fused_head and info.kind == "lm_head":
            bw = None  # its weight gradient is part of its I (the fused loss's one backward pass)
        stats: dict[str, float] = {}
        records.append(LayerRecord(
            name=info.name, kind=info.kind, forward_s=_median(info.name, "forward", got.get("forward", []), stats, untimed),
            backward_input_s=_median(info.name, "backward_input", bi, stats, untimed),
            backward_weight_s=_median(info.name, "backward_weight", bw, stats, untimed),
            output_bytes=0 if info.kind == "lm_head" else info.output_bytes, param_count=info.param_count, stats=stats,
        ))
    notes = []
    if whole:
        notes.append(f"{', '.join(whole)}: torch runs the first stage's whole backward in its W actions (its I does "
                     "nothing), so backward_input_s holds their whole backward and backward_weight_s is 0 (not split)")
    for phase, names in untimed.items():
        notes.append(f"{phase} of {', '.join(names)} was not timed per layer (recorded as 0; the stage's actions "
                     "hold its measured total)")
    return LayerTable(records, split, notes)


__all__ = ["LAYER_TIMES", "LayerTable", "layer_table"]
