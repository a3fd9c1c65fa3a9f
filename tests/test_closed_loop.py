"""The closed loop (``mindpipe demo``) end to end on 2 CPU ranks with a tiny model.

The demo itself runs ``gpt-tiny-8k`` on 2 ranks in 3 rounds (minutes); this is the same code at a
size CI can afford (one round, a tinier model): every stage runs for real (profile, tune, executor
runs, calibration, re-tune, report).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mindpipe.traces.calibration import load_calibration

from mindpipe.loop import LoopConfig, closed_loop, demo_plan
from mindpipe.runs import RunSpec

TINY = {"kind": "gpt", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 32, "vocab_size": 256,
        "name": "tiny2"}


@pytest.mark.slow
def test_closed_loop_on_two_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    model_file = tmp_path / "tiny.json"
    model_file.write_text(json.dumps(TINY))
    log: list[str] = []
    cfg = LoopConfig(model=str(model_file), ranks=2, global_batch=8, profile_micro_batch=2, rounds=1,
                     run=RunSpec(steps=5, warmup_steps=1),
                     probes=[demo_plan(tp=2, micro_batch_size=4), demo_plan(dp=2, micro_batch_size=4)],
                     holdout=[demo_plan(pp=2, micro_batch_size=2, schedule="gpipe")], out=tmp_path / "out")
    res = closed_loop(cfg, log=log.append)

    # Progress is shown, stage by stage, and ends with where the report is.
    assert [m.split("] ", 1)[1][:3] for m in log if "] " in m and m.split("] ", 1)[1][:1].isdigit()] == [
        "1/6", "2/6", "3/6", "4/6", "5/6", "6/6"]
    assert log[-1].endswith(str(res.report))
    text = res.report.read_text()
    summary = json.loads((tmp_path / "out" / "report.json").read_text())
    # The headline is the measured times of this run, and the speedup is their ratio.
    assert res.speedup == pytest.approx(res.default_s / res.tuned_s)
    assert summary["speedup"] == pytest.approx(res.speedup)
    assert f"{res.tuned_s:.3f} s vs {res.default_s:.3f} s per iteration" in text
    assert "Rounds side by side: default" in text and "**Regret:**" in text
    assert "the held-out rounds: " in text and "median of all rounds, s" in text
    assert summary["regret"] == pytest.approx(res.regret) and res.regret >= 0
    assert summary["round_ranges_overlap"] == res.ranges_overlap
    # Every plan measured appears with its rounds; the fastest is named; nothing is written outside --out.
    assert summary["fastest_plan"] in summary["median_s_by_plan"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny.json"]
    # The calibration was fitted on this run's measurements and predicts the held-out plans.
    cal = load_calibration(tmp_path / "out" / "calibration.json")
    assert cal.devices["cpu"].compute["fp32"].samples > 0
    assert res.holdout.n >= 1 and (res.holdout.mape_calibrated_pct or -1.0) >= 0
    # Memory per pipeline rank, predicted vs measured, for every plan measured.
    assert "## Memory per pipeline rank: predicted vs measured" in text
    assert sorted(summary["memory_by_plan"]) == sorted(summary["median_s_by_plan"])
    assert all(r["measured_bytes"] > 0 and r["predicted_bytes"] > 0 for rows in summary["memory_by_plan"].values()
               for r in rows)
    for fig in ("calibration_scatter.png", "gantt_tuned.png", "gantt_default.png", "tune_calibrated_pareto.png"):
        png = tmp_path / "out" / "figures" / fig
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"figures/{fig}" in text


def test_the_default_loop_config_builds():
    # The demo's own probes and held-out plans are valid plans at its global batch.
    from mindpipe.loop import LoopConfig

    cfg = LoopConfig()
    assert all(cfg.at_batch(p).global_batch_size == cfg.global_batch for p in [*cfg.probes, *cfg.holdout])
    assert any(p.micro_batch_size * p.dp == cfg.global_batch for p in cfg.probes)


def test_headline_takes_the_last_rounds_side_by_side_and_the_median_of_every_round():
    from types import SimpleNamespace as NS

    from mindpipe.loop import Measured
    from mindpipe.loop_report import headline

    default, tuned = demo_plan(pp=2, micro_batch_size=2), demo_plan(dp=2, micro_batch_size=4)
    rival, early = demo_plan(tp=2, micro_batch_size=4), demo_plan(dp=2, micro_batch_size=2)
    runs = Measured(out=Path("."), model=None, spec=None, say=print)  # type: ignore[arg-type]
    # The rival ran in the calibration phase (0.9, 1.0) and again beside the tuned plan (0.5, 0.55);
    # ``early`` ran only in the calibration phase, minutes before, on a faster moment of the machine.
    for plan, times in ((default, [1.0, 1.2, 1.1, 1.3]), (tuned, [0.9, 0.5, 0.6]), (rival, [0.9, 1.0, 0.5, 0.55]),
                        (early, [0.3, 0.3])):
        runs.plans[Measured.key(plan)] = plan
        runs.runs[Measured.key(plan)] = [NS(iteration_s=x) for x in times]  # type: ignore[misc]
    facts = NS(cfg=NS(rounds=2), default=default, tuned2=tuned, side_by_side=[default, tuned, rival])
    h = headline(facts, runs)  # type: ignore[arg-type]
    # Speedup and overlap from the last two rounds only (the side-by-side phase).
    assert (h.default_rounds, h.tuned_rounds) == ([1.1, 1.3], [0.5, 0.6])
    assert h.speedup == pytest.approx(1.2 / 0.55) and not h.overlap
    # Regret from the side-by-side rounds only: the tuned plan's 0.55 against the rival's 0.525;
    # the plan measured only minutes earlier does not count, however fast it ran then.
    assert h.fastest == Measured.key(rival) and h.regret == pytest.approx(0.55 / 0.525 - 1)
    assert h.side_medians == pytest.approx({Measured.key(default): 1.2, Measured.key(tuned): 0.55,
                                            Measured.key(rival): 0.525})
    # The plan table's medians are over every round.
    assert h.medians[Measured.key(default)] == pytest.approx(1.15) and h.medians[Measured.key(early)] == 0.3
    # Rounds that interleave overlap.
    runs.runs[Measured.key(tuned)][-1] = NS(iteration_s=1.15)  # type: ignore[call-overload]
    assert headline(facts, runs).overlap  # type: ignore[arg-type]


def test_the_plan_table_says_which_plans_were_fitted_on_and_what_its_medians_cover():
    """The tuned plan and the default were among the fitted plans but read as plain "tuned" and
    "default", so their in-sample predictions looked held out; and the table's medians (all rounds)
    disagreed with the headline's (the last phase) without a word."""
    from types import SimpleNamespace as NS

    from mindpipe.loop import Measured
    from mindpipe.loop_report import _md_result, _plan_table, headline

    default, tuned, held = demo_plan(pp=2, micro_batch_size=2), demo_plan(dp=2, micro_batch_size=4), \
        demo_plan(tp=2, micro_batch_size=4)
    runs = Measured(out=Path("."), model=None, spec=None, say=print)  # type: ignore[arg-type]
    for plan, times in ((default, [1.0, 1.2, 1.1, 1.3]), (tuned, [0.9, 0.8, 0.5, 0.6]), (held, [0.7, 0.7])):
        runs.plans[Measured.key(plan)] = plan
        runs.runs[Measured.key(plan)] = [NS(iteration_s=x) for x in times]  # type: ignore[misc]
    facts = NS(cfg=NS(rounds=2, micro_batch=2), default=default, tuned1=tuned, tuned2=tuned,
               side_by_side=[default, tuned, held], fit_plans=[default, tuned])
    h = headline(facts, runs)  # type: ignore[arg-type]
    rows = {line.split(" | ")[1]: line for line in _plan_table(facts, runs, h, {})[2:]}  # type: ignore[arg-type]
    assert rows[Measured.key(default)].startswith("| default (fitted on) |")
    assert rows[Measured.key(tuned)].startswith("| tuned, uncalibrated, tuned, calibrated (fitted on) |")
    assert rows[Measured.key(held)].startswith("| held out |")
    text = "\n".join(_md_result(facts, h, []))  # type: ignore[arg-type]
    assert "headline and the regret compare the last phase's side-by-side rounds only" in text
    assert "among the 3 distinct plans run side by side in the last phase (" in text


def test_in_sample_fidelity_merges_only_the_rounds_the_calibration_was_fitted_on(monkeypatch):
    from types import SimpleNamespace as NS

    import mindpipe.loop as loop
    from mindpipe.loop import Measured

    plan = demo_plan(dp=2, micro_batch_size=4)
    runs = Measured(out=Path("."), model=None, spec=None, say=print)  # type: ignore[arg-type]
    runs.runs[Measured.key(plan)] = [NS(iteration_s=x) for x in (0.9, 0.8, 0.5, 0.6)]  # type: ignore[misc]
    monkeypatch.setattr(loop, "merge_repeats", lambda rs: [[r.iteration_s for r in rs]])
    assert runs.combined(plan, first=2) == [0.9, 0.8]  # type: ignore[comparison-overlap]
    assert runs.combined(plan) == [0.9, 0.8, 0.5, 0.6]  # type: ignore[comparison-overlap]
