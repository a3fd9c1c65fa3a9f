"""Data contracts: JSON round trips, unknown keys, impossible values, cross-document rules."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindpipe.traces.builtin import BUILTIN_MODELS, load_cluster, load_model, load_plan
from mindpipe.traces.config import Cluster, Model, Plan, check_plan, even_partition
from mindpipe.traces.errors import ContractError
from mindpipe.traces.result import SimulationResult
from mindpipe.traces.schema import from_dict, read_json, to_dict
from mindpipe.traces.trace import LayerRecord, Provenance, Trace

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)


def _write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


def test_builtin_models_load_and_roundtrip():
    for name in ("gpt-mini", "gpt-1.3b", "gpt-13b", "gpt3-175b"):
        m = load_model(name)
        assert m.name == name
        assert from_dict(Model, to_dict(m)) == m
    assert set(BUILTIN_MODELS) >= {"gpt-mini", "gpt-1.3b", "gpt-13b", "gpt3-175b"}


def test_gpt3_175b_parameter_count_matches_narayanan():
    # Narayanan et al. (2021) Eq. 2: P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) with a tied head;
    # our head is untied, so add V·h; the formula also leaves out the final LayerNorm (2h).
    m = load_model("gpt3-175b")
    n_layers, h, v, s = m.num_layers, m.hidden_size, m.vocab_size, m.seq_len
    tied = 12 * n_layers * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * n_layers * h))
    assert m.param_count() == pytest.approx(tied + v * h + 2 * h, rel=1e-12)
    assert 174e9 < tied < 176e9


def test_model_file_roundtrip(tmp_path):
    m = load_model("gpt-13b")
    path = tmp_path / "m.json"
    path.write_text(json.dumps(to_dict(m)))
    assert load_model(str(path)) == m


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"kind": "gpt", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 8}, "vocab_size: missing required key"),
        ({"kind": "gpt", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 8, "vocab_size": 9, "colour": 1}, "colour: unknown key"),
        ({"kind": "gpt", "num_layers": -2, "hidden_size": 64, "num_heads": 4, "seq_len": 8, "vocab_size": 9}, "num_layers=-2 must be > 0"),
        ({"kind": "gpt", "num_layers": 2, "hidden_size": 64, "num_heads": 5, "seq_len": 8, "vocab_size": 9}, "num_heads=5 does not divide hidden_size=64"),
        ({"kind": "bert", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 8, "vocab_size": 9}, "kind='bert' is not one of gpt"),
        ({"kind": "gpt", "num_layers": "2", "hidden_size": 64, "num_heads": 4, "seq_len": 8, "vocab_size": 9}, "num_layers: must be an integer"),
        ({"kind": "gpt", "num_layers": True, "hidden_size": 64, "num_heads": 4, "seq_len": 8, "vocab_size": 9}, "num_layers: must be an integer"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_model_errors_name_file_and_key(tmp_path, doc, needle):
    path = _write(tmp_path, "model.json", doc)
    with pytest.raises(ContractError) as e:
        load_model(path)
    assert str(e.value).startswith(f"{path}: ")
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_malformed_and_missing_files(tmp_path):
    bad = _write(tmp_path, "bad.json", '{"kind": "gpt",, }')
    with pytest.raises(ContractError, match=r"bad.json: malformed JSON at line 1 column 16"):
        load_model(bad)
    with pytest.raises(ContractError, match=r"nope.json: file not found"):
        load_model(str(tmp_path / "nope.json"))
    with pytest.raises(ContractError, match="not a file and not a built-in model"):
        load_model("gpt-7t")


def test_plan_rules():
    with pytest.raises(ContractError, match=r"global_batch_size=10 is not a multiple of micro_batch_size×dp=4"):
        from_dict(Plan, {"dp": 2, "micro_batch_size": 2, "global_batch_size": 10}, "plan.json")
    with pytest.raises(ContractError, match=r"micro_batch_size×dp=3 \(global_batch_size defaults to 1: give it\)"):
        from_dict(Plan, {"dp": 3}, "plan.json")
    with pytest.raises(ContractError, match=r"plan.json: schedule='pipedream' is not one of"):
        from_dict(Plan, {"schedule": "pipedream"}, "plan.json")
    with pytest.raises(ContractError, match=r"zero_stage=4 must be 0, 1, 2 or 3"):
        from_dict(Plan, {"zero_stage": 4}, "plan.json")
    with pytest.raises(ContractError, match=r"partition has 3 entries, expected pp×virtual_stages=2"):
        from_dict(Plan, {"pp": 2, "partition": [1, 1, 1]}, "plan.json")
    with pytest.raises(ContractError, match=r"needs virtual_stages=2"):
        from_dict(Plan, {"schedule": "zbv"}, "plan.json")
    with pytest.raises(ContractError, match=r"tp=0 must be > 0"):
        from_dict(Plan, {"tp": 0}, "plan.json")
    with pytest.raises(ContractError, match=r"sequence_parallel=true needs tp > 1"):
        from_dict(Plan, {"sequence_parallel": True}, "plan.json")


def test_check_plan_cross_rules():
    model = Model(kind="gpt", num_layers=8, hidden_size=128, num_heads=32, seq_len=16, vocab_size=50)
    cluster = load_cluster("a100-sxm4-80gb:2x8")
    with pytest.raises(ContractError) as e:
        check_plan(Plan(tp=3, dp=1, global_batch_size=1), model, None, "plan.json")
    assert str(e.value) == "plan.json: tp=3 does not divide num_heads=32"
    with pytest.raises(ContractError, match=r"dp×tp×pp=2×2×2=8 does not equal the cluster's 2×8=16 devices"):
        check_plan(Plan(dp=2, tp=2, pp=2, global_batch_size=8), model, cluster, "plan.json")
    with pytest.raises(ContractError, match=r"needs micro-batches m=2 >= pp=4"):
        check_plan(Plan(dp=2, tp=2, pp=4, global_batch_size=4), model, cluster, "plan.json")
    with pytest.raises(ContractError, match=r"partition sums to 7 layers"):
        check_plan(Plan(pp=2, global_batch_size=2, partition=[3, 4]), model, None, "plan.json")
    check_plan(Plan(dp=2, tp=2, pp=4, global_batch_size=16), model, cluster, "plan.json")
    check_plan(Plan(pp=8, global_batch_size=2, schedule="gpipe"), model, None)  # gpipe allows m < p


def test_even_partition():
    assert even_partition(10, 4) == [3, 3, 2, 2]
    assert even_partition(8, 8) == [1] * 8


def test_cluster_names_and_files(tmp_path):
    c = load_cluster("a100-sxm4-80gb:64x8")
    assert (c.num_nodes, c.gpus_per_node, c.world_size) == (64, 8, 512)
    assert load_cluster("H100-SXM5-80GB").world_size == 8
    with pytest.raises(ContractError, match="not a known device"):
        load_cluster("tpu-v5")
    path = _write(tmp_path, "cluster.json", {"gpu": "a100-sxm4-40gb", "num_nodes": 2, "pue": 0.5})
    with pytest.raises(ContractError, match=r"cluster.json: pue=0.5 must be >= 1.0"):
        load_cluster(path)
    path = _write(tmp_path, "cluster.json", {"gpu": "a100-pcie", "num_nodes": 2})
    with pytest.raises(ContractError, match=r"cluster.json: gpu: "):
        load_cluster(path)
    path = _write(tmp_path, "cluster.json", {"gpu": "h200-sxm-141gb", "num_nodes": 4, "inter_node_bandwidth_Gbps": 3200})
    assert load_cluster(path).inter_node_bandwidth_Gbps == 3200.0


def test_plan_inline_and_file(tmp_path):
    plan = load_plan('{"dp": 8, "tp": 8, "pp": 16, "global_batch_size": 1536}')
    assert plan.num_microbatches == 192
    path = _write(tmp_path, "plan.json", to_dict(plan))
    assert load_plan(path) == plan
    with pytest.raises(ContractError, match="plan must be a JSON file"):
        load_plan("fast")


def _trace(**kw):
    rec = LayerRecord(name="block.0", kind="block", forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=5e-4, activation_bytes=10)
    base = {"device": "cpu", "dtype": "fp32", "layers": [rec], "provenance": Provenance(tool="test")}
    base.update(kw)
    return Trace(**base)


def test_trace_roundtrip_and_model_check(tmp_path):
    m = load_model("gpt-mini")
    t = _trace(model=m, micro_batch_size=2, seq_len=64)
    path = tmp_path / "t.json"
    t.save(path)
    assert Trace.load(path) == t
    # Taken at seq_len=64, it prices gpt-mini at that length only (its times are for 64-token sequences).
    t.check_model(dataclasses.replace(m, seq_len=64))
    with pytest.raises(ContractError, match=r"t.json: seq_len: the trace was profiled at seq_len=64 but gpt-mini runs "
                                            r"seq_len=128"):
        t.check_model(m, source=str(path))
    with pytest.raises(ContractError, match=r"t.json: model: trace was taken for gpt-mini .* not for gpt-13b"):
        t.check_model(load_model("gpt-13b"), source=str(path))


def test_trace_value_errors(tmp_path):
    doc = to_dict(_trace())
    doc["layers"][0]["forward_s"] = -1
    path = _write(tmp_path, "t.json", doc)
    with pytest.raises(ContractError, match=r"t.json: layers\[0\].forward_s=-1.0 must be >= 0"):
        Trace.load(path)
    doc = to_dict(_trace())
    doc["layers"][0]["weird"] = 1
    with pytest.raises(ContractError, match=r"t.json: layers\[0\].weird: unknown key"):
        Trace.load(_write(tmp_path, "t.json", doc))
    doc = to_dict(_trace())
    doc["format_version"] = 99
    with pytest.raises(ContractError, match=r"format_version=99 is not supported"):
        Trace.load(_write(tmp_path, "t.json", doc))
    doc = to_dict(_trace())
    doc["layers"] = []
    with pytest.raises(ContractError, match=r"layers must not be empty"):
        Trace.load(_write(tmp_path, "t.json", doc))


def test_simulation_result_roundtrip(tmp_path):
    from mindpipe.simulator.api import simulate

    # A result the simulator made (its typed details included, clocks priced on an A100) reads back equal.
    plan = Plan(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4, stage_clocks_mhz=[1410, 1200])
    r = simulate(load_model("gpt-1.3b"), load_cluster("a100-sxm4-80gb:1x2"), plan)
    assert r.extra.stage_clocks_mhz == [1410, 1200] and len(r.extra.memory_by_stage) == 2
    r.save(tmp_path / "r.json")
    assert SimulationResult.load(tmp_path / "r.json") == r
    with pytest.raises(ContractError, match=r"extra\.memory_by_stage\[0\]\.weights_bytes: missing required key"):
        doc = to_dict(r)
        del doc["extra"]["memory_by_stage"][0]["weights_bytes"]
        from_dict(SimulationResult, doc, "r.json")
    with pytest.raises(ContractError, match=r"bubble_fraction=1\.5 must be in"):
        from_dict(SimulationResult, {**to_dict(r), "bubble_fraction": 1.5}, "r.json")


@settings(max_examples=300, deadline=None)
@given(doc=json_values)
def test_loaders_never_crash_on_arbitrary_json(doc):
    for cls in (Model, Plan, Trace, SimulationResult, Cluster):
        try:
            from_dict(cls, doc, "fuzz.json")
        except ContractError as e:
            assert str(e).startswith("fuzz.json: ")


@settings(max_examples=200, deadline=None)
@given(
    doc=st.fixed_dictionaries(
        {"kind": st.sampled_from(["gpt", "x"]), "num_layers": st.integers(-3, 5), "hidden_size": st.integers(-8, 64),
         "num_heads": st.integers(-2, 8), "seq_len": st.integers(0, 9), "vocab_size": st.integers(-1, 9)},
        optional={"dropout": st.floats(-1, 2), "ffn_hidden_size": st.none() | st.integers(-2, 9), "extra": st.integers()},
    )
)
def test_model_loader_near_valid(doc):
    try:
        m = from_dict(Model, doc, "m.json")
    except ContractError as e:
        assert str(e).startswith("m.json: ")
        return
    assert m.hidden_size % m.num_heads == 0 and min(m.num_layers, m.seq_len, m.vocab_size) > 0


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64))
def test_read_json_arbitrary_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "x.json"
    path.write_bytes(data)
    try:
        read_json(path)
    except ContractError as e:
        assert str(path) in str(e)


def test_an_unknown_key_with_a_line_break_in_it_is_refused_on_one_line(tmp_path) -> None:
    """Found by the loader-mutation fuzzer: a key ``"\\num_nodes"`` (a newline, then ``um_nodes``) made a
    two-line error. Every ContractError is one line: line breaks and other controls are escaped."""
    from mindpipe.traces.errors import one_line

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"gpu": "a100-sxm4-80gb", "\num_nodes": 2, "gpus_per_node": 8}))
    with pytest.raises(ContractError) as e:
        load_cluster(str(path))
    assert "\n" not in str(e.value) and "\\num_nodes: unknown key" in str(e.value)
    assert one_line("a\nb\r\tc\x85d\u2028e\x00") == "a\\nb\\r\\tc\\x85d\\u2028e\\x00"
    assert str(ContractError("f\nile", "k\ney", "rule\nbroken")) == "f\\nile: k\\ney: rule\\nbroken"


@pytest.mark.parametrize("doc, kind", [
    ({"dp": 2, "global_batch_size": 4}, "a plan"),
    ({"traceEvents": []}, "a Chrome trace (convert torch.profiler's with: mindpipe import torch-profiler"),
    ({"kind": "gpt", "num_layers": 2, "hidden_size": 8}, "a model description"),
    ({"gpu": "a100-sxm4-80gb", "num_nodes": 1, "gpus_per_node": 8}, "a cluster description"),
    ({"devices": {}, "comm": {}, "measurements": []}, "a calibration"),
])
def test_a_file_of_another_kind_given_as_a_trace_is_named(tmp_path, doc, kind):
    """``inspect plan.json`` said ``dp: unknown key (known keys: backward_split, …)``: true, but it did
    not say that the file is a plan, not a trace."""
    import json

    from mindpipe.traces.trace import Trace

    path = tmp_path / "x.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ContractError) as e:
        Trace.load(path)
    assert str(e.value).startswith(f"{path}: this is {kind}") and "not a per-layer trace" in str(e.value)
    path.write_text(json.dumps({"dp": 2, "layers": []}))  # a trace with a stray key: the usual message
    with pytest.raises(ContractError, match="dp: unknown key"):
        Trace.load(path)
