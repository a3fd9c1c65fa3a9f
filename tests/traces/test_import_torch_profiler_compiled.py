"""torch.profiler importer on traces of ``torch.compile``'d models.

A model compiled per block (each block's ``compile()`` or ``torch.compile(block)``, as torchtitan
does) imports with one record per block; a trace whose compiled code cannot be split by layer (a
model compiled as a whole, ranges dropped or kept inside a graph, compilation inside a layer) is
refused with one line that says what to do. The synthetic traces copy the events torch 2.13 wrote
for the real runs below (see :mod:`mindpipe.traces.importers.compiled`), with exact numbers.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from mindpipe.traces.errors import ContractError
from mindpipe.traces.importers.torch_profiler import import_torch_profiler, record_layers
from mindpipe.traces.trace import Trace

EVAL = "autograd::engine::evaluate_function: "
GPT_LAYERS = ["embedding", "block.0", "block.1", "final_norm", "lm_head"]
KINDS = ["embedding", "block", "block", "final_norm", "lm_head"]


# -- synthetic traces, shaped as torch 2.13 writes them -----------------------------------------
def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _op(name: str, ts: float, dur: float, seq: int, fwd: int = 0) -> dict:
    return _x(name, "cpu_op", ts, dur, **{"Sequence number": seq, "Fwd thread id": fwd})


def _mod(name: str, ts: float, dur: float) -> dict:
    return _x(f"nn.Module: {name}", "python_function", ts, dur)


def _graph(ts: float, dur: float, seq: int, frame: str = "0/0") -> list[dict]:
    """One call of a graph compiled for training, as dynamo and AOTAutograd nest it."""
    return [
        _x("TorchDynamo Cache Lookup", "cpu_op", ts, 2),
        _x(f"Torch-Compiled Region: {frame}", "cpu_op", ts + 2, dur - 2),
        _x("Pregraph bytecode", "cpu_op", ts + 3, 1),
        _op("CompiledFunction", ts + 4, dur - 6, seq),
        _x("## Call CompiledFxGraph faqkri4ocexteefnagosrzy4y24kx7uzukdgjcopuapm4jizo54j ##", "cpu_op", ts + 5, dur - 8),
        _x("aten::mm", "cpu_op", ts + 6, dur - 10),  # a kernel of the graph: no sequence number
    ]


def _backward(ts: float, dur: float, seq: int, node: str) -> list[dict]:
    return [_op(EVAL + node, ts, dur, seq, fwd=1), _op(node, ts + 1, dur - 2, seq, fwd=1)]


def _step(t0: float, s: int, style: str) -> list[dict]:
    """One step of a 2-block GPT at ``t0`` (µs), sequence numbers from ``s``, with ``with_stack=True``.

    ``style``: ``blocks`` (each block's ``compile()``: its graph right in its ``nn.Module`` range),
    ``wrapped`` (``torch.compile(block)``: ``OptimizedModule_k`` around ``Block_k``), ``whole``
    (``torch.compile(model)``: one graph for the model, with no module event inside).
    Forward µs: embedding 50, blocks 200 and 150, final norm 40, head 60; backward µs: 15, 120,
    100, 10, 20 (+ the loss's 10, charged to the head: nearest lower sequence number).
    """
    ev = [_x(f"ProfilerStep#{s}", "user_annotation", t0, 1000)]
    if style == "whole":
        ev += [_mod("OptimizedModule_0", t0 + 5, 600), _mod("GPT_0", t0 + 8, 590), *_graph(t0 + 10, 580, s + 1)]
        ev += [_op("aten::cross_entropy_loss", t0 + 610, 10, s + 6)]
        return ev + _backward(t0 + 630, 10, s + 6, "NllLossBackward0") + _backward(t0 + 650, 265, s + 1,
                                                                                    "CompiledFunctionBackward")
    ev += [_mod("GPT_0", t0 + 5, 600), _mod("Embedding_0", t0 + 10, 50), _op("aten::embedding", t0 + 12, 40, s + 1)]
    for k, (start, fwd) in enumerate([(100, 200), (320, 150)]):
        if style == "wrapped":
            ev += [_mod(f"OptimizedModule_{k}", t0 + start, fwd), _mod(f"Block_{k}", t0 + start + 5, fwd - 10)]
            ev += _graph(t0 + start + 8, fwd - 16, s + 2 + k)
        else:
            ev += [_mod(f"Block_{k}", t0 + start, fwd), *_graph(t0 + start + 3, fwd - 6, s + 2 + k)]
    ev += [_mod("LayerNorm_0", t0 + 480, 40), _op("aten::layer_norm", t0 + 482, 30, s + 4)]
    ev += [_mod("LMHead_0", t0 + 530, 60), _op("aten::linear", t0 + 532, 50, s + 5)]
    ev += [_op("aten::cross_entropy_loss", t0 + 610, 10, s + 6)]
    for at, dur, seq, node in [(630, 10, 6, "NllLossBackward0"), (650, 20, 5, "MmBackward0"),
                               (680, 10, 4, "NativeLayerNormBackward0"), (700, 100, 3, "CompiledFunctionBackward"),
                               (810, 120, 2, "CompiledFunctionBackward"), (940, 15, 1, "EmbeddingBackward0")]:
        ev += _backward(t0 + at, dur, s + seq, node)
    return ev


def _write(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _times(trace: Trace) -> list[tuple[str, float, float]]:
    return [(r.name, round(r.forward_s * 1e6, 6), round(r.backward_input_s * 1e6, 6)) for r in trace.layers]


def _refused(path: Path, *needles: str, **kwargs: object) -> str:
    with pytest.raises(ContractError) as err:
        import_torch_profiler(path, **kwargs)
    message = str(err.value)
    assert message.startswith(f"{path}: traceEvents") and "\n" not in message
    for needle in needles:
        assert needle in message
    return message


PER_BLOCK = [("Embedding_0", 50, 15), ("Block_0", 200, 120), ("Block_1", 150, 100), ("LayerNorm_0", 40, 10),
             ("LMHead_0", 60, 30)]


def test_a_model_compiled_per_block_imports_one_record_per_block(tmp_path: Path) -> None:
    """Each block's graph lies in its block's range, its ``CompiledFunctionBackward`` goes to it by sequence number."""
    trace = import_torch_profiler(_write(tmp_path / "blocks.json", _step(0, 10, "blocks") + _step(1000, 20, "blocks")))
    assert _times(trace) == PER_BLOCK
    assert [r.kind for r in trace.layers] == KINDS
    assert "torch.compile: 4 of 4 compiled regions inside layer ranges" in trace.provenance.notes


def test_torch_compile_wrappers_are_named_after_the_block_they_wrap(tmp_path: Path) -> None:
    """``torch.compile(block)`` (torchtitan) puts ``OptimizedModule_k`` around ``Block_k``: the layer is the
    block, kind ``block``, timed over the wrapper (dynamo's guards run per call, so they are the block's)."""
    path = _write(tmp_path / "wrapped.json", _step(0, 10, "wrapped") + _step(1000, 20, "wrapped"))
    trace = import_torch_profiler(path)
    assert _times(trace) == PER_BLOCK
    assert [r.kind for r in trace.layers] == KINDS
    # The loss (in no range) goes to the nearest chosen layer, as in an eager trace; the norm's and head's
    # backward stay out with them.
    assert _times(import_torch_profiler(path, group="module", pattern="Block_*")) == [("Block_0", 200, 120),
                                                                                      ("Block_1", 150, 110)]


def test_a_model_compiled_as_a_whole_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "whole.json", _step(0, 10, "whole") + _step(1000, 20, "whole"))
    _refused(path, "the only layer found, 'GPT_0', holds torch.compile'd code ('Torch-Compiled Region: 0/0')",
             "compile each block on its own", "with_stack=True or inside record_layers(net)")
    # Chosen on purpose with --pattern, the whole model is one layer.
    assert _times(import_torch_profiler(path, pattern="GPT_0")) == [("GPT_0", 600, 275)]
    # Without module events the error says why there are no ranges: not with_stack, the compile.
    bare = _write(tmp_path / "bare.json", [e for e in _step(0, 10, "whole") if e["cat"] != "python_function"])
    _refused(bare, "no layer ranges found with module grouping: the trace ran torch.compile'd code",
             "compile each block on its own")


def test_the_cli_prints_the_refusal_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mindpipe.cli import main

    path = _write(tmp_path / "whole.json", _step(0, 10, "whole"))
    out = tmp_path / "trace.json"
    assert main(["import", "torch-profiler", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"mindpipe: error: {path}: traceEvents[")
    assert "holds torch.compile'd code" in err and not out.exists()


def test_ranges_dropped_inside_compiled_code_are_refused(tmp_path: Path) -> None:
    """record_function ranges opened inside compiled code vanish (dynamo ignores them): the blocks'
    graphs lie between 'embedding' and 'final_norm' in no range, and their backward used to go to the embedding."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1000), _x("embedding", "user_annotation", 10, 50),
          _op("aten::embedding", 12, 40, 1), *_graph(100, 200, 2, "2/0"), *_graph(320, 150, 3, "2/0"),
          _x("final_norm", "user_annotation", 480, 40), _op("aten::layer_norm", 482, 30, 4),
          _x("lm_head", "user_annotation", 530, 60), _op("aten::linear", 532, 50, 5),
          *_backward(700, 100, 3, "CompiledFunctionBackward"), *_backward(810, 120, 2, "CompiledFunctionBackward")]
    _refused(_write(tmp_path / "dropped.json", ev),
             "ran between layers 'embedding' and 'final_norm' in no layer range", "record_layers(net)")


def test_a_recompute_inside_the_backward_is_no_dropped_layer(tmp_path: Path) -> None:
    """A checkpointed compiled block re-runs its graph inside the backward; in a pipeline schedule that
    backward can fall between two forward layers of the next micro-batch, and is still no lost layer."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1000), _x("embedding", "user_annotation", 10, 50),
          _op("aten::embedding", 12, 40, 1), *_backward(100, 200, 9, "CheckpointFunctionBackward"),
          *_graph(110, 150, 10, "4/0"), _x("block.0", "user_annotation", 320, 100), *_graph(322, 90, 2, "4/0")]
    trace = import_torch_profiler(_write(tmp_path / "recompute.json", ev))
    assert [r.name for r in trace.layers] == ["embedding", "block.0"]
    assert "torch.compile: 1 of 1 compiled regions inside layer ranges" in trace.provenance.notes


def test_a_compiled_loss_after_the_last_layer_is_charged_like_an_eager_one(tmp_path: Path) -> None:
    """torchtitan compiles the loss too: its graph lies after the head in no range, like an eager loss,
    and its backward goes to the nearest layer (the head), as an eager loss's does."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1000)]
    for i, name in enumerate(GPT_LAYERS):
        ev += [_x(name, "user_annotation", 10 + 100 * i, 50), _op("aten::mm", 12 + 100 * i, 40, 1 + i)]
    ev += _graph(600, 30, 6, "3/0") + _backward(700, 25, 6, "CompiledFunctionBackward")
    ev += [*_backward(730, 10, 5, "MmBackward0"), *_backward(750, 10, 1, "MmBackward0")]
    trace = import_torch_profiler(_write(tmp_path / "loss.json", ev))
    assert _times(trace) == [("embedding", 50, 10), ("block.0", 50, 0), ("block.1", 50, 0), ("final_norm", 50, 0),
                             ("lm_head", 50, 35)]
    assert "torch.compile: 0 of 1 compiled regions inside layer ranges" in trace.provenance.notes


def test_ranges_kept_inside_one_graph_are_refused(tmp_path: Path) -> None:
    """With ``torch._dynamo.config.capture_profiler_record_function`` the ranges stay in the graph,
    but its backward is one node: the layers' backward would be 0 (or all on one layer)."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1000), *_graph(10, 500, 20),
          _x("layer_a", "user_annotation", 20, 300), _x("layer_b", "user_annotation", 330, 100),
          *_backward(600, 300, 20, "CompiledFunctionBackward")]
    _refused(_write(tmp_path / "captured.json", ev),
             "layer 'layer_a' lies inside one torch.compile graph ('CompiledFunction', traceEvents[4])",
             "CompiledFunctionBackward")


def test_compiling_inside_a_layer_is_refused_and_torchs_own_ranges_are_no_layers(tmp_path: Path) -> None:
    """A recompile in a profiled step (dynamo's events, observed in a real trace) would be timed as the layer."""
    compiling = [_x("dynamo", "cpu_op", 120, 300), _x("dynamo_data: compile_id=3/5", "user_annotation", 121, 1),
                 _x("entire_frame_compile", "cpu_op", 125, 290),
                 _x("_compile.compile_inner (dynamo_timed)", "cpu_op", 126, 280),
                 _x("bytecode_tracing_data: compile_id=3/5", "user_annotation", 130, 1)]
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1000), _x("block.0", "user_annotation", 10, 500),
          *_graph(20, 90, 1, "5/0"), *compiling, _x("block.1", "user_annotation", 520, 100),
          *_graph(525, 90, 2, "5/0")]
    _refused(_write(tmp_path / "compiling.json", ev),
             "traceEvents[11]: torch.compile compiled ('_compile.compile_inner (dynamo_timed)') inside layer 'block.0'",
             "schedule(warmup=...)")
    # Outside the layers, compilation is no layer's time; dynamo's annotations are never layers.
    ev[1]["dur"] = 100
    trace = import_torch_profiler(_write(tmp_path / "between.json", ev))
    assert [r.name for r in trace.layers] == ["block.0", "block.1"]


