"""Context parallelism in the executor: each sequence split over cp ranks (two balanced chunks each),
K and V all-gathered for the attention or passed round a ring (``cp_comm_type=p2p``;
:mod:`mindpipe.traces.torch_context_parallel`). Plans with
cp train to the single-process losses within 1e-5, GPT and Llama (GQA, rotary positions), alone and
composed with dp, tp (sequence parallel), pp, ZeRO-3 and each recompute policy."""

from __future__ import annotations

from typing import Any

import pytest
from mindpipe.traces.config import Plan
from mindpipe.traces.trace import Trace

from .conftest import STEPS, TINY, assert_layer_times, run_plan
from .test_exec_llama import LLAMA
from .test_exec_parity import assert_parity, reference

# Parity runs 4 steps (each a forward, backward and AdamW update that must match): ten 2-8-rank runs
# are this file's cost, and the resume test keeps the suite's 8.
PARITY_STEPS = 4
BASE = {"micro_batch_size": 2, "global_batch_size": 8, "precision": "fp32", "flash_attention": True}
PLANS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gpt-cp2": ({**BASE, "cp": 2}, TINY),
    "gpt-cp4-selective": ({**BASE, "cp": 4, "recompute": "selective"}, TINY),
    "gpt-dp2-cp2-zero3": ({**BASE, "dp": 2, "cp": 2, "zero_stage": 3}, TINY),
    "gpt-tp2-sp-cp2-full": ({**BASE, "tp": 2, "cp": 2, "sequence_parallel": True, "recompute": "full"}, TINY),
    "gpt-pp2-cp2-interleaved": ({**BASE, "pp": 2, "cp": 2, "virtual_stages": 2, "micro_batch_size": 1,
                                 "schedule": "interleaved_1f1b"}, TINY),
    "gpt-cp2-layer-policies": ({**BASE, "cp": 2, "layer_memory_policy": ["nongemm", "swap", "selective", "recompute"]},
                               TINY),
    "llama-cp2": ({**BASE, "cp": 2}, LLAMA),
    "llama-tp2-cp2-gqa": ({**BASE, "tp": 2, "cp": 2, "zero_stage": 1}, LLAMA),
    # Transformer Engine's ring (traces.torch_context_parallel._RingAttention): K/V passed rank to rank.
    # (test_exec_ring_attention.py checks the ring itself on 2, 3 and 4 ranks.)
    "gpt-pp2-cp2-ring-selective": ({**BASE, "pp": 2, "cp": 2, "cp_comm_type": "p2p", "recompute": "selective"}, TINY),
    "llama-tp2-cp2-ring-gqa": ({**BASE, "tp": 2, "cp": 2, "cp_comm_type": "p2p", "zero_stage": 1}, LLAMA),
}


def test_a_rank_holds_two_balanced_chunks_at_their_global_positions() -> None:
    import torch
    from mindpipe.executor.distributed import mesh_shape
    from mindpipe.traces.torch_context_parallel import ContextShard

    seq = torch.arange(16).view(1, 16)
    shares = [ContextShard(None, r, 4).take(seq) for r in range(4)]
    assert [s.tolist()[0] for s in shares] == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    for r, share in enumerate(shares):  # the positions are the tokens' own
        assert ContextShard(None, r, 4).positions(4, torch.device("cpu")).tolist() == share.tolist()[0]
    # cp sits right inside dp (Megatron-core's tp-cp-dp-pp), whatever the rank order.
    assert mesh_shape(Plan(dp=2, tp=2, pp=2, cp=2, global_batch_size=2, flash_attention=True)) == \
        ((2, 2, 2, 2), ("pp", "dp", "cp", "tp"))
    assert mesh_shape(Plan(dp=2, tp=2, cp=4, global_batch_size=2, flash_attention=True, rank_order="dp-tp-pp"))[1] == \
        ("pp", "tp", "dp", "cp")
    assert mesh_shape(Plan(dp=2, global_batch_size=2))[1] == ("pp", "dp", "tp")  # no cp axis without cp


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_a_rank_attends_each_query_chunk_over_the_keys_up_to_it_as_causal_attention_does(cp: int) -> None:
    """One kernel per query chunk over a prefix of the keys: every rank's rows of causal attention (GQA)."""
    import torch
    import torch.nn.functional as F
    from mindpipe.traces.torch_context_parallel import ContextShard, _attend

    gen = torch.Generator().manual_seed(cp)
    q, k, v = (torch.randn(2, n, 8 * cp, 8, dtype=torch.float64, generator=gen) for n in (4, 2, 2))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    for r in range(cp):
        shard = ContextShard(None, r, cp)
        torch.testing.assert_close(_attend(shard.take(q, 2), k, v, shard, 0.0, True), shard.take(whole, 2),
                                   rtol=0, atol=1e-12)


def _run(tmp, plan: dict[str, Any], model: dict[str, Any], *extra: str, steps: int = STEPS) -> Trace:
    tmp.mkdir(parents=True, exist_ok=True)
    res = run_plan(tmp, plan, Plan(**plan).world_size, *extra, model=model, steps=steps)
    assert res.returncode == 0, res.stderr[-4000:]
    trace = Trace.load(tmp / "measured.json")
    assert_layer_times(trace)
    return trace


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_context_parallel_parity(tmp_path, name: str) -> None:
    plan, model = PLANS[name]
    trace = _run(tmp_path, plan, model, steps=PARITY_STEPS)
    assert_parity(trace.measurement.losses, reference(plan, model, steps=PARITY_STEPS), PARITY_STEPS)
    p = Plan(**plan)
    assert sorted(r.cp_rank for r in trace.measurement.ranks) == sorted(list(range(p.cp)) * (p.world_size // p.cp))


@pytest.mark.slow
def test_a_cp_run_resumes_exactly_and_says_what_it_did_not_measure(tmp_path) -> None:
    plan = {**BASE, "cp": 2, "zero_stage": 1}
    ckpt = str(tmp_path / "ckpt")
    full = _run(tmp_path / "full", plan, TINY, "--checkpoint-dir", ckpt, "--checkpoint-every", "4", "--profile-step", "3")
    assert_parity(full.measurement.losses, reference(plan, TINY))
    # The K/V all-gathers (cp) and the gradient reduction (dp·cp) share op names: the axis is not guessed.
    collectives = [c for c in full.measurement.comms if c.kind == "collective"]
    assert collectives and {c.axis for c in collectives} == {"unknown"}
    # A rank's gradient is over part of each sequence: no noise-scale estimate is made from it.
    assert full.measurement.gradient_noise is None
    resumed = _run(tmp_path / "resumed", plan, TINY, "--checkpoint-dir", ckpt, "--resume-from", "4")
    assert [s.step for s in resumed.measurement.steps] == list(range(5, STEPS + 1))
    assert resumed.measurement.losses == full.measurement.losses[4:]  # bit for bit
