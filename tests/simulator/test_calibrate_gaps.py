"""``mindpipe calibrate`` on the measured CPU runs in ``benchmarks/results/calibration``: a run
missing a rank is refused, a refit of the same runs is the same file, operator kinds no run
exercised and held-out runs of another model are named in the warnings (CLI, ``--json`` and
``fidelity.md``)."""

from __future__ import annotations

import datetime
import gzip
import hashlib
import itertools
import json
from pathlib import Path

from mindpipe.simulator.calibrate import fit as fit_module
from mindpipe.simulator.calibrate import supernet as supernet_module
from mindpipe.simulator.calibrate.fit import held_out_model_warnings, unfitted_kinds_warning
from mindpipe.simulator.calibrate.runs import load_run
from mindpipe.traces.calibration import load_calibration
from mindpipe.traces.schema import to_dict
from mindpipe.tuner.api import fingerprint, reference

from mindpipe.cli import main

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "benchmarks" / "results" / "calibration"
DP4, TP2, PP2 = (str(RUNS / f"{n}.r0.json.gz") for n in ("fit_dp4", "fit_tp2", "fit_pp2_1f1b_mb2"))
HELD = str(RUNS / "ho_pp2_zbh1.r0.json.gz")
LLAMA = str(REPO / "benchmarks" / "results" / "llama_elementwise_cpu" / "llama_dp2.r0.json.gz")


def _read(src: str) -> dict:
    with gzip.open(src) as f:
        return json.loads(f.read())


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and not captured.out, (err, captured.out)
    return err[0]


def _without_ranks(src: str, dest: Path, *drop: int) -> str:
    data = _read(src)
    data["measurement"]["ranks"] = [r for r in data["measurement"]["ranks"] if r["rank"] not in drop]
    dest.write_text(json.dumps(data))
    return str(dest)


# -- 1. a measured run whose ranks list misses a rank --------------------------------------------------------


def test_a_run_missing_a_rank_is_refused_in_one_line_naming_the_file_and_the_rank(tmp_path, capsys):
    gap = _without_ranks(DP4, tmp_path / "gap.json", 2)  # dp4: ranks 0, 1, 3
    want = (f"mindpipe: error: {gap}: measurement.ranks misses rank 2 of world_size=4 "
            "(a measured run has one record per rank)")
    out = tmp_path / "cal.json"
    for argv in (["calibrate", gap, TP2, "--out", str(out)], ["calibrate", DP4, TP2, "--out", str(out), "--holdout", gap],
                 ["validate", "measured", "--data", gap]):
        assert main(argv) == 2, argv
        assert _error_line(capsys) == want
    assert not out.exists()
    two = _without_ranks(DP4, tmp_path / "two.json", 0, 3)
    assert main(["calibrate", two, "--out", str(out)]) == 2
    assert _error_line(capsys) == (f"mindpipe: error: {two}: measurement.ranks misses ranks 0, 3 of world_size=4 "
                                   "(a measured run has one record per rank)")


# -- 2. the same runs refitted give the same file --------------------------------------------------------------


class _MovingClock:
    """Stands in for the ``datetime`` module a fit might read the time from: a minute later at every call."""

    UTC = datetime.UTC

    def __init__(self) -> None:
        ticks = itertools.count()
        start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

        class _DateTime:
            @staticmethod
            def now(tz=None):  # the signature of datetime.now
                return start + datetime.timedelta(minutes=next(ticks))

        self.datetime = _DateTime


def test_refitting_the_same_runs_gives_the_same_file_and_digest(tmp_path, capsys, monkeypatch):
    """The calibration is a function of its runs (the fit does not depend on their order, nor on
    when it ran): a refit must not look like a new calibration to whatever records its digest
    (``tune``'s ``calibration: FILE sha256:...`` reference and its sweep's identity)."""
    # Whatever the fit might read the time from moves between the two fits (raising=False: the
    # fit reads no clock, and the name need not exist).
    monkeypatch.setattr(fit_module, "dt", _MovingClock(), raising=False)
    a, b = tmp_path / "a" / "cal.json", tmp_path / "b" / "cal.json"
    for out in (a, b):
        assert main(["calibrate", DP4, TP2, "--out", str(out), "--json"]) == 0
        capsys.readouterr()
    assert hashlib.sha256(a.read_bytes()).hexdigest() == hashlib.sha256(b.read_bytes()).hexdigest()
    ca, cb = load_calibration(a), load_calibration(b)
    assert reference("cal.json", ca) == reference("cal.json", cb)
    model, cluster = load_run(DP4).model, load_run(DP4).cluster
    assert fingerprint(model, cluster, None, ca) == fingerprint(model, cluster, None, cb)
    assert ca.created == ""  # no creation time: the file's own time says when it was written