# -- real torch.compile runs --------------------------------------------------------------------
@pytest.fixture()
def fresh_dynamo() -> Iterator[None]:
    """Compiled code and dynamo's caches do not outlive the test."""
    import torch

    yield
    torch._dynamo.reset()


def _profile(path: Path, *, compiled: str, backend: str, with_stack: bool = True, hooks: bool = False) -> Path:
    """The tiny GPT (2 blocks, micro-batch 2, seq 16) compiled ``whole`` (``torch.compile(model)``),
    ``blocks`` (each block's ``compile()``) or ``wrapped`` (``torch.compile(block)`` in the
    ModuleDict, as torchtitan does), profiled on CPU for 2 steps after a warm-up step that compiles."""
    import torch
    from mindpipe.traces.config import Model
    from mindpipe.traces.torch_gpt import build_gpt, lm_loss, synthetic_batch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128, name="tiny")
    net = build_gpt(model)
    tokens, targets = synthetic_batch(model, 2, seq_len=16)
    run = torch.compile(net, backend=backend) if compiled == "whole" else net
    for key in list(net.blocks) if compiled != "whole" else []:
        if compiled == "blocks":
            net.blocks[key].compile(backend=backend)
        else:
            net.blocks[key] = torch.compile(net.blocks[key], backend=backend)
    with (
        record_layers(net) if hooks else contextlib.nullcontext(),
        profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                on_trace_ready=lambda p: p.export_chrome_trace(str(path)), with_stack=with_stack) as prof,
    ):
        for _ in range(3):
            lm_loss(run(tokens), targets).backward()
            net.zero_grad(set_to_none=True)
            prof.step()
    return path


