"""The search space: exactly the plans that satisfy the rules, --fix, --what-if, rejection codes."""

from __future__ import annotations

import functools
import itertools

import pytest
from mindpipe.simulator.schedules import build_schedule, schedule_rule
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.config import Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.keys import (
    POINT_KEYS,
    SEARCHED_WHAT_IF_KEYS,
    parse_fixes,
    parse_global_batch,
    parse_what_if,
    plan_of,
    point_key,
    read_fixes,
    what_if_used,
)
from mindpipe.tuner.rules import Rule
from mindpipe.tuner.space import SearchSpace


@functools.cache
def _schedule_ok(name: str, pp: int, m: int, v: int) -> bool:
    try:
        build_schedule(name, pp, m, v)
    except ContractError:
        return False
    return True


def _brute_force(model: Model, cluster, batches: list[int]) -> set[tuple]:
    """Every combination of the plan keys that the contracts accept, with irrelevant keys collapsed."""
    world = cluster.world_size
    out = set()
    scheds = [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4),
              ("zbv", 2), ("dualpipev", 2)]
    for tp, pp, mbs, gbs, (sched, v), rc, sp, zero, comm in itertools.product(
            range(1, world + 1), range(1, world + 1), (1, 2, 4, 8), batches, scheds, ("none", "selective", "full"),
            (False, True), (0, 1, 2, 3), ("fair", "pp_first")):
        if world % (tp * pp) or tp > cluster.gpus_per_node:
            continue
        dp = world // (tp * pp)
        try:
            plan = Plan(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, global_batch_size=gbs, schedule=sched,
                        virtual_stages=v, recompute=rc, sequence_parallel=sp, zero_stage=zero, comm_priority=comm)
            check_plan(plan, model, cluster)
        except ContractError:
            continue
        if not _schedule_ok(sched, pp, plan.num_microbatches, v):
            continue
        # Collapse what cannot matter: one stage (schedule, priority), dp = 1 (ZeRO).
        if pp == 1 and ((sched, v) != ("1f1b", 1) or comm != "fair"):
            continue
        if dp == 1 and zero:
            continue
        out.add((dp, tp, pp, mbs, gbs, sched, v, rc, sp, zero, comm))
    return out


def _tuples(space: SearchSpace) -> set[tuple]:
    keys = ("dp", "tp", "pp", "micro_batch_size", "global_batch_size", "schedule", "virtual_stages", "recompute",
            "sequence_parallel", "zero_stage", "comm_priority")
    return {tuple(p[k] for k in keys) for p in space.points}


def test_space_equals_brute_force_enumeration():
    model = Model(kind="gpt", num_layers=6, hidden_size=96, num_heads=6, seq_len=64, vocab_size=512)
    cluster = load_cluster("a100-sxm4-80gb:2x4")
    space = SearchSpace(model, cluster, [16, 32], what_if=("comm_priority",))
    assert _tuples(space) == _brute_force(model, cluster, [16, 32])
    assert len({point_key(p) for p in space.points}) == space.size  # no duplicates
    assert space.rejected_total > 0
    # Every rule of this landscape is counted under its code: tp 8 > 4 devices per node, 6 heads
    # not divisible by tp 4, more stages than layers, m < pp, dualpipev's m < 2·pp, batch multiple.
    for rule in (Rule.TP_PER_NODE, Rule.HEADS, Rule.LAYERS, Rule.SCHEDULE, Rule.BATCH_MULTIPLE):
        assert space.rejected[rule] > 0, rule
    assert set(space.describe()["rejected_by_rule"]) == {r.value for r in space.rejected}


def test_rule_texts_are_generic_and_distinct():
    texts = [r.text for r in Rule]
    assert len(set(texts)) == len(texts)
    assert not any(ch.isdigit() and ch not in "12" for t in texts for ch in t)  # no numbers of one combination


@pytest.mark.parametrize(("name", "pp", "m", "v"), [("1f1b", 4, 4, 1), ("interleaved_1f1b", 4, 6, 2),
                                                     ("dualpipev", 4, 6, 2), ("zbv", 2, 2, 2), ("gpipe", 4, 1, 1),
                                                     ("zb_h1", 2, 4, 2)])
