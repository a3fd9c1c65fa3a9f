"""Objectives: per-sample metrics, goodput's statistical efficiency, constraints, the Pareto front."""

from __future__ import annotations

import math
import random

import pytest
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.keys import CLI_ARG_NAMES
from mindpipe.tuner.objectives import Objective, pareto_front, parse_constraint, statistical_efficiency
from mindpipe.tuner.records import Metrics


def test_statistical_efficiency_follows_the_noise_scale():
    # McCandlish et al.: E = E_min (1 + B / B_crit); efficiency is E_min / E.
    assert statistical_efficiency(1024, 1024) == pytest.approx(0.5)
    assert statistical_efficiency(0, 1024) == 1.0
    assert statistical_efficiency(3072, 1024) == pytest.approx(0.25)
    effs = [statistical_efficiency(b, 500) for b in (64, 128, 256, 512, 1024)]
    assert effs == sorted(effs, reverse=True)


def test_derive_and_value_for_every_objective():
    metrics = Metrics(throughput_samples_per_s=200.0, energy_j=5000.0, carbon_gco2=2.0)
    good = Objective("goodput", critical_batch=512).derive(metrics, 512)
    assert metrics.energy_per_sample_j is None  # derive returns a new record
    assert good.energy_per_sample_j == pytest.approx(5000 / 512)
    assert good.carbon_per_sample_g == pytest.approx(2 / 512)
    assert good.goodput_samples_per_s == pytest.approx(100.0)
    assert Objective("throughput").derive(metrics, 512).goodput_samples_per_s is None
    assert Objective("goodput", critical_batch=512).value(good) == pytest.approx(100.0)
    assert Objective("energy").value(good) == pytest.approx(5000 / 512)
    thr, carbon = Objective("throughput"), Objective("carbon")
    assert thr.maximize and not carbon.maximize
    # Losses are ordered like preferences: lower loss = better plan.
    assert thr.loss(300.0) < thr.loss(200.0)
    assert carbon.loss(0.001) < carbon.loss(0.002)
    assert thr.gap(196.0, 200.0) == pytest.approx(0.02)
    assert carbon.gap(0.0102, 0.01) == pytest.approx(0.02)


def test_goodput_prefers_a_smaller_batch_when_throughput_gains_are_small():
    obj = Objective("goodput", critical_batch=256)
    small = obj.derive(Metrics(throughput_samples_per_s=100.0), 128)
    large = obj.derive(Metrics(throughput_samples_per_s=120.0), 1024)
    assert obj.better(obj.value(small), obj.value(large))


def test_constraints():
    c = parse_constraint("carbon_per_sample<=0.5")
    assert (c.metric, c.op, c.bound) == ("carbon_per_sample_g", "<=", 0.5)
    assert c.holds(Metrics(carbon_per_sample_g=0.5)) and not c.holds(Metrics(carbon_per_sample_g=0.51))
    assert not c.holds(Metrics())
    lo = parse_constraint(" throughput >= 1e2 ")
    assert lo.metric == "throughput_samples_per_s" and lo.holds(Metrics(throughput_samples_per_s=100.0))
    obj = Objective("throughput", constraints=[c, lo])
    assert obj.violated(Metrics(carbon_per_sample_g=1.0, throughput_samples_per_s=50.0)) == [str(c), str(lo)]
    # Every metric a constraint may name is a field of the record.
    from mindpipe.tuner.objectives import CONSTRAINT_METRICS
    assert all(hasattr(Metrics(), m) for m in CONSTRAINT_METRICS)
    assert "s.t." in obj.describe()
    for bad in ("carbon<0.5", "speed>=3", "carbon<=abc", ""):
        with pytest.raises(ContractError):
            parse_constraint(bad)
    # every metric is >= 0: an upper bound below 0 is refused before a sweep that could meet nothing
    with pytest.raises(ContractError, match="throughput is never negative, so no plan can meet it"):
        parse_constraint("throughput<=-3")
    assert parse_constraint("mfu>=-1").bound == -1.0 and parse_constraint("mfu<=0").bound == 0.0


def test_objective_validation():
    with pytest.raises(ContractError, match=r"objective\.critical_batch"):  # built in Python: named as tune() names it
        Objective("goodput")
    with pytest.raises(ContractError, match="--critical-batch"):
        Objective("goodput", arg_names=CLI_ARG_NAMES)
    with pytest.raises(ContractError):
        Objective("latency")
    with pytest.raises(ContractError):
        Objective("throughput", constraints=[parse_constraint("goodput>=1")])


def test_pareto_front_matches_brute_force():
    rng = random.Random(3)
    rows = [{"throughput_samples_per_s": rng.choice([1.0, 2.0, 3.0, rng.uniform(0, 4)]),
             "carbon_per_sample_g": rng.choice([0.1, 0.2, rng.uniform(0, 0.3)])} for _ in range(60)]
    rows.append({"throughput_samples_per_s": None, "carbon_per_sample_g": 0.0})
    front = set(pareto_front(rows))

    def dominated(i: int) -> bool:
        a = rows[i]
        return any(b is not a and b["throughput_samples_per_s"] is not None
                   and b["throughput_samples_per_s"] >= a["throughput_samples_per_s"]
                   and b["carbon_per_sample_g"] <= a["carbon_per_sample_g"]
                   and (b["throughput_samples_per_s"], b["carbon_per_sample_g"])
                   != (a["throughput_samples_per_s"], a["carbon_per_sample_g"]) for b in rows)

    valid = [i for i, r in enumerate(rows) if r["throughput_samples_per_s"] is not None]
    undominated = {i for i in valid if not dominated(i)}
    # Exact duplicates keep one representative.
    assert front <= undominated
    assert {(rows[i]["throughput_samples_per_s"], rows[i]["carbon_per_sample_g"]) for i in front} == \
        {(rows[i]["throughput_samples_per_s"], rows[i]["carbon_per_sample_g"]) for i in undominated}
    assert not math.isnan(sum(rows[i]["throughput_samples_per_s"] for i in front))
