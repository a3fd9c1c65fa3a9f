"""Tests for the hardware catalog (traces/hardware/catalog.json and traces/catalog.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindpipe.traces.catalog import (
    ENTRY_KEYS,
    NUMERIC_KEYS,
    DeviceSpec,
    describes_this_host,
    device_names,
    get_device,
    load_catalog,
    this_host_cpu,
)
from mindpipe.traces.errors import ContractError

SHIPPED = ("a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "cpu")


def _write_catalog(tmp_path: Path, devices: dict, name: str = "my_catalog.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"format_version": 1, "devices": devices}), encoding="utf-8")
    return path


def _h100_entry() -> dict:
    return copy.deepcopy(get_device("h100-sxm5-80gb").to_dict())


# --- the shipped catalog ---------------------------------------------------------------------


def test_every_shipped_device_loads_and_validates() -> None:
    catalog = load_catalog()
    assert sorted(catalog) == sorted(SHIPPED)
    assert device_names() == sorted(SHIPPED)
    for name, spec in catalog.items():
        assert spec.name == name
        # every GPU says how much host memory its swapped activations may use (the CPU is its own host)
        # and the CPU entry names the machine it was measured on
        assert set(spec.to_dict()) == set(ENTRY_KEYS) | ({"host_memory_bytes"} if spec.kind == "gpu" else {"host_cpu"})
        for dtype in ("fp32", "bf16", "fp16"):
            assert spec.peak_flops(dtype) > 0
        if spec.kind == "gpu":
            assert spec.peak_flops("tf32") > 0
            assert spec.nvlink_bandwidth_unidirectional_GBps * 2 == spec.nvlink_bandwidth_GBps
        for key in NUMERIC_KEYS:
            assert spec.sources[key].strip()
        if spec.host_memory_bytes is not None:
            assert spec.host_memory_bytes >= spec.memory_capacity_bytes and spec.sources["host_memory_bytes"].strip()


def test_host_memory_is_optional_and_checked() -> None:
    entry = _h100_entry()
    assert entry["host_memory_bytes"] == 256 * 2**30
    del entry["host_memory_bytes"], entry["sources"]["host_memory_bytes"]
    assert DeviceSpec.from_dict(entry, name="x").host_memory_bytes is None
    bad = {**_h100_entry(), "host_memory_bytes": -1}
    with pytest.raises(ContractError, match="host_memory_bytes must be a positive whole number"):
        DeviceSpec.from_dict(bad, name="x")
    unsourced = _h100_entry()
    del unsourced["sources"]["host_memory_bytes"]
    with pytest.raises(ContractError, match="host_memory_bytes has no source"):
        DeviceSpec.from_dict(unsourced, name="x")


def test_a_cpu_entry_names_its_machine_and_another_cpu_is_not_it(tmp_path: Path) -> None:
    """The catalog's ``cpu`` figures were measured on one machine; a run on another CPU must not
    take its peak for an MFU (a 2-vCPU Sapphire Rapids host ran a GPT at 134 % "MFU" of it)."""
    cpu = get_device("cpu")
    assert cpu.host_cpu == "AuthenticAMD 25 17" and cpu.sources["host_cpu"].strip()
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "model name\t: AMD EPYC 9654\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n", encoding="utf-8")
    assert this_host_cpu(str(info)) == "AuthenticAMD 25 17" and describes_this_host(cpu, str(info))
    info.write_text("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n", encoding="utf-8")
    assert this_host_cpu(str(info)) == "GenuineIntel 6 143" and not describes_this_host(cpu, str(info))
    missing = str(tmp_path / "none")
    assert this_host_cpu(missing) is None and describes_this_host(cpu, missing)  # unknown: not refused
    assert describes_this_host(get_device("h100-sxm5-80gb"), str(info))  # a GPU is its own device
    for value, rule in (("AMD Zen 4", "must be 'vendor_id family model'"), (25, "must be 'vendor_id family model'")):
        with pytest.raises(ContractError, match=rule):
            DeviceSpec.from_dict({**cpu.to_dict(), "host_cpu": value}, name="x")
    with pytest.raises(ContractError, match="host_cpu describes a cpu entry's machine; this entry is a gpu"):
        DeviceSpec.from_dict({**_h100_entry(), "host_cpu": "GenuineIntel 6 143",
                              "sources": {**_h100_entry()["sources"], "host_cpu": "x"}}, name="x")


def test_shipped_file_equals_explicit_path_load() -> None:
    path = Path(__file__).resolve().parents[2] / "traces" / "hardware" / "catalog.json"
    assert load_catalog(path) == load_catalog()


@pytest.mark.parametrize("name", SHIPPED)
def test_round_trip_to_dict_from_dict(name: str) -> None:
    spec = get_device(name)
    again = DeviceSpec.from_dict(spec.to_dict(), source="x.json", name=name)
    assert again == spec
    assert again.to_dict() == spec.to_dict()
    assert json.loads(json.dumps(spec.to_dict())) == spec.to_dict()


def test_pinned_vendor_figures() -> None:
    a100_40, a100 = get_device("a100-sxm4-40gb"), get_device("a100-sxm4-80gb")
    h100, h200 = get_device("h100-sxm5-80gb"), get_device("h200-sxm-141gb")
    assert a100.peak_flops("bf16") == 312e12
    assert a100_40.peak_flops("bf16") == 312e12
    assert h100.peak_flops("bf16") == pytest.approx(989e12, rel=1e-3)
    assert h200.peak_flops("bf16") == pytest.approx(989e12, rel=1e-3)
    assert h100.peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("bf16"), rel=1e-3)
    assert h200.memory_capacity_gib == 141
    assert a100.memory_capacity_gib == 80 and h100.memory_capacity_gib == 80
    assert a100_40.memory_capacity_gib == 40
    assert a100.memory_bandwidth_GBps == 2039
    assert h100.memory_bandwidth_GBps == 3350
    assert h200.memory_bandwidth_GBps == 4800
    assert (a100.max_power_W, h100.max_power_W, h200.max_power_W) == (400, 700, 700)
    assert (a100.nvlink_bandwidth_GBps, h100.nvlink_bandwidth_GBps) == (600, 900)
    assert (a100.nic_bandwidth_Gbps, h100.nic_bandwidth_Gbps) == (200, 400)
    assert (a100.pcie_bandwidth_GBps, h100.pcie_bandwidth_GBps) == (32, 64)


def test_ratios_are_sane() -> None:
    a100, h100 = get_device("a100-sxm4-80gb"), get_device("h100-sxm5-80gb")
    assert h100.peak_flops("bf16") / a100.peak_flops("bf16") == pytest.approx(3.17, abs=0.01)
    for spec in load_catalog().values():
        # Tensor-core / matrix dtypes are never slower than fp32 on the shipped devices.
        assert spec.peak_flops("bf16") >= spec.peak_flops("fp32")
        assert 0 <= spec.idle_power_W < spec.max_power_W
    cpu = get_device("cpu")
    assert cpu.kind == "cpu" and cpu.nvlink_bandwidth_GBps == 0
    assert cpu.peak_flops("fp32") < a100.peak_flops("fp32") / 10
    assert "measured" in cpu.sources["peak_flops_per_s.fp32"]


def test_dtype_aliases_and_missing_dtype() -> None:
    h100 = get_device("h100-sxm5-80gb")
    assert h100.peak_flops("bfloat16") == h100.peak_flops("bf16")
    assert h100.peak_flops("float16") == h100.peak_flops("fp16")
    assert h100.peak_flops("float32") == h100.peak_flops("fp32")
    with pytest.raises(ContractError) as info:
        get_device("cpu").peak_flops("tf32")
    assert "tf32" in str(info.value) and "bf16" in str(info.value)


def test_get_device_is_case_insensitive_and_lists_names_when_unknown() -> None:
    assert get_device("H100-SXM5-80GB") is get_device("h100-sxm5-80gb")
    with pytest.raises(ContractError) as info:
        get_device("v100-sxm2", source="cluster.json")
    message = str(info.value)
    assert "cluster.json" in message and "v100-sxm2" in message
    for name in SHIPPED:
        assert name in message


def test_load_catalog_returns_a_copy() -> None:
    load_catalog().pop("cpu")
    assert "cpu" in load_catalog()


def test_importing_traces_catalog_does_not_import_torch() -> None:
    code = (
        "import sys, traces.catalog; traces.catalog.load_catalog(); print('torch' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(root)},
    )
    assert out.stdout.strip() == "False"


# --- user catalog files ----------------------------------------------------------------------


def _error_for(tmp_path: Path, entry: dict) -> str:
    path = _write_catalog(tmp_path, {"my-gpu": entry})
    with pytest.raises(ContractError) as info:
        load_catalog(path)
    message = str(info.value)
    assert "my_catalog.json" in message
    return message


def test_user_catalog_loads(tmp_path: Path) -> None:
    path = _write_catalog(tmp_path, {"My-GPU": _h100_entry()})
    catalog = load_catalog(path)
    assert list(catalog) == ["my-gpu"]
    assert get_device("MY-gpu", catalog=catalog).max_power_W == 700


def test_user_catalog_unknown_key(tmp_path: Path) -> None:
    entry = _h100_entry() | {"tdp_W": 700}
    assert "tdp_W" in _error_for(tmp_path, entry)


def test_user_catalog_missing_key(tmp_path: Path) -> None:
    entry = _h100_entry()
    del entry["memory_bandwidth_GBps"]
    assert "memory_bandwidth_GBps" in _error_for(tmp_path, entry)


def test_user_catalog_negative_value(tmp_path: Path) -> None:
    entry = _h100_entry() | {"max_power_W": -700}
    assert "max_power_W" in _error_for(tmp_path, entry)
    entry = _h100_entry()
    entry["peak_flops_per_s"]["bf16"] = -1.0
    assert "peak_flops_per_s.bf16" in _error_for(tmp_path, entry)


def test_user_catalog_missing_source(tmp_path: Path) -> None:
    entry = _h100_entry()
    del entry["sources"]["nic_bandwidth_Gbps"]
    assert "sources.nic_bandwidth_Gbps" in _error_for(tmp_path, entry)
    entry = _h100_entry()
    del entry["sources"]["peak_flops_per_s.fp8"]
    assert "peak_flops_per_s.fp8" in _error_for(tmp_path, entry)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("kind", "tpu"),
        ("memory_capacity_bytes", "80GB"),
        ("memory_capacity_bytes", 1.5),
        ("idle_power_W", True),
        ("idle_power_W", 800),
        ("pcie_bandwidth_GBps", 0),
        ("nvlink_bandwidth_unidirectional_GBps", 900),
        ("peak_flops_per_s", {}),
        ("peak_flops_per_s", [1.0]),
        ("sources", "datasheet"),
        ("display_name", ""),
    ],
)
def test_user_catalog_bad_values(tmp_path: Path, key: str, value: object) -> None:
    assert key in _error_for(tmp_path, _h100_entry() | {key: value})


def test_user_catalog_unknown_dtype_and_stray_source(tmp_path: Path) -> None:
    entry = _h100_entry()
    entry["peak_flops_per_s"]["bf61"] = 1e12
    assert "bf61" in _error_for(tmp_path, entry)
    entry = _h100_entry()
    entry["sources"]["colour"] = "green"
    assert "colour" in _error_for(tmp_path, entry)


def test_user_catalog_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"format_version": 1,\n "devices": {"x": }}', encoding="utf-8")
    with pytest.raises(ContractError) as info:
        load_catalog(path)
    message = str(info.value)
    assert "broken.json" in message and "line 2" in message and "column" in message


def test_user_catalog_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="file not found") as info:
        load_catalog(tmp_path / "nope.json")
    assert "nope.json" in str(info.value)


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ([], None),
        ({"format_version": 2, "devices": {}}, "format_version"),
        ({"format_version": 1, "devices": {}}, "devices"),
        ({"format_version": 1, "devices": {}, "extra": 1}, "extra"),
    ],
)
def test_user_catalog_bad_top_level(tmp_path: Path, doc: object, key: str | None) -> None:
    path = tmp_path / "top.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ContractError) as info:
        load_catalog(path)
    assert info.value.key == key and "top.json" in str(info.value)


def test_user_catalog_duplicate_names(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    entry = json.dumps(_h100_entry())
    path.write_text(f'{{"format_version": 1, "devices": {{"a": {entry}, "A": {entry}}}}}')
    with pytest.raises(ContractError, match="case-insensitive"):
        load_catalog(path)
    path.write_text(f'{{"format_version": 1, "devices": {{"a": {entry}, "a": {entry}}}}}')
    with pytest.raises(ContractError, match="duplicate key"):
        load_catalog(path)


# --- property test ---------------------------------------------------------------------------

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_entry_keys = st.sampled_from(ENTRY_KEYS) | st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_entry_keys, _json_values, max_size=len(ENTRY_KEYS) + 2))
def test_from_dict_only_raises_contract_error(d: dict) -> None:
    try:
        spec = DeviceSpec.from_dict(d, source="fuzz.json")
    except ContractError as exc:
        assert str(exc).startswith("fuzz.json")
    else:
        assert isinstance(spec, DeviceSpec)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ENTRY_KEYS), _json_values)
def test_from_dict_with_one_key_replaced(key: str, value: object) -> None:
    entry = _h100_entry() | {key: value}
    try:
        spec = DeviceSpec.from_dict(entry, source="fuzz.json")
    except ContractError as exc:
        assert key in str(exc)
    else:
        assert DeviceSpec.from_dict(spec.to_dict(), source="fuzz.json") == spec
