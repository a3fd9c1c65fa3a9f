"""What a supernet's parts cost: every candidate operator, the shared parts, a stage of a subnet.

A subnet is priced from its choices (NASPipe, ASPLOS'22; BACKGROUND.md §5): stage s of subnet b
costs the sum of its chosen candidates on s, plus the embedding on the first stage and the final
norm + LM head + loss on the last. Two sources give the same :class:`SupernetCosts`:

* :func:`hardware_costs` — the simulator's kernel models (:mod:`mindpipe.simulator.perf` on GPUs,
  the roofline or a calibration on CPUs) price each candidate's operators
  (:func:`candidate_ops`). ``attention`` and ``ffn`` candidates are the attention and MLP parts of
  a GPT block (:func:`~mindpipe.simulator.block_parts.split_ops`: pre-norm, the op, the residual
  add), so they are priced exactly as GPT layers are. A causal 1-D convolution over the sequence
  is priced as what cuDNN runs for it:

  - ``standard`` (h→h, width k): an implicit GEMM ``[b·s, k·h] × [k·h, h]`` (Chetlur et al.,
    "cuDNN", 2014, §3: convolution lowered to matrix multiplication; implicit lowering does not
    materialise the unfolded input, so no extra traffic is charged);
  - ``separable``: a depthwise convolution — k multiply-adds per element, each input read once
    from cache, so memory-bound element-wise work (2·k FLOPs and read + write per element; its
    weight gradient a reduction over the tokens) — then a pointwise h×h GEMM (Chollet, "Xception",
    CVPR'17; Kaiser et al., "Depthwise separable convolutions for NMT", ICLR'18);
  - ``lightweight`` (Wu et al., ICLR'19): a depthwise convolution whose kernels are shared by
    channel groups and softmax-normalised over k (a negligible k-wide softmax), so priced as the
    depthwise part alone.

* :func:`trace_costs` — a profiled per-candidate trace (``mindpipe profile SUPERNET``:
  ``granularity="candidate"``, records ``embedding``, ``candidate.<name>`` and ``head``) at the
  trace's micro-batch size; times and bytes scale linearly to the plan's.

Parameters always come from the contract (:meth:`~mindpipe.traces.supernet.Candidate.param_count`,
:meth:`~mindpipe.traces.supernet.Supernet.shared_param_count`). Frozen shared parts
(``train_shared=false``) have no weight gradient, and the embedding then no backward at all.
Units: seconds and bytes for one micro-batch (one subnet) on one device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mindpipe.simulator.block_parts import split_ops
from mindpipe.simulator.calibrate.models import CalibratedComputeModel
from mindpipe.simulator.costs import DTYPE_BYTES, ComputeModel, RooflineComputeModel, boundary_bytes, roofline_time
from mindpipe.simulator.memory import activation_bytes_per_layer, embedding_activation_bytes, head_activation_bytes
from mindpipe.simulator.ops import Op, block_ops, embedding_ops, final_norm_ops, gemm_ops, lm_head_ops, memory_ops
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Candidate, Choices, Supernet
from mindpipe.traces.trace import Trace

Pricer = Callable[[Sequence[Op]], tuple[float, float, float]]
"""``price(ops)``: (forward, input-gradient, weight-gradient) seconds of a list of operators."""


@dataclass(frozen=True)
class PartCost:
    """Cost of one part of a subnet (a candidate, a shared part, a whole stage) for one micro-batch.

    Attributes:
        forward_s: Forward compute.
        backward_input_s: Input-gradient compute.
        backward_weight_s: Weight-gradient compute.
        activation_bytes: Bytes saved for the backward.
        output_bytes: Bytes the part's output sends across a stage boundary.
        param_count: Parameters.
        trained_params: Parameters that get gradients and optimizer state (0 for frozen parts).
    """

    forward_s: float = 0.0
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    activation_bytes: float = 0.0
    output_bytes: float = 0.0
    param_count: int = 0
    trained_params: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ContractError("", f.name, f"{f.name}={getattr(self, f.name)!r} must be >= 0")

    @property
    def backward_s(self) -> float:
        """Whole backward: input + weight gradient."""
        return self.backward_input_s + self.backward_weight_s

    def plus(self, other: PartCost) -> PartCost:
        """Sum of two parts run one after the other (the output is the later part's)."""
        return PartCost(self.forward_s + other.forward_s, self.backward_input_s + other.backward_input_s,
                        self.backward_weight_s + other.backward_weight_s,
                        self.activation_bytes + other.activation_bytes, other.output_bytes,
                        self.param_count + other.param_count, self.trained_params + other.trained_params)


@dataclass(frozen=True)
class SupernetCosts:
    """Per-candidate and shared-part costs of a supernet under one plan's micro-batch and precision.

    Attributes:
        supernet: The supernet.
        candidates: Cost of each pool candidate in one layer (same order as ``supernet.candidates``).
        embedding: Token + position embedding (first stage).
        head: Final norm, LM head and loss (last stage).
        source: ``gpu-model``, ``roofline``, ``calibrated``, ``trace`` or ``calibrated trace``.
    """

    supernet: Supernet
    candidates: tuple[PartCost, ...]
    embedding: PartCost
    head: PartCost
    source: str

    def __post_init__(self) -> None:
        if len(self.candidates) != self.supernet.num_choices:
            raise ContractError("", "candidates", f"{len(self.candidates)} candidate costs for "
                                f"{self.supernet.num_choices} candidates")

    def stage(self, choices: Choices, first_layer: int, num_layers: int, first: bool, last: bool) -> PartCost:
        """Cost of one stage of subnet ``choices``: its chosen candidates in layers
        ``[first_layer, first_layer + num_layers)``, the embedding if ``first``, the head if ``last``."""
        out = self.embedding if first else PartCost()
        for layer in range(first_layer, first_layer + num_layers):
            out = out.plus(self.candidates[choices[layer]])
        return out.plus(self.head) if last else out

    def stage_params(self, first_layer: int, num_layers: int, first: bool, last: bool) -> tuple[int, int]:
        """(shared, every candidate's) parameters a stage holds when it keeps its whole slice of the supernet."""
        shared = (self.embedding.param_count if first else 0) + (self.head.param_count if last else 0)
        net = self.supernet
        return shared, sum(self.candidates[k].param_count for layer in range(first_layer, first_layer + num_layers)
                           for k in net.layer_choices(layer))


# -- operators of a candidate --------------------------------------------------------------------


def _gpt_view(net: Supernet, num_heads: int, ffn_hidden_size: int) -> Model:
    """A one-block GPT of the supernet's width whose attention or MLP part is a candidate."""
    return Model(kind="gpt", num_layers=1, hidden_size=net.hidden_size, num_heads=num_heads, seq_len=net.seq_len,
                 vocab_size=net.vocab_size, ffn_hidden_size=ffn_hidden_size)


def _conv_ops(c: Candidate, tokens: int, h: int, d: int) -> list[Op]:
    """Operators of a conv candidate's op (module docstring): implicit GEMM, depthwise, pointwise."""
    k = c.kernel_size or 1
    if c.conv_kind == "standard":
        return gemm_ops("conv", tokens, h, k * h, d)
    elems = float(tokens * h)
    depthwise = [
        Op("depthwise", "forward", "memory", 2.0 * k * elems, 2 * d * elems, out_bytes=d * elems),
        Op("depthwise", "backward_input", "memory", 2.0 * k * elems, 2 * d * elems, out_bytes=d * elems),
        # dW: reduce input × output-gradient over the tokens (reads both, writes k·h or k·heads).
        Op("depthwise_dw", "backward_weight", "memory", 2.0 * k * elems, 2 * d * elems),
    ]
    return depthwise if c.conv_kind == "lightweight" else depthwise + gemm_ops("pointwise", tokens, h, h, d)


def candidate_ops(net: Supernet, c: Candidate, plan: Plan) -> list[Op]:
    """Operators of one candidate (its pre-norm, the op, the residual add) for one micro-batch.

    An attention candidate's core is the fused kernel: the executor's supernet attention is
    ``scaled_dot_product_attention`` (:mod:`mindpipe.traces.torch_supernet`) whatever the plan's
    ``flash_attention`` says.
    """
    b, s, h, d = plan.micro_batch_size, net.seq_len, net.hidden_size, DTYPE_BYTES[plan.precision]
    if c.op == "attention":
        return split_ops(block_ops(_gpt_view(net, c.num_heads or 1, 4 * h), b, s, 1, False, d,
                                   flash_attention=True))[0]
    if c.op == "ffn":
        return split_ops(block_ops(_gpt_view(net, 1, c.ffn_hidden_size or 1), b, s, 1, False, d))[1]
    tokens = b * s
    return memory_ops("conv_norm", tokens * h, 1, 1, d) + _conv_ops(c, tokens, h, d) + memory_ops(
        "conv_residual", tokens * h, 2, 1, d, bwd_factor=1.0)


def candidate_activation_bytes(net: Supernet, c: Candidate, plan: Plan) -> float:
    """Bytes a candidate saves for its backward (one micro-batch).

    Attention and FFN: the attention and MLP parts of Korthikanti et al.'s per-layer count
    (:func:`~mindpipe.simulator.memory.activation_bytes_per_layer`, no dropout; attention with the
    fused core's per-row statistics in place of the scores, as :func:`candidate_ops`). Convolutions: the
    norm's input and the op's input (standard, lightweight), and the pointwise GEMM's input too
    (separable), d·b·s·h each.
    """
    if c.op == "attention":
        return activation_bytes_per_layer(_gpt_view(net, c.num_heads or 1, 4 * net.hidden_size),
                                          dataclasses.replace(plan, flash_attention=True), part="attention")
    if c.op == "ffn":
        return activation_bytes_per_layer(_gpt_view(net, 1, c.ffn_hidden_size or 1), plan, part="mlp")
    sbh = plan.micro_batch_size * net.seq_len * net.hidden_size * DTYPE_BYTES[plan.precision]
    return (3 if c.conv_kind == "separable" else 2) * sbh


# -- the hardware source ------------------------------------------------------------------------


def op_pricer(compute: ComputeModel, plan: Plan) -> tuple[Pricer, str]:
    """How ``compute`` prices a list of operators under ``plan``'s precision, and the source's name.

    Raises:
        ContractError: a compute model that does not price operators (e.g. a per-layer trace).
    """
    precision = plan.precision
    if isinstance(compute, GpuComputeModel):
        def gpu(ops: Sequence[Op]) -> tuple[float, float, float]:
            t = compute.phase_times(ops, precision)
            return t.forward_s, t.backward_input_s, t.backward_weight_s
        return gpu, "gpu-model"
    if isinstance(compute, CalibratedComputeModel) and precision in compute.calibration:
        cal = compute.calibration[precision]
        return (lambda ops: compute.phase_times(ops, cal, precision)[:3]), "calibrated"
    if isinstance(compute, CalibratedComputeModel):
        return op_pricer(compute.fallback, plan)
    if isinstance(compute, RooflineComputeModel):
        peak = compute.device.peak_flops(precision) * compute.flops_efficiency
        bw = compute.device.memory_bandwidth_GBps * 1e9 * compute.bandwidth_efficiency
        return (lambda ops: roofline_time(ops, peak, bw)[:3]), "roofline"
    raise ContractError("", "compute", f"{type(compute).__name__} does not price operators; a supernet needs a "
                        "hardware model, a calibration or a per-candidate trace")


def _shared_view(net: Supernet) -> Model:
    return _gpt_view(net, 1, 4 * net.hidden_size)


def _frozen(cost: PartCost, trained: bool, no_backward: bool = False) -> PartCost:
    """A shared part as trained (``train_shared``) or frozen: no weight gradient; the embedding no backward."""
    if trained:
        return dataclasses.replace(cost, trained_params=cost.param_count)
    if no_backward:
        return dataclasses.replace(cost, backward_input_s=0.0, backward_weight_s=0.0, activation_bytes=0.0,
                                   trained_params=0)
    return dataclasses.replace(cost, backward_weight_s=0.0, trained_params=0)


def hardware_costs(net: Supernet, plan: Plan, compute: ComputeModel) -> SupernetCosts:
    """Every candidate and shared part priced by a hardware (or calibrated) compute model (module docstring)."""
    return priced_costs(net, plan, *op_pricer(compute, plan))


def priced_costs(net: Supernet, plan: Plan, price: Pricer, source: str) -> SupernetCosts:
    """Every candidate and shared part priced by ``price`` (the operators of :func:`candidate_ops`,
    the embedding, the final norm and LM head; frozen shared parts as the module docstring says).

    Any linear ``price`` works, e.g. one that counts operators or sums one kind's reference time
    (the supernet calibration's features, :mod:`mindpipe.simulator.calibrate.supernet`).
    """
    b, s, h, d = plan.micro_batch_size, net.seq_len, net.hidden_size, DTYPE_BYTES[plan.precision]
    gpt = _shared_view(net)
    out_bytes = float(boundary_bytes(gpt, plan))
    cands = []
    for c in net.candidates:
        f, i, w = price(candidate_ops(net, c, plan))
        n = c.param_count(h)
        cands.append(PartCost(f, i, w, candidate_activation_bytes(net, c, plan), out_bytes, n, n))
    f, i, w = price(embedding_ops(gpt, b, s, 1, d))
    emb = PartCost(f, i, w, embedding_activation_bytes(gpt, plan, mask_bytes=0), out_bytes,
                   net.vocab_size * h + s * h)
    f, i, w = price([*final_norm_ops(gpt, b, s, 1, False, d), *lm_head_ops(gpt, b, s, 1, d)])
    head = PartCost(f, i, w, head_activation_bytes(gpt, plan), 0.0, 2 * h + net.vocab_size * h)
    return SupernetCosts(net, tuple(cands), _frozen(emb, net.train_shared, no_backward=True),
                         _frozen(head, net.train_shared), source)


# -- the trace source ---------------------------------------------------------------------------


def check_candidate_trace(trace: Trace, net: Supernet, source: str = "trace") -> None:
    """Raise unless ``trace`` is a per-candidate trace of ``net`` (same shape and candidates, each with its
    settings; the per-layer lists may differ: a candidate costs the same in every layer).

    Raises:
        ContractError: naming ``source``, the key and the rule.
    """
    if trace.granularity != "candidate":
        raise ContractError(source, "granularity", f"granularity={trace.granularity!r}: a supernet needs a "
                            "per-candidate trace (mindpipe profile SUPERNET)")
    t = trace.supernet
    if t is not None:
        shape = ("num_layers", "hidden_size", "seq_len", "vocab_size")
        if any(getattr(t, k) != getattr(net, k) for k in shape) or [c.name for c in t.candidates] != [
                c.name for c in net.candidates]:
            raise ContractError(source, "supernet", f"trace was taken for {t.describe()}, not for {net.describe()}")
        for mine, theirs in zip(net.candidates, t.candidates, strict=True):
            if mine != theirs:
                raise ContractError(source, "supernet", f"candidate {mine.name!r} was profiled as "
                                    f"{theirs.describe()}, {net.label} has {mine.describe()}")
    if trace.seq_len is not None and trace.seq_len != net.seq_len:  # profile SUPERNET --seq-len: shorter sequences
        raise ContractError(source, "seq_len", f"the trace was profiled at seq_len={trace.seq_len} but {net.label} "
                            f"runs seq_len={net.seq_len}: profile again without --seq-len")
    names = {r.name for r in trace.layers}
    for need in ("embedding", "head", *(f"candidate.{c.name}" for c in net.candidates)):
        if need not in names:
            raise ContractError(source, "layers", f"no record named {need!r} (a per-candidate trace has "
                                "embedding, candidate.<name> for every candidate, and head)")


def trace_costs(net: Supernet, plan: Plan, trace: Trace, source: str = "trace", time_scale: float = 1.0) -> SupernetCosts:
    """Candidate and shared-part costs from a per-candidate trace, scaled to the plan's micro-batch.

    Times and recorded bytes scale linearly with micro-batch size (module docstring); bytes the
    trace does not record come from the hardware-model counts (:func:`candidate_activation_bytes`).
    Times are further multiplied by ``time_scale`` (a supernet calibration's ``trace_scale``: how much
    slower the executor ran the actions than the profiler timed them).
    """
    check_candidate_trace(trace, net, source)
    k = plan.micro_batch_size / (trace.micro_batch_size or plan.micro_batch_size)
    t = k * time_scale
    rec = {r.name: r for r in trace.layers}
    gpt = _shared_view(net)
    out_bytes = float(boundary_bytes(gpt, plan))
    h, s = net.hidden_size, net.seq_len

    def part(name: str, act: float, out: float, params: int) -> PartCost:
        r = rec[name]
        return PartCost(r.forward_s * t, r.backward_input_s * t, r.backward_weight_s * t,
                        act if r.activation_bytes is None else r.activation_bytes * k,
                        out if r.output_bytes is None else r.output_bytes * k, params, params)

    cands = tuple(part(f"candidate.{c.name}", candidate_activation_bytes(net, c, plan), out_bytes, c.param_count(h))
                  for c in net.candidates)
    emb = part("embedding", embedding_activation_bytes(gpt, plan, mask_bytes=0), out_bytes, net.vocab_size * h + s * h)
    head = part("head", head_activation_bytes(gpt, plan), 0.0, 2 * h + net.vocab_size * h)
    # A profiler times what the model runs: frozen shared parts already have no weight gradient there.
    return SupernetCosts(net, cands, _frozen(emb, net.train_shared, no_backward=True),
                         _frozen(head, net.train_shared), "trace" if time_scale == 1.0 else "calibrated trace")


__all__ = [
    "PartCost",
    "Pricer",
    "SupernetCosts",
    "candidate_activation_bytes",
    "candidate_ops",
    "check_candidate_trace",
    "hardware_costs",
    "op_pricer",
    "priced_costs",
    "trace_costs",
]
