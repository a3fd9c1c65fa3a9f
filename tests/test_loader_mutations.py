"""Mutation tests of every loader: a mutated valid file loads as a valid object or is refused.

Each loader starts from a valid file of its kind, which hypothesis mutates the ways a careless
or hostile user would: truncated, bytes flipped, hostile tokens inserted (``1e400``, ``NaN``, a
400-digit integer, ``true``, invalid UTF-8), a JSON value or a CSV cell replaced by a value of the
wrong type or an absurd size, gzip bodies corrupted. Whatever comes out, the loader either
returns an object that passes its contract (and whose numbers are finite) or raises
:class:`ContractError` naming the file, never another exception.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from mindpipe.simulator.action_table import read_csv as read_action_table
from mindpipe.simulator.action_table import write_csv as write_action_table
from mindpipe.simulator.calibrate.runs import load_run
from mindpipe.simulator.carbon import load_carbon_csv
from mindpipe.simulator.perf.constants import read_constants
from mindpipe.simulator.perf.vtrain import COLUMNS, load_vtrain
from mindpipe.simulator.schedules import build_schedule
from mindpipe.traces.builtin import BUILTIN_MODELS, load_cluster, load_model, load_plan
from mindpipe.traces.calibration import (
    Calibration,
    ComputeCalibration,
    DeviceCalibration,
    LinkCalibration,
    load_calibration,
    save_calibration,
)
from mindpipe.traces.catalog import load_catalog
from mindpipe.traces.errors import ContractError
from mindpipe.traces.importers.aicb import import_aicb
from mindpipe.traces.importers.torch_profiler import import_torch_profiler
from mindpipe.traces.trace import Trace

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("MINDPIPE_MUTATION_EXAMPLES", "40"))  # more for a bug hunt
HOSTILE_TOKENS = ("1e400", "-1e400", "NaN", "Infinity", "-Infinity", "9" * 400, "true", "null", '"x"', "[]", "{}",
                  "-1", "0", "1e308", "2e-400", ",", "\n", '"', "\\", "\x00", "\u2028")
HOSTILE_VALUES: tuple[Any, ...] = (10**400, -(10**30), 2**53 + 1, 1e300, -1, 0, True, False, None, "x", "", [], {},
                                   [1, "a"], {"k": 1}, math.nan, math.inf, -math.inf, 1.5, "9" * 1000)
HOSTILE_CELLS = ("1e300", "nan", "inf", "-inf", "-1", "0", "", "x", "9" * 5000, "1.5", "2024-13-45 00:00:00",
                 "2024-01-01T00:00:00+05:00", "\ufeff1", "true")


# -- mutations --------------------------------------------------------------------------------------
@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` truncated, with a byte flipped, a hostile token inserted or a span deleted."""
    op = draw(st.sampled_from(("truncate", "flip", "insert", "delete", "invalid_utf8")))
    i = draw(st.integers(0, max(0, len(data) - 1)))
    if op == "truncate":
        return data[:i]
    if op == "flip":
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:] if data else data
    if op == "insert":
        return data[:i] + draw(st.sampled_from(HOSTILE_TOKENS)).encode() + data[i:]
    if op == "invalid_utf8":
        return data[:i] + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88"))) + data[i:]
    j = draw(st.integers(i, min(len(data), i + 64)))
    return data[:i] + data[j:]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in ``doc`` (object keys and list indices), at most 3 items per list."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def json_mutation(draw: st.DrawFn, doc: Any) -> bytes:
    """``doc`` with one value replaced by a hostile one (or a key added or removed), as JSON text."""
    doc = json.loads(json.dumps(doc))
    paths = [p for p in _paths(doc) if p]
    path = draw(st.sampled_from(paths))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    op = draw(st.sampled_from(("replace", "replace", "drop", "add")))
    if op == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    elif op == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(("extra", "x" * 300, "")))] = draw(st.sampled_from(HOSTILE_VALUES))
    else:
        parent[path[-1]] = draw(st.sampled_from(HOSTILE_VALUES))
    return json.dumps(doc, allow_nan=True).encode()


