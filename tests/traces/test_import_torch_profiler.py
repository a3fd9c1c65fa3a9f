"""torch.profiler importer: a live CPU trace of gpt-mini, exact synthetic traces, errors, fuzzing."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindpipe.traces.errors import ContractError
from mindpipe.traces.importers.torch_profiler import import_torch_profiler, record_layers
from mindpipe.traces.trace import Trace

FIXTURE = Path(__file__).parent / "data" / "torch_profiler" / "gpt_tiny_cpu_stack.json.gz"
GPT_LAYERS = ["embedding", "block.0", "block.1", "block.2", "block.3", "final_norm", "lm_head"]


# -- a live trace of our GPT ------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_mini_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpt-mini, micro-batch 2, seq 64, on CPU: 1 warm-up and 3 profiled steps."""
    from mindpipe.traces.builtin import load_model
    from mindpipe.traces.torch_gpt import build_gpt, lm_loss, synthetic_batch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = load_model("gpt-mini")
    net = build_gpt(model)
    tokens, targets = synthetic_batch(model, 2, seq_len=64)
    path = tmp_path_factory.mktemp("torch_profiler") / "gpt_mini.json"
    with (
        record_layers(net),
        profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        ) as prof,
    ):
        for _ in range(4):
            lm_loss(net(tokens), targets).backward()
            net.zero_grad(set_to_none=True)
            prof.step()
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in net.modules())  # hooks removed
    return path


def test_live_gpt_mini(gpt_mini_trace: Path, tmp_path: Path) -> None:
    trace = import_torch_profiler(gpt_mini_trace, micro_batch_size=2, seq_len=64, dtype="fp32")
    assert [r.name for r in trace.layers] == GPT_LAYERS
    assert [r.kind for r in trace.layers] == ["embedding", *["block"] * 4, "final_norm", "lm_head"]
    assert all(r.forward_s > 0 for r in trace.layers)
    assert all(r.backward_input_s > 0 for r in trace.layers if r.kind == "block")
    assert all(r.backward_weight_s == 0 for r in trace.layers)
    assert trace.backward_split == "combined" and trace.granularity == "layer" and trace.device == "cpu"
    assert trace.provenance.tool == "mindpipe import torch-profiler"
    assert trace.provenance.source_file == str(gpt_mini_trace)
    assert "divided by 3 steps (ProfilerStep#N ranges)" in trace.provenance.notes
    events = json.loads(gpt_mini_trace.read_text())["traceEvents"]
    step_s = statistics.mean(e["dur"] for e in events if e.get("name", "").startswith("ProfilerStep#")) / 1e6
    assert 0.5 * step_s <= trace.forward_backward_s <= step_s
    trace.save(tmp_path / "imported.json")
    assert Trace.load(tmp_path / "imported.json") == trace  # a valid contract


def test_record_layers_fixture_module_and_record_function_agree() -> None:
    by_name = import_torch_profiler(FIXTURE)  # auto: the record_function ranges win
    by_module = import_torch_profiler(FIXTURE, group="module")
    assert [r.name for r in by_name.layers] == ["embedding", "block.0", "block.1", "final_norm", "lm_head"]
    # torch 2.13 numbers modules per class object: GPT's children are these (see module docstring).
    assert [r.name for r in by_module.layers] == ["Embedding_0", "Block_0", "Block_1", "LayerNorm_4", "LMHead_0"]
    # Named by class, they get the simulator's kinds (standard_kinds), so `simulate --trace` prices them.
    assert [r.kind for r in by_module.layers] == [r.kind for r in by_name.layers] == [
        "embedding", "block", "block", "final_norm", "lm_head"]
    # The module range encloses the hooks' record_function range; both hold the same forward ops.
    for rf, mod in zip(by_name.layers, by_module.layers, strict=True):
        assert mod.forward_s >= rf.forward_s > 0
        assert mod.backward_input_s == rf.backward_input_s
    blocks = import_torch_profiler(FIXTURE, group="module", pattern="Block_*")
    assert [r.name for r in blocks.layers] == ["Block_0", "Block_1"]
    assert "pattern 'Block_*'" in blocks.provenance.notes
    # Nested matches ('Embedding*' matches the wrapper and nn.Embedding alike) count once.
    emb = import_torch_profiler(FIXTURE, group="module", pattern="Embedding*")
    assert [r.name for r in emb.layers] == ["Embedding_0"]
    assert emb.layers[0].forward_s == by_module.layers[0].forward_s


