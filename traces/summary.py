"""Human- and machine-readable summaries of a trace (``mindpipe inspect``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mindpipe.traces.trace import Trace
from mindpipe.traces.units import plural


@dataclass
class KindTotals:
    """Records of one layer kind: how many, and their summed times and saved activations."""

    count: int = 0
    forward_s: float = 0.0
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    activation_bytes: int = 0


@dataclass(frozen=True)
class TraceSummary:
    """Totals of a trace by layer kind and overall, with what it was taken at (``inspect --json``).

    ``step_forward_backward_s`` and ``layer_sum_over_step`` (per-layer sum ÷ the whole step timed
    separately) are None when the trace has no step cross-check.
    """

    model: str | None
    device: str
    dtype: str
    micro_batch_size: int | None
    seq_len: int | None
    tp: int
    granularity: str
    backward_split: str
    num_records: int
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    forward_backward_s: float
    activation_bytes: int | None  # None when no record says (an imported or measured trace)
    param_count: int | None  # None when no record says (an imported trace)
    forward_flops: float | None
    by_kind: dict[str, KindTotals]
    provenance: dict[str, str | None] = field(default_factory=dict)
    step_forward_backward_s: float | None = None
    layer_sum_over_step: float | None = None
    mean_subnet_forward_backward_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``--json`` (the step keys only when the trace has a step cross-check, the
        mean subnet only for a per-candidate trace that records its supernet)."""
        out = asdict(self)
        if self.layer_sum_over_step is None:
            del out["step_forward_backward_s"], out["layer_sum_over_step"]
        if self.mean_subnet_forward_backward_s is None:
            del out["mean_subnet_forward_backward_s"]
        return out


def _said(trace: Trace, key: str) -> bool:
    """True when some record says ``key`` (imported and measured traces leave it unset)."""
    return any(getattr(r, key) is not None for r in trace.layers)


def _known_int(trace: Trace, key: str) -> int | None:
    """The records' total of ``key``, or None when no record says it (not 0: unknown is not none)."""
    return int(trace.total(key)) if _said(trace, key) else None


def mean_subnet_seconds(trace: Trace) -> float | None:
    """Forward + backward seconds of a mean subnet of a per-candidate trace's supernet, or None.

    A per-candidate trace records every candidate once, so its records' sum is no step of any
    subnet; a subnet runs the embedding, one candidate per choice layer and the head. Under the
    uniform sampler, its expected time is the embedding, plus each layer's mean over the
    candidates it may choose (:meth:`~mindpipe.traces.supernet.Supernet.layer_choices`), plus the head.
    """
    net = trace.supernet
    if trace.granularity != "candidate" or net is None:
        return None
    rec = {r.name: r.forward_s + r.backward_input_s + r.backward_weight_s for r in trace.layers}
    names = [f"candidate.{c.name}" for c in net.candidates]
    if any(n not in rec for n in ("embedding", "head", *names)):
        return None
    per_layer = (sum(rec[names[k]] for k in net.layer_choices(layer)) / len(net.layer_choices(layer))
                 for layer in range(net.num_layers))
    return rec["embedding"] + sum(per_layer) + rec["head"]


def summarize(trace: Trace) -> TraceSummary:
    """Totals by layer kind and for the whole trace, plus the step cross-check if present."""
    kinds: dict[str, KindTotals] = {}
    for r in trace.layers:
        k = kinds.setdefault(r.kind, KindTotals())
        k.count += 1
        k.forward_s += r.forward_s
        k.backward_input_s += r.backward_input_s
        k.backward_weight_s += r.backward_weight_s
        k.activation_bytes += r.activation_bytes or 0
    step = trace.step if trace.step is not None and trace.step.forward_backward_s > 0 else None
    return TraceSummary(
        model=trace.model.label if trace.model else trace.model_name, device=trace.device, dtype=trace.dtype,
        micro_batch_size=trace.micro_batch_size, seq_len=trace.seq_len, tp=trace.tp, granularity=trace.granularity,
        backward_split=trace.backward_split, num_records=len(trace.layers), forward_s=trace.total("forward_s"),
        backward_input_s=trace.total("backward_input_s"), backward_weight_s=trace.total("backward_weight_s"),
        forward_backward_s=trace.forward_backward_s,
        activation_bytes=_known_int(trace, "activation_bytes"), param_count=_known_int(trace, "param_count"),
        forward_flops=trace.total("forward_flops") if _said(trace, "forward_flops") else None, by_kind=kinds,
        provenance={"tool": trace.provenance.tool, "date": trace.provenance.date,
                    "torch_version": trace.provenance.torch_version},
        step_forward_backward_s=step.forward_backward_s if step is not None else None,
        layer_sum_over_step=trace.forward_backward_s / step.forward_backward_s if step is not None else None,
        mean_subnet_forward_backward_s=mean_subnet_seconds(trace),
    )