@pytest.mark.usefixtures("fresh_dynamo")
def test_real_per_block_compile_with_record_layers(tmp_path: Path) -> None:
    """``aot_eager`` gives the compiled-region structure (dynamo, AOTAutograd) without a C++ compiler.
    record_layers used to fail here ('NoneType' object has no attribute '__exit__'), and its ranges,
    traced into the blocks' graphs, were dropped."""
    path = _profile(tmp_path / "blocks.json", compiled="blocks", backend="aot_eager", hooks=True)
    trace = import_torch_profiler(path)
    assert [r.name for r in trace.layers] == GPT_LAYERS
    assert all(r.forward_s > 0 and r.backward_input_s > 0 for r in trace.layers)
    assert "torch.compile: 4 of 4 compiled regions inside layer ranges" in trace.provenance.notes
    by_module = import_torch_profiler(path, group="module")
    assert [r.name for r in by_module.layers] == ["Embedding_0", "Block_0", "Block_1", "LayerNorm_0", "LMHead_0"]
    assert [r.kind for r in by_module.layers] == KINDS


@pytest.mark.usefixtures("fresh_dynamo")
def test_real_torchtitan_style_compile_imports_blocks(tmp_path: Path) -> None:
    trace = import_torch_profiler(_profile(tmp_path / "wrapped.json", compiled="wrapped", backend="aot_eager"))
    assert [r.name for r in trace.layers] == ["Embedding_0", "Block_0", "Block_1", "LayerNorm_0", "LMHead_0"]
    assert [r.kind for r in trace.layers] == KINDS  # was OptimizedModule_0, OptimizedModule_1


