"""``mindpipe profile``: per-layer (or per-operator) traces of the GPT or Llama model on CPU or CUDA.

Method: one forward pass through the model's pipeline layers (embedding, blocks, final norm, LM
head + loss) records every layer's real input; then each layer is re-run in isolation on that
input, ``warmup`` times untimed and ``repeats`` times timed, and the median is kept
(:func:`mindpipe.traces.timing.measure_unit`). A whole forward+backward step of the same model and batch
is timed too, so a reader can check that the per-layer sum accounts for the step
(``benchmarks/profile_vs_step.py``).

With ``granularity="op"`` each block is split into operators from its ``torch.fx`` graph (as
DawnPiper profiles), see :mod:`mindpipe.traces.op_graph`.

A supernet (:func:`profile_supernet`) is profiled per candidate operator: ``embedding``, one
``candidate.<name>`` per candidate (timed once — every choice layer's instance has the same shape
and input shape) and ``head`` (final norm, LM head and loss), in a trace of
``granularity="candidate"`` that carries the supernet. Frozen shared parts have no weight
gradient, so their W is 0; the head's B is the input gradient the last stage sends back.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from mindpipe.traces.config import Model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.timing import Clock, measure_unit, median_iqr
from mindpipe.traces.torch_gpt import TORCH_DTYPES, lm_loss, synthetic_batch
from mindpipe.traces.torch_models import TransformerLM, build_model
from mindpipe.traces.torch_supernet import CandidateBlock, SupernetEmbedding, SupernetHead, synthetic_tokens
from mindpipe.traces.trace import PROFILE_DTYPES, LayerRecord, Provenance, StepMeasurement, Trace
from mindpipe.traces.units import plural

Progress = Callable[[str], None]
# A profiled unit: (name, kind, module, the callable timed, its input).
Unit = tuple[str, str, torch.nn.Module, Callable[..., object], object]


@dataclass
class ProfileOptions:
    """What to profile and how.

    Attributes:
        micro_batch_size: Sequences per micro-batch.
        seq_len: Tokens per sequence (None = the model's).
        device: ``cpu`` or ``cuda`` (or ``cuda:N``).
        dtype: ``fp32``, ``bf16`` or ``fp16``.
        granularity: ``layer`` or ``op``.
        warmup: Untimed repetitions per unit.
        repeats: Timed repetitions per unit.
        seed: Seed for weights, data and output gradients.
        step_repeats: Timed repetitions of the whole step (0 skips it).
        flash_attention: Run the blocks' attention core as one fused kernel (what a plan's
            ``flash_attention`` runs, :func:`mindpipe.traces.torch_models.use_flash_attention`);
            layer granularity only (an operator graph of a fused block has no explicit softmax to
            cut around).
    """

    micro_batch_size: int = 1
    seq_len: int | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    granularity: str = "layer"
    warmup: int = 3
    repeats: int = 10
    seed: int = 0
    step_repeats: int = 20
    flash_attention: bool = False

    def check(self, model: Model) -> None:
        """Validate against the model (errors name the option)."""
        for key in ("micro_batch_size", "warmup", "repeats"):
            if getattr(self, key) < (0 if key == "warmup" else 1):
                raise ContractError("profile", key, f"{key}={getattr(self, key)} is too small")
        if self.seq_len is not None and not 1 <= self.seq_len <= model.seq_len:
            raise ContractError("profile", "seq_len", f"seq_len={self.seq_len} must be in 1..{model.seq_len}")
        if self.granularity not in ("layer", "op"):
            raise ContractError("profile", "granularity", f"granularity={self.granularity!r} is not layer or op")
        if self.flash_attention and self.granularity == "op":
            raise ContractError("profile", "flash_attention", "a fused attention core has no operators to cut "
                                "between; profile --flash-attention at layer granularity")
        if self.dtype not in PROFILE_DTYPES:
            raise ContractError("profile", "dtype", f"dtype={self.dtype!r} is not {', '.join(PROFILE_DTYPES[:-1])} "
                                f"or {PROFILE_DTYPES[-1]}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ContractError("profile", "device", f"device={self.device!r} but CUDA is not available here")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ContractError("profile", "device", f"device={self.device!r} is not cpu or cuda")


def device_label(device: torch.device) -> str:
    """Catalog name of the device when recognisable (``cpu``, ``a100-sxm4-80gb`` …), else its name."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    mem_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    if "a100" in name:
        return "a100-sxm4-80gb" if mem_gib > 45 else "a100-sxm4-40gb"
    if "h200" in name:
        return "h200-sxm-141gb"
    if "h100" in name:
        return "h100-sxm5-80gb"
    return name.replace(" ", "-")


