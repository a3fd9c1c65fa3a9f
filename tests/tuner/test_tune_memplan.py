"""Memory-aware partitioners (vpipe, dawnpiper) and the maximum-batch search."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mindpipe.executor.precheck import check_run
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import LAYER_MEMORY_POLICIES, Plan
from mindpipe.traces.layout import LAYER_POLICY
from mindpipe.tuner.materialize import Problem, materialize
from mindpipe.tuner.maxbatch import base_point, search, throughput_at
from mindpipe.tuner.memsplit import MEMORY_PARTITIONERS, dawnpiper_partition, memory_partition
from mindpipe.tuner.space import SearchSpace

MODEL = load_model("gpt-1.3b")
CLUSTER = load_cluster("a100-sxm4-40gb:1x4")
SIM = Simulator(MODEL, CLUSTER)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(MEMORY_PARTITIONERS), pp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2]),
       mbs=st.integers(1, 48), m_per_stage=st.sampled_from([1, 2]), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_every_plan_fits_and_has_a_valid_policy(name, pp, tp, mbs, m_per_stage, schedule):
    """Every plan, dawnpiper's with boundaries inside blocks included, is judged as the simulator
    judges it, fits when the planner says so, runs, and is one the executor's precheck accepts."""
    tp = tp if pp * tp <= 4 else 1  # four devices
    m, dp = pp * m_per_stage, 4 // (pp * tp)
    plan = Plan(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, global_batch_size=dp * mbs * m, schedule=schedule)
    mp = memory_partition(name, SIM, plan)
    assert len(mp.partition) == pp and min(mp.partition) >= 1 and sum(mp.partition) == MODEL.num_layers
    assert len(mp.policy) == MODEL.num_layers and set(mp.policy) <= set(LAYER_MEMORY_POLICIES)
    assert mp.stage_cuts is None or (name == "dawnpiper" and len(mp.stage_cuts) == pp - 1)
    assert mp.swap_copy_back is None or (name == "dawnpiper" and len(mp.swap_copy_back) == pp)
    done = dataclasses.replace(plan, partition=mp.partition, layer_memory_policy=list(mp.policy),
                               stage_cuts=mp.stage_cuts, swap_copy_back=mp.swap_copy_back)
    memory = SIM.memory(done)
    assert mp.fits == all(rm.fits for rm in memory)  # the planner's verdict is the simulator's
    if mp.fits:
        assert SIM.run(done).fits_in_memory
        check_run(MODEL, done, done.world_size, "cuda", None)  # no combination the executor refuses


def test_keep_everything_when_it_fits():
    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=4)
    for name in MEMORY_PARTITIONERS:
        assert memory_partition(name, SIM, plan).policy == ["keep"] * MODEL.num_layers


def test_planners_beat_pipedream_max_batch():
    problem = Problem(MODEL, CLUSTER)
    fixes = {"dp": 1, "tp": 1, "pp": 4}
    got = {name: search(problem, fixes, name)[0] for name in ("pipedream", "vpipe", "dawnpiper")}
    base = got["pipedream"].global_batch_size
    assert base > 0
    for name in MEMORY_PARTITIONERS:
        r = got[name]
        assert r.global_batch_size >= 2 * base, (name, r.global_batch_size, base)
        assert r.plan is not None and all(rm.fits for rm in SIM.memory(r.plan))
        # One more sample per micro-batch no longer fits (the search's upper edge is tight).
        assert throughput_at(problem, base_point(1, 1, 4, name, {}), r.micro_batch_size + 1, 4) is None
    assert throughput_at(problem, base_point(1, 1, 4, "pipedream", {}), got["pipedream"].micro_batch_size + 1, 4) is None


def test_materialize_writes_the_policy():
    point = dict(dp=1, tp=1, pp=4, micro_batch_size=16, global_batch_size=64, schedule="1f1b", recompute="none",
                 partitioner="dawnpiper")
    mat = materialize(Problem(MODEL, CLUSTER), point)
    assert mat.fits and mat.plan.partition is not None and mat.plan.layer_memory_policy is not None
    # Keeping every block does not fit at this batch: some block re-runs operators or swaps.
    assert set(mat.plan.layer_memory_policy) & {"recompute", "swap", "selective", "nongemm"}


def test_balanced_keeps_memory_caps_with_a_pinned_policy():
    """Was: caps off as soon as a layer_memory_policy was set, so the time-balanced split overflowed."""
    point = dict(dp=1, tp=1, pp=4, micro_batch_size=8, global_batch_size=32, schedule="1f1b", recompute="none",
                 partitioner="balanced")
    pinned = {"layer_memory_policy": ["keep"] * 24}
    capped = materialize(Problem(MODEL, CLUSTER, pinned=pinned), point)
    blind = materialize(Problem(MODEL, CLUSTER, pinned=pinned, memory_caps=False), point)
    assert capped.fits and not blind.fits


