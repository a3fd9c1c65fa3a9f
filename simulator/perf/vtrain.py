"""Load vTrain's published Megatron-DeepSpeed iteration times as (model, cluster, plan, time) rows.

Files (``VIA-Research/vTrain: data/ground_truth_{single,multi}.csv``, MIT; shipped beside the repo
as ``validation/vtrain_a100_{single,multi}_node.csv``): columns ``# GPUs, global batch, micro
batch, hidden size, attention heads, # layers, sequence length, tensor parallelism, data
parallelism, pipeline parallelism, iteration time (ms)``; the multi-node file starts with
``Parameters (billion)``. The setup follows vTrain's validation configs
(``config/validation/{single,multi}/*.json`` and ``src/config.py``): A100, fp16, activation
checkpointing of every layer (``use_checkpoint: true`` → ``recompute="full"``), 1F1B, no gradient
bucketing (``use_gradient_bucket: false`` → no overlap of the data-parallel all-reduce), 8 GPUs
per node, 800 Gbit/s per node between nodes, GPT-2 vocabulary 50,257 — padded as
Megatron-DeepSpeed pads it, to a multiple of 128 × tp (``_vocab_size_with_padding``) —,
Megatron's default dropout 0.1, and Megatron's blocking pipeline sends (``blocking_p2p``:
``p2p_communication._communicate`` waits on its ``batch_isend_irecv`` requests and calls
``torch.cuda.synchronize()``, so each activation or gradient transfer delays its sender), and its
data parallelism Megatron's: gradients reduced in place in one contiguous buffer (``dp_impl="megatron"``). The micro-batch size is the measured row's (vTrain's simulator
replaces it by global/dp when pp = 1; Megatron ran the listed value). Rows with fewer
micro-batches than pipeline stages (96 single-node rows) get ``schedule="gpipe"``: Megatron's
1F1B degenerates to GPipe's order there.

Which A100: the configs say only ``"gpu_name": "A100"``. The default cluster uses the 80 GB part
(``a100-sxm4-80gb``): several multi-node rows (e.g. 18.4B at tp 1, pp 8: 2.3 B parameters per GPU,
41 GB of weights, gradients and Adam states alone without ZeRO) do not fit in 40 GB. Pass
``gpu="a100-sxm4-40gb"`` to try the other.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from mindpipe.traces.builtin import BUILTIN_CLUSTERS, load_cluster
from mindpipe.traces.config import Cluster, Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.reading import VTRAIN_CSV, parse_float, parse_int, read_headed_csv

T = TypeVar("T")

COLUMNS = ("# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers", "sequence length",
           "tensor parallelism", "data parallelism", "pipeline parallelism", "iteration time (ms)")
MULTI_PREFIX = "Parameters (billion)"
VOCAB = 50257
VOCAB_MULTIPLE = 128  # Megatron --make-vocab-size-divisible-by default
CLUSTER_NAME = "vtrain-a100"
GPUS_PER_NODE = int(BUILTIN_CLUSTERS[CLUSTER_NAME]["gpus_per_node"])
INTER_NODE_GBPS = float(BUILTIN_CLUSTERS[CLUSTER_NAME]["inter_node_bandwidth_Gbps"])
DROPOUT = 0.1
DEFAULT_GPU = "a100-sxm4-80gb"


@dataclass(frozen=True)
class VTrainRow:
    """One measured configuration.

    Attributes:
        model, cluster, plan: MindPipe contracts for the run.
        measured_iteration_time_s: Published iteration time.
        source: ``<file>:<line>`` of the row.
        stated_params_billion: The multi-node file's parameter count (None for single-node).
    """

    model: Model
    cluster: Cluster
    plan: Plan
    measured_iteration_time_s: float
    source: str
    stated_params_billion: float | None = None


def padded_vocab(vocab: int, tp: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Megatron's padded vocabulary: the next multiple of ``multiple × tp``."""
    step = multiple * tp
    return -(-vocab // step) * step


# Largest value each column may hold: the contract limits where one applies (traces.limits.LIMITS).
_COLUMN_LIMITS = {
    "# GPUs": "devices", "global batch": "global_batch_size", "micro batch": "micro_batch_size",
    "hidden size": "hidden_size", "attention heads": "num_heads", "# layers": "num_layers",
    "sequence length": "seq_len", "tensor parallelism": "devices", "data parallelism": "devices",
    "pipeline parallelism": "devices",
}
MAX_ITERATION_MS = 1e9  # 11.6 days per iteration: past any measurement


def _int(text: str, where: str, column: str) -> int:
    return parse_int(text, where, column, 1, int(limit(_COLUMN_LIMITS[column])))


def _row(cells: dict[str, str], where: str, gpu: str) -> VTrainRow:
    v = {c: _int(cells[c], where, c) for c in COLUMNS[:-1]}
    ms = parse_float(cells["iteration time (ms)"], where, "iteration time (ms)", 0.0, MAX_ITERATION_MS)
    if not ms > 0:
        raise ContractError(where, "iteration time (ms)", f"iteration time {ms} must be > 0")
    tp, dp, pp, gpus = v["tensor parallelism"], v["data parallelism"], v["pipeline parallelism"], v["# GPUs"]
    if tp * dp * pp != gpus:
        raise ContractError(where, "# GPUs", f"tp×dp×pp={tp}×{dp}×{pp} does not equal # GPUs={gpus}")
    per_node = min(GPUS_PER_NODE, gpus)
    if gpus % per_node:
        raise ContractError(where, "# GPUs", f"# GPUs={gpus} does not fill whole {GPUS_PER_NODE}-GPU nodes")
    try:
        model = Model(kind="gpt", num_layers=v["# layers"], hidden_size=v["hidden size"], num_heads=v["attention heads"],
                      seq_len=v["sequence length"], vocab_size=padded_vocab(VOCAB, tp), dropout=DROPOUT, tie_embeddings=True,
                      name=f"vtrain-h{v['hidden size']}-L{v['# layers']}")
        # The built-in cluster entry of these runs' machines (traces.builtin.BUILTIN_CLUSTERS).
        cluster = load_cluster(f"{CLUSTER_NAME}:{gpus // per_node}x{per_node}")
        if gpu != cluster.gpu:
            cluster = dataclasses.replace(cluster, gpu=gpu)
        micro = v["global batch"] // (v["micro batch"] * dp)
        # Megatron's 1F1B warms up min(pp − rank − 1, m) forwards, so with fewer micro-batches
        # than stages it runs all forwards, then all backwards on the first ranks: GPipe's order
        # and makespan. MindPipe's 1f1b requires m >= pp, hence gpipe for those rows.
        schedule = "1f1b" if micro >= pp else "gpipe"
        plan = Plan(dp=dp, tp=tp, pp=pp, micro_batch_size=v["micro batch"], global_batch_size=v["global batch"],
                    schedule=schedule, recompute="full", precision="fp16", overlap_grad_reduce=False,
                    blocking_p2p=True, dp_impl="megatron")
        check_plan(plan, model, cluster, source=where)
    except ContractError as e:
        raise ContractError(where, e.key, e.rule) from None
    stated = parse_float(cells[MULTI_PREFIX], where, MULTI_PREFIX, 0.0, 1e6) if MULTI_PREFIX in cells else None
    return VTrainRow(model, cluster, plan, ms / 1e3, where, stated)


def load_vtrain(path: str | Path, gpu: str = DEFAULT_GPU) -> list[VTrainRow]:
    """Read a vTrain ground-truth CSV (single- or multi-node layout; header checked).

    Raises:
        ContractError: naming ``<file>:<line>`` and the column for a bad header or row.
    """
    def header_for(seen: list[str]) -> list[str]:  # the multi-node layout adds a column (first, as published)
        return [MULTI_PREFIX, *COLUMNS] if MULTI_PREFIX in seen else list(COLUMNS)

    return [_row(cells, where, gpu) for where, cells in
            read_headed_csv(path, VTRAIN_CSV, header_for, max_rows=int(limit("vtrain_rows")))]


def split_fit_holdout(rows: Sequence[T], seed: int = 0, fit_fraction: float = 0.5) -> tuple[list[T], list[T]]:
    """Deterministic random split: (fit rows, hold-out rows), at most half for fitting.

    Args:
        rows: Any sequence (kept in its original order inside each part).
        seed: Seed of the shuffle (``random.Random(seed)``).
        fit_fraction: Share for fitting, in (0, 0.5]; ``floor(n · fit_fraction)`` rows.

    Raises:
        ContractError: ``fit_fraction`` outside (0, 0.5].
    """
    if not 0.0 < fit_fraction <= 0.5:
        raise ContractError("split", "fit_fraction", f"fit_fraction={fit_fraction} must be in (0, 0.5]")
    idx = list(range(len(rows)))
    random.Random(seed).shuffle(idx)
    chosen = set(idx[: int(len(rows) * fit_fraction)])
    return [r for i, r in enumerate(rows) if i in chosen], [r for i, r in enumerate(rows) if i not in chosen]


__all__ = ["COLUMNS", "VTrainRow", "load_vtrain", "padded_vocab", "split_fit_holdout"]
