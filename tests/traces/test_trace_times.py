"""A trace's times are measurements: each record within the ``record_seconds`` limit, and at least one
record timed (a trace of zeros would price every plan at no compute). Single zeros stay legal."""

from __future__ import annotations

import json

import pytest
from mindpipe.traces.data import load_shipped_trace
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import LIMITS, limit
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace

ZERO_RULE = ("layers: forward_s, backward_input_s and backward_weight_s are 0 s in every record: nothing was "
             "measured (a trace must time at least one layer)")


def _shipped() -> dict:
    return to_dict(load_shipped_trace("gpt-mini.cpu"))


@pytest.mark.parametrize("key", ["forward_s", "backward_input_s", "backward_weight_s", "update_s"])
def test_a_time_past_the_limit_is_refused_naming_file_record_and_limit(key):
    data = _shipped()
    data["layers"][2][key] = 1e30
    with pytest.raises(ContractError) as e:
        Trace.from_dict(data, "t.json")
    assert str(e.value) == (f"t.json: layers[2].{key}=1e+30 exceeds the limit of 1,000,000 seconds of one trace "
                            "record's forward, backward or update time (one micro-batch)")
    assert e.value.key == f"layers[2].{key}"


def test_the_limit_itself_is_a_legal_time():
    assert LIMITS["record_seconds"].maximum == limit("record_seconds") == 1_000_000
    data = _shipped()
    data["layers"][1]["forward_s"] = limit("record_seconds")
    assert Trace.from_dict(data, "t.json").layers[1].forward_s == 1_000_000


def test_a_trace_of_zeros_is_refused(tmp_path):
    data = _shipped()
    for rec in data["layers"]:
        rec.update(forward_s=0.0, backward_input_s=0, backward_weight_s=0.0)
    with pytest.raises(ContractError) as e:
        Trace.from_dict(data, "t.json")
    assert str(e.value) == f"t.json: {ZERO_RULE}"
    path = tmp_path / "zero.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ContractError, match=f"^{path}: layers: "):
        Trace.load(path)


def test_an_update_time_alone_does_not_make_a_trace_measured():
    data = _shipped()
    for rec in data["layers"]:
        rec.update(forward_s=0.0, backward_input_s=0.0, backward_weight_s=0.0, update_s=1e-3)
    with pytest.raises(ContractError, match="nothing was measured"):
        Trace.from_dict(data, "t.json")


def test_single_zero_records_stay_legal():
    # A frozen part (no time at all) and the embedding's input gradient (nothing to propagate into).
    data = _shipped()
    data["layers"][0]["backward_input_s"] = 0.0
    data["layers"][1].update(forward_s=0.0, backward_input_s=0.0, backward_weight_s=0.0)
    trace = Trace.from_dict(data, "t.json")
    assert trace.layers[1].forward_s == 0.0 and trace.forward_backward_s > 0


def test_one_timed_time_is_enough():
    data = _shipped()
    for rec in data["layers"]:
        rec.update(forward_s=0.0, backward_input_s=0.0, backward_weight_s=0.0)
    data["layers"][-1]["backward_weight_s"] = 1e-6
    assert Trace.from_dict(data, "t.json").forward_backward_s == pytest.approx(1e-6)