def test_space_searches_memory_partitioners_once_per_recompute_level():
    space = SearchSpace(MODEL, CLUSTER, [16], {"pp": 4, "tp": 1, "micro_batch_size": 1},
                        ("balanced", "vpipe", "dawnpiper"))
    parts = [p for p in space.points if p["partitioner"] in MEMORY_PARTITIONERS]
    assert parts and all(p["virtual_stages"] == 1 for p in parts)
    assert len({p["recompute"] for p in parts}) == 1
    assert any(p["virtual_stages"] > 1 for p in space.points)  # interleaving stays for balanced


def test_cli_max_batch_json(tmp_path):
    res = subprocess.run([sys.executable, "-m", "mindpipe.cli", "tune", "--model", "gpt-1.3b", "--cluster",
                          "a100-sxm4-40gb:1x4", "--objective", "max_batch", "--partitioner", "vpipe",
                          "--fix", "pp=4", "--fix", "tp=1", "--out", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    plan = info["best_plan"]
    assert info["best_value"] == plan["global_batch_size"] == plan["dp"] * plan["micro_batch_size"] * 4
    assert plan["layer_memory_policy"] and plan["partition"] and info["throughput_samples_per_s"] > 0
    assert json.loads((tmp_path / "best_plan.json").read_text())["made_for"]["tool"].endswith("max_batch")
    assert json.loads((tmp_path / "summary.json").read_text()) == info  # the file says what --json printed

    # From Python the summary has the JSON's names too
    from mindpipe.traces.schema import to_dict
    from mindpipe.tuner.maxbatch import tune_max_batch

    summary = tune_max_batch("gpt-1.3b", "a100-sxm4-40gb:1x4", out=tmp_path / "py", partitioners=["vpipe"],
                             fixes={"pp": 4, "tp": 1})
    assert summary.best_value == info["best_value"] and summary.best_plan is not None
    assert to_dict(summary.best_plan) == info["best_plan"] | {"made_for": to_dict(summary.best_plan)["made_for"]}


def test_stage_times_are_the_plans_own():
    """The planner's stage time is time_of of its policies; a stage that fits kept is all keep."""
    from mindpipe.tuner.memsplit import stage_model

    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=24, global_batch_size=96)
    sm = stage_model(SIM, plan)
    mp = memory_partition("vpipe", SIM, plan)
    lo = 0
    for s, n in enumerate(mp.partition):
        sp = sm.plan(s, lo, lo + n, "vpipe")
        assert sp.time_s == pytest.approx(sm.time_of(s, lo, lo + n, sp.policies))
        assert list(sp.policies) == mp.policy[lo:lo + n]
        lo += n


@pytest.mark.parametrize("mbs", [1, 8, 24])
def test_dawnpiper_cuts_inside_blocks_as_the_simulator_prices_them(mbs):
    """dawnpiper's half-block stages: each stage's units are the layout's parts, its policies the
    plan's (a cut block's one policy on both sides), its memory verdict and time the simulator's."""
    from mindpipe.traces.layout import lazy_copy_back, stage_layout
    from mindpipe.tuner.memsplit import stage_model

    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=mbs, global_batch_size=4 * mbs)
    mp = memory_partition("dawnpiper", SIM, plan)
    assert mp.stage_cuts is not None and "after_attention" in mp.stage_cuts  # the finer cuts are used here
    done = dataclasses.replace(plan, partition=mp.partition, layer_memory_policy=list(mp.policy),
                               stage_cuts=mp.stage_cuts, swap_copy_back=mp.swap_copy_back)
    sm = stage_model(SIM, plan, halves=True)
    spans = stage_layout(done, MODEL)
    bounds, lo = [], 0
    for span in spans:
        hi = 2 * (span.first_block + span.num_blocks) - (span.last_part == "attention")
        bounds.append((lo, hi))
        lo = hi
    assert lo == 2 * MODEL.num_layers
    for s, ((lo, hi), span, rm) in enumerate(zip(bounds, spans, SIM.memory(done), strict=True)):
        units = sm.units(lo, hi)
        assert [(b, part) for _, part, b in units] == span.parts()
        pols, lazy = [mp.policy[b] for _, _, b in units], s in lazy_copy_back(done)
        assert sm.fits(s, pols, [u[1] for u in units], lazy) == rm.fits
        assert sm.budget(s, lazy).total_bytes([LAYER_POLICY[p] for p in pols], [u[1] for u in units]) == rm.total_bytes
        assert sm.time_of(s, lo, hi, pols, lazy) == pytest.approx(mp.stage_time_s[s])
    # The planner's slowest stage is no slower than the best it finds on whole blocks.
    assert max(mp.stage_time_s) <= max(dawnpiper_partition(stage_model(SIM, plan)).stage_time_s) * (1 + 1e-9)


