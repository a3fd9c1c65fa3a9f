"""``mindpipe calibrate`` on the measured CPU runs in ``benchmarks/results/calibration``: what it
refuses, what it warns about, and that the fit depends on the runs alone (not their order)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from mindpipe.simulator.calibrate.fidelity import fidelity, format_calibration
from mindpipe.simulator.calibrate.fit import calibrate
from mindpipe.simulator.calibrate.runs import load_run
from mindpipe.traces.schema import to_dict

from mindpipe.cli import main

RUNS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "calibration"
DP4, TP2, PP2 = (str(RUNS / f"{n}.r0.json.gz") for n in ("fit_dp4", "fit_tp2", "fit_pp2_1f1b_mb2"))


def _read(src: str) -> dict:
    with gzip.open(src) as f:
        return json.loads(f.read())


def _edited(src: str, dest: Path, **measurement) -> str:
    """A copy of the measured run ``src`` with some of its measurement's keys replaced."""
    data = _read(src)
    data["measurement"].update(measurement)
    dest.write_text(json.dumps(data))
    return str(dest)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_copied_run_counts_once_and_is_never_both_fitted_on_and_held_out(tmp_path, capsys):
    copy = tmp_path / "renamed.json.gz"
    shutil.copyfile(DP4, copy)
    # Fitted twice, it would weigh double in every fit (and in the noise scale's runs).
    assert main(["calibrate", DP4, str(copy), TP2, "--out", str(tmp_path / "c.json")]) == 2
    assert _error_line(capsys) == (f"mindpipe: error: {copy}: records the same measurement as {DP4}: "
                                   "each measured run counts once in the fit")
    # Held out, its in-sample error would be reported as a held-out one.
    assert main(["calibrate", DP4, TP2, "--out", str(tmp_path / "c.json"), "--holdout", str(copy)]) == 2
    assert _error_line(capsys) == (f"mindpipe: error: --holdout: {copy} is both fitted on and held out "
                                   f"(it records the same measurement as {DP4})")
    assert not (tmp_path / "c.json").exists()


def test_the_fit_does_not_depend_on_the_order_of_the_runs():
    runs = [load_run(p) for p in (DP4, TP2, PP2)]
    forward, _ = calibrate(runs)
    backward, _ = calibrate(runs[::-1])
    a, b = to_dict(forward), to_dict(backward)
    a.pop("created"), b.pop("created")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_a_run_of_a_precision_not_fitted_leaves_the_step_overhead_alone(tmp_path):
    """A lone bf16 run has too few action groups to fit bf16 compute: its catalog-priced error
    (-80 %) must not become every fp32 run's step overhead."""
    fp32 = load_run(DP4)
    bf16 = load_run(_edited(TP2, tmp_path / "bf16.json",
                            plan={**_read(TP2)["measurement"]["plan"], "precision": "bf16"}))
    cal, notes = calibrate([fp32, bf16])
    assert "bf16" not in cal.devices["cpu"].compute
    (row,) = fidelity([fp32], cal)
    assert abs(row.calibrated_error or 0) < 0.05, row  # was +43.9 %, with a 470 ms step overhead
    assert any(w.startswith(f"{bf16.source}: no cpu bf16 compute was fitted") for w in notes.warnings), notes.warnings


def test_a_run_whose_steps_are_all_warm_up_is_named(tmp_path):
    warm = load_run(_edited(TP2, tmp_path / "warm.json", warmup_steps=10))
    _, notes = calibrate([warm, load_run(DP4)])
    assert any(w.startswith(f"{warm.source}: every one of its 10 steps is warm-up") for w in notes.warnings), notes.warnings


def test_constants_the_runs_cannot_identify_are_named_in_the_report(tmp_path, capsys):
    """One data-parallel run: no tensor-parallel layers, and every rank updates the same
    parameters, so neither the TP overheads nor the optimizer's time per parameter is fitted."""
    out, report = tmp_path / "cal.json", tmp_path / "report"
    assert main(["calibrate", DP4, "--out", str(out), "--report", str(report), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    warnings = printed["warnings"]
    assert any("no run fitted on has tensor-parallel layers" in w for w in warnings), warnings
    assert any("time per parameter is not identifiable" in w for w in warnings), warnings
    md = (report / "fidelity.md").read_text()
    assert all(f"- warning: {w}" in md for w in warnings)
    # The per-module data-parallel overhead it did fit is printed with the other constants.
    c = printed["calibration"]["devices"]["cpu"]["compute"]["fp32"]
    assert c["dp_unit_overhead_s"] > 0
    assert "per data-parallel-wrapped module" in md


def test_format_calibration_prints_the_data_parallel_module_overhead():
    cal, _ = calibrate([load_run(p) for p in (DP4, TP2, PP2)])
    dp = cal.devices["cpu"].compute["fp32"].dp_unit_overhead_s
    assert dp > 0
    assert f"{1e3 * dp:.3g} ms per data-parallel-wrapped module per forward and backward" in format_calibration(cal)

