"""The stated limits of model and plan sizes, and the number rules every contract checks with.

The simulator plays every action of one pipeline (each micro-batch on each stage), so its time
grows with m · pp · virtual_stages; the layer, width and device limits keep every derived
quantity (parameter counts, FLOPs, bytes) finite and every list the simulator builds small. The
limits were chosen by measurement (README "Limits"): the largest plan they allow simulates in
about 8 s and under 100 MiB on the 2-core CI machine (``benchmarks/input_limits.py``). A value
past a limit is refused before any work starts, with a message that names the limit:
``model.json: num_layers: num_layers=20000 exceeds the limit of 16384 transformer blocks``.

Number rules (:func:`integer`, :func:`number`) reject the wrong type (``true`` or ``"8"`` for an
integer), NaN and infinities, and values outside the stated range, so contracts built from Python
(the tuner's ``--fix``, the importers) get the same one-line errors as contracts read from JSON.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, cast

from mindpipe.traces.errors import ContractError


@dataclass(frozen=True)
class Limit:
    """The largest value MindPipe accepts for one quantity.

    Attributes:
        key: The contract key (or derived quantity) it bounds.
        maximum: Largest accepted value.
        what: What the quantity is, for messages and the README table.
    """

    key: str
    maximum: int | float
    what: str


LIMITS: dict[str, Limit] = {lim.key: lim for lim in (
    Limit("num_layers", 16_384, "transformer blocks"),
    Limit("hidden_size", 262_144, "hidden size"),
    Limit("num_heads", 65_536, "attention heads"),
    Limit("ffn_hidden_size", 1_048_576, "MLP width"),
    Limit("seq_len", 2_097_152, "tokens per sequence"),
    Limit("vocab_size", 4_194_304, "vocabulary entries"),
    Limit("num_nodes", 16_384, "nodes"),
    Limit("gpus_per_node", 1_024, "devices per node"),
    Limit("devices", 131_072, "devices (num_nodes × gpus_per_node, dp × tp × pp × cp)"),
    Limit("micro_batch_size", 65_536, "sequences per micro-batch"),
    Limit("global_batch_size", 16_777_216, "sequences per iteration"),
    Limit("loss_chunks", 4_096, "pieces the loss upcasts the logits in (chunked cross-entropy)"),
    Limit("subnet_window", 4_096, "subnets in flight on one pipeline stage (CSP look-ahead window)"),
    Limit("virtual_stages", 64, "model chunks per pipeline rank"),
    Limit("pipeline_stages", 4_096, "pipeline stages (pp × virtual_stages)"),
    Limit("micro_batches", 16_384, "micro-batches per iteration (m = global / (micro × dp))"),
    Limit("microbatch_stages", 131_072, "micro-batch stages per iteration (m × pp × virtual_stages)"),
    Limit("subnet_choices", 524_288, "choices one supernet simulation draws (subnets × num_layers)"),
    Limit("bandwidth", 1e6, "GB/s or Gbit/s of a bandwidth override"),
    Limit("pue", 10.0, "power usage effectiveness"),
    Limit("carbon_intensity", 5000.0, "gCO2eq/kWh of a carbon-series value"),
    Limit("global_batch_choices", 64, "global batch sizes one `tune --global-batch` searches"),
    Limit("tune_budget", 100_000, "simulations one `tune` runs"),
    Limit("trace_layers", 1_048_576, "records in one trace"),
    Limit("record_seconds", 1_000_000, "seconds of one trace record's forward, backward or update time (one micro-batch)"),
    Limit("aicb_rows", 65_536, "rows of an AICB workload"),
    Limit("carbon_rows", 262_144, "rows of a carbon-intensity CSV (30 years of hours)"),
    Limit("vtrain_rows", 4_096, "rows of a vTrain CSV (each is simulated)"),
    Limit("train_steps", 10_000_000, "training steps of one `mindpipe run` (and its warm-up, checkpoint, profile steps)"),
    Limit("timeout_s", 10_000_000, "seconds of a `mindpipe run` timeout (--timeout, --run-timeout)"),
    Limit("seed", 2**32 - 1, "for a seed (numpy's RandomState takes seeds below 2^32)"),
)}
"""Every limit, by key (the README's "Limits" table lists them)."""


def _fmt(x: int | float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def limit(key: str) -> int | float:
    """The maximum of limit ``key``."""
    return LIMITS[key].maximum


def shown(value: Any) -> str:
    """``repr(value)``, shortened (a refused value may be a 4,000-digit integer or a 200 KB string)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def within_limit(key: str, value: int | float, limit_key: str | None = None, label: str | None = None) -> None:
    """Raise unless ``value`` <= the limit ``limit_key`` (default: ``key``'s own).

    ``label`` names a derived value in the message (``dp×tp×pp``); the key stays the one to fix.

    Raises:
        ContractError: ``num_layers=20000 exceeds the limit of 16384 transformer blocks``.
    """
    lim = LIMITS[limit_key or key]
    if value > lim.maximum:
        raise ContractError("", key, f"{label or key}={shown(value)} exceeds the limit of {_fmt(lim.maximum)} {lim.what}")


def integer(key: str, value: Any, minimum: int | None = 1, limit_key: str | None = None) -> None:
    """Raise unless ``value`` is an integer (not a bool), >= ``minimum`` and within its limit.

    Args:
        key: The key named in the error.
        value: The value to check.
        minimum: Smallest accepted value (None: no lower bound).
        limit_key: The :data:`LIMITS` entry bounding it (None: none).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ContractError("", key, f"{key}={shown(value)} must be an integer")
    if minimum is not None and value < minimum:
        bound = "> 0" if minimum == 1 else f">= {minimum}"
        raise ContractError("", key, f"{key}={value} must be {bound}")
    if limit_key is not None:
        within_limit(key, cast(int, value), limit_key)  # an Integral (int, numpy integer) compares as an int


def number(key: str, value: Any, minimum: float | None = None, limit_key: str | None = None) -> None:
    """Raise unless ``value`` is a finite number (not a bool), >= ``minimum`` and within its limit."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ContractError("", key, f"{key}={shown(value)} must be a number")
    if not math.isfinite(value):
        raise ContractError("", key, f"{key}={value} must be a finite number")
    if minimum is not None and value < minimum:
        raise ContractError("", key, f"{key}={value} must be >= {minimum}")
    if limit_key is not None:
        within_limit(key, cast(float, value), limit_key)  # a Real (int, float, numpy number) compares as a float


def limits_table() -> str:
    """The README's "Limits" table (Markdown), from :data:`LIMITS`."""
    rows = ["| limit | maximum | what |", "|---|---:|---|"]
    rows += [f"| `{lim.key}` | {_fmt(lim.maximum)} | {lim.what} |" for lim in LIMITS.values()]
    return "\n".join(rows)


__all__ = ["LIMITS", "Limit", "integer", "limit", "limits_table", "number", "shown", "within_limit"]
