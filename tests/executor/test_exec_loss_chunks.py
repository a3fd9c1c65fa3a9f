"""``Plan.loss_chunks`` in the executor: the last stage's loss is :func:`mindpipe.traces.torch_gpt.lm_loss`
in the plan's pieces (:func:`~mindpipe.traces.torch_gpt.plan_loss`), on every rank and in the
single-process reference.

Parity: a tiny GPT under pp2 (zb_h1: the split backward's I and W run through the chunked loss's
backward) and under tp2 (sequence parallel) with ``loss_chunks=4`` reproduces the reference's
losses, chunked and unchunked, within 1e-5. Memory: the executor's live-tensor accounting
(``ranks[].memory``, :mod:`mindpipe.executor.memory_account`) of the last stage holds, per
micro-batch, the fp32 log-softmax (4·s·b·V bytes) and nll_loss's fp32 total weight (4 bytes)
unchunked, and the logits in the compute dtype (d·s·b·V, d = 2 under bf16, 4 under fp32)
chunked; the targets are kept either way. Compared here against those closed forms, run against
run, so that the test does not depend on the simulator's memory model of the key
(:func:`mindpipe.simulator.memory.head_logit_bytes`).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from mindpipe.executor.memory_account import MemoryAccount
from mindpipe.executor.stages import build_stage_modules
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.torch_gpt import build_gpt, plan_loss, synthetic_batch

from .conftest import TINY, launched_trace
from .test_exec_parity import RTOL, assert_parity, reference

PP2_ZB = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "zb_h1", "precision": "fp32",
          "loss_chunks": 4}
TP2 = {"tp": 2, "micro_batch_size": 2, "global_batch_size": 8, "sequence_parallel": True, "recompute": "selective",
       "precision": "fp32", "loss_chunks": 4}
# V = 512: the loss's tensors are the largest the last stage keeps; 2·s·b = 64 tokens, 4 pieces of 16.
WIDE: dict[str, Any] = {**TINY, "vocab_size": 512, "name": "tiny4-v512"}
PP2_BF16 = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 8, "schedule": "1f1b", "precision": "bf16"}
NLL_TOTAL_WEIGHT = 4  # the fp32 scalar nll_loss saves next to the log-softmax (unchunked only)


def _logit_elems(model: Model, plan: Plan) -> int:
    return model.seq_len * plan.micro_batch_size * model.vocab_size


def _last_stage_loss_bytes(model: Model, plan: Plan, split: bool = False) -> tuple[int, int]:
    """The last pipeline stage of ``plan`` in the plan's dtype, in process, one micro-batch under the
    executor's accounting: (bytes the loss saved, bytes the backward released — torch's I only, with ``split``)."""
    from torch.distributed.pipelining._backward import stage_backward_input

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[plan.precision]
    mod = build_stage_modules(build_gpt(model, seed=0, dtype=plan.precision), plan, plan.pp - 1)[plan.pp - 1]
    memory = MemoryAccount([mod], torch.device("cpu"), "pipeline rank 1 (stages [1])")
    memory.count_weights()
    x = torch.randn(plan.micro_batch_size, model.seq_len, model.hidden_size, dtype=dtype, requires_grad=True)
    _, y = synthetic_batch(model, plan.global_batch_size, seed=1)  # a micro-batch's rows of the batch, as a schedule splits it
    with memory.saving(1):
        out = mod(x)
        before = memory.terms.activations
        loss = plan_loss(plan)(out, y[:plan.micro_batch_size])
        after_f = memory.terms.activations
        if split:
            stage_backward_input([loss], None, [x], mod.parameters())
        else:
            loss.backward()
        after_b = memory.terms.activations
    return after_f - before, after_f - after_b


@pytest.mark.parametrize("precision,dbytes", [("bf16", 2), ("fp32", 4)])
def test_the_chunked_loss_keeps_the_logits_in_the_compute_dtype(precision, dbytes):
    model = Model(**WIDE)
    plans = [Plan(**{**PP2_BF16, "precision": precision, "loss_chunks": c}) for c in (1, 4)]
    (whole, _), (chunked, _) = (_last_stage_loss_bytes(model, p) for p in plans)
    n = _logit_elems(model, plans[0])
    assert whole - chunked == 4 * n + NLL_TOTAL_WEIGHT - dbytes * n, (whole, chunked)
    targets = chunked - dbytes * n  # the flattened targets, as nll_loss keeps them
    assert 0 < targets <= 8 * plans[0].micro_batch_size * model.seq_len


@pytest.mark.parametrize("chunks", [1, 4])
def test_a_split_backwards_input_pass_frees_the_loss(chunks):
    """torch's I (retain_graph, then the loss detached) frees what the loss kept, chunked or not:
    the simulator's ``after_input_bytes`` (all but the head's logit term) holds for both."""
    model = Model(**WIDE)
    plan = Plan(**{**PP2_BF16, "schedule": "zb_h1", "loss_chunks": chunks})
    saved, released = _last_stage_loss_bytes(model, plan, split=True)
    assert released == saved > 0


def _unchunked(plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` at the default ``loss_chunks`` (1), spelled as test_exec_parity's plans: their references are cached."""
    return {k: v for k, v in plan.items() if k != "loss_chunks"}


