"""The shipped CPU trace of gpt-mini is real, labelled and consistent with the model."""

from mindpipe.traces.builtin import load_model
from mindpipe.traces.data import load_shipped_trace, shipped_trace_names


def test_gpt_mini_cpu_trace_is_labelled_and_matches_the_model() -> None:
    assert "gpt-mini.cpu" in shipped_trace_names()
    trace = load_shipped_trace("gpt-mini.cpu")
    assert trace.device == "cpu"
    assert "CPU trace" in trace.provenance.notes
    assert trace.provenance.command.startswith("mindpipe profile gpt-mini")
    assert trace.provenance.torch_version and trace.provenance.date
    trace.check_model(load_model("gpt-mini"))
    names = [r.name for r in trace.layers]
    assert names == ["embedding", "block.0", "block.1", "block.2", "block.3", "final_norm", "lm_head"]
    assert all(r.forward_s > 0 for r in trace.layers)
    # The profiler's per-layer sum agrees with its own whole-step measurement (issue 2 bound).
    assert trace.step is not None
    assert 0.85 <= trace.forward_backward_s / trace.step.forward_backward_s <= 1.15