def test_schedule_rule_agrees_with_build_schedule(name, pp, m, v):
    rule = schedule_rule(name, pp, m, v)
    assert (rule is None) == _schedule_ok(name, pp, m, v)
    if rule is not None:
        with pytest.raises(ContractError, match=rule.split("=")[0]):
            build_schedule(name, pp, m, v)


@pytest.mark.parametrize(("model", "cluster", "batches"), [
    ("gpt-13b", "a100-sxm4-80gb:8x8", [128, 512]), ("gpt-1.3b", "a100-sxm4-80gb:1x8", [16, 64]),
    ("gpt-mini", "cpu:1x4", [8, 32]),
])
def test_default_space_holds_only_what_the_executor_runs(model, cluster, batches):
    """No point of a default space sets a what-if knob to a value the executor does not carry out."""
    model, cluster = load_model(model), load_cluster(cluster)
    space = SearchSpace(model, cluster, batches)
    assert space.size > 0
    for p in space.points:
        assert what_if_used(p) == [], p
        assert all(p[k] == run for k, run in SEARCHED_WHAT_IF_KEYS.items())
        assert what_if_used(plan_of(p)) == []
    # With --what-if every knob is searched wherever it can matter, and only there.
    wide = SearchSpace(model, cluster, batches, what_if=parse_what_if("all"))
    assert wide.size > space.size
    used = {k for p in wide.points for k in what_if_used(p)}
    # overlap_param_gather overlaps Megatron's gather after the step: only with dp_impl=megatron,
    # which "all" leaves out (FSDP2, the executor's, gathers under the forward already).
    assert used == set(SEARCHED_WHAT_IF_KEYS) - {"overlap_param_gather"}
    assert {p["cp_comm_type"] for p in wide.points} == {"allgather"}  # no cp > 1 point: no K/V exchange
    assert not any(p["comm_priority"] != "fair" for p in wide.points if p["pp"] == 1)
    assert not any(p["overlap_grad_reduce"] for p in wide.points if p["dp"] == 1)
    narrow = {point_key(p) for p in space.points}
    assert narrow == {point_key(p) for p in wide.points if not what_if_used(p)}


def test_what_if_knob_pinned_off_the_executor_needs_what_if():
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    for fix in ("comm_priority=pp_first", "overlap_grad_reduce=true", "comm_priority=fair,pp_first"):
        with pytest.raises(ContractError, match="--what-if") as e:
            SearchSpace(model, cluster, [64], parse_fixes([fix]))
        assert e.value.source == "--fix" and "executor runs only" in str(e.value)
    # Pinning the executor's own value needs nothing; naming the knob (or all) allows the others.
    assert SearchSpace(model, cluster, [64], parse_fixes(["comm_priority=fair"])).size > 0
    space = SearchSpace(model, cluster, [64], parse_fixes(["overlap_grad_reduce=true"]),
                        what_if=parse_what_if("overlap-grad-reduce"))
    assert {p["overlap_grad_reduce"] for p in space.points if p["dp"] > 1} == {True}
    assert parse_what_if("") == parse_what_if("all") == tuple(SEARCHED_WHAT_IF_KEYS)
    assert parse_what_if(None) == ()
    with pytest.raises(ContractError, match="not a what-if knob"):
        parse_what_if("tp")