def test_the_reference_chunked_is_the_reference_unchunked():
    chunked = reference(PP2_ZB)
    whole = reference(_unchunked(PP2_ZB))
    assert max(abs(a - b) / b for a, b in zip(chunked, whole, strict=True)) <= RTOL


@pytest.mark.parametrize("plan", [PP2_ZB, TP2], ids=["pp2_zb_h1", "tp2_sequence_parallel"])
def test_chunked_loss_parity(tmp_path, plan):
    trace = launched_trace(tmp_path, plan)
    assert trace.measurement.plan.loss_chunks == 4  # measured.json records the key
    assert_parity(trace.measurement.losses, reference(plan))
    assert_parity(trace.measurement.losses, reference(_unchunked(plan)))


def test_launched_bf16_last_stage_holds_less(tmp_path):
    """pp2 1F1B under bf16 (FSDP2 replicate's mixed precision: bf16 compute, fp32 master weights):
    the last stage's measured activations drop from 4·s·b·V (+ nll_loss's scalar) to 2·s·b·V
    bytes, the first stage's do not change."""
    traces = []
    for chunks in (1, 4):
        (tmp_path / str(chunks)).mkdir()
        traces.append(launched_trace(tmp_path / str(chunks), {**PP2_BF16, "loss_chunks": chunks}, WIDE, steps=2))
    whole, chunked = ({r.pp_rank: r.memory for r in t.measurement.ranks} for t in traces)
    assert all(m is not None for m in (*whole.values(), *chunked.values()))
    n = _logit_elems(Model(**WIDE), Plan(**PP2_BF16))
    assert whole[0].activations_bytes == chunked[0].activations_bytes  # type: ignore[union-attr]
    dropped = whole[1].activations_bytes - chunked[1].activations_bytes  # type: ignore[union-attr]
    # Up to the int64 targets' copy (8·s·b) and nll_loss's scalar, which the paths keep differently.
    assert abs(dropped - (4 * n - 2 * n)) <= 8 * n // Model(**WIDE).vocab_size + NLL_TOTAL_WEIGHT, (whole[1], chunked[1])
    # The loss's backward temporaries are counted: two fp32 gradients whole, the bf16 gradient and
    # a piece's fp32 work chunked (mindpipe.simulator.memory.loss_transient_bytes).
    assert whole[1].transient_bytes >= 8 * n  # type: ignore[union-attr]
    assert 2 * n <= chunked[1].transient_bytes < 8 * n  # type: ignore[union-attr]
    a, b = (t.measurement.losses for t in traces)
    assert max(abs(x - y) / y for x, y in zip(a, b, strict=True)) <= 1e-4  # bf16 training, chunked or not


# V = 511 over tp 2: rows 0..255 and 256..510 (torch's Shard(0) split), an uneven vocabulary as GPT-2's.
ODD: dict[str, Any] = {**WIDE, "vocab_size": 511, "name": "tiny4-v511"}
TP2_WIDE = {"tp": 2, "micro_batch_size": 2, "global_batch_size": 8, "sequence_parallel": True, "precision": "fp32"}


@pytest.mark.parametrize("chunks", [1, 4])
def test_tensor_parallel_loss_is_vocabulary_parallel(tmp_path, chunks):
    """Under tp2 each rank's token table, LM head and loss work on its half of the vocabulary
    (Megatron's vocabulary-parallel embedding and cross-entropy,
    :class:`mindpipe.traces.torch_gpt.VocabShard`): the losses are the single process's, and each
    rank's measured peak is the simulator's, whose vocabulary terms are divided by t
    (:func:`mindpipe.simulator.costs.layer_params`, :func:`mindpipe.simulator.memory.logit_count`).
    A rank that gathered the whole logits (or kept the whole table's gradient) would hold ≥ 10 %
    more than predicted here, where they are the largest tensors on the rank."""
    from .test_exec_memory_runs import assert_memory_matches_simulator

    plan = {**TP2_WIDE, "loss_chunks": chunks}
    trace = launched_trace(tmp_path, plan, ODD)
    assert_parity(trace.measurement.losses, reference(plan, ODD))
    assert_memory_matches_simulator(trace, ODD, rel=0.01)
    for r in trace.measurement.ranks:  # torch's Shard(0) split of 511 rows: 256 on rank 0, 255 on rank 1
        assert r.memory is not None and r.memory.gradients_bytes <= r.memory.weights_bytes, r.memory  # at the peak


def test_sequence_parallel_gemms_keep_their_shard_under_recompute_and_swap(tmp_path):
    """The shard-saving column-parallel GEMMs (:mod:`mindpipe.executor.sp_linear`) inside a fully
    recomputed block (its forward runs twice) and a swapped one (the shard goes to the host pool):
    the single process's losses, and the simulator's peak within 1 %."""
    from .test_exec_memory_runs import assert_memory_matches_simulator

    plan = {**TP2_WIDE, "layer_memory_policy": ["recompute", "swap", "keep", "recompute"]}
    trace = launched_trace(tmp_path, plan, ODD)
    assert_parity(trace.measurement.losses, reference(plan, ODD))
    assert_memory_matches_simulator(trace, ODD, rel=0.01)
    assert all(r.memory is not None and r.memory.host_pool_peak_bytes > 0 for r in trace.measurement.ranks)
