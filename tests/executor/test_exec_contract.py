"""The measured-run contract (traces/measured.py) and its place in the trace schema."""

from __future__ import annotations

import copy

import pytest
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import Measurement
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.trace import Trace


def _measurement() -> dict:
    return {
        "plan": {"pp": 2, "global_batch_size": 4, "micro_batch_size": 1},
        "world_size": 2, "nodes": 1, "backend": "gloo", "device_kind": "cpu", "device_name": "cpu",
        "threads_per_rank": 1, "torch_version": "2.13.0", "schedule_source": "torch", "seed": 0, "data": "synthetic",
        "warmup_steps": 1,
        "steps": [{"step": 1, "loss": 4.2, "iteration_s": 0.5, "tokens_per_s": 128.0},
                  {"step": 2, "loss": 4.1, "iteration_s": 0.1, "tokens_per_s": 640.0}],
        "tokens_per_s": 640.0, "model_flops_per_iteration": 1e9, "peak_flops_per_s": 1.5e11, "devices_for_mfu": 1,
        "mfu": 0.06, "energy_j_per_iteration": 0.5, "energy_source": "estimated",
        "actions": [{"rank": 1, "step": 2, "stage": 1, "microbatch": 0, "kind": "F", "start_s": 0.01, "duration_s": 0.002}],
        "comms": [{"rank": 0, "step": 2, "kind": "p2p_wait", "axis": "pp", "op": "wait", "start_s": 0.0, "duration_s": 0.001}],
        "ranks": [{"rank": 0, "pp_rank": 0, "dp_rank": 0, "tp_rank": 0, "stages": [0], "host": "h", "compute_s": 0.05,
                   "p2p_wait_s": 0.01, "dp_sync_s": 0.0, "optimizer_s": 0.01, "peak_memory_bytes": 1000,
                   "memory_source": "process_rss"},
                  {"rank": 1, "pp_rank": 1, "dp_rank": 0, "tp_rank": 0, "stages": [1], "host": "h", "compute_s": 0.05,
                   "p2p_wait_s": 0.01, "dp_sync_s": 0.0, "optimizer_s": 0.01, "peak_memory_bytes": 1000,
                   "memory_source": "process_rss"}],
    }


def _trace(measurement: dict) -> dict:
    return {
        "device": "cpu", "dtype": "fp32", "provenance": {"tool": "mindpipe run"}, "backward_split": "combined",
        "layers": [{"name": n, "kind": k, "forward_s": 1e-3, "backward_input_s": 2e-3, "backward_weight_s": 0.0}
                   for n, k in (("embedding", "embedding"), ("block.0", "block"), ("lm_head", "lm_head"))],
        "measurement": measurement,
    }


def test_roundtrip_through_the_trace(tmp_path):
    trace = Trace.from_dict(_trace(_measurement()), "m.json")
    trace.save(tmp_path / "m.json")
    again = Trace.load(tmp_path / "m.json")
    assert again == trace and again.measurement is not None
    assert again.measurement.losses == [4.2, 4.1]
    assert [s.step for s in again.measurement.measured_steps] == [2]
    assert to_dict(again)["measurement"]["format_version"] == 1


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.update(extra=1), "extra: unknown key"),
        (lambda m: m["actions"][0].update(kind="X"), "kind='X' is not one of F, B, I, W"),
        (lambda m: m["comms"][0].update(axis="ep"), "axis='ep' is not one of"),
        (lambda m: m["steps"][1].update(step=3), "step numbers must be consecutive"),
        (lambda m: m.update(world_size=4), "differs from the plan's dp×tp×pp=1×1×2=2"),
        (lambda m: m["actions"][0].update(rank=2), "actions[0].rank=2 >= world_size=2"),
        (lambda m: m.update(format_version=2), "format_version=2 is not supported"),
        (lambda m: m.update(energy_source="guess"), "energy_source='guess' is not one of"),
        (lambda m: m["ranks"][0].update(peak_memory_bytes=-1), "peak_memory_bytes=-1 must be >= 0"),
        (lambda m: m.pop("steps"), "steps: missing required key"),
        (lambda m: m["ranks"][0].update(rank=7), "ranks lists rank 7, past world_size=2"),
    ],
)
def test_invalid_measurements_are_refused_with_the_key(edit, needle):
    m = copy.deepcopy(_measurement())
    edit(m)
    with pytest.raises(ContractError) as e:
        Trace.from_dict(_trace(m), "measured.json")
    assert str(e.value).startswith("measured.json: ") and needle in str(e.value)


def test_measurement_alone():
    m = from_dict(Measurement, _measurement(), "x")
    assert m.plan.pp == 2 and m.ranks[0].memory_source == "process_rss"
