"""Write the hostile input files of the corpus (``tests/hostile/inputs/``) from the valid files they mutate.

Run from the repository root: ``.venv/bin/python tests/hostile/make_inputs.py``. The files are
committed; this script documents how each was made and makes them again (deterministically).
Inputs that are huge or special (``/dev/zero``, FIFOs, gzip bombs, sparse multi-GiB files, a
10^6-row AICB workload, a 200 KB CSV field) are not here: :mod:`corpus` makes them at test time
(the ``make`` steps of ``cases.toml``).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = HERE / "inputs"
MEASURED = REPO / "benchmarks/results/calibration/fit_dp4.r0.json.gz"
SHIPPED_TRACE = REPO / "traces/data/gpt-mini.cpu.trace.json"

MODEL = {"kind": "gpt", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 32, "vocab_size": 128}
CLUSTER = {"gpu": "a100-sxm4-80gb", "num_nodes": 1, "gpus_per_node": 8}
PLAN = {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 8, "schedule": "1f1b"}
BAD_UTF8 = b"\xff\xfe\xc3("
BOM = b"\xef\xbb\xbf"
CARBON_HEAD = ("Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO\u2082eq/kWh (direct),"
               "Carbon Intensity gCO\u2082eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,"
               "Data Estimated,Data Estimation Method")
VTRAIN_SINGLE_HEAD = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
                      "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)")
VTRAIN_SINGLE_ROWS = ["2,16,8,1024,16,24,1024,1,1,2,372.160408", "8,32,4,1024,16,24,1024,2,2,2,219.732754",
                      "4,16,4,1024,16,24,1024,1,4,1,301.5"]
VTRAIN_MULTI = ("Parameters (billion),# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
                "sequence length,tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
                "3.6,64,512,8,3072,32,30,2048,1,64,1,3566.5\n3.6,64,512,4,3072,32,30,2048,1,64,1,3638.3\n")
AICB_HEAD = "HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 checkpoints: 0 checkpoint_initiates: 0\n"
AICB_ROWS = ["embedding_layer\t-1\t1000\tALLREDUCE\t2097152\t1000\tNONE\t0\t1000\tNONE\t0\t100",
             "attention_layer\t-1\t75200\tALLREDUCE\t2097152\t75200\tNONE\t0\t75200\tNONE\t0\t100",
             "mlp_layer\t-1\t75000\tALLREDUCE\t2097152\t75000\tNONE\t0\t75000\tNONE\t0\t100"]


def _json(doc: Any) -> bytes:
    return json.dumps(doc, indent=1).encode()


def _with(doc: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {**doc, **kw}


def _token(doc: dict[str, Any], key: str, token: str) -> bytes:
    """``doc`` as JSON with ``key``'s value written as the raw ``token`` (NaN, 1e400, a 400-digit integer)."""
    return json.dumps({**doc, key: "@@"}).replace('"@@"', token).encode()


def _carbon(rows: list[tuple[str, str]], head: str = CARBON_HEAD) -> bytes:
    lines = [head] + [f"{t},Great Britain,Great Britain,GB,{v},{v},85.5,62.7, nationalgrideso.com,false," for t, v in rows]
    return ("\n".join(lines) + "\n").encode()


HOURS = [(f"2024-01-01 {h:02d}:00:00", f"{100 * (h + 1)}") for h in range(6)]  # 00:00 → 100 ... 05:00 → 600 g/kWh