def test_module_names_get_the_simulators_kinds() -> None:
    """``--group module`` names layers by class: the blocks are the one kind ending in Block or Layer,
    an embedding before them, a norm and then a head or a linear layer after them (a Hugging Face
    Llama's top-level children); nothing is guessed when the blocks cannot be told."""
    from mindpipe.traces.importers.torch_profiler import standard_kinds

    hf = ["Embedding", "LlamaDecoderLayer", "LlamaDecoderLayer", "LlamaRMSNorm", "Linear"]
    assert standard_kinds(hf) == {"Embedding": "embedding", "LlamaDecoderLayer": "block",
                                  "LlamaRMSNorm": "final_norm", "Linear": "lm_head"}
    assert standard_kinds(["Embedding", "Dropout", "GPT2Block", "LayerNorm"]) == {
        "Embedding": "embedding", "GPT2Block": "block", "LayerNorm": "final_norm"}
    assert standard_kinds(["Linear", "Block"]) == {"Block": "block"}  # a linear before the blocks is no head
    assert standard_kinds(["EncoderLayer", "DecoderLayer"]) == {}  # two kinds of block: not told
    assert standard_kinds(["embedding", "block", "lm_head"]) == {}  # already the simulator's


def test_a_module_grouped_import_is_priced_by_the_simulator(tmp_path: Path) -> None:
    from mindpipe.simulator.simulator import Simulator
    from mindpipe.traces.config import Cluster, Model, Plan

    trace = import_torch_profiler(FIXTURE, group="module")
    model = Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)
    result = Simulator(model, Cluster(gpu="cpu", num_nodes=1, gpus_per_node=1), trace=trace).run(
        Plan(micro_batch_size=1, global_batch_size=1, precision="fp32"))
    by = {r.kind: r for r in trace.layers}
    assert result.iteration_time_s >= sum(r.forward_s + r.backward_input_s for r in trace.layers) > by["block"].forward_s


# -- synthetic traces with exact numbers ------------------------------------------------------
def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _op(name: str, ts: float, dur: float, seq: int, tid: int = 1, fwd: int = 0, **args: object) -> dict:
    return _x(name, "cpu_op", ts, dur, tid, **{"Sequence number": seq, "Fwd thread id": fwd}, **args)


EVAL = "autograd::engine::evaluate_function: "


def _synthetic_step(t0: float, s0: int, bwd_tid: int = 1) -> list[dict]:
    """One step at time t0 (µs) with sequence numbers from s0.

    Per step: forward a = 100 µs, b = 200 µs; backward of a = 40 (mm) + 5 (AccumulateGrad),
    of b = 30 (add) + 10 (the loss, outside any layer: nearest lower sequence number is b's).
    """
    return [
        _x(f"ProfilerStep#{s0}", "user_annotation", t0, 1000),
        _x("model", "user_annotation", t0 + 5, 320),  # encloses the layers: not innermost
        _x("a", "user_annotation", t0 + 10, 100),
        _op("aten::mm", t0 + 20, 30, s0 + 1),
        _x("b", "user_annotation", t0 + 120, 200),
        _op("aten::add", t0 + 130, 20, s0 + 2),
        _op("aten::nll_loss", t0 + 330, 5, s0 + 3),
        _x("backward", "user_annotation", t0 + 395, 120, bwd_tid),  # holds backward work: not a layer
        _op(EVAL + "NllLossBackward0", t0 + 400, 10, s0 + 3, bwd_tid, fwd=1),
        _op("NllLossBackward0", t0 + 401, 8, s0 + 3, bwd_tid, fwd=1),  # nested in the evaluate event
        _op(EVAL + "AddBackward0", t0 + 420, 30, s0 + 2, bwd_tid, fwd=1),
        _op(EVAL + "MmBackward0", t0 + 460, 40, s0 + 1, bwd_tid, fwd=1),
        _x(EVAL + "torch::autograd::AccumulateGrad", "cpu_op", t0 + 500, 5, bwd_tid),
        _x("Optimizer.step#SGD.step", "user_annotation", t0 + 600, 50),  # torch's own range
    ]


def _write(path: Path, events: list, wrap: bool = True) -> Path:
    path.write_text(json.dumps({"traceEvents": events, "schemaVersion": 1} if wrap else events))
    return path


def _times(trace: Trace) -> list[tuple[str, float, float]]:
    return [(r.name, round(r.forward_s * 1e6, 6), round(r.backward_input_s * 1e6, 6)) for r in trace.layers]


