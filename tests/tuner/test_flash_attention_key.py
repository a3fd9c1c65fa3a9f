"""The plan's flash_attention in the tuner: pinned with --fix, and pinned to a trace's when tuning on one."""

from __future__ import annotations

import pytest
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.trace import LayerRecord, Provenance, Trace
from mindpipe.tuner.api import attention_as_profiled, build_space
from mindpipe.tuner.keys import parse_fixes, plan_of


def _trace(flash: bool) -> Trace:
    rec = [LayerRecord("embedding", "embedding", 1e-3, 1e-3, 0.0), LayerRecord("block.0", "block", 1e-2, 1e-2, 1e-2),
           LayerRecord("lm_head", "lm_head", 1e-3, 1e-3, 1e-3)]
    return Trace("cpu", "fp32", rec, Provenance("test"), micro_batch_size=1, flash_attention=flash)


def test_default_space_runs_explicit_attention_and_fix_pins_flash() -> None:
    model, cluster = load_model("gpt-mini"), load_cluster("cpu:1x2")
    default = build_space(model, cluster, 8, [], ["balanced"])
    assert {p["flash_attention"] for p in default.points} == {False}
    pinned = build_space(model, cluster, 8, ["flash_attention=true"], ["balanced"])
    assert pinned.size == default.size
    assert all(plan_of(p, pinned.pinned).flash_attention for p in pinned.points)
    both = build_space(model, cluster, 8, ["flash_attention=false,true"], ["balanced"])
    assert both.size == 2 * default.size


def test_a_llama_model_on_gpus_searches_flash_attention_by_default() -> None:
    """Llama-family recipes run a fused attention kernel on GPUs; GPT and CPU spaces keep Megatron's."""
    gpus = load_cluster("h100-sxm5-80gb:1x8")
    llama = build_space(load_model("llama3-8b"), gpus, 32, [], ["balanced"])
    assert {p["flash_attention"] for p in llama.points} == {False, True}
    explicit = build_space(load_model("llama3-8b"), gpus, 32, ["flash_attention=false"], ["balanced"])
    assert 2 * explicit.size == llama.size
    assert {p["flash_attention"] for p in build_space(load_model("gpt-13b"), gpus, 32, [], ["balanced"]).points} == {False}
    on_cpu = build_space(load_model("llama-tiny"), load_cluster("cpu:1x2"), 8, [], ["balanced"])
    assert {p["flash_attention"] for p in on_cpu.points} == {False}


def test_a_trace_pins_the_attention_it_was_profiled_with() -> None:
    # pinned either way: a Llama model on GPUs would otherwise search FlashAttention too
    assert attention_as_profiled({}, _trace(False)) == {"flash_attention": False}
    assert attention_as_profiled({}, _trace(True)) == {"flash_attention": True}
    assert attention_as_profiled(parse_fixes(["flash_attention=true"]), _trace(True))["flash_attention"] is True
    with pytest.raises(ContractError, match="profiled without flash attention") as e:
        attention_as_profiled(parse_fixes(["flash_attention=true"]), _trace(False))
    assert e.value.key == "flash_attention"
    with pytest.raises(ContractError, match="profiled with flash attention"):
        attention_as_profiled(parse_fixes(["flash_attention=false,true"]), _trace(True))


def test_a_point_without_the_key_is_the_same_point_as_one_with_false() -> None:
    """Sweeps stored before the key existed resume as the same points (tuner.keys.point_key)."""
    from mindpipe.tuner.keys import point_key

    space = build_space(load_model("gpt-mini"), load_cluster("cpu:1x2"), 8, [], ["balanced"])
    p = space.points[0]
    old = {k: v for k, v in p.items() if k != "flash_attention"}
    assert point_key(old) == point_key(p)
    assert point_key({**p, "flash_attention": True}) != point_key(p)
    assert plan_of(old).flash_attention is False


def test_the_summary_says_which_attention_the_search_covered(tmp_path) -> None:
    from mindpipe.tuner.api import tune
    from mindpipe.tuner.sweep import SweepConfig

    for fixes, searched in (([], [False]), (["flash_attention=true"], [True]), (["flash_attention=false,true"], [False, True])):
        out = tmp_path / "-".join(fixes or ["default"])
        outcome = tune("gpt-mini", "cpu:1x2", global_batch=8, fixes=fixes, out=out, plots=False,
                       config=SweepConfig(optimizer="random", budget=2))
        assert outcome.summary.flash_attention_searched == searched
