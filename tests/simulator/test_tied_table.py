"""A tied LM head (``tie_embeddings``) under pipeline parallelism: the last stage holds a copy of
the token table and the two copies' gradients are all-reduced before the step
(:func:`mindpipe.traces.layout.tied_table_ranks`). The simulator prices the copy's memory and the
exchange; one stage holds the one table and exchanges nothing."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.costs import layer_params
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Plan
from mindpipe.traces.layout import tied_table_ranks

TIED = load_model("llama3.2-3b")
UNTIED = dataclasses.replace(TIED, tie_embeddings=False)
CLUSTER = load_cluster("h100-sxm5-80gb:8x2")
BASE = dict(micro_batch_size=1, global_batch_size=64, precision="bf16", flash_attention=True, zero_stage=1)


def _plan(**kw: object) -> Plan:
    return Plan(**{**BASE, **kw})  # type: ignore[arg-type]


def test_the_rule_names_the_two_ranks_only_when_stages_differ() -> None:
    assert tied_table_ranks(_plan(dp=16), TIED) is None
    assert tied_table_ranks(_plan(dp=4, pp=4), UNTIED) is None
    assert tied_table_ranks(_plan(dp=4, pp=4), TIED) == (0, 3)
    assert tied_table_ranks(_plan(dp=8, pp=2, schedule="zbv", virtual_stages=2), TIED) == (0, 0)
    assert tied_table_ranks(_plan(dp=8, pp=2, schedule="interleaved_1f1b", virtual_stages=2), TIED) == (0, 1)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_last_stage_holds_a_copy_of_the_table(tp: int) -> None:
    h, v = TIED.hidden_size, TIED.vocab_size
    one = dict((n, k) for n, _, k in layer_params(TIED, tp, _plan(dp=16 // tp, tp=tp)))
    two = dict((n, k) for n, _, k in layer_params(TIED, tp, _plan(dp=8 // tp, tp=tp, pp=2)))
    assert one["lm_head"] == 0 and two["lm_head"] == -(-v // tp) * h == two["embedding"]


def test_memory_is_the_untied_models_on_two_stages_and_less_on_one() -> None:
    two = _plan(dp=8, pp=2)
    tied, untied = Simulator(TIED, CLUSTER).memory(two), Simulator(UNTIED, CLUSTER).memory(two)
    assert [m.total_bytes for m in tied] == pytest.approx([m.total_bytes for m in untied], rel=1e-12)
    one = _plan(dp=16)
    saved = Simulator(UNTIED, CLUSTER).memory(one)[0].weights_bytes - Simulator(TIED, CLUSTER).memory(one)[0].weights_bytes
    assert saved == pytest.approx(TIED.vocab_size * TIED.hidden_size * 2, rel=1e-9)  # bf16 weights


@pytest.mark.parametrize("kw, ranks", [(dict(dp=8, pp=2), {0, 1}), (dict(dp=4, pp=4), {0, 3})])
def test_the_two_ranks_exchange_their_shards_before_the_step(kw: dict, ranks: set[int]) -> None:
    plan = _plan(**kw)
    tied = Simulator(TIED, CLUSTER).run(plan, timeline=True)
    untied = Simulator(UNTIED, CLUSTER).run(plan)
    events = [e for e in tied.timeline or [] if e.name == "tied table all-reduce"]
    assert {e.rank for e in events} == ranks
    exchange = max(e.end_s - e.start_s for e in events)
    # A ZeRO-1 shard of the fp32 gradient of the 128256 × 3072 table, over NVLink: milliseconds.
    assert 1e-4 < exchange < 0.05
    opt = [e for e in tied.timeline or [] if e.name == "optimizer" and e.rank in ranks]
    assert all(o.start_s >= max(e.end_s for e in events) - 1e-12 for o in opt)
    assert untied.iteration_time_s < tied.iteration_time_s <= untied.iteration_time_s + exchange * (1 + 1e-3)


def test_one_rank_holding_both_stages_exchanges_nothing() -> None:
    plan = _plan(dp=8, pp=2, schedule="zbv", virtual_stages=2)
    res = Simulator(TIED, CLUSTER).run(plan, timeline=True)
    assert not [e for e in res.timeline or [] if e.name == "tied table all-reduce"]
    assert res.iteration_time_s == Simulator(UNTIED, CLUSTER).run(plan).iteration_time_s
