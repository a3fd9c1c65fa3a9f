"""Per-layer timing inside the actions (executor/layer_timing.py), in process, on real autograd.

A stand-in for torch's ``PipelineStage`` runs a real stage module the way torch does — forward,
whole backward (B), or input gradients (I) then weight gradients (W) through torch's own
``stage_backward_input``/``stage_backward_weight`` — under the :class:`Recorder`'s timed
wrappers. One block is made much heavier (a wide MLP), so it must come out slowest.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from mindpipe.executor.layer_records import layer_table
from mindpipe.executor.layer_timing import backward_segments, completion_segments, forward_segments
from mindpipe.executor.measure import Recorder
from mindpipe.executor.parallelize import apply_recompute
from mindpipe.executor.payload import Coords, RankPayload
from mindpipe.executor.stages import StageModule
from mindpipe.traces.config import Model
from mindpipe.traces.torch_gpt import Block, build_gpt, lm_loss
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

MODEL = Model(kind="gpt", num_layers=3, hidden_size=64, num_heads=4, seq_len=64, vocab_size=64)
BATCH = 8
HEAVY = "block.1"
MICROBATCHES = 5


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread, as the executor's CPU ranks run: a second one spinning at barriers on a
    busy machine stalls whichever layer is running, and the heavy block would no longer stand out."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FakeStage:
    """The four methods the Recorder wraps, with torch's semantics for a non-first stage."""

    def __init__(self, module: StageModule, stage_index: int) -> None:
        self.submod, self.stage_index, self.dw_builder = module, stage_index, None
        self.cache: dict[int, tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = {}
        self.groups: dict[int, list] = {}

    def forward_one_chunk(self, mb: int, args: tuple[torch.Tensor, ...]) -> torch.Tensor:
        out = self.submod(*args)
        self.cache[mb] = (out, args)
        return out

    def backward_one_chunk(self, mb: int, loss: torch.Tensor | None = None, full_backward: bool = True,
                           last_backward: bool = False) -> None:
        _out, inputs = self.cache.pop(mb)
        if full_backward:
            torch.autograd.backward(loss)
        else:
            _, self.groups[mb] = stage_backward_input([loss], None, list(inputs), self.submod.parameters())

    def backward_weight_one_chunk(self, mb: int, last_backward: bool = False) -> None:
        stage_backward_weight(self.submod.parameters(), self.groups.pop(mb))

    def perform_reduce_grad(self, grad_scale_factor: int) -> None:
        pass


def _stage(recompute: str) -> StageModule:
    """Blocks 0..2, final norm and head (a last, non-first stage); block 1's MLP is 32× wider."""
    gpt = build_gpt(MODEL, seed=0)
    gpt.blocks["1"] = Block(Model(**{**MODEL.__dict__, "ffn_hidden_size": 128 * MODEL.hidden_size}))
    stage = StageModule(gpt, 0, 3, is_first=False, is_last=True)
    apply_recompute(stage, [recompute] * MODEL.num_layers)
    return stage


def _run(recompute: str, split: bool) -> Recorder:
    torch.manual_seed(0)
    stage = FakeStage(_stage(recompute), stage_index=1)
    rec = Recorder(torch.device("cpu"), origin=time.perf_counter())
    rec.wrap_stage(stage, stage.submod.layers())
    for step in (1, 2):  # step 1 warms up (first calls allocate and dispatch slowly)
        rec.begin_step(step)
        for mb in range(MICROBATCHES):
            x = torch.randn(BATCH, MODEL.seq_len, MODEL.hidden_size, requires_grad=True)
            y = torch.randint(0, MODEL.vocab_size, (BATCH, MODEL.seq_len))
            loss = lm_loss(stage.forward_one_chunk(mb, (x,)), y)
            stage.backward_one_chunk(mb, loss=loss, full_backward=not split)
            if split:
                stage.backward_weight_one_chunk(mb)
        rec.end_step()
    return rec


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("split", [False, True], ids=["B", "I+W"])
def test_layer_segments_add_up_to_each_action_and_find_the_heavy_block(recompute, split):
    rec = _run(recompute, split)
    names = [n for n, _, _ in _stage("none").layers()]
    kinds = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}
    assert sorted({a.kind for a in rec.spans.actions}) == (["F", "I", "W"] if split else ["B", "F"])
    for a in rec.spans.actions:
        segs = [s for s in rec.spans.layers
                if (s.step, s.microbatch, s.phase) == (a.step, a.microbatch, kinds[a.kind])]
        # Consecutive segments, one per layer, covering the action exactly.
        assert sorted(s.layer for s in segs) == sorted(names), (a.kind, segs)
        assert sum(s.end_s - s.start_s for s in segs) == pytest.approx(a.end_s - a.start_s, abs=1e-9)
        assert all(s.end_s >= s.start_s for s in segs)
    for phase in sorted({kinds[a.kind] for a in rec.spans.actions}):
        times = {n: statistics.median(s.end_s - s.start_s for s in rec.spans.layers
                                      if s.layer == n and s.phase == phase and s.step == 2) for n in names}
        assert max(times, key=times.__getitem__) == HEAVY, (phase, times)