def test_blocking_p2p_is_pinned_by_name_and_never_in_all():
    """Megatron's blocking pipeline exchanges: ``all`` leaves them out (they only cost time); naming the
    knob with ``--fix blocking_p2p=true`` plans for a Megatron deployment; without a pipeline there is
    nothing to block on, so an unpinned search keeps pp = 1 points at the executor's value."""
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    assert "blocking_p2p" not in parse_what_if("all") and parse_what_if("blocking-p2p") == ("blocking_p2p",)
    with pytest.raises(ContractError, match="--what-if blocking_p2p"):
        SearchSpace(model, cluster, [64], parse_fixes(["blocking_p2p=true"]))
    pinned = SearchSpace(model, cluster, [64], parse_fixes(["blocking_p2p=true", "pp=2"]), what_if=("blocking_p2p",))
    assert pinned.size > 0 and all(p["blocking_p2p"] is True for p in pinned.points)
    assert all(plan_of(p).blocking_p2p and what_if_used(plan_of(p)) == ["blocking_p2p"] for p in pinned.points)
    searched = SearchSpace(model, cluster, [64], what_if=parse_what_if("blocking_p2p"))
    assert {p["blocking_p2p"] for p in searched.points if p["pp"] > 1} == {False, True}
    assert {p["blocking_p2p"] for p in searched.points if p["pp"] * p["virtual_stages"] == 1} == {False}
    # A point stored before the key existed keeps its identity.
    plain = SearchSpace(model, cluster, [64]).points[0]
    assert point_key(plain) == point_key({k: v for k, v in plain.items() if k != "blocking_p2p"})


def test_every_point_satisfies_the_issue_rules():
    model, cluster = load_model("gpt-13b"), load_cluster("a100-sxm4-80gb:8x8")
    space = SearchSpace(model, cluster, [128, 256])
    assert space.size > 1000
    for p in space.points:
        assert p["dp"] * p["tp"] * p["pp"] == 64
        assert p["tp"] <= 8 and model.num_heads % p["tp"] == 0
        assert p["pp"] * p["virtual_stages"] <= model.num_layers
        assert p["global_batch_size"] % (p["micro_batch_size"] * p["dp"]) == 0
    # Irrelevant dimensions are not multiplied out.
    assert all(p["zero_stage"] == 0 for p in space.points if p["dp"] == 1)
    assert all(p["comm_priority"] == "fair" and p["schedule"] == "1f1b" for p in space.points if p["pp"] == 1)
    assert not any(p["sequence_parallel"] for p in space.points if p["tp"] == 1)


def test_fix_pins_and_restricts():
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    fixes = parse_fixes(["tp=8", "recompute=full", "schedule=1f1b,zb_h1", "sequence-parallel=true"])
    assert fixes == {"tp": 8, "recompute": "full", "schedule": ["1f1b", "zb_h1"], "sequence_parallel": True}
    space = SearchSpace(model, cluster, [64], fixes)
    assert space.size > 0
    assert {p["tp"] for p in space.points} == {8}
    assert {p["recompute"] for p in space.points} == {"full"}
    assert {p["schedule"] for p in space.points} <= {"1f1b", "zb_h1"}
    assert all(p["sequence_parallel"] for p in space.points)
    # Pinning a key that would be collapsed keeps the pinned value.
    space = SearchSpace(model, cluster, [64], parse_fixes(["pp=1", "comm_priority=pp_first"]),
                        what_if=("comm_priority",))
    assert {p["comm_priority"] for p in space.points} == {"pp_first"}


def test_fixes_from_python_follow_the_same_rules_as_the_flag():
    # tune(fixes={...}) went straight into the space: unknown keys were ignored and bad values
    # evaluated thousands of invalid plans or raised a TypeError deep in the space's arithmetic.
    both = {"tp": 8, "schedule": ["1f1b", "zb_h1"], "sequence-parallel": True, "partition": [20, 4]}
    assert read_fixes(both) == parse_fixes(["tp=8", "schedule=1f1b,zb_h1", "sequence_parallel=true",
                                            "partition=[20,4]"])
    assert read_fixes("tp=8") == {"tp": 8} and read_fixes(None) == {} and read_fixes(["pp=2"]) == {"pp": 2}
    for bad, needle in (({"bogus": 1}, "bogus: not a plan key"), ({"schedule": "1F1B"}, "is not one of"),
                        ({"recompute": True}, "recompute='true' is not one of"), ({"zero_stage": 7}, "must be 0, 1"),
                        ({"tp": 8.0}, "tp='8.0' must be an integer"), ({"tp": True}, "must be an integer"),
                        ({"partition": 4}, "partition must be a JSON list")):
        with pytest.raises(ContractError, match=needle):
            read_fixes(bad)