@pytest.mark.parametrize("bwd_tid", [1, 2])  # CPU autograd runs on the caller's thread, CUDA's on its own
def test_synthetic_exact_attribution(tmp_path: Path, bwd_tid: int) -> None:
    path = _write(tmp_path / "syn.json", _synthetic_step(0, 1, bwd_tid) + _synthetic_step(1000, 11, bwd_tid))
    trace = import_torch_profiler(path)
    assert _times(trace) == [("a", 100, 45), ("b", 200, 40)]
    notes = trace.provenance.notes
    assert "divided by 2 steps (ProfilerStep#N ranges)" in notes
    assert "7e-05 s by its forward op's sequence number" in notes  # 30 + 40 µs
    assert "1e-05 s by the nearest ranged forward op's sequence number" in notes
    assert "5e-06 s by the backward node that ran just before (AccumulateGrad)" in notes
    # steps overrides the divisor; without ProfilerStep ranges the first layer's count is used.
    assert _times(import_torch_profiler(path, steps=4)) == [("a", 50, 22.5), ("b", 100, 20)]
    no_steps = [e for e in _synthetic_step(0, 1) + _synthetic_step(1000, 11) if "ProfilerStep" not in e["name"]]
    bare = import_torch_profiler(_write(tmp_path / "bare.json", no_steps, wrap=False))
    assert _times(bare) == [("a", 100, 45), ("b", 200, 40)]
    assert "occurrences of the first layer" in bare.provenance.notes
    # An AccumulateGrad first on its thread has no sequence number and no node before it.
    lost = _x(EVAL + "torch::autograd::AccumulateGrad", "cpu_op", 900, 8, tid=3)
    orphan = import_torch_profiler(_write(tmp_path / "orphan.json", [*no_steps, lost]))
    assert _times(orphan) == [("a", 100, 45), ("b", 200, 40)]
    assert "4e-06 s unattributed" in orphan.provenance.notes


def test_synthetic_pattern(tmp_path: Path) -> None:
    path = _write(tmp_path / "syn.json", _synthetic_step(0, 1) + _synthetic_step(1000, 11))
    only_b = import_torch_profiler(path, pattern="b", group="record_function")
    # b keeps its own backward and the loss's (outside every range: the nearest lower sequence
    # number is b's); the mm's twin is in 'a', which the pattern leaves out, so its backward is
    # unattributed (it used to be charged to b as well: 85, what 'a' and 'b' hold together).
    assert _times(only_b) == [("b", 200, 40)]
    assert "s unattributed (its forward op is in a range the pattern leaves out)" in only_b.provenance.notes
    assert _times(import_torch_profiler(path, pattern="model|a")) == [("model", 320, 85)]
    assert _times(import_torch_profiler(path, pattern="Optimizer*")) == [("Optimizer.step#SGD.step", 50, 0)]
    assert _times(import_torch_profiler(path, pattern="[ab]")) == [("a", 100, 45), ("b", 200, 40)]


def test_pattern_is_a_glob_and_cannot_backtrack(tmp_path: Path) -> None:
    """``--pattern`` is a glob: a regex that backtracks exponentially in ``re`` is just literal text here."""
    name = "a" * 5000 + "!"
    events = [_x(name, "user_annotation", 0, 10), _x("a" * 30, "user_annotation", 20, 10)]
    path = _write(tmp_path / "evil.json", events)
    with pytest.raises(ContractError, match="no layer ranges found"):
        import_torch_profiler(path, pattern="^(a+)+$", group="record_function")
    hit = import_torch_profiler(path, pattern="*a*a*a*a*a*a*a*a*a*a*a*a*!", group="record_function")
    assert [r.name for r in hit.layers] == [name]