def host_description() -> str:
    """CPU model and core count (for provenance)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}; {torch.get_num_threads()} torch threads"


def _layer_units(net: TransformerLM, tokens: torch.Tensor, targets: torch.Tensor) -> list[Unit]:
    """(name, kind, module, callable, input) for every pipeline layer, inputs from one real pass."""
    units: list[Unit] = []
    x: object = tokens
    with torch.no_grad():
        for name, kind, mod in net.layers():
            fn: Callable[..., object] = mod
            if kind == "lm_head":
                # The last pipeline stage computes the loss: count it with the head.
                def fn(h: torch.Tensor, mod: torch.nn.Module = mod) -> torch.Tensor:
                    return lm_loss(mod(h), targets)

            units.append((name, kind, mod, fn, x))
            x = mod(x)
    return units


def step_samples(net: TransformerLM, tokens: torch.Tensor, targets: torch.Tensor, clock: Clock, warmup: int, repeats: int) -> list[float]:
    """Times of ``repeats`` whole forward + loss + backward steps of ``net`` (after ``warmup``)."""

    def step() -> None:
        lm_loss(net(tokens), targets).backward()

    times = []
    for i in range(warmup + repeats):
        net.zero_grad(set_to_none=True)
        clock.sync()
        t = clock.time(step)
        if i >= warmup:
            times.append(t)
    net.zero_grad(set_to_none=True)
    return times


def _profile_units(units: list[Unit], opts: ProfileOptions, clock: Clock, buffers: list[torch.Tensor],
                   say: Progress) -> list[LayerRecord]:
    """One record per unit (layer), or per operator of each block at ``granularity="op"``."""
    records: list[LayerRecord] = []
    prev_name: str | None = None
    for i, (name, kind, mod, fn, x) in enumerate(units):
        if opts.granularity == "op" and kind == "block":
            from mindpipe.traces.op_graph import profile_block_ops  # fx machinery only when asked for

            say(f"profiling {name} by operator ({i + 1}/{len(units)})")
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name}: expected a tensor input")
            ops = profile_block_ops(mod, x, name, prev_name, clock, opts.warmup, opts.repeats, opts.seed, buffers)
            records.extend(ops)
            prev_name = ops[-1].name
            continue
        say(f"profiling {name} ({i + 1}/{len(units)})")
        params = list(mod.parameters())
        cost = measure_unit(
            fn, [x], params, clock, warmup=opts.warmup, repeats=opts.repeats, exclude_storages=buffers, seed=opts.seed + i
        )
        records.append(
            LayerRecord(
                name=name,
                kind=kind,
                forward_s=cost.forward_s,
                backward_input_s=cost.backward_input_s,
                backward_weight_s=cost.backward_weight_s,
                activation_bytes=cost.activation_bytes,
                output_bytes=cost.output_bytes,
                param_count=sum(p.numel() for p in params),
                forward_flops=cost.forward_flops,
                backward_flops=cost.backward_flops,
                inputs=[prev_name] if opts.granularity == "op" and prev_name else None,
                stats=cost.stats,
            )
        )
        prev_name = name
    return records


def _provenance(opts: ProfileOptions, device: torch.device, command: str | None) -> Provenance:
    """Where the trace comes from: the command, the date, torch, the host and how it was timed."""
    return Provenance(
        tool="mindpipe profile",
        command=command if command is not None else " ".join(["mindpipe", *sys.argv[1:]]),
        date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        torch_version=torch.__version__,
        host=host_description() if device.type == "cpu" else torch.cuda.get_device_name(device),
        notes=(
            f"{'CPU' if device.type == 'cpu' else 'GPU'} trace; median of {plural(opts.repeats, 'run')} after "
            f"{plural(opts.warmup, 'warm-up run')}; backward split as B=grad(inputs), W=full-B"
            + ("; attention core fused (scaled_dot_product_attention)" if opts.flash_attention else "")
        ),
    )


def profile_model(model: Model, opts: ProfileOptions, *, command: str | None = None, progress: Progress | None = None) -> Trace:
    """Profile ``model`` and return its trace.

    Args:
        model: The model contract.
        opts: Profiling options (validated here).
        command: Command line recorded in the provenance (defaults to ``sys.argv``).
        progress: Called with a short message before each unit (the CLI prints it to stderr).
    """
    opts.check(model)
    say = progress or (lambda _msg: None)
    device = torch.device(opts.device)
    clock = Clock(device)
    seq_len = opts.seq_len or model.seq_len
    net = build_model(model, seed=opts.seed, dtype=opts.dtype, device=device, flash_attention=opts.flash_attention)
    net.train()
    tokens, targets = synthetic_batch(model, opts.micro_batch_size, seed=opts.seed, seq_len=seq_len, device=device)
    buffers = list(net.buffers())

    # The whole step is sampled before and after the per-layer runs, so a slow drift of the
    # machine (other processes, frequency changes) affects both sides of the comparison alike.
    half = (opts.step_repeats + 1) // 2
    steps = step_samples(net, tokens, targets, clock, opts.warmup, half) if opts.step_repeats else []
    records = _profile_units(_layer_units(net, tokens, targets), opts, clock, buffers, say)

    step = None
    if opts.step_repeats:
        say("timing a whole forward+backward step")
        steps += step_samples(net, tokens, targets, clock, opts.warmup, opts.step_repeats - half)
        med, iqr = median_iqr(steps)
        step = StepMeasurement(forward_backward_s=med, repeats=len(steps), iqr_s=iqr)
    return Trace(
        device=device_label(device),
        dtype=opts.dtype,
        layers=records,
        provenance=_provenance(opts, device, command),
        # The network the times are for: at the profiled sequence length, so that the trace prices
        # only a model of that length (Trace.check_model).
        model=dataclasses.replace(model, seq_len=seq_len) if seq_len != model.seq_len else model,
        model_name=model.name,
        micro_batch_size=opts.micro_batch_size,
        seq_len=seq_len,
        flash_attention=opts.flash_attention,
        granularity=opts.granularity,
        step=step,
    )


def _record(name: str, kind: str, mod: torch.nn.Module, fn: Callable[..., object], x: object, clock: Clock,
            opts: ProfileOptions, i: int) -> LayerRecord:
    params = list(mod.parameters())
    cost = measure_unit(fn, [x], params, clock, warmup=opts.warmup, repeats=opts.repeats, seed=opts.seed + i)
    return LayerRecord(name=name, kind=kind, forward_s=cost.forward_s, backward_input_s=cost.backward_input_s,
                       backward_weight_s=cost.backward_weight_s, activation_bytes=cost.activation_bytes,
                       output_bytes=cost.output_bytes, param_count=sum(p.numel() for p in params),
                       forward_flops=cost.forward_flops, backward_flops=cost.backward_flops, stats=cost.stats)


def profile_supernet(net: Supernet, opts: ProfileOptions, *, command: str | None = None,
                     progress: Progress | None = None) -> Trace:
    """Profile every candidate operator of ``net`` plus its embedding and head (see module docstring).

    No whole-step measurement: the records are one per candidate, not the layers of one subnet, so
    their sum is not a step's time (the simulator prices a subnet from its choices).
    """
    # The options' checks read only the sequence length of the model: the supernet's serves.
    dataclasses.replace(opts, granularity="layer").check(net)  # type: ignore[arg-type]
    say = progress or (lambda _msg: None)
    device = torch.device(opts.device)
    dtype = TORCH_DTYPES[opts.dtype]
    clock = Clock(device)
    seq_len = opts.seq_len or net.seq_len
    torch.manual_seed(opts.seed)
    emb = SupernetEmbedding(net).to(device, dtype).requires_grad_(net.train_shared)
    head = SupernetHead(net).to(device, dtype).requires_grad_(net.train_shared)
    blocks = [CandidateBlock(net, c).to(device, dtype) for c in net.candidates]
    rows = synthetic_tokens(net, opts.seed, 0, opts.micro_batch_size)[:, :seq_len + 1].to(device)
    tokens, targets = rows[:, :-1], rows[:, 1:]
    with torch.no_grad():
        hidden = emb(tokens)
    units: list[tuple[str, str, torch.nn.Module, Callable[..., object], object]] = [("embedding", "embedding", emb, emb, tokens)]
    units += [(f"candidate.{c.name}", c.op, b, b, hidden) for c, b in zip(net.candidates, blocks, strict=True)]
    units.append(("head", "lm_head", head, lambda h: head.loss(h, targets), hidden))
    records = []
    for i, (name, kind, mod, fn, x) in enumerate(units):
        say(f"profiling {name} ({i + 1}/{len(units)})")
        records.append(_record(name, kind, mod, fn, x, clock, opts, i))
    return Trace(
        device=device_label(device), dtype=opts.dtype, layers=records,
        provenance=Provenance(
            tool="mindpipe profile", command=command if command is not None else " ".join(["mindpipe", *sys.argv[1:]]),
            date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), torch_version=torch.__version__,
            host=host_description() if device.type == "cpu" else torch.cuda.get_device_name(device),
            notes=(f"supernet trace, one record per candidate operator; median of {plural(opts.repeats, 'run')} after "
                   f"{plural(opts.warmup, 'warm-up run')}; backward split as B=grad(inputs), W=full-B; shared parts "
                   f"{'trained' if net.train_shared else 'frozen (no W)'}")),
        model_name=net.label, micro_batch_size=opts.micro_batch_size, seq_len=seq_len, granularity="candidate",
        supernet=net,
    )