def test_dawnpiper_recomputes_only_the_attention_core_where_that_is_cheapest():
    """DawnPiper's operator-level choice: between keeping a block and re-running it whole, re-running
    only its attention core (``selective``) frees most of its bytes for a fraction of the time, so at a
    batch where some blocks must give memory back dawnpiper's slowest stage beats vpipe's."""
    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=8, global_batch_size=32)
    vp, dawn = (memory_partition(name, SIM, plan) for name in ("vpipe", "dawnpiper"))
    assert not {"selective", "nongemm"} & set(vp.policy) and "recompute" in vp.policy
    assert {"selective", "nongemm"} & set(dawn.policy) and vp.fits and dawn.fits
    assert max(dawn.stage_time_s) < max(vp.stage_time_s)
    done = dataclasses.replace(plan, partition=dawn.partition, layer_memory_policy=list(dawn.policy),
                               stage_cuts=dawn.stage_cuts, swap_copy_back=dawn.swap_copy_back)
    assert SIM.run(done).fits_in_memory
    check_run(MODEL, done, done.world_size, "cuda", None)


def test_dawnpiper_nongemm_beats_layer_and_core_choices_and_is_priced_by_the_simulator():
    """Re-running every operator but the GEMMs frees 30 of a kept block's 48·s·b·h bytes here
    (18 kept, against selective's 32) for the attention core plus the memory-bound operators: with
    it dawnpiper's slowest stage is faster than without it, and the simulator's engine prices the
    plan at the time the planner predicted for its slowest stage's recompute."""
    from mindpipe.tuner.memsplit import dawnpiper_partition, stage_model

    plan = Plan(dp=1, tp=1, pp=4, micro_batch_size=16, global_batch_size=64)
    with_it = dawnpiper_partition(stage_model(SIM, plan, halves=True))
    sm = stage_model(SIM, plan, halves=True)
    sm.nongemm = False  # as for a plan that refuses it (tp > 1, a split backward)
    without = dawnpiper_partition(sm)
    assert "nongemm" in with_it.policy and "nongemm" not in without.policy and with_it.fits and without.fits
    assert max(with_it.stage_time_s) < max(without.stage_time_s)
    done = dataclasses.replace(plan, partition=with_it.partition, layer_memory_policy=list(with_it.policy),
                               stage_cuts=with_it.stage_cuts, swap_copy_back=with_it.swap_copy_back)
    assert SIM.run(done).fits_in_memory
    check_run(MODEL, done, done.world_size, "cuda", None)
    # Its re-run is the core and the memory-bound operators, more than selective's, less than full's.
    block = next(c for c in SIM.layer_costs(plan) if c.kind == "block")
    assert block.recompute_selective_s < block.recompute_nongemm_s < block.forward_s


def test_cli_max_batch_text_names_the_memory_policy(tmp_path):
    # The text output says what decided the memory: a memory-blind partitioner's one recompute
    # setting (and ZeRO), or the per-block policy a memory-aware one chose.
    base = [sys.executable, "-m", "mindpipe.cli", "tune", "--model", "gpt-1.3b", "--cluster", "a100-sxm4-40gb:1x4",
            "--objective", "max_batch", "--fix", "pp=2", "--fix", "tp=1", "--fix", "dp=2"]
    blind = subprocess.run([*base, "--out", str(tmp_path / "a")], capture_output=True, text=True, timeout=300)
    assert blind.returncode == 0, blind.stderr
    assert ("memory policy    recompute=none for every block (balanced chooses no per-block policy; "
            "--partitioner vpipe,dawnpiper do); zero_stage=0") in blind.stdout
    aware = subprocess.run([*base, "--partitioner", "vpipe", "--out", str(tmp_path / "b")], capture_output=True,
                           text=True, timeout=300)
    plan = json.loads((tmp_path / "b" / "best_plan.json").read_text())
    counts = ", ".join(f"{n} {p}" for p, n in sorted(Counter(plan["layer_memory_policy"]).items()))
    assert f"memory policy    per-block policy from vpipe: {counts}; zero_stage=0" in aware.stdout
