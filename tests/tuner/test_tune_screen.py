"""The sweep's memory screen: points the memory model refuses are dropped in the searcher's process.

On a space where most plans cannot fit (a large model on few devices) a sweep used to spend a round
of proposals and evaluations on every such plan; the screen refuses them at a few milliseconds each,
with the very record the evaluation would have made, and BO walks on in its acquisition's order.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.tuner.api import build_space, tune
from mindpipe.tuner.evaluate import evaluate, screen
from mindpipe.tuner.keys import point_key
from mindpipe.tuner.materialize import Problem
from mindpipe.tuner.optimizers import WALK, BayesSearch, GridSearch, RandomSearch
from mindpipe.tuner.records import MemoryCode, Status
from mindpipe.tuner.sweep import SweepConfig

# 11 B parameters on 8 × 40 GB: about two plans in three cannot hold their model states or activations.
TIGHT = ('{"kind":"gpt","num_layers":24,"hidden_size":6144,"num_heads":48,"seq_len":2048,"vocab_size":32000,'
         '"name":"gpt-tight"}')
CLUSTER = "a100-sxm4-40gb:1x8"


@pytest.fixture(scope="module")
def tight():
    model, cluster = load_model(TIGHT), load_cluster(CLUSTER)
    return Problem(model, cluster), build_space(model, cluster, 32, None, ("balanced",))


def test_screen_refuses_exactly_what_the_evaluation_refuses_before_simulating(tight):
    problem, space = tight
    refused = 0
    for i in random.Random(0).sample(range(len(space.points)), 80):
        point = space.points[i]
        rec, full = screen(problem, point), evaluate(problem, point)
        if full.status is Status.OUT_OF_MEMORY and full.code is MemoryCode.ESTIMATE:
            refused += 1
            assert rec is not None and not rec.simulated and not rec.costs_budget
            assert (rec.key, rec.point, rec.status, rec.code, rec.plan, rec.metrics, rec.message) == (
                full.key, full.point, full.status, full.code, full.plan, full.metrics, full.message)
        else:
            assert rec is None, point
    assert 20 <= refused <= 70  # the space has both kinds


def test_searchers_never_propose_a_refused_point(tight):
    bad = set(range(0, 200, 3))

    def refuse(i: int) -> bool:
        return i in bad

    for searcher in (GridSearch(200), RandomSearch(200, 3)):
        got = [i for _ in range(20) for i in searcher.ask(5, refuse)]
        assert len(got) == 100 and not bad & set(got) and len(set(got)) == 100
    points = tight[1].points[:200]
    bo = BayesSearch(points, seed=1, n_initial=4)
    seen: list[int] = []
    while len(seen) < 40:
        batch = bo.ask(2, refuse)
        assert not bad & set(batch)
        bo.tell(batch, [float(points[i]["tp"] * points[i]["pp"] + points[i]["micro_batch_size"]) for i in batch])
        seen += batch
    assert len(set(seen)) == len(seen)


def test_a_long_walk_ends_the_ask_early(tight):
    bo = BayesSearch(tight[1].points, seed=0, n_initial=2)
    first = bo.ask(2)
    bo.tell(first, [1.0, 2.0])
    walked: list[int] = []

    def refuse_all(i: int) -> bool:
        walked.append(i)
        return True

    assert bo.ask(2, refuse_all) == [] and len(walked) == WALK  # the caller tells them, then asks again
    assert not set(walked) & set(bo._remaining)


@pytest.mark.parametrize("optimizer", ["bo", "random"])
def test_a_screened_sweep_stores_and_counts_every_refusal(tmp_path, optimizer):
    asked: list[str] = []

    def counting(problem: Any, point: Any):
        asked.append(point_key(point))
        return evaluate(problem, point)

    cfg = SweepConfig(optimizer=optimizer, seed=2, budget=12, n_initial=4, workers=1)
    outcome = tune(TIGHT, CLUSTER, out=tmp_path / "s", global_batch=32, plots=False, config=cfg, evaluator=counting)
    res = outcome.result
    refused = [r for r in res.records if r.evaluation.code is MemoryCode.ESTIMATE]
    assert refused and res.simulations == 12
    # No refused point reached the evaluator; every record is in the store and the table.
    assert not {r.key for r in refused} & set(asked)
    assert sorted(asked) == sorted(r.key for r in res.records if r.evaluation.code is not MemoryCode.ESTIMATE)
    assert res.infeasible["out_of_memory"] >= len(refused)
    # Without the screen the same sweep evaluates refused points in the evaluator instead.
    asked.clear()
    plain = tune(TIGHT, CLUSTER, out=tmp_path / "p", global_batch=32, plots=False, config=cfg, evaluator=counting,
                 screen=None)
    assert plain.result.simulations == 12
    oom = {r.key for r in plain.result.records if r.evaluation.code is MemoryCode.ESTIMATE}
    assert oom <= set(asked)


class _Interrupt(Exception):
    pass


def test_an_interrupted_screened_bo_sweep_resumes_into_the_same_search(tmp_path):
    cfg = SweepConfig(optimizer="bo", seed=4, budget=12, n_initial=4, workers=1)
    kwargs: dict[str, Any] = dict(global_batch=32, plots=False, config=cfg)
    whole = tune(TIGHT, CLUSTER, out=tmp_path / "whole", **kwargs)
    calls = 0

    def dies_after_5(problem: Any, point: Any):
        nonlocal calls
        if calls == 5:
            raise _Interrupt
        calls += 1
        return evaluate(problem, point)

    with pytest.raises(_Interrupt):
        tune(TIGHT, CLUSTER, out=tmp_path / "cut", evaluator=dies_after_5, **kwargs)
    resumed = tune(TIGHT, CLUSTER, out=tmp_path / "cut", resume=True, **kwargs)
    assert [r.key for r in resumed.result.records] == [r.key for r in whole.result.records]
    assert resumed.result.reused >= 5 and resumed.summary.best_plan == whole.summary.best_plan
