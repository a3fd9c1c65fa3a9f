"""The per-operator bound benchmark's memory arithmetic (``benchmarks/opmem_bound.py``)."""

from __future__ import annotations

import pytest
from mindpipe.simulator.memory import activation_bytes_per_layer
from mindpipe.traces.builtin import load_cluster
from mindpipe.traces.config import Model, Plan
from mindpipe.tuner.materialize import Problem

from .conftest import load_benchmark

bound = load_benchmark("opmem_bound")  # it imports its sibling scripts

MODEL = Model(kind="gpt", num_layers=8, hidden_size=1024, num_heads=16, seq_len=512, vocab_size=50257, dropout=0.1)


@pytest.mark.parametrize(("tp", "sp", "per_sbh"), [(1, False, 18.0), (8, True, 18.0 / 8), (8, False, 4 + 14 / 8)])
def test_no_gemm_rerun_bytes_counts_korthikanti_tensors(tp: int, sp: bool, per_sbh: float) -> None:
    """Block input and LN2 input (sequence-sharded only under SP), Q, K, V and the GeLU input (split
    over t): 18·s·b·h at t = 1, bf16, f = 4h."""
    plan = Plan(dp=1, tp=tp, pp=1, micro_batch_size=2, global_batch_size=2, sequence_parallel=sp)
    sbh = MODEL.seq_len * 2 * MODEL.hidden_size
    assert bound.no_gemm_rerun_bytes(MODEL, plan) == pytest.approx(per_sbh * sbh)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_no_gemm_rerun_lies_between_full_and_selective(tp: int) -> None:
    """It keeps more than a re-run block's checkpoint and less than selective recompute does."""
    plan = Plan(dp=1, tp=tp, pp=1, micro_batch_size=2, global_batch_size=2)
    mine = bound.no_gemm_rerun_bytes(MODEL, plan)
    assert activation_bytes_per_layer(MODEL, plan, policy="full") < mine
    assert mine < activation_bytes_per_layer(MODEL, plan, policy="selective")


def test_head_bound_is_the_last_micro_batch_that_fits() -> None:
    """At the bound the last stage fits its head and the least it can hold of blocks; one more sample does not."""
    model = next(iter(bound.SETUPS.values()))[0]  # the GPT-2-XL shape
    problem = Problem(model, load_cluster("a100-sxm4-40gb:1x8"))
    base = {"dp": 1, "tp": 1, "pp": 8, "partitioner": "vpipe", "schedule": "1f1b", "recompute": "none"}
    top = bound.head_bound(problem, base, 8, 400)
    assert 0 < top < 400
    sim = problem.simulator()
    for mbs, fits in ((top, True), (top + 1, False)):
        last = sim.stage_budgets(Plan(dp=1, tp=1, pp=8, micro_batch_size=mbs, global_batch_size=8 * mbs))[-1]
        least = min(last.total_bytes([p], [part]) for p in ("swap", "full") for part in ("whole", "mlp"))
        assert (least <= last.capacity_bytes) is fits
