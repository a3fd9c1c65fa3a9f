"""The Gantt chart draws every span visibly: a 2 ms transfer on a 14 s iteration is a fifth of a pixel."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from mindpipe.simulator.timeline import COLORS, COMM_LANE, draw_gantt
from mindpipe.traces.chrome_trace import TimelineEvent


def _events(ranks: int = 8) -> list[TimelineEvent]:
    """Per rank: forward/backward blocks filling 14 s and a 2 ms p2p transfer every ~0.19 s, offset per rank."""
    out = []
    for r in range(ranks):
        t = 0.0
        while t < 14.0:
            out.append(TimelineEvent(r, "compute", "F", t, t + 0.066, "F"))
            out.append(TimelineEvent(r, "compute", "B", t + 0.066, t + 0.18, "B"))
            t += 0.18
        out += [TimelineEvent(r, "comm", "send", s, s + 0.002, "p2p") for s in np.arange(0.05 + 0.011 * r, 14.0, 0.187)]
    return out


def test_every_ranks_short_transfers_are_drawn_in_their_colour():
    events = _events()
    fig, ax = plt.subplots(figsize=(12, 6), dpi=100)
    try:
        draw_gantt(ax, events)
        fig.canvas.draw()
        img = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(float) / 255
        height = img.shape[0]
        want = np.array(to_rgb(COLORS["p2p"]))
        for r in range(8):
            p2p = [e for e in events if e.rank == r and e.category == "p2p"]
            seen = 0
            for e in p2p:
                middle = r + COMM_LANE[0] + COMM_LANE[1] / 2  # the comm lane's middle
                x, y = ax.transData.transform(((e.start_s + e.end_s) / 2, middle))
                col, line = int(np.rint(x)), height - int(np.rint(y))
                patch = img[line - 2:line + 3, col - 1:col + 2].reshape(-1, 3)
                seen += bool((np.abs(patch - want).max(axis=1) < 0.12).any())
            assert seen == len(p2p), f"rank {r}: {seen} of {len(p2p)} transfers drawn"
    finally:
        plt.close(fig)


def test_an_interleaved_ranks_two_chunks_are_told_apart():
    """Interleaved 1F1B, pp2 v2: rank 0 runs stages 0 and 2. The simulated timeline says which chunk
    each action ran (the Chrome trace too), and the Gantt draws the second chunk in a lighter shade."""
    import json

    from mindpipe.simulator.simulator import Simulator
    from mindpipe.simulator.timeline import _colour
    from mindpipe.traces.chrome_trace import chrome_trace
    from mindpipe.traces.config import Cluster, Model, Plan

    sim = Simulator(Model(kind="gpt", num_layers=8, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128),
                    Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=2))
    plan = Plan(pp=2, micro_batch_size=1, global_batch_size=4, schedule="interleaved_1f1b", virtual_stages=2)
    events = sim.run(plan, timeline=True).timeline
    fwd = [e for e in events if e.thread == "compute" and e.category == "F"]
    by_stage = {int(e.name.split("F")[0]): e.chunk for e in fwd}
    assert by_stage == {0: 0, 1: 0, 2: 1, 3: 1}
    traced = [ev for ev in chrome_trace(events)["traceEvents"] if ev["ph"] == "X" and ev["cat"] == "F"]
    assert sorted({ev.get("args", {}).get("chunk", 0) for ev in traced}) == [0, 1]
    json.dumps(traced)
    first, second = np.array(_colour("F", 0)), np.array(_colour("F", 1))
    assert np.allclose(first, to_rgb(COLORS["F"])) and (second > first).all()
    fig, ax = plt.subplots(figsize=(8, 3), dpi=100)
    try:
        draw_gantt(ax, events)
        fig.canvas.draw()
        img = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(float) / 255
        for shade in (first, second):
            assert (np.abs(img - shade).max(axis=2) < 0.02).sum() > 50
    finally:
        plt.close(fig)