def test_global_batch_and_partitioners_from_python(tmp_path):
    from mindpipe.tuner.api import build_space

    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    assert build_space(model, cluster, [128, 64], None, ["even"]).global_batches == [64, 128]
    assert build_space(model, cluster, 64, None, "even").partitioners == ("even",)  # one name, not its letters
    for bad in (0, 128.0, True, []):
        with pytest.raises(ContractError, match="--global-batch"):
            build_space(model, cluster, bad, None, ["balanced"])

def test_fix_partition_pins_the_partitioner():
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    space = SearchSpace(model, cluster, [64], parse_fixes(["pp=2", "partition=[20,4]", "schedule=1f1b"]))
    assert space.partitioners == ("given",)
    assert all(plan_of(p, space.pinned).partition == [20, 4] for p in space.points)
    # A partition that does not fit the plan rules empties the space with a reason.
    space = SearchSpace(model, cluster, [64], parse_fixes(["pp=2", "partition=[20,5]"]))
    assert space.size == 0 and Rule.PARTITION in space.rejected


@pytest.mark.parametrize("bad", ["tp", "tpx=3", "tp=two", "schedule=fast", "sequence_parallel=maybe", "partition=4"])
def test_fix_rejects_bad_input(bad):
    with pytest.raises(ContractError) as e:
        parse_fixes([bad])
    assert e.value.source == "--fix"


def test_parse_global_batch():
    assert parse_global_batch("512") == [512]
    assert parse_global_batch("256,128,256") == [128, 256]
    assert parse_global_batch("128:1024") == [128, 256, 512, 1024]
    for bad in ("0", "x", "64:32", "-4:8"):
        with pytest.raises(ContractError):
            parse_global_batch(bad)


def test_impossible_space_is_empty_with_reasons():
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    space = SearchSpace(model, cluster, [64], parse_fixes(["tp=3"]))
    assert space.size == 0
    assert space.rejected_total > 0 and set(space.rejected) == {Rule.MESH}
    assert set(POINT_KEYS) >= set(space.describe()["values"])
    space = SearchSpace(model, cluster, [64], parse_fixes(["tp=8", "dp=2"]))
    assert space.size == 0 and set(space.rejected) == {Rule.PINNED}


def test_fp8_is_searched_only_when_pinned_and_only_on_devices_with_fp8():
    model = load_model("gpt-1.3b")
    h100 = load_cluster("h100-sxm5-80gb:1x8")
    # Default space: bf16 only (the executor runs it everywhere).
    assert {p["precision"] for p in SearchSpace(model, h100, [64]).points} == {"bf16"}
    pinned = SearchSpace(model, h100, [64], parse_fixes(["precision=fp8"]))
    assert pinned.size > 0 and {p["precision"] for p in pinned.points} == {"fp8"}
    with pytest.raises(ContractError, match="precision 'fp8' needs FP8 tensor cores"):
        SearchSpace(model, load_cluster("a100-sxm4-80gb:1x8"), [64], parse_fixes(["precision=fp8"]))


def test_overlap_knobs_are_searched_only_where_they_mean_something():
    model, cluster = load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x8")
    space = SearchSpace(model, cluster, [64], parse_fixes(["dp_impl=megatron"]),
                        what_if=parse_what_if("tp_comm_overlap,overlap_param_gather,dp_impl"))
    tpo = {p["tp_comm_overlap"] for p in space.points if p["sequence_parallel"]}
    assert tpo == {False, True}
    assert not any(p["tp_comm_overlap"] for p in space.points if not p["sequence_parallel"])
    assert {p["overlap_param_gather"] for p in space.points if p["zero_stage"] in (1, 2) and p["dp"] > 1} == {False, True}
    assert not any(p["overlap_param_gather"] for p in space.points if p["zero_stage"] in (0, 3) or p["dp"] == 1)
    # Under FSDP2 (the executor's) there is no gather after the step to overlap.
    fsdp2 = SearchSpace(model, cluster, [64], what_if=parse_what_if("overlap_param_gather"))
    assert fsdp2.size > 0 and not any(p["overlap_param_gather"] for p in fsdp2.points)
    # Without --what-if both stay at the executor's value.
    assert not any(p["tp_comm_overlap"] or p["overlap_param_gather"] for p in SearchSpace(model, cluster, [64]).points)