def _gpu_trace() -> list[dict]:
    """Layers a, b on CPU thread 1; backward on thread 2; kernels on the GPU (pid 0, tid 7)."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1000), _x("a", "user_annotation", 10, 100)]
    ev += [_op("aten::mm", 20, 30, 1), _x("b", "user_annotation", 120, 200), _op("aten::add", 130, 20, 2)]

    def launch(ts: float, corr: int, kdur: float, *, tid: int = 1, runtime: bool = True, **kargs: object) -> None:
        if runtime:
            ev.append(_x("cudaLaunchKernel", "cuda_runtime", ts, 2, tid, correlation=corr, **{"External id": 900}))
        ev.append(_x(f"kernel{corr}", "kernel", 2000 + corr * 10, kdur, 7, 0, **kargs))

    launch(25, 1, 3.0, correlation=1)
    launch(30, 2, 4.5, correlation=2)
    launch(135, 3, 7.0, correlation=3)  # b
    # b: linked only by an ac2g flow (no runtime event with this correlation) ...
    launch(140, 4, 1.5, runtime=False, correlation=4)
    ev += [{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 4, "pid": 1, "tid": 1, "ts": 140}]
    # ... and by External id to the op that issued it.
    launch(0, 5, 2.0, runtime=False, **{"External id": 77})
    ev[4]["args"]["External id"] = 77  # aten::add
    launch(0, 6, 100.0, runtime=False)  # linked to nothing: counted, charged to no layer
    ev += [_op(EVAL + "AddBackward0", 400, 30, 2, 2, fwd=1), _op(EVAL + "MmBackward0", 460, 40, 1, 2, fwd=1)]
    launch(410, 7, 6.0, tid=2, correlation=7)  # b's backward
    launch(470, 8, 8.0, tid=2, correlation=8)  # a's backward
    launch(700, 9, 50.0, tid=2, correlation=9)  # after the backward: no layer
    return ev


def test_gpu_kernels_linked_by_correlation(tmp_path: Path) -> None:
    trace = import_torch_profiler(_write(tmp_path / "gpu.json", _gpu_trace()))
    assert _times(trace) == [("a", 7.5, 8), ("b", 10.5, 6)]  # b: 7 + 1.5 (flow) + 2 (External id)
    assert trace.device == "cuda"
    assert "GPU kernel time (9 kernels, 1 not linked to a launch)" in trace.provenance.notes
    assert import_torch_profiler(tmp_path / "gpu.json", device="h100-sxm5-80gb").device == "h100-sxm5-80gb"


def test_gzip_and_bare_list(tmp_path: Path) -> None:
    events = _synthetic_step(0, 1)
    gz = tmp_path / "syn.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(events).encode()))
    assert _times(import_torch_profiler(gz)) == [("a", 100, 45), ("b", 200, 40)]


# -- errors -----------------------------------------------------------------------------------
STEP_ONLY = {"traceEvents": [_x("ProfilerStep#1", "user_annotation", 0, 10)]}


@pytest.mark.parametrize(
    ("content", "kwargs", "needle"),
    [
        (None, {}, "file not found"),
        (b"{not json", {}, "malformed JSON"),
        (b"\x1f\x8bnot really gzip", {}, "corrupt gzip"),
        (b"\xff\xfe", {}, "not UTF-8"),
        ({"events": []}, {}, "not a Chrome trace"),
        ({"traceEvents": 3}, {}, "not a Chrome trace"),
        ("a string", {}, "not a Chrome trace"),
        (STEP_ONLY, {}, "no layer ranges found with module grouping"),
        (STEP_ONLY, {"group": "record_function"}, "--pattern"),
        (STEP_ONLY, {"group": "module"}, "with_stack=True"),
        ({"traceEvents": _synthetic_step(0, 1)}, {"pattern": "zzz*"}, "pattern 'zzz*'"),
        ({"traceEvents": _synthetic_step(0, 1)}, {"pattern": "a||b"}, "empty alternative"),
        ({"traceEvents": _synthetic_step(0, 1)}, {"pattern": "x" * 1001}, "pattern must be 1 to 1000 characters"),
        ({"traceEvents": _synthetic_step(0, 1)}, {"group": "layers"}, "group='layers'"),
        ({"traceEvents": _synthetic_step(0, 1)}, {"steps": 0}, "steps=0"),
        ({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "a", "pid": 1, "tid": 1, "ts": 0}]}, {},
         "traceEvents[0].dur"),
        ({"traceEvents": [{}, _x("a", "user_annotation", 0, -1)]}, {}, "traceEvents[1].dur must be >= 0"),
        ({"traceEvents": [_x("a", "cpu_op", "0", 1)]}, {}, "traceEvents[0].ts must be a finite number"),
        ({"traceEvents": [{**_x(3, "user_annotation", 0, 1)}]}, {}, "traceEvents[0].name"),
        ({"traceEvents": [{**_x("a", "user_annotation", 0, 1), "tid": None}]}, {}, "traceEvents[0].tid"),
        ({"traceEvents": [{**_x("a", "cpu_op", 0, 1), "args": []}]}, {}, "traceEvents[0].args"),
        ({"traceEvents": [*_synthetic_step(0, 1), _op("aten::x", 10, 1, "7")]}, {}, "args.Sequence number"),
        ({"traceEvents": [*_synthetic_step(0, 1), _x("k", "kernel", 0, 1, correlation=1.5)]}, {},
         "args.correlation must be an integer"),
    ],
)
def test_errors_name_the_file(tmp_path: Path, content: object, kwargs: dict, needle: str) -> None:
    path = tmp_path / "bad_trace.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(json.dumps(content))
    with pytest.raises(ContractError) as err:
        import_torch_profiler(path, **kwargs)
    assert str(path) in str(err.value) and needle in str(err.value)


# -- fuzzing ----------------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Valid values 29 times in 30, anything else otherwise."""
    return st.integers(0, 29).flatmap(lambda i: JSON if i == 13 else valid)  # not a bound: hypothesis favours those


