"""Regenerate ``gpt_tiny_cpu_stack.json.gz``: a real torch.profiler CPU trace of a tiny GPT.

The trace has both layer groupings the importer reads: ``record_function`` ranges opened by
:func:`mindpipe.traces.importers.torch_profiler.record_layers` and, because of ``with_stack=True``, the
``nn.Module: <Class>_<k>`` python_function events. Two profiled steps (one warm-up step first).

Run from the repository root: ``PYTHONPATH=. .venv/bin/python tests/traces/data/torch_profiler/make_fixture.py``
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import torch
from mindpipe.traces.config import Model
from mindpipe.traces.importers.torch_profiler import record_layers
from mindpipe.traces.torch_gpt import build_gpt, lm_loss, synthetic_batch
from torch.profiler import ProfilerActivity, profile, schedule

OUT = Path(__file__).with_name("gpt_tiny_cpu_stack.json.gz")
MODEL = Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128, name="tiny")
MICRO_BATCH, SEQ, ACTIVE = 2, 16, 2


def main() -> None:
    """Profile the tiny GPT and write the gzip'ed trace beside this script."""
    torch.manual_seed(0)
    net = build_gpt(MODEL)
    tokens, targets = synthetic_batch(MODEL, MICRO_BATCH, seq_len=SEQ)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        with (
            record_layers(net),
            profile(
                activities=[ProfilerActivity.CPU],
                schedule=schedule(wait=0, warmup=1, active=ACTIVE, repeat=1),
                on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
                with_stack=True,
            ) as prof,
        ):
            for _ in range(1 + ACTIVE):
                lm_loss(net(tokens), targets).backward()
                net.zero_grad(set_to_none=True)
                prof.step()
        doc = json.loads(raw.read_text())
    doc["traceName"] = OUT.name  # not the temporary path
    data = json.dumps(doc, separators=(",", ":")).encode()
    OUT.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(doc['traceEvents'])} events, torch {torch.__version__})")


if __name__ == "__main__":
    main()
