"""``Plan.fused_head_loss`` in the executor: the last stage's forward ends in the loss, the LM head's
GEMM fused into it piece by piece (:class:`mindpipe.traces.torch_head_loss.LinearCrossEntropy`).

Parity: pp2 1F1B, interleaved pp2, zero-bubble pp2 (``zb_h1``, ``zbv``), dp2 under ZeRO-3 (the head gathered and resharded by FSDP2
with the stage), a Llama under dp2 ZeRO-1 and the vocabulary-parallel head under tp2 (with and
without sequence parallelism, on an uneven 511-token vocabulary) reproduce the single process's
losses within 1e-5, fused and unfused. Memory: every rank's accounted peak (:mod:`mindpipe.executor.memory_account`)
is the simulator's within 1 %, and under bf16 the last stage no longer holds the logits
(d·s·b·V per micro-batch) that ``loss_chunks`` alone keeps.
"""

from __future__ import annotations

from typing import Any

import pytest
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.trace import Trace

from .conftest import TINY, assert_layer_times, run_plan
from .test_exec_memory_runs import assert_memory_matches_simulator
from .test_exec_parity import assert_parity, reference

# V = 512: the loss's tensors are the largest the last stage holds.
WIDE: dict[str, Any] = {**TINY, "vocab_size": 512, "name": "tiny4-v512"}
# V = 511 over tp 2: rows 0..255 and 256..510, an uneven vocabulary as GPT-2's.
ODD: dict[str, Any] = {**TINY, "vocab_size": 511, "name": "tiny4-v511"}
LLAMA: dict[str, Any] = {"kind": "llama", "num_layers": 4, "hidden_size": 32, "num_heads": 4, "num_kv_heads": 2,
                         "ffn_hidden_size": 64, "seq_len": 16, "vocab_size": 512, "name": "llama-tiny4-v512"}
FUSED = {"precision": "fp32", "loss_chunks": 4, "fused_head_loss": True}
PLANS = {
    "pp2_1f1b": ({"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, **FUSED}, WIDE),
    # Zero-bubble: the fused loss's backward takes the head's weight gradient in I; W has none of it.
    "pp2_zb_h1": ({"pp": 2, "schedule": "zb_h1", "micro_batch_size": 2, "global_batch_size": 8, **FUSED}, WIDE),
    "pp2_zbv": ({"pp": 2, "schedule": "zbv", "virtual_stages": 2, "micro_batch_size": 1, "global_batch_size": 4,
                 **FUSED}, WIDE),
    "pp2_interleaved": ({"pp": 2, "virtual_stages": 2, "schedule": "interleaved_1f1b", "micro_batch_size": 1,
                         "global_batch_size": 4, **FUSED}, WIDE),
    "dp2_zero3": ({"dp": 2, "zero_stage": 3, "micro_batch_size": 2, "global_batch_size": 8, **FUSED}, WIDE),
    "llama_dp2_zero1": ({"dp": 2, "zero_stage": 1, "micro_batch_size": 2, "global_batch_size": 8, **FUSED,
                         "loss_chunks": 3}, LLAMA),
    "tp2": ({"tp": 2, "micro_batch_size": 2, "global_batch_size": 8, **FUSED}, ODD),
    "tp2_sequence_parallel": ({"tp": 2, "sequence_parallel": True, "micro_batch_size": 2, "global_batch_size": 8,
                               **FUSED}, ODD),
}


def _launched(tmp, plan: dict[str, Any], model: dict[str, Any]) -> Trace:
    res = run_plan(tmp, plan, Plan(**plan).world_size, model=model)
    assert res.returncode == 0, res.stderr[-4000:]
    trace = Trace.load(tmp / "measured.json")
    assert_layer_times(trace)  # the head's segments included: its GEMM runs inside the last stage's F
    return trace


def _unfused(plan: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in plan.items() if k != "fused_head_loss"}


@pytest.mark.parametrize("name", list(PLANS))
def test_fused_head_loss_parity_and_memory(tmp_path, name):
    plan, model = PLANS[name]
    trace = _launched(tmp_path, plan, model)
    assert trace.measurement.plan.fused_head_loss  # measured.json records the key
    assert_parity(trace.measurement.losses, reference(plan, model))
    assert_parity(trace.measurement.losses, reference(_unfused(plan), model))
    assert_memory_matches_simulator(trace, model, rel=0.01)


def test_bf16_last_stage_drops_the_logits(tmp_path):
    """pp2 1F1B under bf16: against ``loss_chunks`` alone, the last stage's measured activations drop
    by the bf16 logits, 2·s·b·V bytes; the first stage's do not change; losses agree to bf16 rounding."""
    base = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "precision": "bf16", "loss_chunks": 4}
    traces = []
    for fused in (False, True):
        (tmp_path / str(fused)).mkdir()
        traces.append(_launched(tmp_path / str(fused), {**base, "fused_head_loss": fused}, WIDE))
    chunked, fused_mem = ({r.pp_rank: r.memory for r in t.measurement.ranks} for t in traces)
    logits = Model(**WIDE).seq_len * base["micro_batch_size"] * WIDE["vocab_size"]
    assert chunked[0].activations_bytes == fused_mem[0].activations_bytes  # type: ignore[union-attr]
    assert chunked[1].activations_bytes - fused_mem[1].activations_bytes == 2 * logits  # type: ignore[union-attr]
    for t in traces:
        assert_memory_matches_simulator(t, WIDE, rel=0.02)
    a, b = (t.measurement.losses for t in traces)
    assert max(abs(x - y) / y for x, y in zip(a, b, strict=True)) <= 1e-4