ARGS = st.fixed_dictionaries(
    {},
    optional={
        "Sequence number": _mostly(st.integers(-1, 4)),
        "Fwd thread id": st.integers(0, 2),
        "correlation": _mostly(st.integers(0, 3)),
        "External id": st.integers(0, 3),
    },
)
OP_ARGS = st.fixed_dictionaries(
    {"Sequence number": _mostly(st.integers(0, 4))}, optional={"Fwd thread id": st.sampled_from([0, 0, 1])}
)


def _event(
    cat: str, names: list[str], ph: str = "X", *, t0: int = 0, dur: int = 60, args: st.SearchStrategy = ARGS,
    ts: int | None = None,
) -> st.SearchStrategy:
    """Events of one kind, mostly well-formed; ``ts`` pins the start (wide ranges that hold ops)."""
    return st.fixed_dictionaries(
        {
            "ph": _mostly(st.just(ph)),
            "cat": _mostly(st.just(cat)),
            "name": _mostly(st.sampled_from(names)),
            "pid": _mostly(st.just(1)),
            "tid": _mostly(st.sampled_from([1, 1, 1, 2])),
            "ts": _mostly(st.integers(t0, t0 + 30) | st.floats(t0, t0 + 30)) if ts is None else st.just(ts),
            "dur": _mostly(st.integers(0, dur)),
            "id": st.integers(0, 3),
            "args": _mostly(args),
        }
    )


EVENT = st.one_of(
    _event("user_annotation", ["a", "b", "ProfilerStep#1", "Optimizer.step#SGD.step", "", "dynamo_data: compile_id=0/0"]),
    _event("user_annotation", ["a", "b"], ts=0),
    _event("cpu_op", ["aten::mm"], dur=5, args=OP_ARGS),
    _event("cpu_op", [EVAL + "MmBackward0", EVAL + "torch::autograd::AccumulateGrad"], t0=70, args=OP_ARGS | ARGS),
    _event("python_function", ["nn.Module: M_0", "nn.Module: Block_0", "nn.Module: OptimizedModule_0", "nn.Module: ",
                                "f"]),
    _event("cpu_op", ["Torch-Compiled Region: 0/0", "CompiledFunction", "x (dynamo_timed)"], dur=40, args=OP_ARGS),
    st.one_of(  # GPU events, rarer: with any kernel, CPU ranges cost their kernels' time only
        _event("kernel", ["k"]),
        _event("cuda_runtime", ["cudaLaunchKernel"]),
        _event("ac2g", ["ac2g"], "s"),
        _event("ac2g", ["ac2g"], "f"),
    ),
)


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file the fuzz tests overwrite (hypothesis does not mix with function-scoped tmp_path)."""
    return tmp_path_factory.mktemp("fuzz") / "fuzz_trace.json"


def _import_or_contract_error(path: Path, doc: object) -> None:
    path.write_text(json.dumps(doc))
    try:
        trace = import_torch_profiler(path)
    except ContractError as e:
        assert str(path) in str(e)
    else:
        assert isinstance(trace, Trace) and trace.layers


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_fuzz_any_json(fuzz_path: Path, doc: object) -> None:
    _import_or_contract_error(fuzz_path, doc)


@settings(max_examples=200, deadline=None)
@given(st.lists(EVENT, max_size=12), st.booleans())
def test_fuzz_event_lists(fuzz_path: Path, events: list, wrap: bool) -> None:
    _import_or_contract_error(fuzz_path, {"traceEvents": events} if wrap else events)
