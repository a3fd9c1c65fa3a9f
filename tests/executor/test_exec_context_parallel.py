"""Context parallelism in the executor: each sequence split over cp ranks (two balanced chunks each),
K and V all-gathered for the attention (:mod:`mindpipe.traces.torch_context_parallel`). Plans with
cp train to the single-process losses within 1e-5, GPT and Llama (GQA, rotary positions), alone and
composed with dp, tp (sequence parallel), pp, ZeRO-3 and each recompute policy."""

from __future__ import annotations

from typing import Any

import pytest
from mindpipe.traces.config import Plan
from mindpipe.traces.trace import Trace

from .conftest import TINY, assert_layer_times, run_plan
from .test_exec_llama import LLAMA
from .test_exec_parity import assert_parity, reference

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
}


def _run(tmp, plan: dict[str, Any], model: dict[str, Any], *extra: str) -> Trace:
    res = run_plan(tmp, plan, Plan(**plan).world_size, *extra, model=model)
    assert res.returncode == 0, res.stderr[-4000:]
    trace = Trace.load(tmp / "measured.json")
    assert_layer_times(trace)
    return trace


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_context_parallel_parity(tmp_path, name: str) -> None:
    plan, model = PLANS[name]
    trace = _run(tmp_path, plan, model)
    assert_parity(trace.measurement.losses, reference(plan, model))
    p = Plan(**plan)
    assert sorted(r.cp_rank for r in trace.measurement.ranks) == sorted(list(range(p.cp)) * (p.world_size // p.cp))
