"""The torch.profiler importer on traces that span several processes (ranks).

A Chrome trace merged from several ranks (or one written by a tool that profiles every rank into
one file) holds each rank's events under its own ``pid``. Every rank has its own
``ProfilerStep#N`` ranges and its own autograd sequence numbers, which start from the same values
on every rank.
"""

from __future__ import annotations

import json
from pathlib import Path

from mindpipe.traces.importers.torch_profiler import import_torch_profiler
from mindpipe.traces.trace import Trace

EVAL = "autograd::engine::evaluate_function: "


def _x(name: str, cat: str, ts: float, dur: float, pid: int, tid: int, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _op(name: str, ts: float, dur: float, seq: int, pid: int, tid: int, fwd: int = 0) -> dict:
    return _x(name, "cpu_op", ts, dur, pid, tid, **{"Sequence number": seq, "Fwd thread id": fwd})


def _step(step: int, t0: float, pid: int, layers: list[tuple[str, float, float]]) -> list[dict]:
    """One profiled step on process ``pid`` (main thread ``pid``, autograd thread ``pid + 1``).

    ``layers`` is ``(name, forward µs, backward µs)`` in forward order; each layer's forward holds
    one op whose sequence number is its position (the same numbers on every process, as torch
    numbers each process's autograd nodes from the same start).
    """
    ev = [_x(f"ProfilerStep#{step}", "user_annotation", t0, 5000, pid, pid)]
    t = t0 + 10
    for seq, (name, fwd, _) in enumerate(layers, start=1):
        ev += [_x(name, "user_annotation", t, fwd, pid, pid), _op("aten::mm", t + 1, fwd / 2, seq, pid, pid)]
        t += fwd + 10
    for seq, (_, _, bwd) in reversed(list(enumerate(layers, start=1))):
        ev.append(_op(EVAL + "MmBackward0", t, bwd, seq, pid, pid + 1, fwd=1))
        t += bwd + 10
    return ev


def _write(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _times(trace: Trace) -> list[tuple[str, float, float]]:
    return [(r.name, round(r.forward_s * 1e6, 6), round(r.backward_input_s * 1e6, 6)) for r in trace.layers]


def test_data_parallel_ranks_in_one_file_are_averaged_not_summed(tmp_path: Path) -> None:
    """Two ranks run the same layers: a layer's time is the mean over ranks, not their sum."""
    rank0 = [("a", 100, 40), ("b", 200, 60)]
    rank1 = [("a", 300, 80), ("b", 100, 20)]
    events = [*_step(1, 0, 10, rank0), *_step(2, 10_000, 10, rank0)]
    events += [*_step(1, 3, 20, rank1), *_step(2, 10_003, 20, rank1)]
    trace = import_torch_profiler(_write(tmp_path / "dp2.json", events))
    # Per step and rank: a = (100 + 300) / 2, its backward (40 + 80) / 2; b = (200 + 100) / 2, (60 + 20) / 2.
    assert _times(trace) == [("a", 200, 60), ("b", 150, 40)]
    assert "2 processes" in trace.provenance.notes


def test_pipeline_ranks_keep_their_own_backward(tmp_path: Path) -> None:
    """Two pipeline ranks hold different layers; each rank's sequence numbers start from 1.

    The backward of rank 1's first op (sequence number 1) belongs to rank 1's layer, not to the
    layer that holds sequence number 1 on rank 0.
    """
    events = [*_step(1, 0, 10, [("embedding", 100, 30)]), *_step(1, 0, 20, [("lm_head", 400, 700)])]
    trace = import_torch_profiler(_write(tmp_path / "pp2.json", events))
    assert _times(trace) == [("embedding", 100, 30), ("lm_head", 400, 700)]


def test_one_process_unchanged(tmp_path: Path) -> None:
    """The single-process case keeps its divisor and notes."""
    layers = [("a", 100, 40), ("b", 200, 60)]
    events = [*_step(1, 0, 10, layers), *_step(2, 10_000, 10, layers)]
    trace = import_torch_profiler(_write(tmp_path / "one.json", events))
    assert _times(trace) == [("a", 100, 40), ("b", 200, 60)]
    assert "divided by 2 steps (ProfilerStep#N ranges)" in trace.provenance.notes
    assert "processes" not in trace.provenance.notes


def _gpu_rank(pid: int, device: int, kernel_us: float) -> list[dict]:
    """One step of one rank on a GPU: layer ``a`` launches one kernel (correlation 1)."""
    return [
        _x("ProfilerStep#1", "user_annotation", 0, 1000, pid, pid),
        _x("a", "user_annotation", 10, 100, pid, pid),
        _x("cudaLaunchKernel", "cuda_runtime", 20, 2, pid, pid, correlation=1),
        _x("gemm", "kernel", 30, kernel_us, device, 7, correlation=1, device=device),
    ]


def test_gpu_ranks_whose_correlation_ids_collide_are_refused(tmp_path: Path) -> None:
    """Each process numbers its CUDA correlation ids from the same start: in a file merged from two
    ranks a kernel cannot be linked to its launch, so the times would be charged to the wrong rank."""
    import pytest
    from mindpipe.traces.errors import ContractError

    path = _write(tmp_path / "gpu2.json", [*_gpu_rank(10, 0, 5.0), *_gpu_rank(20, 1, 9.0)])
    with pytest.raises(ContractError) as err:
        import_torch_profiler(path)
    assert str(path) in str(err.value) and "correlation" in str(err.value) and "10" in str(err.value)
    # One rank alone links its kernel: a = 5 µs.
    one = import_torch_profiler(_write(tmp_path / "gpu1.json", _gpu_rank(10, 0, 5.0)))
    assert _times(one) == [("a", 5, 0)]


def _accumulating_step(step: int, t0: float, micro_batches: int, layers: list[tuple[str, float, float]]) -> list[dict]:
    """One optimizer step (one ``ProfilerStep#N``) of gradient accumulation over ``micro_batches``
    micro-batches, each a forward and a backward of ``layers`` (sequence numbers keep counting)."""
    ev = [_x(f"ProfilerStep#{step}", "user_annotation", t0, 50_000, 1, 1)]
    t, seq0 = t0 + 10, 100 * step
    for mb in range(micro_batches):
        base = seq0 + 10 * mb
        for i, (name, fwd, _) in enumerate(layers):
            ev += [_x(name, "user_annotation", t, fwd, 1, 1), _op("aten::mm", t + 1, fwd / 2, base + i, 1, 1)]
            t += fwd + 10
        for i, (_, _, bwd) in reversed(list(enumerate(layers))):
            ev.append(_op(EVAL + "MmBackward0", t, bwd, base + i, 1, 1, fwd=1))
            t += bwd + 10
    return ev


def test_gradient_accumulation_gives_times_per_micro_batch(tmp_path: Path) -> None:
    """A trace's times are for one micro-batch (the Trace contract). A training loop that calls
    ``prof.step()`` once per optimizer step runs every layer once per micro-batch inside it."""
    layers = [("a", 100, 40), ("b", 200, 60)]
    events = [*_accumulating_step(1, 0, 3, layers), *_accumulating_step(2, 100_000, 3, layers)]
    trace = import_torch_profiler(_write(tmp_path / "accumulate.json", events))
    assert _times(trace) == [("a", 100, 40), ("b", 200, 60)]
    assert "3 micro-batches per step" in trace.provenance.notes