@pytest.mark.usefixtures("fresh_dynamo")
def test_real_whole_model_compile(tmp_path: Path) -> None:
    """Compiled as a whole, the model used to import as one record 'GPT_0'. record_layers breaks the
    graph at each layer (its hooks run outside compiled code), which gives per-layer records."""
    whole = _profile(tmp_path / "whole.json", compiled="whole", backend="aot_eager")
    _refused(whole, "the only layer found, 'GPT_0', holds torch.compile'd code")
    import torch

    torch._dynamo.reset()
    split = import_torch_profiler(_profile(tmp_path / "split.json", compiled="whole", backend="aot_eager",
                                           with_stack=False, hooks=True))
    assert [r.name for r in split.layers] == GPT_LAYERS
    assert all(r.backward_input_s > 0 for r in split.layers if r.kind == "block")


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_dynamo")
def test_real_inductor_per_block_compile(tmp_path: Path) -> None:
    """Inductor (C++ kernels on CPU) as users run it: each block's graph in its range."""
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        pytest.skip(reason="Inductor on CPU needs a C++ compiler; none on PATH")
    path = _profile(tmp_path / "inductor.json", compiled="blocks", backend="inductor", hooks=True)
    trace = import_torch_profiler(path)
    assert [r.name for r in trace.layers] == GPT_LAYERS
    assert all(r.forward_s > 0 and r.backward_input_s > 0 for r in trace.layers)
    assert "## Call CompiledFxGraph" in path.read_text()