def test_layer_table_holds_medians_of_the_segments():
    rec = _run("none", split=True)
    payload = RankPayload(rank=0, coords=Coords(0, 0, 0), stages=[1], host="h", cpu_count=1, threads=1,
                          spans=rec.spans, layers=rec.layers.infos(), losses=[1.0, 1.0], first_step=1, first_measured=2,
                          cpu_s=1.0, cpu_steps=1, energy_j=None, peak_memory_bytes=1, memory_source="process_rss")
    table = layer_table([payload])
    assert table.split and not table.notes
    assert [r.name for r in table.records] == ["block.0", "block.1", "block.2", "final_norm", "lm_head"]
    heavy = next(r for r in table.records if r.name == HEAVY)
    for phase in ("forward_s", "backward_input_s", "backward_weight_s"):
        assert max(table.records, key=lambda r: getattr(r, phase)) is heavy
    assert all(r.stats["forward_samples"] == MICROBATCHES for r in table.records)
    # Measured on the tensors: the wide block holds more parameters; the head's output crosses no boundary.
    assert heavy.param_count > table.records[0].param_count == MODEL.block_param_count()
    assert table.records[0].output_bytes == BATCH * MODEL.seq_len * MODEL.hidden_size * 4
    assert table.records[-1].output_bytes == 0
    # Each record is the median of the layer's segments over the measured step's micro-batches.
    for r in table.records:
        for phase in ("forward", "backward_input", "backward_weight"):
            spans = [s.end_s - s.start_s for s in rec.spans.layers if s.layer == r.name and s.phase == phase and s.step == 2]
            assert len(spans) == MICROBATCHES and getattr(r, f"{phase}_s") == statistics.median(spans)


def test_segment_rules():
    t0, t1 = 0.0, 10.0
    assert forward_segments(3, {0: 2.0, 1: 5.0}, t0, t1) == [(0, 0.0, 2.0), (1, 2.0, 5.0), (2, 5.0, 10.0)]
    assert forward_segments(3, {0: 2.0}, t0, t1) is None  # a missing mark: no guess
    # Backward: gradients arrive last layer first; layer j ends when layer j-1's output gradient is ready.
    assert backward_segments(3, {2: 1.0, 1: 3.0, 0: 6.0}, t0, t1) == [(0, 6.0, 10.0), (1, 3.0, 6.0), (2, 0.0, 3.0)]
    assert backward_segments(1, {}, t0, t1) == [(0, 0.0, 10.0)]
    # Weight gradients: in completion order (a layer's last parameter), the last one to the end.
    marks = [(0, 1.0), (0, 2.0), (2, 4.0), (1, 5.0), (1, 6.0)]
    assert completion_segments(marks, t0, t1) == [(0, 0.0, 2.0), (2, 2.0, 4.0), (1, 4.0, 10.0)]