@st.composite
def csv_mutation(draw: st.DrawFn, text: str, sep: str = ",") -> bytes:
    """``text`` (CSV) with one cell replaced by a hostile one, or a row duplicated, dropped or reversed."""
    rows = [line.split(sep) for line in text.splitlines()]
    op = draw(st.sampled_from(("cell", "cell", "cell", "duplicate", "drop", "reverse", "header_only")))
    r = draw(st.integers(0, len(rows) - 1))
    if op == "cell":
        rows[r][draw(st.integers(0, len(rows[r]) - 1))] = draw(st.sampled_from(HOSTILE_CELLS))
    elif op == "duplicate":
        rows.insert(r, list(rows[r]))
    elif op == "drop":
        del rows[r]
    elif op == "reverse":
        rows = rows[:1] + rows[:0:-1]
    else:
        rows = rows[:1]
    return ("\n".join(sep.join(row) for row in rows) + "\n").encode()


# -- seeds: one valid file per kind -----------------------------------------------------------------
def _model() -> dict[str, Any]:
    return dict(BUILTIN_MODELS["gpt-mini"])


def _calibration(tmp: Path) -> Any:
    cal = Calibration(
        devices={"cpu": DeviceCalibration(kind="cpu", cpus_per_node=2, op_cpu_s=2e-5, compute={
            "fp32": ComputeCalibration(scale={"gemm": 1.8, "memory": 1.5}, op_overhead_s=1.6e-4, samples=32,
                                       fit_mape=0.04)})},
        comm={"gloo": {"local": LinkCalibration(step_latency_s=8.6e-5, bandwidth_Bps=1.07e9, samples=288)}},
        measurements=["a.json"], created="2026-01-01T00:00:00+00:00")
    save_calibration(cal, tmp / "seed.json")
    return json.loads((tmp / "seed.json").read_text())


def _carbon_text() -> str:
    start = dt.datetime(2024, 1, 1)
    rows = [f"{(start + dt.timedelta(hours=h)).strftime('%Y-%m-%d %H:%M:%S')},GB,{50 + h}.5,{90 + h}.25"
            for h in range(24)]
    return "Datetime (UTC),Zone Id,Carbon Intensity gCO2eq/kWh (direct),Carbon Intensity gCO2eq/kWh (LCA)\n" + \
        "\n".join(rows) + "\n"


def _vtrain_text() -> str:
    rows = ["2,16,8,1024,16,24,1024,1,1,2,372.160408", "8,32,4,1024,16,24,1024,2,2,2,219.732754",
            "4,32,2,2048,16,24,1024,2,2,1,180.5"]
    return ",".join(COLUMNS) + "\n" + "\n".join(rows) + "\n"


def _aicb_text() -> str:
    rows = ["grad_norm -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 4 100",
            "embedding_layer -1 1000 ALLREDUCE 8388608 1 NONE 0 2000 NONE 0 100",
            "attention_layer -1 30000 ALLREDUCE 8388608 40000 ALLREDUCE 8388608 35000 NONE 0 100",
            "mlp_layer -1 50000 ALLREDUCE 8388608 60000 ALLREDUCE 8388608 55000 NONE 0 100"]
    return "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 8\n4\n" + "\n".join(rows) + "\n"


def _chrome() -> dict[str, Any]:
    def x(name: str, cat: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [x("ProfilerStep#1", "user_annotation", 0, 500), x("a", "user_annotation", 10, 100),
              x("aten::mm", "cpu_op", 20, 50, **{"Sequence number": 1, "Fwd thread id": 0}),
              x("b", "user_annotation", 120, 200),
              x("aten::relu", "cpu_op", 130, 40, **{"Sequence number": 2, "Fwd thread id": 0}),
              x("autograd::engine::evaluate_function: ReluBackward0", "cpu_op", 350, 30, tid=2,
                **{"Sequence number": 2, "Fwd thread id": 1}),
              x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 390, 60, tid=2,
                **{"Sequence number": 1, "Fwd thread id": 1})]
    return {"traceEvents": events, "schemaVersion": 1}


# -- the loaders and what a valid result must satisfy -------------------------------------------------
def _finite_trace(trace: Trace) -> None:
    assert trace.layers and math.isfinite(trace.forward_backward_s)


