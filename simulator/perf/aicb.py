"""Compare the GPU compute model with AICB's per-layer A100 timings (issue 4, point 3).

AICB workload files (``aliyun/aicb: workload/simAI/model_workload/``, read with
:func:`mindpipe.traces.importers.aicb.import_aicb`) give, per Megatron sub-layer row, forward,
input-gradient and weight-gradient compute times in ns. What is comparable with MindPipe's GPT
model, and how:

* The unit is one transformer block = the file's two (or, with sequence parallelism, four)
  consecutive layer rows; the per-row split inside a block is AICB's own and does not follow the
  GEMM boundaries (e.g. the GPT-175B "mlp_norm" forward is faster than its MLP GEMMs at peak).
  Backward is compared as input-gradient + weight-gradient: AICB repeats the same number in
  both columns, so only their sum carries information.
* The shape of each file (hidden size, heads, sequence length) is fixed by its communication
  sizes: a TP all-reduce of b·s·h·2 bytes (s = 2048 in every file).
* LLaMA uses SwiGLU and RMSNorm; our model is GPT-only. The comparable stand-in is the GPT block
  with the same GEMM FLOPs: ffn = 1.5 × LLaMA's ffn (three h×f matrices instead of two).
* AICB's measured kernels use FlashAttention (its AIOB op list names ``atten_flash``), so the
  comparison prices attention as FlashAttention-2.
* Not comparable: the DeepSpeed ZeRO-3 files (whole-model rows of unknown batch and shape) and
  ``aiob_Example.txt`` (per-op statistics of an unstated model).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.importers.aicb import import_aicb
from mindpipe.traces.trace import LayerRecord

# Shapes of the comparable AICB files; s·h from the files' TP all-reduce sizes (b·s·h·2 bytes).
AICB_CASES: dict[str, dict[str, object]] = {
    "G13B-M1-C01_GPT13B_megatron_tp8_pp1_mbs1_A100.txt": {
        "family": "gpt", "model": {"num_layers": 40, "hidden_size": 5120, "num_heads": 40}, "tp": 8, "sp": False},
    "G13B-M1-C02_GPT13B_megatron_tp8_pp1_mbs1_sp_A100.txt": {
        "family": "gpt", "model": {"num_layers": 40, "hidden_size": 5120, "num_heads": 40}, "tp": 8, "sp": True},
    "G175B-M1-C03_GPT175B_megatron_tp8_pp1_mbs1_A100.txt": {
        "family": "gpt", "model": {"num_layers": 96, "hidden_size": 12288, "num_heads": 96}, "tp": 8, "sp": False},
    "L65B-M1-C05_Llama65B_megatron_tp8_pp1_mbs1_A100.txt": {
        "family": "llama", "model": {"num_layers": 80, "hidden_size": 8192, "num_heads": 64, "ffn_hidden_size": 22016 * 3 // 2},
        "tp": 8, "sp": False},
    "L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt": {
        "family": "llama", "model": {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "ffn_hidden_size": 11008 * 3 // 2},
        "tp": 2, "sp": False},
}
SEQ_LEN = 2048
VOCAB = 50304  # GPT-2's 50,257 padded (Megatron); only the embedding/head rows depend on it
# Row names that make up a transformer block in each file, in order.
_BLOCK_ROWS = ("attention", "mlp")


@dataclass(frozen=True)
class BlockComparison:
    """Measured (AICB, median over the file's blocks) vs predicted seconds for one block."""

    file: str
    family: str
    tp: int
    sequence_parallel: bool
    measured_forward_s: float
    predicted_forward_s: float
    measured_backward_s: float
    predicted_backward_s: float
    flops_forward: float

    @property
    def forward_error(self) -> float:
        """Relative error of the forward, (predicted − measured) / measured."""
        return (self.predicted_forward_s - self.measured_forward_s) / self.measured_forward_s

    @property
    def backward_error(self) -> float:
        """Relative error of the backward (input + weight gradient)."""
        return (self.predicted_backward_s - self.measured_backward_s) / self.measured_backward_s

    @property
    def measured_tflops(self) -> float:
        """Achieved forward TFLOP/s implied by the measurement (model FLOPs of the block)."""
        return self.flops_forward / self.measured_forward_s / 1e12


def case_model(name: str, flash_attention: bool = True) -> tuple[Model, Plan, str]:
    """(GPT model, plan, family) that an AICB file describes (its kernels are FlashAttention's;
    ``flash_attention=False`` prices Megatron's explicit attention instead, for comparison)."""
    case = AICB_CASES[name]
    model = Model(kind="gpt", seq_len=SEQ_LEN, vocab_size=VOCAB, name=name.split("_")[1], **case["model"])  # type: ignore[arg-type]
    tp = int(case["tp"])  # type: ignore[call-overload]
    plan = Plan(tp=tp, micro_batch_size=1, global_batch_size=1, precision="bf16", sequence_parallel=bool(case["sp"]),
                flash_attention=flash_attention)
    return model, plan, str(case["family"])


def _blocks(path: str | Path) -> list[list[LayerRecord]]:
    """The file's Megatron blocks, each a list of its attention and MLP rows in order."""
    trace = import_aicb(path)
    rows = [r for r in trace.layers if any(r.name.startswith(p) for p in _BLOCK_ROWS)]
    # A block starts at an attention row that follows an MLP row (or the first row): with
    # sequence parallelism a block has two attention rows (column, row) then two MLP rows.
    blocks: list[list[LayerRecord]] = []
    for r in rows:
        if r.name.startswith("attention") and (not blocks or blocks[-1][-1].name.startswith("mlp")):
            blocks.append([])
        if blocks:
            blocks[-1].append(r)
    full = [b for b in blocks if any(r.name.startswith("mlp") for r in b)]
    if not full:
        raise ContractError(str(path), "layers", "no attention + mlp row pairs (not a Megatron AICB workload)")
    return full


def measured_blocks(path: str | Path) -> tuple[float, float]:
    """Median (forward, input+weight gradient) seconds per block of an AICB Megatron file."""
    full = _blocks(path)
    fwd = [sum(r.forward_s for r in b) for b in full]
    bwd = [sum(r.backward_input_s + r.backward_weight_s for r in b) for b in full]
    return statistics.median(fwd), statistics.median(bwd)


def measured_parts(path: str | Path) -> dict[str, float]:
    """Median forward seconds of each block's attention rows and MLP rows (AICB's own split)."""
    full = _blocks(path)
    return {part: statistics.median(sum(r.forward_s for r in b if r.name.startswith(part)) for b in full)
            for part in _BLOCK_ROWS}


def compare_file(path: str | Path, compute: GpuComputeModel, flash_attention: bool = True) -> BlockComparison:
    """Predicted vs measured block times for one AICB file (attention priced as FlashAttention, as
    AICB measured it, unless ``flash_attention`` is false)."""
    name = Path(path).name
    model, plan, family = case_model(name, flash_attention)
    mf, mb = measured_blocks(path)
    block = next(c for c in compute.layer_costs(model, plan) if c.kind == "block")
    h, s, t = model.hidden_size, model.seq_len, plan.tp
    flops = (2 * s * (4 * h * h + 2 * h * model.ffn) + 4 * s * s * h) / t
    return BlockComparison(name, family, t, plan.sequence_parallel, mf, block.forward_s, mb,
                           block.backward_input_s + block.backward_weight_s, flops)


def compare_dir(directory: str | Path, compute: GpuComputeModel) -> list[BlockComparison]:
    """:func:`compare_file` for every comparable AICB file present in ``directory``."""
    d = Path(directory)
    return [compare_file(d / n, compute) for n in AICB_CASES if (d / n).is_file()]


__all__ = ["AICB_CASES", "BlockComparison", "case_model", "compare_dir", "compare_file", "measured_blocks", "measured_parts"]