def test_refitting_the_same_supernet_runs_gives_the_same_calibration(monkeypatch):
    from tests.simulator.test_subnet_calibrate import _synthetic

    monkeypatch.setattr(supernet_module, "dt", _MovingClock(), raising=False)
    runs = [_synthetic("sequential"), _synthetic("csp")]
    first, _ = supernet_module.calibrate_supernet(runs)
    again, _ = supernet_module.calibrate_supernet(runs)
    assert json.dumps(to_dict(first), sort_keys=True) == json.dumps(to_dict(again), sort_keys=True)


# -- 3. operator kinds no run exercised ---------------------------------------------------------------------


def test_operator_kinds_no_run_exercised_are_named_in_the_output_and_the_report(tmp_path, capsys):
    """The CPU runs ran attention unfused (flash_attention false): no flash operator, so its scale
    is not fitted and a flash-attention plan would be priced at the uncalibrated 1.0 there."""
    out, report = tmp_path / "cal.json", tmp_path / "report"
    want = ("cpu fp32: no run fitted on exercises the flash operator kind: its scale is not fitted "
            "(it stays 1.0, the uncalibrated model's time, in any plan that runs it)")
    assert main(["calibrate", DP4, TP2, "--out", str(out), "--report", str(report)]) == 0
    assert f"\nwarning: {want}\n" in capsys.readouterr().out
    assert f"- warning: {want}\n" in (report / "fidelity.md").read_text()
    assert "flash" not in load_calibration(out).devices["cpu"].compute["fp32"].scale
    assert main(["calibrate", DP4, TP2, "--out", str(tmp_path / "again.json"), "--json"]) == 0
    assert want in json.loads(capsys.readouterr().out)["warnings"]


def test_the_unfitted_kinds_warning_names_each_kind_and_nothing_when_all_are_fitted():
    fitted = {"gemm": 1.8, "memory": 1.7}
    assert unfitted_kinds_warning("cpu fp32", fitted) == (
        "cpu fp32: no run fitted on exercises the bmm and flash operator kinds: their scales are not fitted "
        "(they stay 1.0, the uncalibrated model's time, in any plan that runs them)")
    assert unfitted_kinds_warning("cpu fp32", {**fitted, "bmm": 1.9, "flash": 2.0}) is None
    # A supernet simulation never prices bmm (attention is the fused kernel there).
    assert unfitted_kinds_warning("cpu bf16", {**fitted, "flash": 2.0}, supernet_module.PRICED_KINDS) is None


# -- 4. a held-out run of another model -----------------------------------------------------------------------


def test_a_held_out_run_of_another_model_is_predicted_with_a_warning(tmp_path, capsys):
    """Held-out llama-mini runs out of a gpt-mini fit are a question the project asks itself
    (benchmarks/llama_elementwise_cpu.py), so they are predicted, not refused; but their error is
    the calibration's transfer to another model, and the output says so."""
    out, report = tmp_path / "cal.json", tmp_path / "report"
    gpt, llama = load_run(DP4).model, load_run(LLAMA).model
    want = (f"{LLAMA}: held out, but it ran {llama.describe()}, not {gpt.describe()} as the runs fitted on did: "
            "its error is how the calibration carries over to another model, not the fit's held-out error")
    assert main(["calibrate", DP4, TP2, "--out", str(out), "--holdout", HELD, LLAMA, "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert f"\nwarning: {want}\n" in printed
    assert f"- warning: {want}\n" in (report / "fidelity.md").read_text()
    assert HELD not in "".join(line for line in printed.splitlines() if line.startswith("warning:"))
    assert main(["calibrate", DP4, TP2, "--out", str(out), "--holdout", HELD, LLAMA, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert want in doc["warnings"] and doc["holdout"]["n"] == 2


def test_held_out_runs_of_the_fitted_model_give_no_model_warning():
    fitted = [load_run(p) for p in (DP4, TP2)]
    assert held_out_model_warnings(fitted, [load_run(HELD)]) == []
    assert held_out_model_warnings([], [load_run(LLAMA)]) == []
    (only,) = held_out_model_warnings(fitted, [load_run(HELD), load_run(LLAMA)])
    assert only.startswith(f"{LLAMA}: held out, but it ran llama-mini (")