Loader = Callable[[Path], Any]
JSON_SEEDS: dict[str, tuple[str, Callable[[Path], Any], Loader, Callable[[Any], None]]] = {
    "model": ("m.json", lambda _: _model(), lambda p: load_model(str(p)), lambda m: m.param_count()),
    "cluster": ("c.json", lambda _: {"gpu": "a100-sxm4-80gb", "num_nodes": 2, "gpus_per_node": 8, "pue": 1.1},
                lambda p: load_cluster(str(p)), lambda c: c.world_size),
    "plan": ("p.json", lambda _: {"dp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 8,
                                  "schedule": "1f1b", "partition": [2, 2], "recompute": "selective"},
             lambda p: load_plan(str(p)), lambda p: p.num_microbatches),
    "trace": ("t.json", lambda _: json.loads((REPO / "traces/data/gpt-mini.cpu.trace.json").read_text()),
              Trace.load, _finite_trace),
    "calibration": ("cal.json", _calibration, load_calibration, lambda c: c.devices or c.comm),
    "measured": ("run.json", lambda _: json.loads(gzip.decompress(
        (REPO / "benchmarks/results/calibration/fit_dp4.r0.json.gz").read_bytes())),
        load_run, lambda r: math.isfinite(r.iteration_s) and r.iteration_s > 0),
    "chrome": ("prof.json", lambda _: _chrome(), lambda p: import_torch_profiler(p, group="record_function"),
               _finite_trace),
    "catalog": ("catalog.json", lambda _: json.loads((REPO / "traces/hardware/catalog.json").read_text()),
                load_catalog, lambda c: c),
    "constants": ("a100.json", lambda _: json.loads((REPO / "simulator/perf/data/a100.json").read_text()),
                  read_constants, lambda c: c),
}
TEXT_SEEDS: dict[str, tuple[str, Callable[[], str], Loader, Callable[[Any], None]]] = {
    "carbon": ("zone.csv", _carbon_text, load_carbon_csv,
               lambda s: all(math.isfinite(v) for _, v in s) and s.intensity_over(s.times[0], 60.0) >= 0),
    "vtrain": ("v.csv", _vtrain_text, load_vtrain, lambda rows: [r.plan.world_size for r in rows]),
    "aicb": ("w_A100.txt", _aicb_text, import_aicb, _finite_trace),
    "action_table": ("table.csv", lambda: "", lambda p: read_action_table(p, "1f1b"), lambda s: s.orders),
}


def _check(loader: Loader, valid: Callable[[Any], None], path: Path, data: bytes) -> str:
    """Load ``data`` from ``path``: ``loaded`` (and valid) or ``refused`` (one line naming the file)."""
    path.write_bytes(data)
    try:
        obj = loader(path)
    except ContractError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return "refused"
    valid(obj)
    return "loaded"


@pytest.mark.parametrize("kind", sorted(JSON_SEEDS))
def test_mutated_json_inputs_load_or_are_refused(kind: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    name, seed, loader, valid = JSON_SEEDS[kind]
    tmp = tmp_path_factory.mktemp(kind)
    doc = seed(tmp)
    text = json.dumps(doc).encode()
    assert _check(loader, valid, tmp / name, text) == "loaded"  # the seed itself is valid

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        how = data.draw(st.sampled_from(("bytes", "json", "gzip")))
        if how == "bytes":
            mutated = data.draw(byte_mutation(text))
        elif how == "json":
            mutated = data.draw(json_mutation(doc))
        else:  # a gzip body with a flipped or cut byte (the header kept)
            mutated = data.draw(byte_mutation(gzip.compress(text)))
        event(_check(loader, valid, tmp / (name + (".gz" if how == "gzip" else "")), mutated))

    run()


@pytest.mark.parametrize("kind", sorted(TEXT_SEEDS))
def test_mutated_text_inputs_load_or_are_refused(kind: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    name, seed, loader, valid = TEXT_SEEDS[kind]
    tmp = tmp_path_factory.mktemp(kind)
    text = seed()
    if kind == "action_table":
        write_action_table(build_schedule("1f1b", 2, 4, 1), tmp / "seed.csv")
        text = (tmp / "seed.csv").read_text()
    assert _check(loader, valid, tmp / name, text.encode()) == "loaded"

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        if data.draw(st.booleans()):
            mutated = data.draw(byte_mutation(text.encode()))
        else:
            mutated = data.draw(csv_mutation(text, " " if kind == "aicb" else ","))
        event(_check(loader, valid, tmp / name, mutated))

    run()
