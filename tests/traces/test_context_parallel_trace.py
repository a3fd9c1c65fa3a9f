"""A trace measured by a cp run prices other plans only with a note: its layers ran s/cp tokens each."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mindpipe.traces.builtin import load_model
from mindpipe.traces.config import Plan
from mindpipe.traces.measured import Measurement, StepRecord
from mindpipe.traces.trace import Trace

SHIPPED = Path(__file__).resolve().parents[2] / "traces" / "data" / "gpt-mini.cpu.trace.json"


def _measured(plan: Plan) -> Measurement:
    return Measurement(plan=plan, world_size=plan.world_size, nodes=1, backend="gloo", device_kind="cpu",
                       device_name="cpu", threads_per_rank=1, torch_version="2.13.0", schedule_source="torch",
                       seed=0, data="synthetic", warmup_steps=0, steps=[StepRecord(1, 5.0, 1.0, 1.0)], tokens_per_s=1.0,
                       model_flops_per_iteration=1.0, peak_flops_per_s=1.0, devices_for_mfu=1, mfu=0.0,
                       energy_j_per_iteration=0.0, energy_source="estimated")


def test_a_cp_measured_trace_says_its_layers_ran_a_share_of_the_sequence():
    """`mindpipe run` with cp=2 writes a trace whose header says seq 64 while every layer ran 32 tokens
    (and the K/V all-gathers); `simulate --trace` priced a cp=1 plan from it without a word."""
    trace = Trace.load(SHIPPED)
    model = load_model("gpt-mini")
    plan = Plan(micro_batch_size=trace.micro_batch_size or 1, global_batch_size=4, precision=trace.dtype)
    cp2 = Plan(cp=2, micro_batch_size=1, global_batch_size=4, flash_attention=True, precision=trace.dtype)
    noted = dataclasses.replace(trace, measurement=_measured(cp2)).pricing_notes(model, plan, trace.device)
    assert any("context parallelism (cp=2)" in n and "seq_len/cp=64 tokens" in n for n in noted), noted
    plain = dataclasses.replace(trace, measurement=_measured(Plan(global_batch_size=4))).pricing_notes(
        model, plan, trace.device)
    assert not any("context parallelism" in n for n in plain)
