"""The trace contract: per-layer (or per-operator) costs of one micro-batch on one device.

A trace is what the simulator consumes instead of its hardware model. It is written by the
profiler (``mindpipe profile``), by the importers (``mindpipe import``) and, later, by the
executor's measurements. Times are seconds for one micro-batch of ``micro_batch_size`` sequences
of ``seq_len`` tokens at tensor-parallel degree ``tp``.

The backward pass is split into B (input gradient) and W (weight gradient) because zero-bubble
schedules place them separately (Qi et al., ICLR'24). ``backward_split="combined"`` marks traces
whose source cannot separate them (then ``backward_input_s`` holds the whole backward and
``backward_weight_s`` is 0).

A supernet trace (``granularity="candidate"``, with ``supernet`` set) holds one record per
candidate operator (``candidate.<name>``) plus ``embedding`` and ``head``, each for one choice
layer at the trace's micro-batch size (:mod:`mindpipe.simulator.subnet_costs` reads it).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from mindpipe.traces.config import PRECISIONS, Model, Plan, non_negative, one_of
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import integer, number, within_limit
from mindpipe.traces.measured import Measurement
from mindpipe.traces.reading import TRACE as TRACE_FILE
from mindpipe.traces.schema import check_format_version, from_dict, read_json, write_json
from mindpipe.traces.supernet import Supernet

TRACE_FORMAT_VERSION = 1
GRANULARITIES = ("layer", "op", "candidate")
BACKWARD_SPLITS = ("measured", "combined")
COMM_PHASES = ("forward", "backward_input", "backward_weight", "update")
COMM_OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "p2p")
TRACE_DTYPES = (*PRECISIONS, "unknown")
# A record's times: each within the ``record_seconds`` limit (11.6 days, AICB's largest field in ns).
TIME_KEYS = ("forward_s", "backward_input_s", "backward_weight_s", "update_s")
# The times a trace exists to give: at least one record must have one of them above 0.
COMPUTE_KEYS = ("forward_s", "backward_input_s", "backward_weight_s")
# The dtypes the profiler runs a model in (torch dtypes: FP8 is a GEMM recipe, not a parameter dtype);
# the profiler's check and ``mindpipe profile --dtype`` both read it.
PROFILE_DTYPES = ("fp32", "bf16", "fp16")


def _other_document(data: dict[str, Any]) -> str | None:
    """What a JSON document without ``layers`` is, told by its keys (None: not recognised)."""
    keys = set(data)
    if "traceEvents" in keys:
        return "a Chrome trace (convert torch.profiler's with: mindpipe import torch-profiler FILE --out trace.json)"
    if {"devices", "comm"} & keys and "measurements" in keys:
        return "a calibration (mindpipe calibrate --out)"
    if "kind" in keys and "num_layers" in keys:
        return "a model description"
    if "gpu" in keys and ({"num_nodes", "gpus_per_node"} & keys):
        return "a cluster description"
    if keys and keys <= {f.name for f in dataclasses.fields(Plan)}:
        return "a plan"
    if "best_plan" in keys or "best_value" in keys:
        return "a tuner summary (its best_plan is a plan)"
    return None


@dataclass
class CommRecord:
    """A collective issued by a layer (e.g. Megatron's TP all-reduce), as AICB records them."""

    phase: str
    op: str
    size_bytes: int

    def __post_init__(self) -> None:
        one_of("phase", self.phase, COMM_PHASES)
        one_of("op", self.op, COMM_OPS)
        non_negative("size_bytes", self.size_bytes)


@dataclass
class LayerRecord:
    """Costs of one layer (or operator) for one micro-batch.

    Attributes:
        name: Layer name (``embedding``, ``block.3``, ``block.3.attn_qkv`` …); unique within
            profiler traces, repeated as published in imported ones.
        kind: Role: ``embedding``, ``block``, ``final_norm``, ``lm_head`` or an operator kind.
        forward_s: Forward time.
        backward_input_s: Input-gradient (B) time; the whole backward if not split.
        backward_weight_s: Weight-gradient (W) time.
        activation_bytes: Bytes saved for backward by this layer (None = unknown).
        output_bytes: Bytes of the output that cross a stage boundary if cut after this layer.
        param_count: Parameters owned by this layer.
        forward_flops: FLOPs of the forward pass (torch.utils.flop_counter counting).
        backward_flops: FLOPs of the backward pass.
        update_s: Optimizer update time if the source records it.
        comm: Collectives issued by the layer.
        inputs: Names of the records whose outputs this one consumes (operator graphs only).
        stats: Spread of the timings (e.g. ``forward_s_iqr``, ``repeats``).
    """

    name: str
    kind: str
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    activation_bytes: int | None = None
    output_bytes: int | None = None
    param_count: int | None = None
    forward_flops: float | None = None
    backward_flops: float | None = None
    update_s: float | None = None
    comm: list[CommRecord] = field(default_factory=list)
    inputs: list[str] | None = None
    stats: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ContractError("", "name", "name must not be empty")
        for key in ("activation_bytes", "output_bytes", "param_count", "forward_flops", "backward_flops"):
            non_negative(key, getattr(self, key))
        # 0 s is a legal record (a frozen layer's weight gradient, the embedding's input gradient);
        # past days for one micro-batch of one layer it is a unit mix-up or a corrupt file, not a measurement.
        for key in TIME_KEYS:
            if getattr(self, key) is not None:
                number(key, getattr(self, key), 0, "record_seconds")

    @property
    def backward_s(self) -> float:
        """Whole backward: B + W."""
        return self.backward_input_s + self.backward_weight_s


@dataclass
class Provenance:
    """Where a trace came from, so a reader can judge and reproduce it."""

    tool: str
    command: str = ""
    date: str = ""
    torch_version: str | None = None
    host: str | None = None
    source_file: str | None = None
    notes: str = ""


@dataclass
class StepMeasurement:
    """A whole forward+backward step of the same model and batch, measured separately."""

    forward_backward_s: float
    repeats: int
    iqr_s: float = 0.0

    def __post_init__(self) -> None:
        non_negative("forward_backward_s", self.forward_backward_s)
        non_negative("iqr_s", self.iqr_s)


@dataclass
class Trace:
    """Per-layer costs of a model on a device (see module docstring).

    A supernet's trace (``mindpipe profile supernet-mini``) has ``granularity="candidate"``, the
    supernet in ``supernet`` and one record per candidate operator (``candidate.<name>``, timed
    once: every layer's instance has the same shape) plus ``embedding`` and ``head``; a measured
    supernet run carries ``supernet`` too. ``flash_attention`` says whether the blocks' attention
    core ran as one fused kernel (``mindpipe profile --flash-attention``, or a run of a plan with
    ``flash_attention``); a simulation prices only plans that run attention the same way from it.
    """

    device: str
    dtype: str
    layers: list[LayerRecord] = field(repr=False)  # a notebook shows the header, not every record
    provenance: Provenance
    model: Model | None = None
    model_name: str | None = None
    micro_batch_size: int | None = None
    seq_len: int | None = None
    tp: int = 1
    sequence_parallel: bool = False
    flash_attention: bool = False
    granularity: str = "layer"
    backward_split: str = "measured"
    step: StepMeasurement | None = None
    measurement: Measurement | None = None
    supernet: Supernet | None = None
    format_version: int = TRACE_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version, TRACE_FORMAT_VERSION, "traces")
        if not self.device:
            raise ContractError("", "device", "device must not be empty")
        one_of("dtype", self.dtype, TRACE_DTYPES)
        one_of("granularity", self.granularity, GRANULARITIES)
        one_of("backward_split", self.backward_split, BACKWARD_SPLITS)
        if not self.layers:
            raise ContractError("", "layers", "layers must not be empty")
        within_limit("layers", len(self.layers), "trace_layers", "number of layers")
        if not any(getattr(r, key) for r in self.layers for key in COMPUTE_KEYS):
            # Single zeros are legal (see LayerRecord); all of them means nothing was timed, and
            # every plan would be priced at zero compute.
            raise ContractError("", "layers", f"{', '.join(COMPUTE_KEYS[:-1])} and {COMPUTE_KEYS[-1]} are 0 s in "
                                "every record: nothing was measured (a trace must time at least one layer)")
        for key, bound in (("micro_batch_size", "micro_batch_size"), ("seq_len", "seq_len"), ("tp", "devices")):
            value = getattr(self, key)
            if value is not None:
                integer(key, value, 1, bound)
        if self.model is not None and self.seq_len is not None and self.seq_len > self.model.seq_len:
            raise ContractError(
                "", "seq_len", f"seq_len={self.seq_len} exceeds the model's seq_len={self.model.seq_len}"
            )
        if self.granularity == "candidate" and self.supernet is None:
            raise ContractError("", "supernet", 'granularity="candidate" needs the supernet the candidates belong to')
        if self.backward_split == "combined" and any(r.backward_weight_s for r in self.layers):
            raise ContractError("", "backward_split", 'backward_split="combined" requires backward_weight_s=0 everywhere')

    # -- aggregates -----------------------------------------------------------------------
    def total(self, key: str) -> float:
        """Sum of a numeric per-layer field (unknown values count as 0)."""
        return float(sum(getattr(r, key) or 0 for r in self.layers))

    @property
    def forward_backward_s(self) -> float:
        """Sum over layers of forward + backward (B + W) time."""
        return self.total("forward_s") + self.total("backward_input_s") + self.total("backward_weight_s")

    def check_model(self, model: Model, source: str = "trace") -> None:
        """Raise unless this trace was taken for ``model``: same shape, and profiled at its sequence length.

        A trace profiled at a shorter ``seq_len`` (``mindpipe profile --seq-len``) prices only a model of
        that length: its times are for shorter sequences and nothing rescales them.

        Raises:
            ContractError: ``trace.json: model: trace was taken for ... not for ...``, or
                ``trace.json: seq_len: the trace was profiled at seq_len=64 but gpt-mini runs seq_len=128 ...``.
        """
        if self.model is None:
            return
        # A trace written before the profiler recorded the profiled length names the full-length model.
        taken = dataclasses.replace(self.model, seq_len=self.seq_len) if self.seq_len is not None else self.model
        if not dataclasses.replace(taken, seq_len=model.seq_len).same_shape(model):
            raise ContractError(
                source,
                "model",
                f"model: trace was taken for {taken.describe()}, not for {model.describe()}",
            )
        if taken.seq_len != model.seq_len:
            # Times, activations and FLOPs are those of seq_len-token sequences; nothing rescales them
            # (attention is not linear in s), so the model's own sequences cannot be priced from them.
            raise ContractError(source, "seq_len", (
                f"the trace was profiled at seq_len={taken.seq_len} but {model.label} runs seq_len={model.seq_len}: "
                f"its times are for {taken.seq_len}-token sequences; profile again at the model's sequence length "
                f"(mindpipe profile without --seq-len) or give a model of seq_len={taken.seq_len}"))

    def pricing_notes(self, model: Model, plan: Plan, device: str) -> list[str]:
        """What a simulation of ``plan`` on ``device`` prices from this trace that the trace did not measure.

        The simulator scales a trace's times only by micro-batch size and TP degree (and says so);
        these are the differences it does not scale: another precision or device, a micro-batch size
        or sequence length the trace does not record or that differs without a model to refuse it, and
        pipeline layers the trace lacks (priced as 0 s) or holds twice (the first is used).
        """
        notes: list[str] = []
        if self.dtype in PRECISIONS and self.dtype != plan.precision:
            # mindpipe profile has no fp8 (PROFILE_DTYPES): for such a plan the way out is the hardware model
            again = (f"profile with --dtype {plan.precision}" if plan.precision in PROFILE_DTYPES
                     else f"mindpipe profile has no {plan.precision}: simulate without --trace")
            notes.append(f"trace profiled in {self.dtype}, the plan runs {plan.precision}: its times are {self.dtype} "
                         f"times, not rescaled ({again}, or give the plan \"precision\": \"{self.dtype}\")")
        if self.device != device:
            notes.append(f"trace taken on {self.device}, the cluster's devices are {device}: its times are "
                         f"{self.device} times, not rescaled")
        if self.micro_batch_size is None:
            notes.append(f"the trace does not record its micro-batch size: its times are used as they are for "
                         f"micro_batch_size={plan.micro_batch_size}")
        if self.model is None and self.seq_len is not None and self.seq_len != model.seq_len:
            notes.append(f"trace taken at seq_len={self.seq_len}, the model runs seq_len={model.seq_len}: "
                         "times not rescaled")
        ran = self.measurement.plan if self.measurement is not None else None
        if ran is not None and ran.cp > 1:
            notes.append(f"trace measured under context parallelism (cp={ran.cp}): each layer's time is one rank's "
                         f"seq_len/cp={self.seq_len // ran.cp if self.seq_len else '?'} tokens with its K/V exchange, "
                         "not the whole sequence's: times not rescaled (profile with cp=1)")
        if self.granularity in ("layer", "op"):
            kinds = [r.kind for r in self.layers]
            for kind, what in (("embedding", "the embedding"), ("lm_head", "the LM head and loss")):
                if kind not in kinds:
                    notes.append(f"the trace has no {kind} record: {what} priced as 0 s")
            for kind in ("embedding", "final_norm", "lm_head"):
                if (n := kinds.count(kind)) > 1:
                    notes.append(f"the trace has {n} {kind} records: the first is used")
        return notes

    # -- I/O ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> Trace:
        """Build a trace from parsed JSON (errors name ``source``)."""
        return from_dict(cls, data, source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a trace JSON file (plain or gzip; within the reading layer's trace size limit).

        Raises:
            ContractError: not a trace of this format; a document without ``layers`` that is
                another kind of file (a plan, a model, a calibration, a Chrome trace …) is named as such.
        """
        data = read_json(path, TRACE_FILE)
        if isinstance(data, dict) and "layers" not in data and (kind := _other_document(data)) is not None:
            raise ContractError(str(path), None, f"this is {kind}, not a per-layer trace (it has no layers; "
                                "mindpipe profile, import or run --out write one)")
        return from_dict(cls, data, str(path))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the trace as JSON."""
        write_json(self, path)

