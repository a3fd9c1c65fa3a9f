"""The throughput-carbon Pareto front and its plot.

gpt-1.3b on 8 A100-80GB (``--objective carbon --global-batch 64,128,256 --budget 60``): the front is three
plans at 0.005013 / 0.004986 / 0.004977 gCO2 per sample and 75.49 / 75.46 / 74.98 samples/s — each faster
one dirtier, so none dominated (a true front) — but the cloud spans 0.005 to 0.03 g, and on pareto.png
the three drew as one dot. A bunched front gets a zoomed panel with each point named.
"""

from __future__ import annotations

import pytest
from mindpipe.tuner import output
from mindpipe.tuner.objectives import pareto_front

FRONT = [(75.490220, 0.005013, 8, 1, 1, 8), (75.459346, 0.004986, 4, 1, 2, 4), (74.976263, 0.004977, 4, 1, 2, 8)]


def _row(thr: float, g: float, dp: int = 1, tp: int = 1, pp: int = 1, mb: int = 1) -> dict:
    return {"feasible": True, "throughput_samples_per_s": thr, "carbon_per_sample_g": g, "dp": dp, "tp": tp,
            "pp": pp, "micro_batch_size": mb, "global_batch_size": 256, "schedule": "1f1b"}


def _table() -> list[dict]:
    cloud = [_row(70.0 - 2 * k, 0.0052 + 0.0005 * k) for k in range(30)] + [_row(8.0, 0.0305)]
    return [_row(*f) for f in FRONT] + cloud


def test_the_bunched_front_is_a_true_front():
    table = _table()
    idx = pareto_front(table)
    assert [table[i]["carbon_per_sample_g"] for i in idx] == [0.005013, 0.004986, 0.004977]
    for i in idx:  # no row has at least the throughput and at most the carbon of a front point, one strictly
        a = table[i]
        assert not any(b is not a and b["throughput_samples_per_s"] >= a["throughput_samples_per_s"]
                       and b["carbon_per_sample_g"] <= a["carbon_per_sample_g"] for b in table)


def test_a_bunched_front_gets_a_zoomed_panel_naming_its_plans(monkeypatch, tmp_path):
    drawn = {}
    monkeypatch.setattr(output, "_save", lambda fig, path: drawn.update(axes=fig.axes))
    table = _table()
    front = [table[i] for i in pareto_front(table)]
    output._plot_pareto(table, front, tmp_path / "p.png", "gpt-1.3b on a100-sxm4-80gb:1x8 (8 devices)")
    assert len(drawn["axes"]) == 2
    zoom = drawn["axes"][1]
    lo, hi = zoom.get_xlim()
    assert lo <= 0.004977 and hi >= 0.005013 and hi - lo < 0.1 * (0.0305 - 0.004977)
    labels = {t.get_text() for t in zoom.texts}
    assert labels == {"dp8 tp1 pp1 mb8 gb256 1f1b", "dp4 tp1 pp2 mb4 gb256 1f1b", "dp4 tp1 pp2 mb8 gb256 1f1b"}


@pytest.mark.parametrize("spread", [True, False])
def test_a_spread_or_single_front_keeps_one_panel(monkeypatch, tmp_path, spread):
    drawn = {}
    monkeypatch.setattr(output, "_save", lambda fig, path: drawn.update(axes=fig.axes))
    table = [_row(30.0, 0.01), _row(20.0, 0.005), _row(10.0, 0.02)] if spread else [_row(30.0, 0.01), _row(20.0, 0.02)]
    front = [table[i] for i in pareto_front(table)]
    output._plot_pareto(table, front, tmp_path / "p.png")
    assert len(drawn["axes"]) == 1
