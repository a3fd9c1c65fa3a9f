"""Load NVIDIA's NeMo 24.07 DGX-H100 FP8 pre-training table as (model, cluster, plan, time) rows.

The table (``NVIDIA/NeMo: docs/source/performance/performance_summary.md``, NeMo 24.07 container,
Apache-2.0; shipped beside the repo as ``validation/nemo_2407_h100_fp8.csv``) has the columns
``model, gpus, global_batch, micro_batch, seq_len, tp, pp, cp, vp, tokens_per_s_per_gpu,
model_tflops_per_gpu``. It publishes no iteration time; the loader derives it as
``global_batch × seq_len / (tokens_per_s_per_gpu × gpus)`` (tokens of one iteration over the
whole job's token rate).

Architectures come from NeMo's own model configs (``simulator/perf/data/nemo_models.json``, each
with its source file and how MindPipe's contracts represent it). The setup is NeMo's performance
recipe as far as MindPipe's plan can say it: DGX-H100 (8 H100 SXM5 per node), FP8 GEMMs
(Transformer Engine) → ``precision="fp8"``; FlashAttention (TE's fused attention) →
``flash_attention=true`` (the kernel model's flash pricing and the memory model's); the distributed optimizer
→ ``zero_stage=1``; gradient reduce-scatter overlapped with the backward →
``overlap_grad_reduce=true`` (``overlap_grad_sync``); the parameter all-gather overlapped with the
next forward → ``overlap_param_gather=true`` (``overlap_param_sync``: true in every launcher file
read); sequence parallelism whenever tp > 1; interleaved 1F1B with the
table's ``vp`` chunks when vp > 1, else 1F1B; pipeline sends in flight under the interleaved
schedule (``overlap_p2p_comm: true``, ``batch_p2p_comm: false`` in the launcher files), blocking
otherwise (Megatron-core's 1F1B: ``blocking_p2p``; no row of the table has pp > 1 with vp = 1). Per model (``recipe`` in ``nemo_models.json``, each
with the NeMo-Framework-Launcher file it was read from): Transformer Engine's userbuffers overlap of
the TP collectives with the GEMMs → ``tp_comm_overlap=true`` (when tp > 1), and the activation
recompute level (``selective`` for the GPT-3 20B and 175B recipes, else none).
Transformer Engine's fused RMSNorm, rotary (``apply_rope_fusion: true``) and SwiGLU
(``bias_activation_fusion: true``, ``activation: fast-swiglu``; e.g. the launcher's
``conf/training/llama/llama3_8b.yaml``) → ``fused_elementwise=true``. Megatron-core's data parallelism
(DDP and distributed optimizer) reduces and gathers in contiguous buffers in place, the parameters
after the optimizer step → ``dp_impl=megatron``.
``overlap_grad_reduce``, ``overlap_param_gather``, ``tp_comm_overlap``, ``blocking_p2p``, ``fused_elementwise`` and
``dp_impl`` are
what-if knobs: the simulator models them, MindPipe's executor does not run them. What the plan cannot say is left out
and reported by the error: the gradient reduce-scatter in bf16 (``grad_sync_dtype: bf16`` in some
recipes; the plan reduces fp32 main gradients), TE's extra all-gather of the normed input for the
weight gradient, and the userbuffers' SM sharing.

Context parallelism (``cp`` > 1, the two Llama 3 rows) is the plan's ``cp`` (a what-if knob the
simulator prices: each rank's s/cp tokens, the attention over the whole sequence with the K/V
ring under it; Megatron-core's ``context_parallel_size`` with TE's p2p attention, ``cp_comm_type=p2p``,
another what-if knob); those rows are
in the hold-out half (:func:`mindpipe.simulator.perf.nemo_validate.nemo_split`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.simulator.perf.constants import data_text
from mindpipe.simulator.perf.vtrain import padded_vocab
from mindpipe.traces.builtin import load_cluster
from mindpipe.traces.config import Cluster, Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.reading import NEMO_CSV, parse_float, parse_int, read_headed_csv
from mindpipe.traces.schema import from_dict

COLUMNS = ("model", "gpus", "global_batch", "micro_batch", "seq_len", "tp", "pp", "cp", "vp",
           "tokens_per_s_per_gpu", "model_tflops_per_gpu")
GPU = "h100-sxm5-80gb"
GPUS_PER_NODE = 8  # DGX-H100
MAX_ROWS = 1024
# GPT-2 BPE (the GPT-3 rows): Megatron pads it to a multiple of 128 × tp, as for vTrain's runs.
GPT2_VOCAB = 50257
# Far beyond any GPU: 1e9 tokens/s per GPU; 1e6 TFLOP/s per GPU.
MAX_TOKENS_PER_S = 1e9
MAX_TFLOPS = 1e6
MODELS_FILE = "nemo_models.json"
# NeMo's published table says nothing else per row; these are its recipe's settings (module docstring).
_INT_LIMITS = {"gpus": "devices", "global_batch": "global_batch_size", "micro_batch": "micro_batch_size",
               "seq_len": "seq_len", "tp": "devices", "pp": "devices", "cp": "devices", "vp": "virtual_stages"}


@dataclass(frozen=True)
class NemoRecipe:
    """What NeMo's performance recipe runs for a model beyond the table's columns (module docstring).

    Attributes:
        tp_comm_overlap: Transformer Engine userbuffers overlap (``ub_tp_comm_overlap``), used when tp > 1.
        recompute: ``none`` or ``selective`` (``activations_checkpoint_granularity``).
        evidence: The launcher files (with commits) these were read from, and what differs from the row.
    """

    tp_comm_overlap: bool
    recompute: str
    evidence: str


@dataclass(frozen=True)
class NemoModel:
    """A model of the table: the contract, where its architecture comes from, how it is represented,
    and its recipe."""

    name: str
    model: Model
    source: str
    modelled_as: str
    recipe: NemoRecipe


@dataclass(frozen=True)
class NemoRow:
    """One published configuration.

    Attributes:
        name: The table's model name (``GPT3-175B``).
        model, cluster: MindPipe contracts for the run.
        plan: The plan.
        measured_iteration_time_s: Derived from the published tokens/s per GPU (module docstring).
        source: ``<file>:<line>`` of the row.
        model_tflops_per_gpu: As published.
    """

    name: str
    model: Model
    cluster: Cluster
    plan: Plan
    measured_iteration_time_s: float
    source: str
    model_tflops_per_gpu: float

    @property
    def cp(self) -> int:
        """Context-parallel degree of the row (its plan's ``cp``)."""
        return self.plan.cp


@functools.lru_cache(maxsize=1)
def nemo_models() -> dict[str, NemoModel]:
    """The shipped architectures (``simulator/perf/data/nemo_models.json``), by table name."""
    src = f"simulator/perf/data/{MODELS_FILE}"
    doc = json.loads(data_text(MODELS_FILE))
    out = {}
    for name, entry in doc["models"].items():
        try:
            model = from_dict(Model, {**entry["model"], "seq_len": 4096, "name": name})
        except ContractError as e:
            raise ContractError(src, f"models.{name}.{e.key}", e.rule) from None
        r = entry["recipe"]
        if r["recompute"] not in ("none", "selective") or not isinstance(r["tp_comm_overlap"], bool):
            raise ContractError(src, f"models.{name}.recipe", "recipe needs tp_comm_overlap true/false and "
                                "recompute none or selective")
        recipe = NemoRecipe(r["tp_comm_overlap"], r["recompute"], r["evidence"])
        out[name] = NemoModel(name, model, entry["source"], entry["modelled_as"], recipe)
    return out


def _model(name: str, seq_len: int, tp: int) -> Model:
    base = nemo_models()[name].model
    vocab = padded_vocab(GPT2_VOCAB, tp) if base.vocab_size == GPT2_VOCAB else base.vocab_size
    return from_dict(Model, {**_fields(base), "seq_len": seq_len, "vocab_size": vocab})


def _fields(model: Model) -> dict[str, Any]:
    return {k: v for k, v in vars(model).items() if v is not None}


def nemo_plan(gpus: int, global_batch: int, micro_batch: int, tp: int, pp: int, vp: int,
              recipe: NemoRecipe | None = None, cp: int = 1) -> Plan:
    """The MindPipe plan of a NeMo performance-recipe row (module docstring); without ``recipe``, no
    TP overlap and no recompute."""
    dp = gpus // (tp * pp * cp)
    return Plan(dp=dp, tp=tp, pp=pp, cp=cp, cp_comm_type="p2p" if cp > 1 else "allgather", micro_batch_size=micro_batch, global_batch_size=global_batch,
                schedule="interleaved_1f1b" if vp > 1 else "1f1b", virtual_stages=vp,
                recompute=recipe.recompute if recipe is not None else "none",
                sequence_parallel=tp > 1, zero_stage=1, precision="fp8", overlap_grad_reduce=True,
                overlap_param_gather=True, tp_comm_overlap=recipe is not None and recipe.tp_comm_overlap and tp > 1,
                flash_attention=True,
                # Transformer Engine's fused RMSNorm, rotary (apply_rope_fusion) and SwiGLU
                # (bias_activation_fusion) kernels, which the recipes switch on.
                fused_elementwise=True,
                # Megatron-core blocks on its pipeline sends except in the interleaved schedule with
                # overlap_p2p_comm, which NeMo's recipes set (with batch_p2p_comm false) whenever vp > 1.
                blocking_p2p=pp > 1 and vp == 1,
                # Megatron-core's DDP reduces the gradients in one contiguous buffer in place, and its
                # distributed optimizer all-gathers the parameters straight into theirs.
                dp_impl="megatron")


def _row(cells: dict[str, str], where: str) -> NemoRow:
    name = cells["model"]
    models = nemo_models()
    if name not in models:
        raise ContractError(where, "model", f"unknown model {name[:40]!r}; known: {', '.join(models)}")
    v = {c: parse_int(cells[c], where, c, 1, int(limit(lim))) for c, lim in _INT_LIMITS.items()}
    tps = parse_float(cells["tokens_per_s_per_gpu"], where, "tokens_per_s_per_gpu", 0.0, MAX_TOKENS_PER_S)
    tflops = parse_float(cells["model_tflops_per_gpu"], where, "model_tflops_per_gpu", 0.0, MAX_TFLOPS)
    if not tps > 0:
        raise ContractError(where, "tokens_per_s_per_gpu", f"tokens_per_s_per_gpu={tps:g} must be > 0")
    gpus, tp, pp, cp = v["gpus"], v["tp"], v["pp"], v["cp"]
    if gpus % (tp * pp * cp):
        raise ContractError(where, "gpus", f"tp×pp×cp={tp}×{pp}×{cp} does not divide gpus={gpus}")
    per_node = min(GPUS_PER_NODE, gpus)
    if gpus % per_node:
        raise ContractError(where, "gpus", f"gpus={gpus} does not fill whole {GPUS_PER_NODE}-GPU DGX-H100 nodes")
    seconds = v["global_batch"] * v["seq_len"] / (tps * gpus)
    try:
        model = _model(name, v["seq_len"], tp)
        cluster = load_cluster(f"{GPU}:{gpus // per_node}x{per_node}")
        plan = nemo_plan(gpus, v["global_batch"], v["micro_batch"], tp, pp, v["vp"], models[name].recipe, cp)
        check_plan(plan, model, cluster, source=where)
    except ContractError as e:
        raise ContractError(where, e.key, e.rule) from None
    return NemoRow(name, model, cluster, plan, seconds, where, tflops)


def load_nemo(path: str | Path) -> list[NemoRow]:
    """Read a NeMo performance CSV (header checked).

    Raises:
        ContractError: naming ``<file>:<line>`` and the column for a bad header or row.
    """
    rows = read_headed_csv(path, NEMO_CSV, lambda _seen: list(COLUMNS), max_rows=MAX_ROWS, sep=",")
    return [_row(cells, where) for where, cells in rows]


__all__ = ["COLUMNS", "GPU", "NemoModel", "NemoRecipe", "NemoRow", "load_nemo", "nemo_models", "nemo_plan"]
