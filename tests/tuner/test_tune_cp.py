"""``tune --search cp``: context parallelism searched on request (a plan key the executor runs)."""

from __future__ import annotations

import json

import pytest
from mindpipe.simulator.api import simulate
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.what_if import what_if_used
from mindpipe.tuner.api import build_space, tune
from mindpipe.tuner.keys import plan_of, point_key
from mindpipe.tuner.rules import Rule
from mindpipe.tuner.space import SearchSpace
from mindpipe.tuner.sweep import SweepConfig

MODEL, CLUSTER = load_model("gpt-mini"), load_cluster("cpu:1x4")


def test_cp_splits_the_data_parallel_devices_only_when_searched() -> None:
    plain = SearchSpace(MODEL, CLUSTER, [16])
    assert {p["cp"] for p in plain.points} == {1}
    wide = SearchSpace(MODEL, CLUSTER, [16], search=("cp",))
    assert {p["cp"] for p in wide.points} == {1, 2, 4}
    for p in wide.points:
        plan = plan_of(p)
        assert plan.world_size == CLUSTER.world_size, p
        if p["cp"] > 1:  # the Plan's cp rule: FlashAttention
            assert p["flash_attention"] and what_if_used(plan) == [], p
    # cp = 1 is weighed with the same attention kernels as cp > 1 (and without them, as before).
    assert {p["flash_attention"] for p in wide.points if p["cp"] == 1} == {False, True}
    # Without cp every point of the plain space is in the wide one, under the same identity.
    assert {point_key(p) for p in plain.points} <= {point_key(p) for p in wide.points}
    assert all('"cp"' not in point_key(p) for p in plain.points)


def test_both_kv_exchanges_are_searched_where_cp_exchanges_kv_and_the_executor_runs_both() -> None:
    from mindpipe.tuner.keys import parse_what_if

    wide = SearchSpace(MODEL, CLUSTER, [16], search=("cp",))
    assert {p["cp_comm_type"] for p in wide.points if p["cp"] > 1} == {"allgather", "p2p"}
    assert {p["cp_comm_type"] for p in wide.points if p["cp"] == 1} == {"allgather"}  # no K/V exchange
    assert all(what_if_used(p) == [] for p in wide.points)
    pinned = SearchSpace(MODEL, CLUSTER, [16], search=("cp",), fixes={"cp_comm_type": "allgather"})
    assert sum(p["cp"] > 1 for p in wide.points) == 2 * sum(p["cp"] > 1 for p in pinned.points)
    # Stored points from before the key existed (all allgather) resume as the same points.
    p = next(p for p in pinned.points if p["cp"] > 1)
    assert point_key({k: v for k, v in p.items() if k != "cp_comm_type"}) == point_key(p)
    with pytest.raises(ContractError, match="not a what-if knob"):
        parse_what_if("cp_comm_type")


def test_gradient_replicas_not_dp_decide_whether_zero_matters() -> None:
    space = SearchSpace(MODEL, CLUSTER, [16], fixes={"cp": 4, "tp": 1, "pp": 1}, search=("cp",))
    assert {p["dp"] for p in space.points} == {1}
    assert {p["zero_stage"] for p in space.points} == {0, 1, 2, 3}  # dp 1 but dp·cp 4 replicas


def test_a_pinned_cp_without_flash_attention_is_counted_under_its_rule() -> None:
    space = SearchSpace(MODEL, CLUSTER, [16], fixes={"cp": 2, "flash_attention": False}, search=("cp",))
    assert space.size == 0 and Rule.CONTEXT_PARALLEL in space.rejected
    assert "flash_attention" in Rule.CONTEXT_PARALLEL.text


def test_a_trace_cannot_tune_cp() -> None:
    from mindpipe.traces.data import load_shipped_trace

    with pytest.raises(ContractError, match="a trace's layers ran whole sequences"):
        build_space(MODEL, CLUSTER, 16, None, ("balanced",), None, load_shipped_trace("gpt-mini.cpu"), search="cp")


def test_tune_returns_a_cp_plan_priced_as_simulate_prices_it(tmp_path) -> None:
    # --fix cp=2 pins it without --search, like any plan key.
    outcome = tune(MODEL, CLUSTER, out=tmp_path, global_batch=16, fixes=["cp=2", "tp=1", "pp=1"],
                   config=SweepConfig(budget=4, workers=1), plots=False)
    info = outcome.summary.to_dict()
    best = info["best_plan"]
    assert best["cp"] == 2 and best["dp"] == 2 and best["flash_attention"] is True
    assert info["what_if"]["best_plan_uses"] == []
    saved = json.loads((tmp_path / "best_plan.json").read_text())
    assert saved["cp"] == 2 and saved["made_for"]["what_if"] == []
    again = simulate(MODEL, CLUSTER, plan_of({k: v for k, v in best.items() if k not in ("partition", "made_for")},
                                             partition=best["partition"]))
    assert info["best_value"] == pytest.approx(again.throughput_samples_per_s, rel=1e-9)


def test_the_cli_says_what_search_opened(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from mindpipe.cli import main

    assert main(["tune", "--model", "gpt-mini", "--cluster", "cpu:1x4", "--search", "cp", "--budget", "3", "--workers",
                 "1", "--quiet", "--no-plots", "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "also searched    cp = 1, 2, 4 (--search)" in out
    assert "what-if knobs    none searched: every plan is one the executor runs" in out
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert summary["search"] == {"cp": [1, 2, 4]}