def models() -> dict[str, bytes]:
    m = MODEL
    return {
        "ok.json": _json(m),
        "bom.json": BOM + _json(m),
        "ok.json.gz": gzip.compress(_json(m), mtime=0),
        "int400.json": _token(m, "num_layers", "9" * 400),
        "int5000.json": _token(m, "vocab_size", "7" * 5000),
        "f1e400.json": _token(m, "num_layers", "1e400"),
        "nan.json": _token(m, "hidden_size", "NaN"),
        "inf.json": _token(m, "seq_len", "Infinity"),
        "negative.json": _json(_with(m, num_layers=-4)),
        "zero.json": _json(_with(m, num_heads=0)),
        "bool.json": _json(_with(m, num_layers=True)),
        "float.json": _json(_with(m, num_layers=2.5)),
        "float_whole.json": _json(_with(m, hidden_size=64.0)),
        "string.json": _json(_with(m, num_layers="4")),
        "layers_1e8.json": _json(_with(m, num_layers=100_000_000)),
        "layers_1e300.json": _token(m, "num_layers", "1e300"),
        "seq_2e60.json": _json(_with(m, seq_len=2**60)),
        "heads_indivisible.json": _json(_with(m, num_heads=5)),
        "unknown_key.json": _json(_with(m, num_layer=4)),
        "kind_bert.json": _json(_with(m, kind="bert")),
        "list.json": _json([m]),
        "string_doc.json": _json("gpt-mini"),
        "null.json": b"null\n",
        "empty.json": b"",
        "whitespace.json": b"  \n\t\n",
        "truncated.json": _json(m)[:40],
        "bad_utf8.json": _json(m)[:20] + BAD_UTF8 + _json(m)[20:],
        "duplicate_key.json": b'{"kind": "gpt", "num_layers": 2, "num_layers": 96, "hidden_size": 64, "num_heads": 4, '
                              b'"seq_len": 32, "vocab_size": 128}',
        "cluster_as_model.json": _json(CLUSTER),
        "binary.json": bytes(range(256)) * 4,
        "corrupt.json.gz": gzip.compress(_json(m), mtime=0)[:12] + b"\x00garbage-body\xff" * 8,
        "truncated.json.gz": gzip.compress(_json(m), mtime=0)[:-12],
        "nul_in_name.json": _json(_with(m, name="a\x00b")),
    }


def clusters() -> dict[str, bytes]:
    c = CLUSTER
    return {
        "ok.json": _json(c),
        "gpus_zero.json": _json(_with(c, gpus_per_node=0)),
        "nodes_1e300.json": _token(c, "num_nodes", "1e300"),
        "nodes_int400.json": _token(c, "num_nodes", "1" * 400),
        "gpu_unknown.json": _json(_with(c, gpu="tpu-v9")),
        "bandwidth_nan.json": _token(c, "inter_node_bandwidth_Gbps", "NaN"),
        "bandwidth_negative.json": _json(_with(c, intra_node_bandwidth_GBps=-300)),
        "pue_negative.json": _json(_with(c, pue=-1.2)),
        "pue_huge.json": _json(_with(c, pue=1e6)),
        "devices_over.json": _json(_with(c, num_nodes=16384, gpus_per_node=1024)),
        "gpu_number.json": _json(_with(c, gpu=100)),
        "region_list.json": _json(_with(c, region=["GB"])),
        "unknown_key.json": _json(_with(c, gpus=8)),
    }


def plans() -> dict[str, bytes]:
    p = PLAN
    return {
        "ok.json": _json(p),
        "pp_1e6.json": _json(_with(p, pp=1_000_000)),
        "tp3.json": _json(_with(p, tp=3)),
        "dp_2e40.json": _json(_with(p, dp=2**40, global_batch_size=2**40)),
        "micro_zero.json": _json(_with(p, micro_batch_size=0)),
        "global_2e40.json": _json(_with(p, global_batch_size=2**40)),
        "m_2e20.json": _json(_with(p, global_batch_size=2**20)),
        "virtual_1000.json": _json(_with(p, pp=2, virtual_stages=1000, schedule="interleaved_1f1b")),
        "partition_strings.json": _json(_with(p, pp=2, partition=["a", "b"])),
        "partition_negative.json": _json(_with(p, pp=2, partition=[-1, 3])),
        "partition_sum.json": _json(_with(p, pp=2, partition=[1, 5])),
        "partition_length.json": _json(_with(p, pp=2, partition=[1, 1, 0])),
        "partition_1e400.json": _token(_with(p, pp=2), "partition", "[1e400, 1]"),
        "partition_nested.json": _json(_with(p, pp=2, partition=[[1], [1]])),
        "schedule_unknown.json": _json(_with(p, schedule="2f2b")),
        "recompute_maybe.json": _json(_with(p, recompute="maybe")),
        "zero_stage_7.json": _json(_with(p, zero_stage=7)),
        "precision_fp4.json": _json(_with(p, precision="fp4")),
        "policy_junk.json": _json(_with(p, layer_memory_policy=["keep", "teleport"])),
        "tp_float.json": _json(_with(p, tp=2.0)),
        "dp_bool.json": _json(_with(p, dp=True)),
        "made_for_foreign.json": _json(_with(p, made_for={"model": "gpt-mini", "tool": 3})),
        "list.json": _json([p]),
        "global_not_multiple.json": _json(_with(p, micro_batch_size=3, global_batch_size=8)),
    }


