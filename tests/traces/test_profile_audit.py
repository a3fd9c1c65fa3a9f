"""A trace prices only what it measured: its sequence length is refused when it differs from the model's,
and what it does not measure of a plan (precision, device, micro-batch, missing layers) is said."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Plan
from mindpipe.traces.data import load_shipped_trace
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace


def _shipped(**changes: object) -> Trace:
    data = to_dict(load_shipped_trace("gpt-mini.cpu"))
    data.update(changes)
    return Trace.from_dict(data, "t.json")


def test_a_trace_profiled_at_a_shorter_sequence_is_refused_for_the_full_model():
    # A trace written by `profile --seq-len 64` before the profiler recorded the profiled length:
    # its model is gpt-mini (s = 128) but its times are for 64-token sequences.
    trace = _shipped(seq_len=64)
    with pytest.raises(ContractError, match=r"t\.json: seq_len: the trace was profiled at seq_len=64 but gpt-mini "
                                            r"runs seq_len=128"):
        trace.check_model(load_model("gpt-mini"), source="t.json")


def test_such_a_trace_prices_the_model_at_its_length():
    trace = _shipped(seq_len=64)
    short = dataclasses.replace(load_model("gpt-mini"), seq_len=64)
    trace.check_model(short)  # the network the times are for
    other = dataclasses.replace(load_model("gpt-mini"), seq_len=64, hidden_size=512)
    with pytest.raises(ContractError, match=r"trace was taken for .*seq_len=64.*not for"):
        trace.check_model(other)


def test_the_profiler_records_the_model_at_the_profiled_length():
    from mindpipe.traces.profiler import ProfileOptions, profile_model

    model = load_model("llama-tiny")
    trace = profile_model(model, ProfileOptions(seq_len=16, warmup=0, repeats=1, step_repeats=0))
    assert trace.seq_len == 16 and trace.model is not None and trace.model.seq_len == 16
    trace.check_model(dataclasses.replace(model, seq_len=16))
    with pytest.raises(ContractError, match="profiled at seq_len=16 but llama-tiny runs seq_len=64"):
        trace.check_model(model)


def test_pricing_notes_name_what_the_trace_did_not_measure():
    model = load_model("gpt-mini")
    trace = load_shipped_trace("gpt-mini.cpu")  # fp32, on cpu, micro-batch 4
    same = Plan(micro_batch_size=4, global_batch_size=8, precision="fp32")
    assert trace.pricing_notes(model, same, "cpu") == []
    notes = trace.pricing_notes(model, Plan(micro_batch_size=4, global_batch_size=8), "a100-sxm4-80gb")
    assert notes[0].startswith("trace profiled in fp32, the plan runs bf16: its times are fp32 times")
    assert notes[1].startswith("trace taken on cpu, the cluster's devices are a100-sxm4-80gb")
    assert len(notes) == 2


def test_pricing_notes_name_missing_and_repeated_layers_and_an_unknown_micro_batch():
    model = load_model("gpt-mini")
    data = to_dict(load_shipped_trace("gpt-mini.cpu"))
    layers = [r for r in data["layers"] if r["kind"] != "lm_head"]
    data.update(layers=[*layers, layers[0]], micro_batch_size=None)  # no head, two embeddings
    trace = Trace.from_dict(data, "t.json")
    notes = trace.pricing_notes(model, Plan(micro_batch_size=2, global_batch_size=8, precision="fp32"), "cpu")
    assert notes == [
        "the trace does not record its micro-batch size: its times are used as they are for micro_batch_size=2",
        "the trace has no lm_head record: the LM head and loss priced as 0 s",
        "the trace has 2 embedding records: the first is used",
    ]
