"""``mindpipe inspect``'s table (``traces/summary.py``): what a trace does not say is printed as unknown."""

from __future__ import annotations

from mindpipe.traces.summary import format_summary, summarize
from mindpipe.traces.trace import LayerRecord, Provenance, Trace


def _trace(activations: list[int | None], **extra) -> Trace:
    layers = [LayerRecord(f"l{i}", "block", 1e-3, 2e-3, 0.0, activation_bytes=a) for i, a in enumerate(activations)]
    return Trace(device="cpu", dtype="unknown", layers=layers,
                 provenance=Provenance("mindpipe import torch-profiler", date="2026-01-01T00:00:00Z"), **extra)


def test_an_imported_traces_missing_model_batch_and_sequence_print_as_unknown():
    text = format_summary(_trace([None, None]))
    header, total = text.splitlines()[0], text.splitlines()[-2]
    assert "None" not in text
    assert header.startswith("trace: unknown model on cpu (unknown), micro-batch unknown, seq unknown, tp 1, "
                             "2 layer records")
    assert total.startswith("total") and total.split()[-1] == "unknown" and " B" not in total
    summary = summarize(_trace([None, None]))
    assert summary.activation_bytes is None  # --json: null, not a total of 0 bytes
    assert summary.param_count is None and summary.forward_flops is None  # nor 0 parameters, 0 FLOPs


def test_known_fields_and_totals_print_as_before_and_a_partial_total_says_so():
    full = format_summary(_trace([2**20, 2**20], model_name="gpt-mini", micro_batch_size=4, seq_len=128))
    assert full.splitlines()[0].startswith("trace: gpt-mini on cpu (unknown), micro-batch 4, seq 128, tp 1")
    assert full.splitlines()[-2].endswith("2.00 MiB")
    partial = format_summary(_trace([2**20, None]))
    assert partial.splitlines()[-2].endswith("1.00 MiB + unknown")
    one = format_summary(_trace([None]), max_rows=0)
    assert "1 layer record " in one and "... 1 more record\n" in one