def traces() -> dict[str, bytes]:
    doc = json.loads(SHIPPED_TRACE.read_text())
    ok = _json(doc)

    def layer(**kw: Any) -> dict[str, Any]:
        d = json.loads(json.dumps(doc))
        d["layers"][1].update(kw)
        return d

    def layer_token(key: str, token: str) -> bytes:
        return json.dumps(layer(**{key: "@@"})).replace('"@@"', token).encode()

    return {
        "ok.json": ok,
        "bom.json": BOM + ok,
        "nan.json": layer_token("forward_s", "NaN"),
        "f1e400.json": layer_token("backward_input_s", "1e400"),
        "int400.json": layer_token("param_count", "3" * 400),
        "negative.json": _json(layer(forward_s=-0.01)),
        "bool.json": _json(layer(param_count=True)),
        "float_int.json": _json(layer(param_count=1.5)),
        "string.json": _json(layer(forward_s="0.01")),
        "layers_empty.json": _json(_with(doc, layers=[])),
        "layers_dict.json": _json(_with(doc, layers={"a": 1})),
        "unknown_key.json": _json(_with(doc, colour="blue")),
        "list.json": _json(doc["layers"]),
        "foreign_model.json": _json(MODEL),
        "truncated.json": ok[: len(ok) // 2],
        "bad_utf8.json": ok[:100] + BAD_UTF8 + ok[100:],
        "corrupt.json.gz": gzip.compress(ok, mtime=0)[:20] + b"\x13\x37" * 64,
        "plain_named.json.gz": ok,
    }


def carbon() -> dict[str, bytes]:
    shifted = [(f"2024-01-01T{h + 5:02d}:00:00+05:00", v) for h, (_, v) in enumerate(HOURS)]
    dup = [*HOURS[:5], ("2024-01-01 03:00:00", "999"), HOURS[5]]
    return {
        "ok.csv": _carbon(HOURS),
        "bom.csv": BOM + _carbon(HOURS),
        "reversed.csv": _carbon(HOURS[::-1]),
        "offsets.csv": _carbon(shifted),
        "duplicate_hour.csv": _carbon(dup),
        "gap.csv": _carbon([HOURS[0], HOURS[1], HOURS[4], HOURS[5]]),
        "header_only.csv": (CARBON_HEAD + "\n").encode(),
        "empty.csv": b"",
        "blank_rows.csv": (CARBON_HEAD + "\n\n,,,\n\n").encode(),
        "nan.csv": _carbon([*HOURS[:4], ("2024-01-01 04:00:00", "NaN"), HOURS[5]]),
        "inf.csv": _carbon([*HOURS[:4], ("2024-01-01 04:00:00", "inf"), HOURS[5]]),
        "negative.csv": _carbon([*HOURS[:4], ("2024-01-01 04:00:00", "-50"), HOURS[5]]),
        "f1e400.csv": _carbon([*HOURS[:4], ("2024-01-01 04:00:00", "1e400"), HOURS[5]]),
        "over_limit.csv": _carbon([*HOURS[:4], ("2024-01-01 04:00:00", "6000"), HOURS[5]]),
        "value_text.csv": _carbon([*HOURS[:4], ("2024-01-01 04:00:00", "low"), HOURS[5]]),
        "bad_date.csv": _carbon([*HOURS[:4], ("2024-13-45 04:00:00", "500"), HOURS[5]]),
        "year_10000.csv": _carbon([("9999-12-31 23:00:00", "100"), ("10000-01-01 00:00:00", "100")]),
        "no_datetime.csv": _carbon(HOURS, head=CARBON_HEAD.replace("Datetime (UTC)", "When")),
        "no_intensity.csv": _carbon(HOURS, head=CARBON_HEAD.replace("Carbon Intensity", "CO2")),
        "short_row.csv": (CARBON_HEAD + "\n2024-01-01 00:00:00,GB\n").encode(),
        "bad_utf8.csv": _carbon(HOURS)[:300] + BAD_UTF8 + _carbon(HOURS)[300:],
        "unterminated_quote.csv": (CARBON_HEAD + '\n"2024-01-01 00:00:00,GB,GB,GB,1,1\n').encode(),
        "direct_only.csv": ("Datetime (UTC),Carbon Intensity gCO2eq/kWh (direct)\n"
                            + "".join(f"{t},{v}\n" for t, v in HOURS)).encode(),
        "ok.csv.gz": gzip.compress(_carbon(HOURS), mtime=0),
    }


def vtrain() -> dict[str, bytes]:
    head, rows = VTRAIN_SINGLE_HEAD, VTRAIN_SINGLE_ROWS

    def single(*rs: str) -> bytes:
        return ("\n".join([head, *rs]) + "\n").encode()

    return {
        "single_ok.csv": single(*rows),
        "single_bom.csv": BOM + single(*rows),
        "multi_ok.csv": VTRAIN_MULTI.encode(),
        "layers_1e300.csv": single("2,16,8,1024,16,1e300,1024,1,1,2,372.16"),
        "time_nan.csv": single("2,16,8,1024,16,24,1024,1,1,2,nan"),
        "time_negative.csv": single("2,16,8,1024,16,24,1024,1,1,2,-372.16"),
        "time_zero.csv": single("2,16,8,1024,16,24,1024,1,1,2,0"),
        "time_1e400.csv": single("2,16,8,1024,16,24,1024,1,1,2,1e400"),
        "gpus_int400.csv": single("2" * 400 + ",16,8,1024,16,24,1024,1,1,2,372.16"),
        "gpus_mismatch.csv": single("8,16,8,1024,16,24,1024,1,1,2,372.16"),
        "heads_indivisible.csv": single("2,16,8,1000,16,24,1024,1,1,2,372.16"),
        "tp_float.csv": single("2,16,8,1024,16,24,1024,1.5,1,2,372.16"),
        "header_only.csv": (head + "\n").encode(),
        "wrong_header.csv": single(*rows).replace(b"# layers", b"layers"),
        "short_row.csv": single("2,16,8"),
        "empty.csv": b"",
        "bad_utf8.csv": single(*rows)[:150] + BAD_UTF8 + single(*rows)[150:],
        "aicb_as_vtrain.csv": (AICB_HEAD + "3\n" + "\n".join(AICB_ROWS) + "\n").encode(),
    }


NEMO_HEAD = "model,gpus,global_batch,micro_batch,seq_len,tp,pp,cp,vp,tokens_per_s_per_gpu,model_tflops_per_gpu"
NEMO_ROWS = ["LLAMA2-7B,8,128,1,4096,1,1,1,1,16847,776", "LLAMA3-8B,8,128,1,8192,1,1,2,1,12036,697"]


def nemo() -> dict[str, bytes]:
    def table(*rs: str, head: str = NEMO_HEAD) -> bytes:
        return ("\n".join([head, *rs]) + "\n").encode()

    return {
        "ok.csv": table(*NEMO_ROWS),
        "missing_column.csv": table(*(",".join(r.split(",")[:-1]) for r in NEMO_ROWS),
                                    head=NEMO_HEAD.removesuffix(",model_tflops_per_gpu")),
        "tps_nan.csv": table("LLAMA2-7B,8,128,1,4096,1,1,1,1,nan,776"),
        "tps_inf.csv": table("LLAMA2-7B,8,128,1,4096,1,1,1,1,inf,776"),
        "tflops_1e400.csv": table("LLAMA2-7B,8,128,1,4096,1,1,1,1,16847,1e400"),
        "tps_zero.csv": table("LLAMA2-7B,8,128,1,4096,1,1,1,1,0,776"),
        "gpus_1e300.csv": table("LLAMA2-7B,1e300,128,1,4096,1,1,1,1,16847,776"),
        "unknown_model.csv": table("GPT5-1T,8,128,1,4096,1,1,1,1,16847,776"),
        "gpus_indivisible.csv": table("LLAMA2-7B,8,128,1,4096,3,1,1,1,16847,776"),
        "only_cp_rows.csv": table(NEMO_ROWS[1]),
        "header_only.csv": table(),
        "empty.csv": b"",
        "bad_utf8.csv": table(*NEMO_ROWS)[:120] + BAD_UTF8 + table(*NEMO_ROWS)[120:],
    }


def aicb() -> dict[str, bytes]:
    def workload(*rows: str, count: int | None = None, head: str = AICB_HEAD) -> bytes:
        return (head + f"{len(rows) if count is None else count}\n" + "\n".join(rows) + "\n").encode()

    def bad(field: int, value: str) -> bytes:
        row = AICB_ROWS[1].split("\t")
        row[field] = value
        return workload(AICB_ROWS[0], "\t".join(row), AICB_ROWS[2])

    ok = workload(*AICB_ROWS)
    return {
        "ok.txt": ok,
        "bom.txt": BOM + ok,
        "ok.txt.gz": gzip.compress(ok, mtime=0),
        "empty.txt": b"",
        "header_only.txt": AICB_HEAD.encode(),
        "count_mismatch.txt": workload(*AICB_ROWS, count=92),
        "count_text.txt": workload(*AICB_ROWS).replace(b"\n3\n", b"\nthree\n"),
        "time_1e400.txt": bad(2, "1e400"),
        "time_int400.txt": bad(2, "8" * 400),
        "time_nan.txt": bad(5, "nan"),
        "time_negative.txt": bad(8, "-75200"),
        "bytes_1e300.txt": bad(4, "1e300"),
        "short_row.txt": workload(AICB_ROWS[0], "attention_layer\t-1\t75200", AICB_ROWS[2]),
        "comm_unknown.txt": bad(3, "TELEPORT"),
        "no_layers.txt": workload(count=0),
        "bad_utf8.txt": ok[:60] + BAD_UTF8 + ok[60:],
        "binary.txt": bytes(range(256)) * 8,
        "corrupt.txt.gz": gzip.compress(ok, mtime=0)[:16] + b"\xde\xad\xbe\xef" * 16,
        "group_text.txt": workload(*AICB_ROWS, head=AICB_HEAD.replace(": 2", ": two")),
        "group_zero.txt": workload(*AICB_ROWS, head=AICB_HEAD.replace(": 2", ": 0")),
    }


def chrome() -> dict[str, bytes]:
    def ev(name: str, ts: Any, dur: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    good = {"traceEvents": [ev("Block_0", 0, 100), ev("Block_1", 100, 100)]}
    return {
        "empty.json": b"",
        "list.json": _json(good["traceEvents"]),
        "foreign_model.json": _json(MODEL),
        "events_not_list.json": _json({"traceEvents": {"a": 1}}),
        "no_events.json": _json({"traceEvents": []}),
        "event_not_object.json": _json({"traceEvents": [1, "x", None]}),
        "ts_nan.json": json.dumps(good).replace('"ts": 100', '"ts": NaN').encode(),
        "dur_1e400.json": json.dumps(good).replace('"dur": 100', '"dur": 1e400', 1).encode(),
        "ts_int400.json": json.dumps(good).replace('"ts": 100', '"ts": ' + "4" * 400).encode(),
        "dur_negative.json": json.dumps(good).replace('"dur": 100', '"dur": -100', 1).encode(),
        "dur_string.json": json.dumps(good).replace('"dur": 100', '"dur": "100"', 1).encode(),
        "missing_fields.json": _json({"traceEvents": [{"ph": "X", "name": "Block_0"}]}),
        "backtrack.json": _json({"traceEvents": [ev("a" * 30 + "!", 0, 1)]}),
        "bad_utf8.json": _json(good)[:30] + BAD_UTF8 + _json(good)[30:],
    }


def measured() -> dict[str, bytes]:
    doc = json.loads(gzip.decompress(MEASURED.read_bytes()))

    def step0(key: str, token: str) -> bytes:
        d = json.loads(json.dumps(doc))
        d["measurement"]["steps"][0][key] = "@@"
        return json.dumps(d).replace('"@@"', token).encode()

    def edit(fn: Any) -> bytes:
        d = json.loads(json.dumps(doc))
        fn(d)
        return json.dumps(d).encode()

    return {
        "zero_time.json": step0("iteration_s", "0"),
        "negative_time.json": step0("iteration_s", "-2.5"),
        "nan_time.json": step0("iteration_s", "NaN"),
        "inf_time.json": step0("iteration_s", "Infinity"),
        "loss_1e400.json": step0("loss", "1e400"),
        "step_float.json": step0("step", "1.5"),
        "step_bool.json": step0("step", "true"),
        "tokens_int400.json": edit(lambda d: d["measurement"].update(tokens_per_s=int("5" * 400))),
        "other_model.json": edit(lambda d: d["model"].update(num_layers=2, name="other")),
        "steps_empty.json": edit(lambda d: d["measurement"].update(steps=[])),
        "world_size_bool.json": edit(lambda d: d["measurement"].update(world_size=True)),
        "no_measurement.json": SHIPPED_TRACE.read_bytes(),
        "cluster_foreign.json": _json(CLUSTER),
        "corrupt.json.gz": MEASURED.read_bytes()[:200] + b"\x00" * 64,
    }


def calibration() -> dict[str, bytes]:
    cal = {"devices": {"cpu": {"kind": "cpu", "compute": {"fp32": {
        "scale": {"gemm": 1.85, "bmm": 1.85, "memory": 1.85}, "op_overhead_s": 0.0, "tp_op_overhead_s": 0.0005,
        "tp_comm_cpu_s_per_byte": 0.0, "dp_unit_overhead_s": 0.014, "optimizer_s_per_param": 3.1e-09,
        "optimizer_overhead_s": 0.008, "threads_per_rank": 1, "samples": 12, "fit_mape": 0.02}},
        "cpus_per_node": 2, "op_cpu_s": 0.0, "step_cpu_s": 0.0, "host_samples": 0, "host_fit_mape": 0.0,
        "step_overhead_s": 0.22}},
        "comm": {"gloo": {"local": {"step_latency_s": 0.0, "bandwidth_Bps": 1384176946.4, "samples": 140,
                                    "fit_mape": 0.36, "cpu_s_per_step": 0.0, "cpu_s_per_byte": 0.0}}},
        "measurements": ["fit_dp4.r0.json.gz"], "created": "2026-11-25T10:49:04+00:00",
        "tool": "mindpipe calibrate", "format_version": 1}
    text = json.dumps(cal, indent=1)
    return {
        "ok.json": text.encode(),
        "nan_scale.json": text.replace('"gemm": 1.85', '"gemm": NaN').encode(),
        "negative_bandwidth.json": text.replace('"bandwidth_Bps": 1384176946.4', '"bandwidth_Bps": -1').encode(),
        "zero_bandwidth.json": text.replace('"bandwidth_Bps": 1384176946.4', '"bandwidth_Bps": 0').encode(),
        "scale_string.json": text.replace('"gemm": 1.85', '"gemm": "fast"').encode(),
        "threads_int400.json": text.replace('"threads_per_rank": 1', '"threads_per_rank": ' + "6" * 400).encode(),
        "unknown_key.json": text.replace('"tool"', '"colour": 1, "tool"').encode(),
        "foreign_model.json": _json(MODEL),
        "truncated.json": text.encode()[:300],
        "list.json": b"[]",
    }


def sweep() -> dict[str, bytes]:
    return {
        "garbage.json": b"this is not JSON\n",
        "foreign_model.json": _json(MODEL),
        "list.json": b"[1, 2, 3]\n",
        "version1.json": _json({"state_version": 1, "model": MODEL}),
        "version_huge.json": b'{"state_version": ' + b"9" * 5000 + b"}\n",
        "eval_garbage.jsonl": b'{"key": \n',
        "eval_foreign.jsonl": b'{"a": 1}\n{"b": 2}\n',
        "eval_list.jsonl": b"[1, 2]\n",
        "eval_bad_utf8.jsonl": b'{"key": "' + BAD_UTF8 + b'"}\n',
        "eval_int5000.jsonl": b'{"key": ' + b"1" * 5000 + b"}\n",
        "eval_nan.jsonl": b'{"key": NaN, "point": 1}\n',
    }


def other() -> dict[str, bytes]:
    return {
        "data/small.txt": b"tiny",
        "data/bad_utf8.txt": BAD_UTF8 * 200,
    }


GROUPS = {"model": models, "cluster": clusters, "plan": plans, "trace": traces, "carbon": carbon, "vtrain": vtrain,
          "nemo": nemo, "aicb": aicb, "chrome": chrome, "measured": measured, "calibration": calibration, "sweep": sweep, "": other}


def main() -> None:
    """Write every input file (the folder is replaced)."""
    shutil.rmtree(OUT, ignore_errors=True)
    for group, make in GROUPS.items():
        for name, data in make().items():
            path = OUT / group / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {sum(1 for p in OUT.rglob('*') if p.is_file())} files, {total / 1024:.0f} KiB, under {OUT}")


if __name__ == "__main__":
    main()