def _fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:8.3f} s "
    if seconds >= 1e-3:
        return f"{seconds * 1e3:8.3f} ms"
    return f"{seconds * 1e6:8.1f} us"


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:8.2f} {unit}"
    return f"{n:8.0f} B  "


def _known(value: object, missing: str = "unknown") -> str:
    """``value`` as printed, or ``missing`` where the trace does not say (an imported or measured trace)."""
    return missing if value is None else str(value)


def _total_activations(trace: Trace, total: int | None) -> str:
    """The saved-activation total: unknown when no record knows its own, marked when only some do."""
    if total is None:
        return "     unknown"
    known = sum(r.activation_bytes is not None for r in trace.layers)
    return _fmt_bytes(total) + (" + unknown" if known < len(trace.layers) else "")


def format_summary(trace: Trace, max_rows: int = 24) -> str:
    """A table of the trace's layers (first ``max_rows``) and its totals."""
    s = summarize(trace)
    lines = [
        f"trace: {_known(s.model, 'unknown model')} on {s.device} ({s.dtype}), "
        f"micro-batch {_known(s.micro_batch_size)}, seq {_known(s.seq_len)}, tp {s.tp}, "
        f"{plural(s.num_records, f'{s.granularity} record')} "
        f"[{_known(trace.provenance.tool)}, {_known(trace.provenance.date)}]",
        f"{'layer':28s} {'kind':14s} {'forward':>11s} {'bwd input':>11s} {'bwd weight':>11s} {'activations':>12s}",
    ]
    for r in trace.layers[:max_rows]:
        act = _fmt_bytes(r.activation_bytes) if r.activation_bytes is not None else "     unknown"
        lines.append(
            f"{r.name[:28]:28s} {r.kind[:14]:14s} {_fmt_s(r.forward_s)} {_fmt_s(r.backward_input_s)} "
            f"{_fmt_s(r.backward_weight_s)} {act}"
        )
    if len(trace.layers) > max_rows:
        lines.append(f"... {plural(len(trace.layers) - max_rows, 'more record')}")
    lines.append(
        f"{'total':43s} {_fmt_s(s.forward_s)} {_fmt_s(s.backward_input_s)} {_fmt_s(s.backward_weight_s)} "
        f"{_total_activations(trace, s.activation_bytes)}"
    )
    if s.granularity == "candidate":
        lines.append(f"sum of the records (every candidate once, no subnet's step): "
                     f"{_fmt_s(s.forward_backward_s).strip()}")
        if s.mean_subnet_forward_backward_s is not None and trace.supernet is not None:
            lines.append(f"a mean subnet (embedding, one candidate in each of {trace.supernet.num_layers} layers, "
                         f"head): {_fmt_s(s.mean_subnet_forward_backward_s).strip()} forward+backward")
    else:
        lines.append(f"sum of per-layer forward+backward: {_fmt_s(s.forward_backward_s).strip()}")
    if s.layer_sum_over_step is not None and s.step_forward_backward_s is not None:
        lines.append(
            f"whole step measured separately:    {_fmt_s(s.step_forward_backward_s).strip()} "
            f"(per-layer sum / step = {s.layer_sum_over_step:.3f})"
        )
        if not 0.5 <= s.layer_sum_over_step <= 2.0:  # a profile on a quiet machine gives 0.9-1.1
            lines.append("note: the per-layer sum is far from the whole step: the machine was busy while it was "
                         "profiled (see the records' stats) or the records were edited; judge the times with care")
    return "\n".join(lines)
